"""The thin I/O layer under the HA protocol: exact reads into a reusable buffer or the caller's.

``StreamReader.exactly(n)`` returns a memoryview of the next ``n`` bytes, valid until the
next call: headers and control frames. ``StreamReader.exactly_into(target)`` fills a
buffer the caller owns, so a data frame outlives the next read (the slave writes one
frame while it receives the next). Over a real TCP socket both receive with
``recv_into``, a data frame straight into its target: one copy from the kernel and no
allocation; over any other trio stream (in-memory streams in tests) they fall back to
``receive_some``.

``send_now(stream, data)`` writes: what the socket takes at once (``write_now``, never a
scheduling point, also for callers that cannot wait) goes without a scheduling
point (``send_all`` yields to trio's loop after every send, a whole pass of it for an
8-byte ack or a 1 KiB frame), the rest through ``send_all``. Its caller must be the only
task writing to the stream, which is what trio's conflict detector would check.
``writev_now(stream, parts)`` is ``write_now`` for several buffers in one ``writev``.
"""

from __future__ import annotations

import errno
import os

import trio

from . import protocol
from .errors import HaProtocolError

RECEIVE_SLACK_BYTES = 1024 * 1024
# ``exactly`` receives at most this much past what it needs: enough to batch headers, acks
# and small frames, little enough that a data frame behind a header is mostly received by
# ``exactly_into`` straight into its own buffer rather than copied through this one
READ_AHEAD_BYTES = 64 * 1024
# what ``exactly`` serves: a control frame at most (data frames go through ``exactly_into``)
# reads without a scheduling point in a row, at most (see StreamReader._receive_into)
YIELD_EVERY_READS = 16
BUFFER_BYTES_DEFAULT = protocol.CONTROL_LENGTH.size + protocol.CONTROL_BYTES_MAX + RECEIVE_SLACK_BYTES


def write_now(stream: trio.abc.SendStream, data: bytes | memoryview) -> int:
    """Bytes of ``data`` a socket stream's socket took now (0 when it would block; always 0
    for a stream that is not a socket stream). BrokenResourceError if the peer is gone,
    ClosedResourceError if the stream was closed. Never a scheduling point."""
    return _write_now(stream, os.write, data)


def read_into_now(socket, view: memoryview) -> int | None:
    """Bytes a socket held now, read into ``view`` (0 at the end of the stream), or None when
    none wait. Never a scheduling point. ClosedResourceError once the socket is closed,
    BrokenResourceError if the read failed."""
    fd = socket.fileno()   # -1 once closed, never a reused number
    if fd < 0:
        raise trio.ClosedResourceError("the socket was closed")
    try:
        return os.readv(fd, (view,))
    except BlockingIOError:
        return None
    except OSError as error:
        raise trio.BrokenResourceError(f"receive failed: {error}") from error


def writev_now(stream: trio.abc.SendStream, parts) -> int:
    """``write_now`` for the concatenation of ``parts`` (bytes-likes) in one ``os.writev``,
    without building it. Same answers and errors; never a scheduling point."""
    return _write_now(stream, os.writev, parts)


def _write_now(stream: trio.abc.SendStream, write, data) -> int:
    if type(stream) is not trio.SocketStream:
        return 0
    fd = stream.socket.fileno()  # -1 once closed, never a reused number
    if fd < 0:
        raise trio.ClosedResourceError("the socket was closed")
    try:
        return write(fd, data)
    except BlockingIOError:
        return 0
    except OSError as error:
        if error.errno == errno.EBADF:
            raise trio.ClosedResourceError("the socket was closed") from error
        raise trio.BrokenResourceError(f"send failed: {error}") from error


async def send_now(stream: trio.abc.SendStream, data: bytes | memoryview) -> None:
    """``stream.send_all(data)``, writing straight to a socket stream's socket first: no
    scheduling point when the socket takes it all. BrokenResourceError if the peer is
    gone, ClosedResourceError if the stream was closed."""
    sent = write_now(stream, data)
    if sent == len(data):
        return
    await stream.send_all(memoryview(data)[sent:] if sent else data)


class PeerClosed(HaProtocolError):
    """The peer closed the connection."""


class StreamReader:
    def __init__(self, stream: trio.abc.ReceiveStream, capacity: int = BUFFER_BYTES_DEFAULT) -> None:
        self.stream = stream
        self._buffer = bytearray(capacity)
        self._view = memoryview(self._buffer)
        self._start = 0
        self._end = 0
        self._socket = stream.socket if isinstance(stream, trio.SocketStream) else None
        self.received_bytes = 0
        self._reads_unyielded = 0
        # the last read for ``exactly`` took less than it asked for: the socket was empty
        # then, so the next read waits for it first instead of meeting EAGAIN (a syscall and
        # an exception per ack or small frame)
        self._drained = False

    async def _receive_into(self, view: memoryview) -> int:
        if self._socket is not None:
            if self._drained:
                self._drained = False
                self._reads_unyielded = 0
                await trio.lowlevel.wait_readable(self._socket)
            # what waits in the socket is taken without a scheduling point (trio's recv_into
            # yields after every read, a loop pass per ack or small frame); at least every
            # YIELD_EVERY_READS reads a checkpoint all the same, so a peer that keeps the
            # socket full cannot hold the loop
            self._reads_unyielded += 1
            if self._reads_unyielded >= YIELD_EVERY_READS:
                self._reads_unyielded = 0
                await trio.lowlevel.checkpoint()
            socket = self._socket
            while True:
                got = read_into_now(socket, view)
                if got is not None:
                    return got
                self._reads_unyielded = 0
                await trio.lowlevel.wait_readable(socket)
        data = await self.stream.receive_some(len(view))
        view[:len(data)] = data
        return len(data)

    @property
    def buffered_bytes(self) -> int:
        """Bytes received and not yet handed out."""
        return self._end - self._start

    def take_buffered(self) -> bytes:
        """What was received and not yet handed out (a copy), handed out now: the reader is
        empty after it."""
        data = bytes(self._view[self._start:self._end])
        self._start = self._end = 0
        return data

    async def exactly(self, count: int) -> memoryview:
        """The next ``count`` bytes (a view into the buffer, valid until the next call)."""
        if count > len(self._buffer):
            raise HaProtocolError(f"a read of {count} bytes is over the {len(self._buffer)} byte buffer")
        if self._end - self._start < count:
            if self._start + count > len(self._buffer):
                pending = self._end - self._start
                self._view[:pending] = self._view[self._start:self._end]
                self._start, self._end = 0, pending
            while self._end - self._start < count:
                wanted = count - (self._end - self._start) + READ_AHEAD_BYTES
                got = await self._receive_into(self._view[self._end:self._end + wanted])
                if got == 0:
                    raise PeerClosed("the peer closed the connection")
                self._drained = got < wanted
                self._end += got
                self.received_bytes += got
        view = self._view[self._start:self._start + count]
        self._start += count
        if self._start == self._end:
            self._start = self._end = 0
        return view

    async def exactly_into(self, target: memoryview) -> None:
        """Fill ``target`` with the next ``len(target)`` bytes: what is buffered first, the
        rest received straight into ``target``."""
        buffered = min(len(target), self._end - self._start)
        target[:buffered] = self._view[self._start:self._start + buffered]
        self._start += buffered
        if self._start == self._end:
            self._start = self._end = 0
        filled = buffered
        while filled < len(target):
            got = await self._receive_into(target[filled:])
            if got == 0:
                raise PeerClosed("the peer closed the connection")
            filled += got
            self.received_bytes += got

    async def control(self) -> dict:
        """The next control frame's map."""
        length = protocol.control_length(bytes(await self.exactly(protocol.CONTROL_LENGTH.size)))
        return protocol.decode_control(bytes(await self.exactly(length)))

