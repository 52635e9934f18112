"""The thin I/O layer under the HA protocol: exact reads into a reusable buffer or the caller's.

``StreamReader.exactly(n)`` returns a memoryview of the next ``n`` bytes, valid until the
next call: headers and control frames. ``StreamReader.exactly_into(target)`` fills a
buffer the caller owns, so a data frame outlives the next read (the slave writes one
frame while it receives the next). Over a real TCP socket both receive with
``recv_into``, a data frame straight into its target: one copy from the kernel and no
allocation; over any other trio stream (in-memory streams in tests) they fall back to
``receive_some``.
"""

from __future__ import annotations

import trio

from . import protocol
from .errors import HaProtocolError

RECEIVE_SLACK_BYTES = 1024 * 1024
# ``exactly`` receives at most this much past what it needs: enough to batch headers, acks
# and small frames, little enough that a data frame behind a header is mostly received by
# ``exactly_into`` straight into its own buffer rather than copied through this one
READ_AHEAD_BYTES = 64 * 1024
# what ``exactly`` serves: a control frame at most (data frames go through ``exactly_into``)
BUFFER_BYTES_DEFAULT = protocol.CONTROL_LENGTH.size + protocol.CONTROL_BYTES_MAX + RECEIVE_SLACK_BYTES


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

    async def _receive_into(self, view: memoryview) -> int:
        if self._socket is not None:
            try:
                return await self._socket.recv_into(view)
            except OSError as error:
                raise trio.BrokenResourceError(f"receive failed: {error}") from error
        data = await self.stream.receive_some(len(view))
        view[:len(data)] = data
        return len(data)

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

