"""Socket reads and writes for the request/reply hot path, with less of trio's machinery.

Writing a frame at once, without trio's scheduling point:

``trio.SocketStream.send_all`` yields to the scheduler after every successful send (a
whole pass of trio's loop: an epoll call and the other runnable tasks). A request and
its reply are a few hundred bytes that the socket buffer almost always takes whole, so
the node's reply writer and the client's request writer try the socket directly first
and fall back to ``send_all`` for whatever did not fit (or for streams that are not
sockets: the in-memory streams of tests). The callers serialise their writes themselves
(a lock held across the whole frame), which is what trio's conflict detector checks.

Reading: ``receive_some`` does what ``trio.SocketStream.receive_some`` does (read at once
when bytes wait and then yield once; otherwise wait until readable and read) without its
per-call context managers, which cost more than the read itself for a small request.
One task reads a connection at a time, as trio's conflict detector would insist (the
node's reader task; on the client, whichever caller holds the reading role).
"""

from __future__ import annotations

import errno
import os
import threading

import trio

_read_buffers = threading.local()   # read_now's buffer, one per thread


async def receive_some(stream: trio.abc.ReceiveStream, max_bytes: int) -> bytes:
    """``stream.receive_some(max_bytes)``: b"" at end of stream; BrokenResourceError if the
    peer is gone, ClosedResourceError if the stream was closed. A checkpoint, as trio's."""
    if type(stream) is not trio.SocketStream:
        return await stream.receive_some(max_bytes)
    socket = stream.socket
    await trio.lowlevel.checkpoint_if_cancelled()
    data = read_now(socket, max_bytes)
    if data is not None:
        await trio.lowlevel.cancel_shielded_checkpoint()  # the yield trio makes after a read that did not wait
        return data
    while True:
        await trio.lowlevel.wait_readable(socket)
        data = read_now(socket, max_bytes)
        if data is not None:
            return data


def read_now(socket, max_bytes: int) -> bytes | None:
    """What the socket holds now (b"" at its end), or None when nothing waits. Never a
    scheduling point. ClosedResourceError once closed, BrokenResourceError if it failed.

    The bytes are read into this thread's buffer and copied out at their size: ``os.read``
    allocates ``max_bytes`` first, and glibc maps an allocation of 256 KiB afresh each time,
    then shrinks and unmaps it (three system calls and two page faults for a 100-byte reply,
    ~50 us of a one-at-a-time client's ~230 us of CPU a send here)."""
    fd = socket.fileno()
    if fd < 0:
        raise trio.ClosedResourceError("the socket was closed")
    buffer = getattr(_read_buffers, "view", None)
    if buffer is None or len(buffer) < max_bytes:
        buffer = _read_buffers.view = memoryview(bytearray(max_bytes))
    try:
        count = os.readv(fd, (buffer[:max_bytes],))
    except BlockingIOError:
        return None
    except OSError as error:
        raise _stream_error(error, "read") from error
    return bytes(buffer[:count])


def write_now(stream: trio.abc.Stream, data: bytes | memoryview) -> int:
    """Bytes of ``data`` the stream's socket took now (0 when it would block, or when the
    stream is not a socket stream). BrokenResourceError if the peer is gone,
    ClosedResourceError if the stream was closed. Never a scheduling point."""
    if type(stream) is not trio.SocketStream:
        return 0
    fd = stream.socket.fileno()  # looked up each time: -1 once closed, never a reused number
    if fd < 0:
        raise trio.ClosedResourceError("the socket was closed")
    try:
        return os.write(fd, data)
    except BlockingIOError:
        return 0
    except OSError as error:
        raise _stream_error(error, "write") from error


def _stream_error(error: OSError, action: str) -> trio.ClosedResourceError | trio.BrokenResourceError:
    """What trio's own stream raises for a failed socket call: closed (EBADF) or broken."""
    if error.errno == errno.EBADF:
        return trio.ClosedResourceError("the socket was closed")
    return trio.BrokenResourceError(f"socket {action} failed: {error}")
