"""A slave dispatches once for the frames of ``dispatch_delay_ms``, not once per frame (its
follow thread runs the pass itself, the loop's path wakes the store's dispatch), and never
leaves appended bytes unindexed when its session ends."""

from __future__ import annotations

import pytest
import trio

from node.server.dispatch_loop import serve_dispatch
from replication_helpers import begin_term, epoch_file, put, start_master, start_slave, wait_until

pytestmark = pytest.mark.trio

DELAY_S = 1.0


class CountedWakes:
    """The slave's real replica log, counting the dispatch wakes and passes its HA client
    asks for."""

    def __init__(self, replica_log) -> None:
        self._inner = replica_log
        self.wakes = 0
        self.passes = 0
        self.appends = 0

    @property
    def turns(self) -> int:
        """Dispatch wakes and passes asked for."""
        return self.wakes + self.passes

    def __getattr__(self, name: str):
        return getattr(self._inner, name)

    def append(self, offset: int, data, *, wake_dispatch: bool = True, read_ahead: bool = True) -> int:
        self.appends += 1
        return self._inner.append(offset, data, wake_dispatch=wake_dispatch, read_ahead=read_ahead)

    def wake_dispatch(self) -> None:
        self.wakes += 1
        self._inner.wake_dispatch()

    def dispatch_now(self, bytes_max: int) -> int | None:
        self.passes += 1
        return self._inner.dispatch_now(bytes_max)


def queue_count(store, topic: str = "orders", queues: int = 4) -> int:
    return sum(store.max_offset(topic, queue_id) for queue_id in range(queues))


async def master_and_slave(open_store, nursery, dispatch_delay_ms: float):
    """A master in its first term and a slave following it, whose store dispatches only when
    woken, as in a node (dispatch_loop.py), through a CountedWakes of its replica log:
    (master, slave, counted, the master's HAService, the running slave)."""
    master = open_store("master")
    master_epochs = epoch_file(master)
    begin_term(master, master_epochs)
    slave = open_store("slave", dispatcher_thread=False)
    await nursery.start(serve_dispatch, slave.dispatcher)
    counted = CountedWakes(slave.replica_log)
    service, address = await start_master(nursery, master, master_epochs)
    running = await start_slave(nursery, slave, address, replica_store=counted, dispatch_delay_ms=dispatch_delay_ms)
    return master, slave, counted, service, running


async def test_frames_of_the_delay_share_one_dispatch_wake(open_store):
    async with trio.open_nursery() as nursery:
        master, slave, counted, service, running = await master_and_slave(open_store, nursery, DELAY_S * 1000)
        await wait_until(lambda: running.client.statistics().connected, what="session")
        started = trio.current_time()
        for batch in range(10):  # ten frames, normally well within one delay
            put(master, 5, prefix=f"b{batch}")
            service.notify_appended()
            await wait_until(lambda: slave.max_physical_offset == master.max_physical_offset, what="frame")
        # a pass per delay the frames took (one, unless the machine is very slow), not per frame
        allowed = 1 + int((trio.current_time() - started) / DELAY_S)
        assert counted.appends >= 10 and allowed < counted.appends
        if counted.turns == 0:  # within the delay: nothing indexed yet
            assert queue_count(slave) == 0
        assert counted.turns <= allowed
        await wait_until(lambda: queue_count(slave) == 50, what="the slave's queues")
        assert 1 <= counted.turns <= allowed
        # over TCP a follow thread ran the passes itself, with no wake of the loop's dispatch
        assert running.client.passes_by_thread == counted.passes == counted.turns
        await running.stop()
        nursery.cancel_scope.cancel()


async def test_bytes_appended_before_the_session_ends_are_indexed(open_store):
    async with trio.open_nursery() as nursery:
        master, slave, counted, service, running = await master_and_slave(open_store, nursery, 60_000)
        put(master, 20)
        service.notify_appended()
        await wait_until(lambda: slave.max_physical_offset == master.max_physical_offset, what="frames")
        assert counted.turns == 0 and queue_count(slave) == 0
        await running.stop()  # long before the delay: the session's end wakes the dispatch
        assert counted.turns == 1 and counted.wakes == 1
        await wait_until(lambda: queue_count(slave) == 20, what="the slave's queues")
        nursery.cancel_scope.cancel()
