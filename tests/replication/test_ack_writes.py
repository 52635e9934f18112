"""The slave's acks from its two tasks, one write at a time without a lock: an ack asked
for while the other task waits in a partial write is left to that write, which then acks
the log's end again (trio's autojump clock, a real replica log, a lockstep stream whose
writes wait for the reader)."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from replication import protocol
from replication.ha_client import HAClient, HaClientSettings
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
