"""The master's ack reader and the slave's reads, deterministically: trio's autojump clock,
a real store and a real socket pair in one trio run (no process, no network wait)."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from replication import HAService, HaServiceSettings, SyncSettings, protocol
from replication.transport import StreamReader

pytestmark = pytest.mark.trio

from replication_helpers import begin_term, epoch_file, put

ACK_TIMEOUT_MS = 1_000


def _service(store) -> HAService:
    epochs = epoch_file(store)
    begin_term(store, epochs)
    settings = HaServiceSettings(node_id="m", group="g", cluster="c", ack_timeout_ms=ACK_TIMEOUT_MS,
                                 sync=SyncSettings(min_in_sync_replicas=2, max_time_not_catchup_ms=60_000))
    return HAService(store.replica_log, settings, epochs.last_epoch, epochs.entries)


async def _acks_until_dropped(service: HAService, acks: list[tuple[float, int]]) -> float:
    """Run the ack reader of slave s1 over a socket pair while the 'slave' end sends each
    (time from now, offset) of ``acks``; the time it was dropped at."""
    left, right = trio.socket.socketpair()
    master_end, slave_end = trio.SocketStream(left), trio.SocketStream(right)
    service.tracker.connected("s1", "pair", 0, 0)
    replica = service.tracker.replicas["s1"]
    replica.sent_offset = max((offset for _, offset in acks), default=0)
    started = trio.current_time()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            async def slave() -> None:
                for at, offset in acks:
                    await trio.sleep_until(started + at)
                    await slave_end.send_all(protocol.ack(offset))

            nursery.start_soon(slave)
            session = trio.CancelScope()
            with session:
                await service._read_acks(StreamReader(master_end), replica, session)
                await trio.sleep_forever()   # the reader cancels the session when it drops the slave
            dropped = trio.current_time() - started
            nursery.cancel_scope.cancel()
    assert replica.ack_offset == replica.sent_offset
    return dropped


async def test_a_slave_acking_within_the_timeout_is_kept_across_many_timeouts(open_store, autojump_clock):
    store = open_store("m")
    (result,) = put(store, 1)
    service = _service(store)
    # an ack every 0.6 timeouts for 5 timeouts: kept all along, dropped one timeout after the last
    times = [0.6 * i for i in range(1, 9)]
    dropped = await _acks_until_dropped(service, [(at, result.end_offset) for at in times])
    assert times[-1] + ACK_TIMEOUT_MS / 1000 <= dropped < times[-1] + ACK_TIMEOUT_MS / 1000 + 0.01


async def test_a_silent_slave_is_dropped_after_the_ack_timeout(open_store, autojump_clock):
    store = open_store("m")
    service = _service(store)
    dropped = await _acks_until_dropped(service, [])
    assert ACK_TIMEOUT_MS / 1000 <= dropped < ACK_TIMEOUT_MS / 1000 + 0.01


async def test_the_ack_that_reaches_a_puts_end_releases_it_at_once(open_store, autojump_clock):
    store = open_store("m")
    service = _service(store)
    service.tracker.apply_sync_state_set(frozenset({"m", "s1"}))
    (result,) = put(store, 1)
    released_at = []

    async with trio.open_nursery() as nursery:
        started = trio.current_time()

        async def put_waits() -> None:
            await service.wait_for_replicas(result.end_offset)
            released_at.append(trio.current_time() - started)

        nursery.start_soon(put_waits)
        dropped = await _acks_until_dropped(service, [(0.25, result.end_offset - 1), (0.5, result.end_offset)])
    assert released_at == [pytest.approx(0.5, abs=1e-6)]   # not at the ack short of its end
    assert dropped == pytest.approx(0.5 + ACK_TIMEOUT_MS / 1000, abs=0.01)


async def test_a_drained_reader_waits_for_the_socket_then_reads(autojump_clock):
    left, right = trio.socket.socketpair()
    reader_end, writer_end = trio.SocketStream(left), trio.SocketStream(right)
    reader = StreamReader(reader_end)
    await writer_end.send_all(protocol.ack(7))
    assert protocol.parse_ack(await reader.exactly(protocol.ACK.size)) == 7
    assert reader._drained, "a read that took less than it asked for leaves the reader drained"
    got = []

    async def read_next() -> None:
        got.append(protocol.parse_ack(await reader.exactly(protocol.ACK.size)))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read_next)
        await trio.testing.wait_all_tasks_blocked()
        assert got == []
        await trio.sleep(5)
        await writer_end.send_all(protocol.ack(9) + protocol.ack(11)[:3])
    assert got == [9]
    await writer_end.send_all(protocol.ack(11)[3:])
    assert protocol.parse_ack(await reader.exactly(protocol.ACK.size)) == 11


async def test_a_slave_acked_up_to_a_segments_end_is_not_decades_behind(open_store):
    # its ack sits at the segment's closing blank record, which has no store time: the
    # message it lacks is the next segment's first, and its age is what counts
    store = open_store("m")
    service = _service(store)
    results = []
    for _ in range(100):
        results += put(store, 64, body_bytes=900)
        if len(store.commit_log.segments.files) >= 2:
            break
    second_start = store.commit_log.segments.files[1].start_offset
    acked = max(r.end_offset for r in results if r.end_offset <= second_start)
    assert acked < second_start, "no blank record closes the first segment"
    age_ms = service._oldest_unacked_age_ms(acked)
    assert 0 <= age_ms < 60_000
    service.tracker.apply_sync_state_set(frozenset({"m", "s1"}))
    service.tracker.connected("s1", "pair", acked, 0)
    wanted = service.tracker.wanted_sync_state_set(store.max_physical_offset, 0, service._oldest_unacked_age_ms)
    assert wanted == {"m", "s1"}
