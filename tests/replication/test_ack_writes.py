"""The slave's acks from its two tasks, one write at a time without a lock: an ack asked
for while the other task waits in a partial write is left to that write, which then acks
the log's end again (trio's autojump clock, a real replica log, a lockstep stream whose
writes wait for the reader)."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from replication import protocol
from replication.epochs import EpochEntry, Resync, ResyncKind
from replication.ha_client import HAClient, HaClientSettings
from replication.protocol import Welcome
from replication.transport import StreamReader
from replication_helpers import epoch_file, put

pytestmark = pytest.mark.trio


def slave_client(store) -> HAClient:
    return HAClient(store.replica_log, epoch_file(store),
                    HaClientSettings(node_id="s1", group="g", cluster="c", master_ha_address="127.0.0.1:1"))


async def read_acks(stream, count: int) -> list[int]:
    raw = b""
    while len(raw) < count * protocol.ACK.size:
        raw += await stream.receive_some(count * protocol.ACK.size - len(raw))
    return [protocol.parse_ack(raw[at:at + protocol.ACK.size]) for at in range(0, len(raw), protocol.ACK.size)]


async def test_an_ack_asked_for_during_a_write_follows_it_and_names_the_new_end(open_store, autojump_clock):
    master, slave = open_store("master"), open_store("slave")
    put(master, 3)
    chunk = master.replica_log.read(0, 1 << 20)
    client = slave_client(slave)
    sending, receiving = trio.testing.lockstep_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(client._send_ack, sending)   # waits in its write: nobody reads yet
        await trio.testing.wait_all_tasks_blocked()
        slave.replica_log.append(0, chunk, wake_dispatch=False)
        with trio.fail_after(1):   # no wait for the write in progress (the clock would jump)
            await client._send_ack(sending)
        with trio.fail_after(1):
            assert await read_acks(receiving, 2) == [0, len(chunk)]
    # the writer is done, and nothing more was written
    assert not client._ack_writing
    await sending.aclose()
    with trio.fail_after(1):
        assert await receiving.receive_some(8) == b""


async def test_acks_that_do_not_meet_are_written_each_in_full(open_store, autojump_clock):
    master, slave = open_store("master"), open_store("slave")
    put(master, 2)
    chunk = master.replica_log.read(0, 1 << 20)
    client = slave_client(slave)
    sending, receiving = trio.testing.lockstep_stream_pair()
    async with trio.open_nursery() as nursery:
        async def two_acks() -> None:
            await client._send_ack(sending)
            slave.replica_log.append(0, chunk, wake_dispatch=False)
            await client._send_ack(sending)
        nursery.start_soon(two_acks)
        with trio.fail_after(1):
            assert await read_acks(receiving, 1) == [0]
            assert await read_acks(receiving, 1) == [len(chunk)]


async def test_frames_followed_by_a_confirm_are_acked_at_once_not_at_the_idle_interval(open_store, autojump_clock):
    """The receiver defers an inline frame's ack while the next header is already here. When
    that header is a CONFIRM (or a heartbeat), no data frame follows to carry the ack: it must
    go before the receiver waits on the socket, not at the applier's idle ack a second later."""
    master, slave = open_store("master"), open_store("slave")
    put(master, 3)
    first = bytes(master.replica_log.read(0, 1))                 # one record
    second = bytes(master.replica_log.read(len(first), 1 << 20))  # the rest
    epochs = epoch_file(slave)
    epochs.append(1, 0)
    welcome = Welcome(proof=b"", node_id="m", epoch=1, epochs=[EpochEntry(1, 0)], min_offset=0,
                      max_offset=len(first) + len(second),
                      resync=Resync(ResyncKind.TRUNCATE, 0, 1, "test"))
    client = HAClient(slave.replica_log, epochs,
                      HaClientSettings(node_id="s1", group="g", cluster="c", master_ha_address="127.0.0.1:1"))
    assert client.settings.ack_interval_ms >= 1000
    master_end, slave_end = trio.testing.memory_stream_pair()
    free_in, free_out = trio.open_memory_channel(2)
    for _ in range(2):
        free_in.send_nowait(memoryview(bytearray(protocol.DATA_FRAME_BYTES_MAX)))
    frames_in, frames_out = trio.open_memory_channel(2)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(client._apply_frames, slave_end, frames_out, free_in)
        nursery.start_soon(client._receive_frames, slave_end, StreamReader(slave_end), welcome, frames_in, free_out)
        await trio.testing.wait_all_tasks_blocked()      # the applier waits, idle: frames go inline
        await master_end.send_all(protocol.data_header(0, first) + first
                                  + protocol.data_header(len(first), second) + second + protocol.confirm(0))
        with trio.fail_after(0.5):
            acked = 0
            while acked < len(first) + len(second):
                [acked] = await read_acks(master_end, 1)
        assert slave.max_physical_offset == len(first) + len(second)
        assert client.appended_by_receiver == 2
        nursery.cancel_scope.cancel()
