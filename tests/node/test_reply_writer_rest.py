"""A reply the socket took only part of, its rest queued for the writer task: until that
rest is sent the connection is busy and torn (a close notice written now would land inside
the reply), and a writer task cancelled before sending it leaves the connection torn."""

from __future__ import annotations

import socket

import pytest
import trio
import trio.testing

from node.server.connections import ReplyWriter

pytestmark = pytest.mark.trio

REPLY = bytes(range(256)) * 8192   # 2 MiB: more than a loopback socket pair takes at once


def _socket_pair() -> tuple[trio.SocketStream, trio.SocketStream]:
    left, right = trio.socket.socketpair()
    left.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16384)
    right.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
    return trio.SocketStream(left), trio.SocketStream(right)


async def _read(stream: trio.SocketStream, count: int) -> bytes:
    got = bytearray()
    while len(got) < count:
        chunk = await stream.receive_some(count - len(got))
        if not chunk:
            break
        got += chunk
    return bytes(got)


async def test_a_reply_written_in_part_is_busy_and_torn_until_its_rest_is_sent():
    sending, receiving = _socket_pair()
    writer = ReplyWriter(sending, 4)
    assert not writer.busy() and not writer.torn()
    assert writer.write_nowait(REPLY)
    assert writer.busy() and writer.torn()          # the stream ends inside the reply for now
    assert not writer.write_nowait(b"next")          # nothing may go between its parts
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer.run, nursery.cancel_scope)
            assert await _read(receiving, len(REPLY)) == REPLY
            await trio.testing.wait_all_tasks_blocked()
            assert not writer.busy() and not writer.torn()
            writer.close()


async def test_a_writer_task_cancelled_before_the_rest_leaves_the_stream_torn():
    sending, receiving = _socket_pair()
    writer = ReplyWriter(sending, 4)
    assert writer.write_nowait(REPLY)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer.run, nursery.cancel_scope)
            nursery.cancel_scope.cancel()   # the connection closed from outside before it ran
    assert writer.torn()


async def test_a_reply_the_socket_takes_whole_leaves_nothing_behind():
    sending, receiving = _socket_pair()
    writer = ReplyWriter(sending, 4)
    assert writer.write_nowait(b"small reply")
    assert not writer.busy() and not writer.torn()
    with trio.fail_after(10):
        assert await _read(receiving, 11) == b"small reply"
