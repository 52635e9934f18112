"""The slave's receive/apply pipeline against a scripted master, the transport's reads into
caller-owned buffers, and the store pieces the stream relies on (views of the log,
pwrite-based appends, read-ahead population)."""

from __future__ import annotations

import os

import pytest
import trio
import trio.testing

from replication import HAClient, HaClientSettings, protocol
from replication.epochs import EpochEntry, Resync, ResyncKind
from replication.errors import HaProtocolError, expected_failure
from replication.transport import PeerClosed, StreamReader
from store.mapped_file import POPULATE_STEP_BYTES_MIN, MappedFile, _read_ahead_bytes

from replication_helpers import chunks, epoch_file, frame, log_bytes, put

SECRET = "s3cret"
EPOCHS = [EpochEntry(1, 0)]


async def scripted_master(stream, script, acks: list[int]) -> None:
    """HELLO, check the slave's proof, WELCOME (an empty slave keeps its empty log), then
    run ``script``: frames (bytes) are sent, ints wait for the slave's ack of that offset."""
    reader = StreamReader(stream)
    nonce = os.urandom(protocol.NONCE_BYTES)
    await stream.send_all(protocol.Hello("c", nonce).encode())
    slave_nonce = protocol.Handshake.authenticate(await reader.control(), SECRET, nonce)
    await stream.send_all(protocol.Welcome(protocol.master_proof(SECRET, nonce, slave_nonce), "m", 1, EPOCHS, 0,
                                           2**40, Resync(ResyncKind.TRUNCATE, 0, None, "test")).encode())
    acks.append(protocol.parse_ack(await reader.exactly(protocol.ACK.size)))
    for step in script:
        if isinstance(step, int):
            while acks[-1] < step:
                acks.append(protocol.parse_ack(await reader.exactly(protocol.ACK.size)))
        else:
            await stream.send_all(step)
    with trio.move_on_after(5):
        try:
            while True:  # keep reading acks until the slave hangs up
                acks.append(protocol.parse_ack(await reader.exactly(protocol.ACK.size)))
        except (PeerClosed, trio.BrokenResourceError, trio.ClosedResourceError):
            pass


async def follow_until_failure(slave, script) -> tuple[BaseException, list[int]]:
    """Run one HAClient session against the script; the error that ended it and the acks."""
    client = HAClient(slave.replica_log, epoch_file(slave), HaClientSettings(node_id="s1", group="g", cluster="c",
                                                                 master_ha_address="memory:0", secret=SECRET,
                                                                 ack_interval_ms=50))
    master_stream, slave_stream = trio.testing.memory_stream_pair()
    acks: list[int] = []
    error = None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(scripted_master, master_stream, script, acks)
        try:
            await client.follow(slave_stream)
        except BaseException as raised:
            error = expected_failure(raised, (HaProtocolError, PeerClosed, trio.BrokenResourceError,
                                              trio.ClosedResourceError))
            if error is None:
                raise
        await slave_stream.aclose()
        nursery.cancel_scope.cancel()
    assert error is not None, "the session should have failed"
    return error, acks


@pytest.mark.trio
async def test_a_frame_with_a_bad_crc_ends_the_session_and_none_of_it_lands(open_store):
    master, slave = open_store("master"), open_store("slave")
    put(master, 600, body_bytes=900)
    (o1, c1), (o2, c2), (o3, c3) = chunks(master, 3, 100_000)
    script = [frame(o1, c1), frame(o2, c2), o3, frame(o3, c3, crc_flip=1), frame(o3 + len(c3), b"x")]
    error, acks = await follow_until_failure(slave, script)
    assert "CRC mismatch" in str(error)
    assert slave.max_physical_offset == o3  # the two good frames, nothing of the bad one
    assert log_bytes(slave) == c1 + c2
    assert acks == sorted(acks) and acks[-1] == o3
    assert epoch_file(slave).entries == EPOCHS  # the term was recorded before its first byte


@pytest.mark.trio
async def test_frames_received_ahead_of_a_gap_are_a_prefix_of_the_log(open_store):
    """Frames sent back to back: the receiver runs ahead of the writer; a frame that does
    not start where the one before ended fails the session, and what was written is a
    whole-frame prefix of the master's log."""
    master, slave = open_store("master"), open_store("slave")
    put(master, 600, body_bytes=900)
    pieces = chunks(master, 6, 60_000)
    script = [frame(offset, data) for offset, data in pieces[:4]] + [frame(pieces[5][0], pieces[5][1])]
    error, _ = await follow_until_failure(slave, script)
    assert f"frame at {pieces[5][0]}" in str(error)
    ends = [offset + len(data) for offset, data in pieces[:4]]
    assert slave.max_physical_offset in [0] + ends
    assert log_bytes(slave) == b"".join(data for _, data in pieces)[:slave.max_physical_offset]


@pytest.mark.trio
async def test_exactly_into_takes_what_is_buffered_first_then_reads_the_stream():
    left, right = trio.testing.memory_stream_pair()
    reader = StreamReader(right, capacity=64)
    await left.send_all(b"HEAD" + b"0123456789")
    assert bytes(await reader.exactly(4)) == b"HEAD"  # the rest of the send may sit buffered
    target = memoryview(bytearray(30))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(left.send_all, b"abcdefghijklmnopqrst")
        await reader.exactly_into(target)
    assert bytes(target) == b"0123456789abcdefghijklmnopqrst"
    await left.send_all(b"xy")
    await left.aclose()
    with pytest.raises(PeerClosed):
        await reader.exactly_into(memoryview(bytearray(3)))


@pytest.mark.trio
async def test_the_log_is_read_as_views_and_appended_from_views(open_store):
    master, slave = open_store("master"), open_store("slave")
    put(master, 300, body_bytes=900)
    view = master.replica_log.read(0, 100_000)
    assert isinstance(view, memoryview) and view.readonly
    with pytest.raises(TypeError):
        view[0] = 0
    assert slave.replica_log.append(0, view) == len(view)
    assert bytes(slave.commit_log.read(0, len(view))) == bytes(view)  # pwrite shows through the mapping
    assert len(master.replica_log.read(master.max_physical_offset, 100)) == 0


def test_mapped_file_write_and_populate(tmp_path):
    mapped = MappedFile(str(tmp_path / "00000000000000000000"), 0, 1 << 20, create=True)
    try:
        mapped.populate()
        mapped.write(4096, memoryview(b"abc" * 1000))
        assert mapped.mm[4096:7096] == b"abc" * 1000
        with pytest.raises(AssertionError):
            mapped.write((1 << 20) - 2, b"abc")  # past the end: never a partial write
    finally:
        mapped.close()
    mapped.populate(0, 4096)  # a closed file: nothing to bring in, no error
    # not a block device: the kernel's default read-ahead step
    assert _read_ahead_bytes(os.stat("/proc").st_dev) == POPULATE_STEP_BYTES_MIN
