"""Writing a frame to a socket stream at once, without trio's scheduling point.

``trio.SocketStream.send_all`` yields to the scheduler after every successful send (a
whole pass of trio's loop: an epoll call and the other runnable tasks). A request and
its reply are a few hundred bytes that the socket buffer almost always takes whole, so
the node's reply writer and the client's request writer try the socket directly first
and fall back to ``send_all`` for whatever did not fit (or for streams that are not
sockets: the in-memory streams of tests). The callers serialise their writes themselves
(a lock held across the whole frame), which is what trio's conflict detector checks.
"""

from __future__ import annotations

import errno
import os

import trio


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
        if error.errno == errno.EBADF:
            raise trio.ClosedResourceError("the socket was closed") from error
        raise trio.BrokenResourceError(f"socket write failed: {error}") from error
