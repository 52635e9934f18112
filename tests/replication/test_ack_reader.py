"""The master's ack readers (replication/ack_reader.py): acks read by their connection's task
or, while it waits for the socket, by ``take_now``; real socket pairs in one trio run."""

from __future__ import annotations

import socket
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing

from replication import protocol
from replication.ack_reader import AckReaders
from replication.sync_state import ReplicaProgress
from replication.transport import StreamReader

pytestmark = pytest.mark.trio

TIMEOUT_S = 60


class Slave:
    """One slave connection's ack reader, run by a task; the test writes the slave's acks."""

    def __init__(self, acks: AckReaders, sent_offset: int) -> None:
        ours, self.peer = socket.socketpair()
        self.stream = trio.SocketStream(trio.socket.from_stdlib_socket(ours))
        self.replica = ReplicaProgress("s1", "pair", 0, sent_offset=sent_offset)
        self.acks = acks
        self.scope = trio.CancelScope()
        self.ended = False

    async def run(self) -> None:
        with self.scope:
            await self.acks.read(StreamReader(self.stream), self.replica, TIMEOUT_S, self.scope)
        self.ended = True

    def close(self) -> None:
        self.peer.close()


@asynccontextmanager
async def running(acks: AckReaders, sent_offset: int):
    """A Slave whose task runs and waits for its socket; stopped and closed on the way out."""
    slave = Slave(acks, sent_offset)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(slave.run)
            await trio.testing.wait_all_tasks_blocked()   # the task waits for its socket
            yield slave
            nursery.cancel_scope.cancel()
    finally:
        slave.close()


@pytest.fixture
def applied():
    """AckReaders whose handler records (node, offset) and moves the replica's ack offset."""
    got: list[tuple[str, int]] = []

    def on_ack(replica: ReplicaProgress, offset: int, now: float) -> None:
        got.append((replica.node_id, offset))
        replica.ack_offset = offset
    return AckReaders(on_ack), got


async def test_acks_that_wait_are_taken_at_once_and_only_the_last_is_applied(applied):
    acks, got = applied
    async with running(acks, sent_offset=300) as slave:
        slave.peer.sendall(protocol.ack(100) + protocol.ack(200) + protocol.ack(300))
        assert acks.take_now() is True
        assert got == [("s1", 300)] and acks.acks == 3 and acks.taken_now == 1
        assert acks.take_now() is False   # nothing more waits
        await trio.testing.wait_all_tasks_blocked()   # the task, woken for bytes taken, waits again
        assert got == [("s1", 300)] and not slave.ended


async def test_a_piece_of_an_ack_is_kept_for_the_next_read(applied):
    acks, got = applied
    async with running(acks, sent_offset=500) as slave:
        raw = protocol.ack(500)
        slave.peer.sendall(raw[:3])
        acks.take_now()
        assert got == []
        slave.peer.sendall(raw[3:])
        with trio.fail_after(TIMEOUT_S):
            while not got:   # the task or take_now: either one completes it
                acks.take_now()
                await trio.sleep(0.001)
        assert got == [("s1", 500)]


async def test_a_bad_ack_taken_at_once_ends_the_connection_as_its_task_would(applied):
    acks, got = applied
    async with running(acks, sent_offset=100) as slave:
        slave.peer.sendall(protocol.ack(101))   # past what was sent
        assert acks.take_now() is False
        await trio.testing.wait_all_tasks_blocked()
        assert slave.scope.cancel_called and got == []
        assert acks.take_now() is False   # forgotten


async def test_the_task_reads_acks_when_nobody_takes_them(applied):
    acks, got = applied
    async with running(acks, sent_offset=64) as slave:
        slave.peer.sendall(protocol.ack(64))
        with trio.fail_after(TIMEOUT_S):
            while not got:
                await trio.sleep(0.001)
        assert got == [("s1", 64)] and acks.taken_now == 0
        slave.peer.shutdown(socket.SHUT_WR)   # a hang-up ends it
        with trio.fail_after(TIMEOUT_S):
            while not slave.scope.cancel_called:
                await trio.sleep(0.001)
