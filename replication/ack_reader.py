"""The master's ack readers: each slave connection's acks, read by its own task or, while
that task waits for the socket, by whoever polls the loop's sockets now (``take_now``).

    acks = AckReaders(on_ack)                 # on_ack(replica, offset, now): one call per read
    await acks.read(reader, replica, timeout_s, scope)   # a task per slave connection
    acks.take_now()                           # from any task, on the trio thread: no scheduling point

A one-at-a-time sync put is answered from the ack of the last slave to hold it. Read by its
task, that ack costs a pass of trio's loop before anything happens: the node's busy
polling (node/server/busy_poll.py) sees the epoll descriptor ready and gives the loop way,
the loop wakes the task, and the task reads 8 bytes. In a send of about 220 µs, each of the
two slaves' acks took 22-30 µs from the slave's write to the master's read of it; about
17 µs of that was the loop's pass (timestamps in both processes on one clock). A poller
that calls ``take_now`` when the loop's descriptor turns ready reads the acks itself, and
the put's reply leaves from that call (put_waits.py), with no task woken.

Both ways read the same way: whatever the socket holds (``read_into_now``, never waiting), whole
acks applied, a piece of one kept for the next read. Several acks read at once are each
checked (never backwards, never past what was sent to that slave) and only the last one is
applied: acks are offsets, the last says all the others do. A read that finds nothing (the
task woken for bytes ``take_now`` took) is nothing to do. The task stays the connection's
owner: it waits for the socket, ends the connection when the slave goes silent for
``timeout_s``, and meets the slave's hang-up; what ``take_now`` meets that ends the
connection (a hang-up, a bad ack) ends it as the task would (its ``scope`` cancelled).
Streams that are not sockets (in-memory streams in tests) are read by their task only.
"""

from __future__ import annotations

import logging
from typing import Callable

import trio

from . import protocol
from .errors import HaProtocolError, ReplicationError
from .sync_state import ReplicaProgress
from .transport import PeerClosed, StreamReader, read_into_now

log = logging.getLogger(__name__)

RECEIVE_BYTES = 64 * 1024   # acks are 8 bytes: a slave behind by this many acks is far behind
# what ends a slave's connection from its ack reader
READ_FAILURES = (trio.BrokenResourceError, trio.ClosedResourceError, ReplicationError, OSError)

AckHandler = Callable[[ReplicaProgress, int, float], None]


class _Connection:
    """One slave connection's ack reading state."""

    __slots__ = ("stream", "socket", "replica", "scope", "partial", "last_ack")

    def __init__(self, stream, replica: ReplicaProgress, scope: trio.CancelScope, buffered: bytes) -> None:
        self.stream = stream
        self.socket = stream.socket if type(stream) is trio.SocketStream else None
        self.replica = replica
        self.scope = scope
        self.partial = buffered     # bytes of an ack not yet whole
        self.last_ack = trio.current_time()


class AckReaders:
    """Every slave connection's ack reader of one master term."""

    def __init__(self, on_ack: AckHandler) -> None:
        self._on_ack = on_ack
        self._waiting: dict[_Connection, None] = {}   # connections whose task waits for its socket
        self._buffer = memoryview(bytearray(RECEIVE_BYTES))
        self.acks = 0           # acks read
        self.taken_now = 0      # reads by ``take_now`` that found acks

    async def read(self, reader: StreamReader, replica: ReplicaProgress, timeout_s: float,
                   scope: trio.CancelScope) -> None:
        """Read the acks of one connection (``reader``: what the handshake left in it comes
        first) until it fails; then log why and cancel ``scope``."""
        connection = _Connection(reader.stream, replica, scope, reader.take_buffered())
        try:
            self._apply(connection, b"")
            while True:
                # one deadline per timeout_s, not one moved per ack: the scope ends timeout_s
                # after the last ack it knew of, and the slave is dropped only if none came since
                with trio.CancelScope(deadline=connection.last_ack + timeout_s):
                    while True:
                        await self._next(connection)
                if trio.current_time() >= connection.last_ack + timeout_s:
                    raise HaProtocolError(f"slave {replica.node_id} sent no ack for {timeout_s * 1000:.0f} ms")
        except READ_FAILURES as error:
            _end(connection, error)
        finally:
            self._waiting.pop(connection, None)

    async def _next(self, connection: _Connection) -> None:
        """Wait for the socket, then take what it holds."""
        sock = connection.socket
        if sock is None:
            data = await connection.stream.receive_some(RECEIVE_BYTES)
            if not data:
                raise PeerClosed("the peer closed the connection")
            self._apply(connection, data)
            return
        self._waiting[connection] = None
        try:
            await trio.lowlevel.wait_readable(sock)
        finally:
            self._waiting.pop(connection, None)
        self._take(connection)

    def take_now(self) -> bool:
        """Read the acks that wait in the sockets of connections whose task waits for them;
        whether any were. Never a scheduling point; a connection this ends is ended as its
        task would end it."""
        took = False
        for connection in tuple(self._waiting):
            try:
                took = self._take(connection) or took
            except READ_FAILURES as error:
                del self._waiting[connection]
                _end(connection, error)
        if took:
            self.taken_now += 1
        return took

    def _take(self, connection: _Connection) -> bool:
        """What the socket holds now, applied; whether it held anything."""
        buffer = self._buffer
        count = read_into_now(connection.socket, buffer)
        if count is None:
            return False
        if count == 0:
            raise PeerClosed("the peer closed the connection")
        self._apply(connection, buffer[:count])
        return True

    def _apply(self, connection: _Connection, data) -> None:
        """Check each whole ack in what was received, apply the last; keep a piece of one."""
        if connection.partial:
            data = connection.partial + bytes(data)
        size = protocol.ACK.size
        whole = len(data) - len(data) % size
        connection.partial = bytes(data[whole:])
        if not whole:
            return
        replica = connection.replica
        low, high = replica.ack_offset, replica.sent_offset
        offset = low
        for position in range(0, whole, size):
            offset = protocol.parse_ack(data[position:position + size])
            if not low <= offset <= high:
                raise HaProtocolError(f"slave {replica.node_id} acked {offset}: outside [{low}, {high}] (its "
                                      f"last ack, what was sent)")
            low = offset
        self.acks += whole // size
        connection.last_ack = now = trio.current_time()
        self._on_ack(replica, offset, now)


def _end(connection: _Connection, error: BaseException) -> None:
    """A connection's acks ended by ``error``: say why, and end it (its ``scope``)."""
    log.info("slave %s: %s", connection.replica.node_id, error or type(error).__name__)
    connection.scope.cancel()
