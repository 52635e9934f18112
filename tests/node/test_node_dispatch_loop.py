"""Dispatch in the node's trio loop (node/server/dispatch_loop.py, StoreConfig ``dispatcher_thread``):
no dispatcher thread, writes from any thread wake the loop, stop/start gate the passes,
long polls and %SYS%CONFIG replay still work, a slave dispatches replicated bytes, and a
backlog is dispatched in bounded passes that let other requests through."""

from __future__ import annotations

import threading
from functools import partial

import pytest
import trio
import trio.testing

from node.client import OutgoingMessage, open_admin, open_connection, open_producer
from node.server.dispatch_loop import serve_dispatch
from node.server.node import serve_node
from node.wire.protocol import RequestCode
from node.server.role import Role
from store import Message, MessageStore, StoreConfig

from node_helpers import SMALL_STORE, small_config, wait_until


def loop_store(path) -> MessageStore:
    return MessageStore(StoreConfig(store_path=str(path), dispatcher_thread=False, **SMALL_STORE))


def dispatcher_threads() -> list[str]:
    return [thread.name for thread in threading.enumerate() if thread.name == "dispatcher"]


# --- the store's side: no thread, a wake callback, a gate --------------------------------
def test_without_its_thread_the_dispatcher_waits_for_its_owner(tmp_path):
    store = loop_store(tmp_path / "s")
    store.start()
    try:
        assert dispatcher_threads() == []
        wakes = []
        store.dispatcher.wake.listen(lambda: wakes.append(threading.get_ident()))
        store.dispatcher.dispatch_pass()  # clears what start() set
        store.append([Message("t", b"one", queue_id=0)])
        assert wakes == [threading.get_ident()] and store.dispatcher.wake.is_set()
        assert store.max_offset("t", 0) == 0  # nothing runs a pass but the owner
        store.append([Message("t", b"two", queue_id=0)])
        assert len(wakes) == 1  # the flag is still set: a writer calls nothing more
        assert store.dispatcher.dispatch_pass() == 2
        assert store.max_offset("t", 0) == 2 and not store.dispatcher.wake.is_set()
        # stopped (a cut in progress): no pass runs; start() wakes the owner again
        store.dispatcher.stop()
        store.append([Message("t", b"three", queue_id=0)])
        assert store.dispatcher.dispatch_pass() is None and store.max_offset("t", 0) == 2
        store.dispatcher.start()
        assert len(wakes) == 3 and store.dispatcher.dispatch_pass() == 1
        # a waiter with no loop to wait for dispatches by itself
        store.append([Message("t", b"four", queue_id=0)])
        assert store.wait_dispatched(timeout_s=5) and store.max_offset("t", 0) == 4
    finally:
        store.shutdown()


def test_a_store_without_its_dispatcher_thread_still_recovers_and_shuts_down_whole(tmp_path):
    store = loop_store(tmp_path / "s")
    store.start()
    store.append([Message("t", b"x" * 100, queue_id=0) for _ in range(50)])
    store.shutdown()  # nothing dispatched these: shutdown does
    store = loop_store(tmp_path / "s")
    store.start()
    try:
        assert store.max_offset("t", 0) == 50
        assert [m.body for m in store.get("t", 0, 49, 2)] == [b"x" * 100]
    finally:
        store.shutdown()


@pytest.mark.trio
async def test_serve_dispatch_answers_writes_from_the_loop_and_from_worker_threads(tmp_path):
    store = loop_store(tmp_path / "s")
    store.start()
    grown_on = []
    store.add_dispatch_listener(lambda offset, grown: grown_on.append(threading.get_ident()))
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_dispatch, store.dispatcher)
            store.append([Message("t", b"loop", queue_id=0)])
            await wait_until(lambda: store.max_offset("t", 0) == 1, "dispatch of a write on the trio thread")
            await trio.to_thread.run_sync(store.append, [Message("t", b"worker", queue_id=0)])
            await wait_until(lambda: store.max_offset("t", 0) == 2, "dispatch of a write on a worker thread")
            assert set(grown_on) == {threading.get_ident()}  # every pass ran in the loop
            assert dispatcher_threads() == []
            nursery.cancel_scope.cancel()
        assert not store.dispatcher.wake.listening
    finally:
        store.shutdown()


def test_a_wake_is_followed_by_a_pass_as_soon_as_the_loop_is_idle(tmp_path):
    # the clock never moves by itself: a pass that waited for dispatch_interval_ms would
    # never come
    store = MessageStore(StoreConfig(store_path=str(tmp_path / "s"), dispatcher_thread=False,
                                     dispatch_interval_ms=1000, **SMALL_STORE))
    store.start()

    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_dispatch, store.dispatcher)
            store.append([Message("t", b"x", queue_id=0)])
            started = trio.current_time()
            # a cushion: the idle waiter with the least cushion (the dispatch task) goes first
            await trio.testing.wait_all_tasks_blocked(cushion=0.01)
            assert store.max_offset("t", 0) == 1 and trio.current_time() == started
            nursery.cancel_scope.cancel()
    try:
        trio.run(main, clock=trio.testing.MockClock())
    finally:
        store.shutdown()


@pytest.mark.trio
async def test_a_busy_loop_gets_its_pass_after_the_interval(tmp_path):
    store = MessageStore(StoreConfig(store_path=str(tmp_path / "s"), dispatcher_thread=False,
                                     dispatch_interval_ms=50, **SMALL_STORE))
    store.start()
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_dispatch, store.dispatcher)
            store.append([Message("t", b"x", queue_id=0)])
            started = trio.current_time()
            while store.max_offset("t", 0) == 0:  # never idle: always a task to run
                assert trio.current_time() - started < 10, "no pass while the loop stayed busy"
                await trio.lowlevel.checkpoint()
            assert trio.current_time() - started >= 0.05
            nursery.cancel_scope.cancel()
    finally:
        store.shutdown()


class _TaskSteps(trio.abc.Instrument):
    """Counts the steps of the tasks named ``name``."""

    def __init__(self, name: str) -> None:
        self.name, self.steps = name, 0

    def before_task_step(self, task) -> None:
        if task.name.endswith(self.name):
            self.steps += 1


@pytest.mark.trio
async def test_a_wake_whose_bytes_were_dispatched_elsewhere_costs_the_task_one_step(tmp_path):
    # a busy-polling reader's idle pass dispatched what woke the task: the task's own pass
    # then runs at once (it only clears the flag), with no second step after an idle loop,
    # and the next write wakes it again
    store = MessageStore(StoreConfig(store_path=str(tmp_path / "s"), dispatcher_thread=False,
                                     dispatch_interval_ms=50, **SMALL_STORE))
    store.start()
    steps = _TaskSteps("serve_dispatch")
    trio.lowlevel.add_instrument(steps)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_dispatch, store.dispatcher)
            await trio.testing.wait_all_tasks_blocked()
            before = steps.steps
            store.append([Message("t", b"x", queue_id=0)])        # sets the flag, wakes the task
            assert store.dispatcher.dispatch_pass() == 1          # as busy_poll's idle_pass does
            # a cushion: the idle waiter with the least cushion (the dispatch task) goes first
            await trio.testing.wait_all_tasks_blocked(cushion=0.01)
            assert steps.steps - before == 1 and not store.dispatcher.wake.is_set()
            store.append([Message("t", b"y", queue_id=0)])
            await trio.testing.wait_all_tasks_blocked(cushion=0.01)
            assert store.max_offset("t", 0) == 2                 # woken again: not stalled
            nursery.cancel_scope.cancel()
    finally:
        trio.lowlevel.remove_instrument(steps)
        store.shutdown()


@pytest.mark.trio
async def test_a_backlog_is_dispatched_in_bounded_passes_between_other_work(tmp_path):
    store = loop_store(tmp_path / "s")
    store.start()
    pass_bytes_max = 256 * 1024   # smaller than the default, to keep the backlog small
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(partial(serve_dispatch, store.dispatcher, pass_bytes_max=pass_bytes_max))
            store.dispatcher.stop()
            for _ in range(8):
                store.append([Message("t", b"b" * 1024, queue_id=0) for _ in range(512)])
            assert store.dispatcher.lag_bytes > 16 * pass_bytes_max
            store.dispatcher.start()
            ticks = []

            async def ticker():
                while store.dispatcher.lag_bytes:
                    ticks.append(store.dispatcher.lag_bytes)
                    await trio.sleep(0)
            await ticker()
            # the ticker ran between passes, each pass took pass_bytes_max and the rest of
            # the record it ends in (trio runs a batch's tasks in random order: two passes
            # may fall between two ticks)
            record_bytes_max = 2048
            assert len(ticks) >= 16
            assert all(0 <= before - after <= 2 * (pass_bytes_max + record_bytes_max)
                       for before, after in zip(ticks, ticks[1:]))
            assert store.max_offset("t", 0) == 8 * 512
            nursery.cancel_scope.cancel()
    finally:
        store.shutdown()


# --- the node: long polls, replay, a slave, requests during a backlog --------------------
@pytest.mark.trio
async def test_a_node_dispatches_in_its_loop_and_a_send_wakes_a_long_poll(node):
    assert not node.store.dispatcher.threaded and dispatcher_threads() == []
    async with open_admin(node.client_address) as admin:
        await admin.create_topic("live", queue_count=1)
    async with open_connection(node.client_address) as reader, open_connection(node.client_address) as writer:
        replies = []
        async with trio.open_nursery() as nursery:
            async def park():
                replies.append(await reader.request(RequestCode.PULL, topic="live", queue_id=0, offset=0,
                                                    timeout_ms=20_000))
            nursery.start_soon(park)
            await wait_until(lambda: node.handlers.waiters.waiting == 1, "the pull to park")
            started = trio.current_time()
            await writer.request(RequestCode.SEND, topic="live", messages=[OutgoingMessage(b"wake up").to_wire()])
            await wait_until(lambda: replies, "the long poll to wake")
            assert trio.current_time() - started < 1
        assert [m["body"] for m in replies[0]["messages"]] == [b"wake up"]


@pytest.mark.trio
async def test_requests_are_answered_while_a_backlog_is_dispatched(node):
    store = node.store
    async with open_connection(node.client_address) as connection:
        await connection.request(RequestCode.TOPIC_CREATE, topic="backlog", queue_count=1)
        store.dispatcher.stop()
        for _ in range(16):
            store.append([Message("backlog", b"b" * 1024, queue_id=0) for _ in range(512)])
        end = store.max_physical_offset
        store.dispatcher.start()
        reply = await connection.request(RequestCode.STATUS)
        assert reply["store"]["dispatched_offset"] < end  # answered between passes, not after them all
        await wait_until(lambda: store.dispatcher.dispatched_offset == end, "the backlog to be dispatched")
        offsets = await connection.request(RequestCode.QUEUE_OFFSETS, topic="backlog", queue_id=0)
        assert offsets["max_offset"] == 16 * 512


@pytest.mark.trio
async def test_restart_replays_sys_config_and_serves_what_was_written(tmp_path):
    config = small_config(tmp_path / "store")
    async with trio.open_nursery() as nursery:
        first = await nursery.start(serve_node, config)
        async with open_admin(first.client_address) as admin:
            await admin.create_topic("kept", queue_count=3)
            await admin.commit_offsets("g", "kept", {0: 7, 2: 9})
        async with open_producer(first.client_address) as producer:
            await producer.send_batch("kept", [OutgoingMessage(b"m%d" % i, queue_id=1) for i in range(20)])
        nursery.cancel_scope.cancel()
    # the config files were checkpointed at shutdown: drop the replay offset so every
    # %SYS%CONFIG record is replayed through the loop-dispatched ConsumeQueue
    (tmp_path / "store" / "config" / "sysConfigReplay.json").unlink()
    async with trio.open_nursery() as nursery:
        second = await nursery.start(serve_node, config)
        assert second.sys_config.replayed_records >= 2
        assert second.sys_config.topic("kept")["writeQueueNums"] == 3
        assert second.sys_config.offsets("g", "kept") == {0: 7, 2: 9}
        assert second.store.max_offset("kept", 1) == 20
        nursery.cancel_scope.cancel()


@pytest.mark.trio
async def test_a_slave_dispatches_replicated_bytes_in_its_loop_and_serves_them(tmp_path):
    common = dict(group="g", replication="async", ha_heartbeat_interval_ms=100, ha_connection_timeout_ms=2_000)
    async with trio.open_nursery() as nursery:
        master = await nursery.start(serve_node, small_config(tmp_path / "a", node_id="a", **common))
        slave = await nursery.start(serve_node, small_config(
            tmp_path / "b", node_id="b", role="slave", master_ha_address=master.ha_address,
            master_client_address=master.client_address, **common))
        assert not slave.store.dispatcher.threaded
        async with open_admin(master.client_address) as admin:
            await admin.create_topic("copied", queue_count=1)
        async with open_producer(master.client_address, batch_count_max=64) as producer:
            await producer.send_batch("copied", [OutgoingMessage(b"r%d" % i, keys=[f"k{i}"]) for i in range(300)])
        await wait_until(lambda: slave.store.max_offset("copied", 0) == 300, "the slave to dispatch the copy")
        async with open_connection(slave.client_address) as connection:
            reply = await connection.request(RequestCode.PULL, topic="copied", queue_id=0, offset=290, max_count=32)
            assert [m["body"] for m in reply["messages"]] == [b"r%d" % i for i in range(290, 300)]
            found = await connection.request(RequestCode.QUERY_BY_KEY, topic="copied", key="k150")
            assert [m["body"] for m in found["messages"]] == [b"r150"]
        # promoted, the slave replays the %SYS%CONFIG records it received (the topic) itself
        await master.change_role(Role.SLAVE, 2, slave.client_address, master_ha_address=slave.ha_address)
        await slave.change_role(Role.MASTER, 2)
        assert slave.sys_config.topic("copied")["writeQueueNums"] == 1
        nursery.cancel_scope.cancel()
