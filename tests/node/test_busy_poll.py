"""Busy polling (node/server/busy_poll.py): a reader polls its socket while the loop has nothing
else to do, and gives the loop back at once when it has: other I/O, runnable tasks, a
timer, or a millisecond of polling reads without a pass through trio. Real sockets in a
real trio loop; the windows are long (seconds) where a test shows that something else
ended the poll, so a slow machine cannot pass them by timing alone."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import threading
import time
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing

from node.server import busy_poll
from node.server.busy_poll import LOOP_BUSY_S, YIELD_INTERVAL_S, BusyPoll, _LoopView
from node.server.dispatch_loop import idle_pass, serve_dispatch
from store import Message, MessageStore, StoreConfig
from node.client import SyncAdmin, SyncProducer

LONG_US = 3_000_000   # a window no test waits out: something else must end the poll


@pytest.fixture
def pair():
    """(our end as a trio SocketStream, the peer's plain socket)."""
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    yield trio.SocketStream(trio.socket.from_stdlib_socket(ours)), theirs
    ours.close()
    theirs.close()


@pytest.mark.trio
async def test_a_waiting_request_is_read_at_once_without_polling(pair):
    ours, theirs = pair
    busy = BusyPoll(LONG_US)
    theirs.sendall(b"request")
    assert busy.reader(ours).read(1024) == b"request"
    assert busy.statistics().polls == 0


@pytest.mark.trio
async def test_a_request_that_arrives_while_polling_is_read_by_the_poll(pair):
    ours, theirs = pair
    busy = BusyPoll(LONG_US)
    threading.Timer(0.05, theirs.sendall, (b"late",)).start()
    started = time.perf_counter()
    assert busy.reader(ours).read(1024) == b"late"
    assert time.perf_counter() - started < 2
    statistics = busy.statistics()
    assert statistics.polls == 1 and statistics.reads == 1 and statistics.seconds >= 0.03


@pytest.mark.trio
async def test_the_end_of_the_stream_is_read_as_such(pair):
    ours, theirs = pair
    theirs.shutdown(socket.SHUT_WR)
    assert BusyPoll(LONG_US).reader(ours).read(1024) == b""


@pytest.mark.trio
async def test_nothing_arriving_gives_up_after_the_window(pair):
    ours, _ = pair
    busy = BusyPoll(20_000)
    started = time.perf_counter()
    assert busy.reader(ours).read(1024) is None
    assert 0.02 <= time.perf_counter() - started < 1.5
    assert busy.statistics().reads == 0


@pytest.mark.trio
async def test_io_another_task_waits_for_ends_the_poll_at_once(pair):
    ours, _ = pair
    other, other_peer = socket.socketpair()
    with other, other_peer:
        got = []

        async def other_reader() -> None:
            await trio.lowlevel.wait_readable(other)
            got.append(other.recv(16))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(other_reader)
            await trio.testing.wait_all_tasks_blocked()   # registered with the loop's epoll
            busy = BusyPoll(LONG_US)
            threading.Timer(0.05, other_peer.sendall, (b"x",)).start()
            started = time.perf_counter()
            assert busy.reader(ours).read(1024) is None
            assert time.perf_counter() - started < 2
        assert got == [b"x"]


@pytest.mark.trio
async def test_runnable_tasks_are_not_kept_waiting(pair):
    ours, _ = pair
    busy = BusyPoll(LONG_US)
    async with trio.open_nursery() as nursery:
        for _ in range(2):
            nursery.start_soon(trio.sleep, 0)
        started = time.perf_counter()
        assert busy.reader(ours).read(1024) is None   # two tasks wait to run
        assert time.perf_counter() - started < 1
    assert busy.statistics().polls == 0


@pytest.mark.trio
async def test_one_runnable_task_other_than_the_dispatch_is_not_kept_waiting(pair):
    # a sync put's reply task, woken as the senders it woke wait to run in the same batch
    ours, _ = pair
    busy = BusyPoll(LONG_US)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.sleep, 0)
        started = time.perf_counter()
        assert busy.reader(ours).read(1024) is None   # one task waits to run
        assert time.perf_counter() - started < 1
    assert busy.statistics().polls == 0


@pytest.mark.trio
async def test_the_dispatch_task_alone_runnable_lets_the_poll_go_on(pair, tmp_path):
    # its pass is idle_work's: the reader runs it, then polls its window
    ours, _ = pair
    store = MessageStore(StoreConfig(store_path=str(tmp_path / "s"), dispatcher_thread=False))
    store.start()
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_dispatch, store.dispatcher)
            await trio.testing.wait_all_tasks_blocked()
            busy = BusyPoll(20_000, idle_work=idle_pass(store.dispatcher))
            store.append([Message("t", b"m", queue_id=0)])   # wakes the dispatch task
            assert busy._loop.runnable() == 1
            assert busy.reader(ours).read(1024) is None       # the window ran out
            assert busy.statistics().polls == 1
            assert store.max_offset("t", 0) == 1              # dispatched by the idle pass
            nursery.cancel_scope.cancel()
    finally:
        store.shutdown()


@pytest.mark.trio
async def test_the_next_timer_ends_the_poll(pair):
    ours, _ = pair
    busy = BusyPoll(LONG_US)
    with trio.move_on_after(0.05):
        started = time.perf_counter()
        assert busy.reader(ours).read(1024) is None
        assert 0.04 <= time.perf_counter() - started < 2
        await trio.sleep_forever()


@pytest.mark.trio
async def test_idle_work_runs_first_and_tasks_it_wakes_end_the_poll(pair):
    ours, _ = pair
    event = trio.Event()
    woken = []

    async def waiter() -> None:
        await event.wait()
        woken.append(True)

    def work() -> bool:
        event.set()
        return True

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        busy = BusyPoll(LONG_US, idle_work=work)
        started = time.perf_counter()
        assert busy.reader(ours).read(1024) is None
        assert time.perf_counter() - started < 1
    assert woken == [True, True]


@pytest.mark.trio
async def test_a_reader_that_keeps_reading_by_polling_goes_through_trio_every_millisecond(pair):
    ours, theirs = pair
    reader = BusyPoll(LONG_US).reader(ours)
    theirs.sendall(b"one")
    assert reader.read(1024) == b"one"
    time.sleep(YIELD_INTERVAL_S * 2)
    theirs.sendall(b"two")
    assert reader.read(1024) is None   # its turn to pass through trio, though bytes wait
    assert reader.read(1024) == b"two"  # after which it polls again


@pytest.mark.trio
async def test_receive_reads_by_polling_without_a_checkpoint_and_yields_when_its_turn_comes(pair):
    ours, theirs = pair
    busy = BusyPoll(LONG_US)
    reader = busy.reader(ours)
    theirs.sendall(b"one")
    with trio.testing.assert_no_checkpoints():
        assert await reader.receive(1024) == b"one"
    time.sleep(YIELD_INTERVAL_S * 2)
    threading.Timer(0.05, theirs.sendall, (b"two",)).start()
    with trio.testing.assert_checkpoints():
        assert await reader.receive(1024) == b"two"   # a checkpoint, then a poll that catches it
    assert busy.statistics().reads == 1


@pytest.mark.trio
async def test_receive_waits_through_trio_when_polling_gives_up(pair):
    ours, theirs = pair
    busy = BusyPoll(1_000)
    reader = busy.reader(ours)
    threading.Timer(0.1, theirs.sendall, (b"late",)).start()
    with trio.testing.assert_checkpoints():
        assert await reader.receive(1024) == b"late"   # the 1 ms poll gave up: trio's wait got it
    assert busy.statistics().reads == 0


@pytest.mark.trio
async def test_zero_window_never_polls(pair):
    ours, theirs = pair
    busy = BusyPoll(0)
    assert not busy.enabled
    theirs.sendall(b"x")
    assert busy.reader(ours).read(1024) is None


@pytest.mark.integration   # two node processes, and hastore status in a process
def test_a_node_reads_a_one_at_a_time_client_by_polling_and_reports_it(node_process):
    polling = node_process("polling", busy_poll_us=10_000)
    quiet = node_process("quiet", busy_poll_us=0)
    for node, polled in ((polling, True), (quiet, False)):
        with SyncProducer(node.client_address) as producer:
            for index in range(50):
                assert producer.send("t", b"m%d" % index).ok
        with SyncAdmin(node.client_address) as admin:
            status = admin.status()["busy_poll"]
        shown = subprocess.run([sys.executable, "-m", "node.cli", "status", "--bootstrap", node.client_address],
                               capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0, shown.stderr
        if polled:
            assert status["window_us"] == 10_000 and status["reads"] >= 1 and status["seconds"] > 0
            assert 0 <= status["loop_polls_woken"] <= status["loop_polls"]
            shown_reads = re.search(r"busy polling: 10000 us window, (\d+) requests read by polling", shown.stdout)
            assert shown_reads and int(shown_reads[1]) >= status["reads"]   # its own request may add one
        else:
            assert status == {"window_us": 0, "reads": 0, "seconds": 0, "loop_polls": 0, "loop_polls_woken": 0,
                              "loop_seconds": 0, "ready_taken": 0}
            assert "busy polling: off" in shown.stdout


@pytest.mark.trio
async def test_the_loop_view_reads_what_trio_reports():
    view = _LoopView.of_current_run()
    assert view is not None
    with trio.move_on_after(30):
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(trio.sleep, 0)
            statistics = trio.lowlevel.current_statistics()
            assert view.runnable() == statistics.tasks_runnable == 3
            assert abs(view.seconds_to_next_deadline() - statistics.seconds_to_next_deadline) < 0.5
            assert 25 < view.seconds_to_next_deadline() <= 30


# --- the loop's own waits (poll_loop_waits) ---------------------------------------------------
async def _some_io(ours: socket.socket, theirs: socket.socket) -> None:
    """I/O the loop waits for and gets: it is busy with I/O now."""
    theirs.sendall(b"i")
    await trio.lowlevel.wait_readable(ours)
    assert ours.recv(16) == b"i"


@pytest.fixture
def plain_pair():
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    with ours, theirs:
        yield ours, theirs


@pytest.fixture
async def polled_loop():
    """A BusyPoll with a window no test waits out, polling the test loop's waits until the
    test ends."""
    busy = BusyPoll(LONG_US, poll_loop_waits=True)
    try:
        yield busy
    finally:
        busy.close()


@pytest.mark.trio
async def test_a_busy_loop_polls_its_wait_and_io_ends_the_poll_without_a_sleep(plain_pair, polled_loop):
    ours, theirs = plain_pair
    await _some_io(ours, theirs)
    threading.Timer(0.05, theirs.sendall, (b"late",)).start()
    started = time.perf_counter()
    await trio.lowlevel.wait_readable(ours)   # every task waits: the loop's wait is polled
    assert time.perf_counter() - started < 2
    assert ours.recv(16) == b"late"
    statistics = polled_loop.statistics()
    assert statistics.loop_polls_woken >= 1 and statistics.loop_polls >= statistics.loop_polls_woken
    assert statistics.loop_seconds >= 0.03


@pytest.mark.trio
async def test_a_polled_wait_yields_its_cpu_each_turn(plain_pair, monkeypatch):
    # a client the reply woke onto this vCPU runs at once, not after the window
    yields = _counted_yields(monkeypatch)   # before the wait polling is installed: it binds the call then
    busy = BusyPoll(LONG_US, poll_loop_waits=True)
    try:
        ours, theirs = plain_pair
        await _some_io(ours, theirs)
        threading.Timer(0.05, theirs.sendall, (b"late",)).start()
        before = yields[0]
        await trio.lowlevel.wait_readable(ours)
        assert ours.recv(16) == b"late"
        assert busy.statistics().loop_polls_woken >= 1 and yields[0] - before > 0
    finally:
        busy.close()


@pytest.mark.trio
async def test_the_polled_loop_counts_the_tasks_of_its_batch(polled_loop):
    first, first_peer = socket.socketpair()
    second, second_peer = socket.socketpair()
    batches = []

    async def woken_by(sock: socket.socket) -> None:
        await trio.lowlevel.wait_readable(sock)
        batches.append(polled_loop._loop_waits.batch)

    with first, first_peer, second, second_peer:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(woken_by, first)
            nursery.start_soon(woken_by, second)
            await trio.testing.wait_all_tasks_blocked()
            first_peer.sendall(b"x")
            second_peer.sendall(b"x")   # both ready when the loop next looks: one batch
    assert batches == [2, 2]


@pytest.mark.trio
async def test_a_reader_woken_with_another_task_lets_it_run_before_it_polls(pair, plain_pair, polled_loop):
    # trio's run queue shows only the next batch: a reader polling in a step of this batch
    # held back, for the whole window, a task the same pass woke that had not run yet
    ours, theirs = pair
    other_socket, other_peer = plain_pair
    reader = polled_loop.reader(ours)
    order = []

    async def other() -> None:
        await trio.lowlevel.wait_readable(other_socket)
        other_socket.recv(16)
        order.append("other")

    async def read_then_poll() -> None:
        await trio.lowlevel.wait_readable(ours.socket)
        assert reader.read(1024) is None                  # not even the bytes waiting: through trio first
        assert await reader.receive(1024) == b"first"     # read after a checkpoint, by then alone
        threading.Timer(0.05, theirs.sendall, (b"late",)).start()
        assert await reader.receive(1024) == b"late"
        order.append("late")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(other)
        nursery.start_soon(read_then_poll)
        await trio.testing.wait_all_tasks_blocked()
        theirs.sendall(b"first")
        other_peer.sendall(b"x")     # both ready when the loop next looks: one batch
    assert order == ["other", "late"]


@pytest.mark.trio
async def test_a_polled_wait_ends_at_the_loops_next_deadline(plain_pair, polled_loop):
    ours, theirs = plain_pair
    await _some_io(ours, theirs)
    started = time.perf_counter()
    await trio.sleep(0.05)                    # a timer, no I/O: the poll gives way to it
    assert 0.04 <= time.perf_counter() - started < 2
    statistics = polled_loop.statistics()
    assert statistics.loop_polls >= 1 and statistics.loop_polls_woken == 0


@pytest.mark.trio
async def test_a_loop_without_io_sleeps_in_its_waits_at_once(polled_loop):
    await trio.sleep(LOOP_BUSY_S * 2)         # no I/O yet, and none since long enough
    before = polled_loop.statistics().loop_polls
    for _ in range(3):
        await trio.sleep(0.01)
    assert polled_loop.statistics().loop_polls == before


@pytest.mark.trio
async def test_loop_wait_polling_is_removed_by_close_and_installed_once():
    from trio._core._run import GLOBAL_RUN_CONTEXT
    manager = GLOBAL_RUN_CONTEXT.runner.io_manager
    original = type(manager)
    first = BusyPoll(LONG_US, poll_loop_waits=True)
    second = BusyPoll(LONG_US, poll_loop_waits=True)   # the loop's waits are polled already: not again
    try:
        assert type(manager) is not original and isinstance(manager, original)
        assert second._loop_waits is None
    finally:
        second.close()
        first.close()
        first.close()
    assert type(manager) is original
    await trio.sleep(0)   # the loop runs on as before


@pytest.mark.trio
async def test_busy_polling_off_leaves_the_loops_waits_alone():
    from trio._core._run import GLOBAL_RUN_CONTEXT
    manager = GLOBAL_RUN_CONTEXT.runner.io_manager
    original = type(manager)
    busy = BusyPoll(0, poll_loop_waits=True)
    assert type(manager) is original
    assert busy.statistics().loop_polls == 0
    busy.close()


@pytest.mark.trio
async def test_a_wake_up_from_another_thread_is_not_io_and_its_loop_sleeps_at_once(polled_loop):
    # a slave's follow thread wakes its loop now and then: that loop must not poll after it
    await trio.sleep(LOOP_BUSY_S * 2)
    before = polled_loop.statistics().loop_polls
    for _ in range(3):
        await trio.to_thread.run_sync(time.sleep, 0.001)   # its result comes back by run_sync_soon
        await trio.sleep(0.005)
    assert polled_loop.statistics().loop_polls == before


class _Acks:
    """A master's ack socket, with a task of the loop waiting on it (as the HA service's ack
    reader does, so the loop's epoll descriptor turns ready when an ack comes), and the
    ``ready_work`` that takes what waits there: each take records what it read, ends the
    wait for acks (``awaited``) and sends the client's next request on ``client``, as a
    client does once its reply left (``next_after_s`` later), with the count in ``yields``
    (a test's counted yields) then kept in ``yields_at_take``."""

    def __init__(self, client: socket.socket, *, next_after_s: float = 0.0, yields: list[int] | None = None) -> None:
        self.ours, self.peer = socket.socketpair()
        self.ours.setblocking(False)
        self.client = client
        self.events: list = []
        self.awaited = True
        self._next_after_s = next_after_s
        self._yields = yields
        self.yields_at_take: int | None = None

    def take(self) -> bool:
        try:
            self.events.append(self.ours.recv(16))
        except BlockingIOError:
            return False
        self.awaited = False
        if self._yields is not None:
            self.yields_at_take = self._yields[0]
        if self._next_after_s:
            threading.Timer(self._next_after_s, self.client.sendall, (b"next",)).start()
        else:
            self.client.sendall(b"next")
        return True


@asynccontextmanager
async def _acks_waited_on(client: socket.socket, **options):
    acks = _Acks(client, **options)
    with acks.ours, acks.peer:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.lowlevel.wait_readable, acks.ours)
            await trio.testing.wait_all_tasks_blocked()   # registered with the loop's epoll
            yield acks
            nursery.cancel_scope.cancel()


@pytest.mark.trio
async def test_io_that_ready_work_takes_keeps_the_poll_going_for_the_next_request(pair, monkeypatch):
    # a master's ack arriving while a connection's reader polls: read by ready_work (no pass
    # of trio's loop), and the poll goes on until this connection's next request (within
    # the reader's turn, here longer than the test)
    monkeypatch.setattr(busy_poll, "YIELD_INTERVAL_S", 10)
    ours, theirs = pair
    async with _acks_waited_on(theirs) as acks:
        busy = BusyPoll(LONG_US, ready_work=acks.take)
        threading.Timer(0.05, acks.peer.sendall, (b"ack",)).start()
        assert busy.reader(ours).read(1024) == b"next"
        assert acks.events == [b"ack"] and busy.statistics().ready_taken == 1


@pytest.mark.trio
async def test_io_that_ready_work_does_not_take_ends_the_poll(pair):
    ours, _ = pair
    other, other_peer = socket.socketpair()
    with other, other_peer:
        async def other_reader() -> None:
            await trio.lowlevel.wait_readable(other)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(other_reader)
            await trio.testing.wait_all_tasks_blocked()
            busy = BusyPoll(LONG_US, ready_work=lambda: False)
            threading.Timer(0.05, other_peer.sendall, (b"x",)).start()
            started = time.perf_counter()
            assert busy.reader(ours).read(1024) is None
            assert time.perf_counter() - started < 2 and busy.statistics().ready_taken == 0


@pytest.mark.trio
async def test_the_idle_work_waits_while_acks_are_awaited_and_runs_once_they_came(pair, monkeypatch):
    monkeypatch.setattr(busy_poll, "YIELD_INTERVAL_S", 10)
    ours, theirs = pair
    async with _acks_waited_on(theirs) as acks:
        def idle_work() -> bool:
            acks.events.append("idle work")
            return False

        busy = BusyPoll(LONG_US, idle_work, ready_work=acks.take, awaiting=lambda: acks.awaited)
        threading.Timer(0.05, acks.peer.sendall, (b"ack",)).start()
        assert busy.reader(ours).read(1024) == b"next"
        assert acks.events == [b"ack", "idle work"]   # not before the ack


@pytest.mark.trio
async def test_io_ready_when_the_read_starts_is_taken_by_ready_work_too(pair, monkeypatch):
    # an ack that came while the put's frames were being sent: taken at the read's start
    monkeypatch.setattr(busy_poll, "YIELD_INTERVAL_S", 10)
    ours, theirs = pair
    async with _acks_waited_on(theirs) as acks:
        acks.peer.sendall(b"ack")   # before the read
        busy = BusyPoll(LONG_US, ready_work=acks.take)
        assert busy.reader(ours).read(1024) == b"next"
        assert acks.events == [b"ack"] and busy.statistics().ready_taken == 1


def _counted_yields(monkeypatch) -> list[int]:
    yields = [0]

    def sched_yield() -> None:
        yields[0] += 1

    monkeypatch.setattr(busy_poll.os, "sched_yield", sched_yield)
    return yields


@pytest.mark.trio
async def test_a_poll_that_waits_long_for_acks_yields_its_cpu(pair, monkeypatch):
    # acks not there after AWAIT_YIELD_AFTER_S: each turn gives the vCPU to anything queued on it
    monkeypatch.setattr(busy_poll, "YIELD_INTERVAL_S", 10)
    monkeypatch.setattr(busy_poll, "AWAIT_YIELD_AFTER_S", 0.01)
    yields = _counted_yields(monkeypatch)
    ours, theirs = pair
    async with _acks_waited_on(theirs) as acks:
        busy = BusyPoll(LONG_US, ready_work=acks.take, awaiting=lambda: acks.awaited)
        threading.Timer(0.05, acks.peer.sendall, (b"ack",)).start()
        assert busy.reader(ours).read(1024) == b"next"
        assert acks.events == [b"ack"] and yields[0] > 0


@pytest.mark.trio
async def test_a_poll_keeps_its_cpu_while_a_put_has_waited_briefly_for_its_acks(pair, monkeypatch):
    monkeypatch.setattr(busy_poll, "YIELD_INTERVAL_S", 10)
    yields = _counted_yields(monkeypatch)
    ours, theirs = pair
    async with _acks_waited_on(theirs, yields=yields) as acks:
        monkeypatch.setattr(busy_poll, "AWAIT_YIELD_AFTER_S", 10)   # acks awaited, not for long
        busy = BusyPoll(LONG_US, ready_work=acks.take, awaiting=lambda: acks.awaited)
        threading.Timer(0.05, acks.peer.sendall, (b"ack",)).start()
        assert busy.reader(ours).read(1024) == b"next"
        assert acks.yields_at_take == 0


@pytest.mark.trio
@pytest.mark.parametrize("awaiting", [None, lambda: False], ids=["no-replication", "no-put-waits"])
async def test_a_poll_for_the_next_request_yields_each_turn(pair, monkeypatch, awaiting):
    # the client the last reply woke may be queued on this vCPU: it runs, then sends
    monkeypatch.setattr(busy_poll, "YIELD_INTERVAL_S", 10)
    monkeypatch.setattr(busy_poll, "AWAIT_YIELD_AFTER_S", 10)
    yields = _counted_yields(monkeypatch)
    ours, theirs = pair
    busy = BusyPoll(LONG_US, awaiting=awaiting)
    threading.Timer(0.05, theirs.sendall, (b"request",)).start()
    assert busy.reader(ours).read(1024) == b"request"
    assert yields[0] > 0


@pytest.mark.trio
async def test_a_poll_that_answered_its_puts_yields_each_turn_until_the_next_request(pair, monkeypatch):
    # the reply woke the client, perhaps onto this vCPU: its next request cannot come
    # before it runs
    monkeypatch.setattr(busy_poll, "YIELD_INTERVAL_S", 10)
    monkeypatch.setattr(busy_poll, "AWAIT_YIELD_AFTER_S", 10)   # no yield while the acks are awaited
    yields = _counted_yields(monkeypatch)
    ours, theirs = pair
    async with _acks_waited_on(theirs, next_after_s=0.05, yields=yields) as acks:
        busy = BusyPoll(LONG_US, ready_work=acks.take, awaiting=lambda: acks.awaited)
        threading.Timer(0.05, acks.peer.sendall, (b"ack",)).start()
        assert busy.reader(ours).read(1024) == b"next"
        assert acks.events == [b"ack"] and acks.yields_at_take == 0 and yields[0] > 0
