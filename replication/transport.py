"""The thin I/O layer under the HA protocol: exact reads into one reusable buffer.

``StreamReader.exactly(n)`` returns a memoryview of the next ``n`` bytes, valid until the
next call. Over a real TCP socket it receives with ``recv_into`` straight into the buffer,
so a multi-megabyte data frame costs one copy from the kernel and no allocation; over any
other trio stream (in-memory streams in tests) it falls back to ``receive_some``.
"""

from __future__ import annotations

import trio

from . import protocol
from .errors import HaProtocolError

RECEIVE_SLACK_BYTES = 1024 * 1024


class PeerClosed(HaProtocolError):
    """The peer closed the connection."""


class StreamReader:
    def __init__(self, stream: trio.abc.ReceiveStream,
                 capacity: int = protocol.DATA_FRAME_BYTES_MAX + protocol.DATA_HEADER.size + RECEIVE_SLACK_BYTES
                 ) -> None:
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
                got = await self._receive_into(self._view[self._end:])
                if got == 0:
                    raise PeerClosed("the peer closed the connection")
                self._end += got
                self.received_bytes += got
        view = self._view[self._start:self._start + count]
        self._start += count
        if self._start == self._end:
            self._start = self._end = 0
        return view

    async def control(self) -> dict:
        """The next control frame's map."""
        length = protocol.control_length(bytes(await self.exactly(protocol.CONTROL_LENGTH.size)))
        return protocol.decode_control(bytes(await self.exactly(length)))

