"""LogSenders, deterministically: a real store, a real socket pair and trio's autojump clock
in one trio run; the test reads what a slave would receive."""

from __future__ import annotations

import socket

import pytest
import trio
import trio.testing

from replication import protocol
from replication.epochs import EpochEntry
from replication.log_sender import DIRECT_SEND_BYTES_MAX, IDLE_POLL_MS, INLINE_READ_BYTES_MAX, LogSenders
from replication.sync_state import ReplicaProgress
from replication.transport import StreamReader

pytestmark = pytest.mark.trio

from replication_helpers import begin_term, epoch_file, put

HEARTBEAT_MS = 1_000


class _Slave:
    """The receiving end: every frame with the (virtual) time it arrived."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.reader = StreamReader(stream)
        self.frames: list[tuple[float, str, int, int]] = []   # (time, kind, offset, size)

    async def run(self) -> None:
        while True:
            header = protocol.parse_data_header(await self.reader.exactly(protocol.DATA_HEADER.size))
            if header.size:
                protocol.check_data(header, bytes(await self.reader.exactly(header.size)))
            kind = "confirm" if header.is_confirm else "heartbeat" if header.is_heartbeat else "data"
            self.frames.append((trio.current_time(), kind, header.offset, header.size))

    def kinds(self) -> list[str]:
        return [kind for _, kind, _, _ in self.frames]


async def _senders(store, nursery, *, sndbuf: int | None = None):
    epochs = epoch_file(store)
    begin_term(store, epochs)
    senders = LogSenders(store.replica_log, epochs.entries, chunk_bytes_max=4 << 20,
                         heartbeat_interval_ms=HEARTBEAT_MS)
    left, right = trio.socket.socketpair()
    if sndbuf is not None:
        left.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    master_end, slave_end = trio.SocketStream(left), trio.SocketStream(right)
    replica = ReplicaProgress("s1", "pair", store.max_physical_offset)
    replica.sent_offset = store.max_physical_offset
    nursery.start_soon(senders.stream, master_end, replica, store.max_physical_offset)
    await trio.testing.wait_all_tasks_blocked()
    return senders, replica, _Slave(slave_end)


async def test_flowing_frames_carry_the_confirm_offset_and_a_confirm_frame_follows_the_last(
        open_store, autojump_clock):
    store = open_store("m")
    async with trio.open_nursery() as nursery:
        senders, replica, slave = await _senders(store, nursery)
        nursery.start_soon(slave.run)
        ends = [store.replica_log.confirm_offset]   # the slave has not been told any yet
        for _ in range(20):   # a put every 2 ms, each acked (the confirm offset moves) at once
            (result,) = put(store, 1)
            senders.notify_appended()
            store.replica_log.publish_confirm_offset(result.end_offset)
            ends.append(result.end_offset)
            await trio.sleep(0.002)
        last_put = trio.current_time() - 0.002
        await trio.sleep(0.1)
        nursery.cancel_scope.cancel()
    assert senders.direct_sends == 20 and senders.task_wakes == 0
    frames = slave.frames
    # each data frame is led by the confirm offset of the put before it, in the same write
    assert slave.kinds() == ["confirm", "data"] * 20 + ["confirm"]
    assert [offset for _, kind, offset, _ in frames if kind == "confirm"] == ends
    # the last put's confirm offset: a frame of its own, IDLE_POLL_MS after its data frame
    assert frames[-1][0] - last_put == pytest.approx(IDLE_POLL_MS / 1000, abs=1e-6)
    assert replica.sent_offset == store.max_physical_offset


async def test_a_frame_the_socket_takes_in_part_is_finished_by_the_sender_task(open_store, autojump_clock):
    store = open_store("m")
    async with trio.open_nursery() as nursery:
        senders, replica, slave = await _senders(store, nursery, sndbuf=4096)
        results = put(store, 40, body_bytes=1000)   # about 48 KiB: one direct frame, over the socket's buffer
        assert store.max_physical_offset - replica.sent_offset <= DIRECT_SEND_BYTES_MAX
        senders.notify_appended()
        assert senders.direct_sends == 1 and senders.task_wakes == 1, "the task was not handed the rest"
        (more,) = put(store, 1)   # while the task finishes the frame: it is not the put's to write
        senders.notify_appended()
        assert senders.direct_sends == 1
        nursery.start_soon(slave.run)
        with trio.fail_after(1):
            while not slave.frames or slave.frames[-1][2] + slave.frames[-1][3] < more.end_offset:
                await trio.sleep(0.001)
        nursery.cancel_scope.cancel()
    data = [(offset, size) for _, kind, offset, size in slave.frames if kind == "data"]
    assert data[0][0] == results[0].physical_offset and data[-1][0] + data[-1][1] == more.end_offset
    assert all(a + n == b for (a, n), (b, _) in zip(data, data[1:])), "frames out of order or overlapping"


async def test_a_slave_far_behind_is_left_to_the_task(open_store, autojump_clock):
    store = open_store("m")
    async with trio.open_nursery() as nursery:
        senders, replica, slave = await _senders(store, nursery)
        nursery.start_soon(slave.run)
        results = put(store, 200, body_bytes=1000)   # over DIRECT_SEND_BYTES_MAX
        senders.notify_appended()
        assert senders.direct_sends == 0 and senders.task_wakes == 1
        assert replica.sent_offset < results[-1].end_offset   # nothing written from the put's call
        with trio.fail_after(1):
            while replica.sent_offset < results[-1].end_offset or senders.parked == 0:
                await trio.sleep(0.001)
        await trio.sleep(0.001)
        nursery.cancel_scope.cancel()
    assert sum(size for _, kind, _, size in slave.frames if kind == "data") == \
        results[-1].end_offset - results[0].physical_offset


async def test_a_backlog_is_read_inline_within_the_bound_and_in_a_worker_thread_beyond(open_store):
    # the real clock: reads in worker threads take real time
    store = open_store("m", commitlog_segment_bytes=64 << 20)
    async with trio.open_nursery() as nursery:
        senders, replica, slave = await _senders(store, nursery)
        nursery.start_soon(slave.run)

        async def sent_up_to(end: int) -> None:
            with trio.fail_after(30):
                while replica.sent_offset < end or senders.parked == 0:
                    await trio.sleep(0.001)
        near = put(store, INLINE_READ_BYTES_MAX // 2 // 1000, body_bytes=1000)   # ~1 MiB behind
        senders.notify_appended()
        await sent_up_to(near[-1].end_offset)
        assert senders.frames_built == 1           # one frame, read on the loop's thread
        # ~5 MiB behind: a first frame of the 4 MiB chunk, then what is left (~1 MiB)
        far = put(store, (5 << 20) // 1000, body_bytes=1000)
        assert 4 << 20 < far[-1].end_offset - far[0].physical_offset < (4 << 20) + INLINE_READ_BYTES_MAX
        senders.notify_appended()
        await sent_up_to(far[-1].end_offset)
        await trio.sleep(0.05)                      # the slave reads the last frame
        nursery.cancel_scope.cancel()
    far_frames = [frame for frame in slave.frames if frame[1] == "data" and frame[2] >= far[0].physical_offset]
    assert sum(size for _, _, _, size in far_frames) == far[-1].end_offset - far[0].physical_offset
    # the chunk read in a worker thread (more than the bound behind), the rest inline
    assert len(far_frames) == 2 and senders.frames_built == 2


# --- two slaves: a frame built once, the same bytes to both ----------------------------------
async def _connect(senders, store, nursery, name: str, *, sndbuf: int | None = None):
    """A slave connection to ``senders`` from the log's end: its ReplicaProgress and the
    slave's socket end."""
    left, right = trio.socket.socketpair()
    if sndbuf is not None:
        left.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    replica = ReplicaProgress(name, "pair", store.max_physical_offset)
    replica.sent_offset = store.max_physical_offset
    nursery.start_soon(senders.stream, trio.SocketStream(left), replica, store.max_physical_offset)
    return replica, trio.SocketStream(right)


async def _two_slaves(store, nursery, entries=None, *, sndbuf: int | None = None):
    if entries is None:
        epochs = epoch_file(store)
        begin_term(store, epochs)
        entries = epochs.entries
    senders = LogSenders(store.replica_log, entries, chunk_bytes_max=4 << 20, heartbeat_interval_ms=HEARTBEAT_MS)
    first = await _connect(senders, store, nursery, "s1", sndbuf=sndbuf)
    second = await _connect(senders, store, nursery, "s2")
    await trio.testing.wait_all_tasks_blocked()
    assert senders.parked == 2
    return senders, first, second


async def _received(stream: trio.SocketStream, size: int) -> bytes:
    """Every byte the slave's end holds, once at least ``size`` have come."""
    got = bytearray()
    with trio.fail_after(1):
        while len(got) < size:
            got += await stream.receive_some(1 << 20)
    return bytes(got)


def _data_frames(wire: bytes) -> list[tuple[int, bytes]]:
    """The (offset, bytes) of each data frame on ``wire``, their CRCs checked; CONFIRMs skipped."""
    frames, position = [], 0
    while position < len(wire):
        header = protocol.parse_data_header(wire[position:position + protocol.DATA_HEADER.size])
        position += protocol.DATA_HEADER.size
        data = wire[position:position + header.size]
        position += header.size
        if header.size:
            protocol.check_data(header, data)
            frames.append((header.offset, data))
    return frames


async def test_two_caught_up_slaves_get_the_same_bytes_from_one_frame_built_per_put(open_store, autojump_clock):
    store = open_store("m")
    async with trio.open_nursery() as nursery:
        senders, (first, end1), (second, end2) = await _two_slaves(store, nursery)
        start = store.max_physical_offset
        for _ in range(10):
            (result,) = put(store, 1)
            senders.notify_appended()
            store.replica_log.publish_confirm_offset(result.end_offset)
        assert senders.direct_sends == 20 and senders.task_wakes == 0
        assert senders.frames_built == 10 and senders.frames_shared == 10
        size = store.max_physical_offset - start + 20 * protocol.DATA_HEADER.size   # 10 data, 10 CONFIRM
        wire1, wire2 = await _received(end1, size), await _received(end2, size)
        nursery.cancel_scope.cancel()
    assert wire1 == wire2 and len(wire1) == size
    frames = _data_frames(wire1)
    assert b"".join(data for _, data in frames) == bytes(store.replica_log.read(start, 1 << 20))
    assert first.sent_offset == second.sent_offset == store.max_physical_offset


async def test_a_partial_write_to_one_slave_leaves_the_other_whole(open_store, autojump_clock):
    store = open_store("m")
    async with trio.open_nursery() as nursery:
        senders, (first, end1), (second, end2) = await _two_slaves(store, nursery, sndbuf=4096)
        start = store.max_physical_offset
        put(store, 40, body_bytes=1000)   # about 48 KiB: one direct frame, over s1's socket buffer
        senders.notify_appended()
        # s1's socket took part: its task has the rest; s2 took it whole and stays parked
        assert senders.direct_sends == 2 and senders.task_wakes == 1 and senders.parked == 1
        assert senders.frames_built == 1 and senders.frames_shared == 1
        size = store.max_physical_offset - start + 2 * protocol.DATA_HEADER.size   # the first CONFIRM leads
        wire2 = await _received(end2, size)
        wire1 = await _received(end1, size)
        nursery.cancel_scope.cancel()
    assert wire1 == wire2 and len(wire1) == size
    assert [offset for offset, _ in _data_frames(wire1)] == [start]
    assert first.sent_offset == second.sent_offset == store.max_physical_offset


async def test_frames_end_at_an_epoch_boundary_for_both_slaves(open_store, autojump_clock):
    store = open_store("m")
    entries = [EpochEntry(1, store.max_physical_offset)]
    async with trio.open_nursery() as nursery:
        senders, (first, end1), (second, end2) = await _two_slaves(store, nursery, entries)
        start = store.max_physical_offset
        put(store, 10)
        boundary = store.max_physical_offset
        entries.append(EpochEntry(2, boundary))   # the senders' own list: the next term starts here
        put(store, 10)
        senders.notify_appended()
        # each put-path frame stops at the boundary, before the log's end: the tasks send the rest
        assert senders.direct_sends == 2 and senders.task_wakes == 2
        size = store.max_physical_offset - start + 3 * protocol.DATA_HEADER.size   # a CONFIRM, 2 frames
        wire1, wire2 = await _received(end1, size), await _received(end2, size)
        nursery.cancel_scope.cancel()
    assert wire1 == wire2 and len(wire1) == size
    assert [offset for offset, _ in _data_frames(wire1)] == [start, boundary]
    assert senders.frames_built == 2 and senders.frames_shared == 2   # one per frame, by put and by task
    assert first.sent_offset == second.sent_offset == store.max_physical_offset


async def test_slaves_behind_by_more_than_a_direct_send_share_the_tasks_frame(open_store, autojump_clock):
    store = open_store("m")
    async with trio.open_nursery() as nursery:
        senders, (first, end1), (second, end2) = await _two_slaves(store, nursery)
        start = store.max_physical_offset
        put(store, 200, body_bytes=1000)   # over DIRECT_SEND_BYTES_MAX: both tasks woken
        assert store.max_physical_offset - start > DIRECT_SEND_BYTES_MAX
        senders.notify_appended()
        assert senders.direct_sends == 0 and senders.task_wakes == 2 and senders.frames_built == 0
        size = store.max_physical_offset - start + 2 * protocol.DATA_HEADER.size   # the first CONFIRM leads
        wire1, wire2 = await _received(end1, size), await _received(end2, size)
        nursery.cancel_scope.cancel()
    assert wire1 == wire2 and len(wire1) == size
    assert senders.frames_built == 1 and senders.frames_shared == 1
    assert first.sent_offset == second.sent_offset == store.max_physical_offset


async def test_a_frame_is_not_shared_once_the_log_grew(open_store, autojump_clock):
    store = open_store("m")
    async with trio.open_nursery() as nursery:
        senders, _, _ = await _two_slaves(store, nursery)
        start = store.max_physical_offset
        put(store, 1)
        header, data = senders._frame(start)
        put(store, 1)   # the same offset now has a longer frame
        longer_header, longer = senders._frame(start)
        nursery.cancel_scope.cancel()
    assert len(longer) > len(data) and longer_header != header
    assert senders.frames_built == 2 and senders.frames_shared == 0


async def test_a_puts_run_goes_to_caught_up_slaves_from_the_puts_own_bytes(open_store, autojump_clock):
    # the store's run_listener: sent as the records land, with no read of the log back;
    # notify_appended after the put then finds the slave caught up and sends nothing more
    store = open_store("m")
    async with trio.open_nursery() as nursery:
        senders, replica, slave = await _senders(store, nursery)
        nursery.start_soon(slave.run)
        store.commit_log.run_listener = senders.appended_run
        (result,) = put(store, 1)
        assert replica.sent_offset == result.end_offset   # sent from inside the put
        senders.notify_appended()
        await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert senders.frames_built == 0 and senders.direct_sends == 1 and senders.task_wakes == 0
    assert [(kind, offset, size) for _, kind, offset, size in slave.frames if kind == "data"] == [
        ("data", result.physical_offset, result.end_offset - result.physical_offset)]


async def test_a_run_written_on_another_thread_waits_for_notify_appended(open_store, autojump_clock):
    store = open_store("m")
    async with trio.open_nursery() as nursery:
        senders, replica, slave = await _senders(store, nursery)
        nursery.start_soon(slave.run)
        store.commit_log.run_listener = senders.appended_run
        (result,) = await trio.to_thread.run_sync(put, store, 1)
        assert senders.direct_sends == 0   # not from the worker thread
        senders.notify_appended()
        await trio.sleep(0.02)
        nursery.cancel_scope.cancel()
    assert replica.sent_offset == result.end_offset and senders.frames_built == 1   # read back, by the loop
