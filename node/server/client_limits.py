"""What a node's client connections may hold, and which go when there are too many.

Memory. Every reply a connection built and has not written yet, and the partial request
frame its decoder holds, count against two bounds:

- per connection, ``connection_reply_bytes_max``: past it the connection's reader reads
  no further request, so a client that stops reading its replies gets backpressure: the
  node builds nothing more for it until its replies leave;
- in total, ``client_buffer_bytes_max``: past it the connection holding the most bytes is
  closed (the client that reads slowest pays, as Redis's client output buffer limit does).

Counters (``ConnectionCounts``, shown by status replies and metrics): connections open and
the limit, refused busy, shed idle or unauthenticated, idle timeouts, auth timeouts, bytes
held, backpressure pauses, closed for memory.

Before authentication a frame may be at most ``unauthenticated_frame_bytes_max`` (64 KiB)
and it must come within ``auth_timeout_ms``. So the clients' memory is bounded by
``client_buffer_bytes_max`` plus the one reply being built (a frame, 16 MiB at most).

Connections. A connection with no request in progress and nothing read or written for
``idle_timeout_ms`` is closed, with or without a secret. At ``connections_max`` a new
connection sheds, before it is refused, a connection that has not authenticated or never
sent a request (after ``NEW_GRACE_S``), else the one idle longest (after ``SHED_IDLE_S``): a
client that is working is never shed for one that is not. A connection closed for being
idle or shed is told so with a connection-level SYSTEM_BUSY carrying ``unread: true`` (it
had no request in progress, so its client knows that whatever it sent since took no
effect and may send it again).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import trio

from ..wire import protocol
from ..wire.protocol import ResponseCode
from .memory import trim

log = logging.getLogger(__name__)

NEW_GRACE_S = 0.2      # a new connection sends its first request (or AUTH) well within this
SHED_IDLE_S = 1.0      # idle at least this long before a new connection may shed it
REAP_INTERVAL_MAX_S = 1.0
TRIM_AFTER_BYTES = 4 * 1024 * 1024   # a connection that held this much gives memory back when it ends


@dataclass(slots=True, eq=False)
class ConnectionState:
    """One connection's standing, as the limits see it."""

    number: int
    stream: trio.abc.Stream
    scope: trio.CancelScope
    opened_at: float
    last_active: float
    authenticated: bool
    requests: int = 0            # requests read
    in_progress: int = 0         # requests whose reply is being worked on (long polls, waits)
    held_bytes: int = 0          # replies built and not written, plus the partial frame
    partial_bytes: int = 0       # of which the partial request frame (never acted on)
    peak_held_bytes: int = 0
    writer_busy: Callable[[], bool] | None = None
    writer_torn: Callable[[], bool] | None = None   # a write stopped part way: no notice may follow it
    room: trio.Event | None = None
    closed_reason: str | None = None
    notice: bytes | None = None  # what the connection's task writes its client as it ends

    def idle_for(self, now: float) -> float:
        return now - self.last_active if self.in_progress == 0 else 0.0

    def answered_all(self) -> bool:
        """No request in progress and no reply waiting: every request it read is answered."""
        return self.in_progress == 0 and self.held_bytes == self.partial_bytes


@dataclass(slots=True)
class ConnectionCounts:
    """A client server's connection counters, the limits' among them. Its owner may make
    them before the server, so that a part built ahead of it (the status reply the handlers
    give, the metrics) can read them; the server and its limits only add to them."""

    open: int = 0
    connections_max: int = 0       # the limit (the limits that count here set it)
    accepted: int = 0
    refused_busy: int = 0          # at the limit with every connection working: refused
    shed_idle: int = 0             # closed to make room for a new connection: the idle longest
    shed_unauthenticated: int = 0  # ... not authenticated, or silent since it opened
    idle_timeouts: int = 0         # closed after idle_timeout_ms without a request or a reply
    auth_failures: int = 0         # no AUTH first, a wrong digest, a broken frame before it, or none in time
    auth_timeouts: int = 0         # of the failures: no AUTH within auth_timeout_ms
    frame_errors: int = 0
    held_bytes: int = 0            # replies built and not written, and partial request frames
    peak_held_bytes: int = 0
    # times a reader waited for its client to read replies before reading (or handing over)
    # more requests: a reader's write the socket did not take at once, or replies past the bound
    backpressure_pauses: int = 0
    closed_for_memory: int = 0     # closed because every connection together held too much

    def status(self) -> dict:
        """The ``clients`` section of a status reply."""
        return {"open": self.open, "limit": self.connections_max, "accepted": self.accepted,
                "refused_busy": self.refused_busy, "shed_idle": self.shed_idle,
                "shed_unauthenticated": self.shed_unauthenticated, "idle_timeouts": self.idle_timeouts,
                "auth_timeouts": self.auth_timeouts, "auth_failures": self.auth_failures,
                "frame_errors": self.frame_errors, "held_bytes": self.held_bytes,
                "peak_held_bytes": self.peak_held_bytes, "backpressure_pauses": self.backpressure_pauses,
                "closed_for_memory": self.closed_for_memory}


@dataclass(frozen=True, slots=True)
class ClientLimitsStatistics:
    connections: int           # in the limits' table (a connection shed or closed leaves it at once)
    held_bytes: int
    peak_held_bytes: int
    paused_reads: int          # times a reader stopped for a client that did not read its replies
    idle_closed: int
    shed_idle: int             # closed to make room for a new connection
    shed_unauthenticated: int
    closed_for_memory: int     # closed because every connection together held too much


class ClientLimits:
    """The connection table and the byte accounting of one client server."""

    def __init__(self, *, connections_max: int, connection_reply_bytes_max: int, client_buffer_bytes_max: int,
                 idle_timeout_ms: int, counts: ConnectionCounts | None = None,
                 clock: Callable[[], float] = trio.current_time) -> None:
        """``counts``: where the limits count what they do (the server's counters)."""
        self.connections_max = connections_max
        self.connection_reply_bytes_max = connection_reply_bytes_max
        self.client_buffer_bytes_max = client_buffer_bytes_max
        self.idle_timeout_s = idle_timeout_ms / 1000
        self._clock = clock
        self._connections: dict[int, ConnectionState] = {}   # in the order they opened
        self._next_number = 0
        self.counts = counts if counts is not None else ConnectionCounts()
        self.counts.connections_max = connections_max

    @property
    def held_bytes(self) -> int:
        """Bytes every connection holds now: replies not written, partial frames."""
        return self.counts.held_bytes

    def statistics(self) -> ClientLimitsStatistics:
        counts = self.counts
        return ClientLimitsStatistics(len(self._connections), counts.held_bytes, counts.peak_held_bytes,
                                      counts.backpressure_pauses, counts.idle_timeouts, counts.shed_idle,
                                      counts.shed_unauthenticated, counts.closed_for_memory)

    # --- connections ---------------------------------------------------------------------
    def open(self, stream: trio.abc.Stream, scope: trio.CancelScope, authenticated: bool) -> ConnectionState | None:
        """Register a new connection, shedding one that is not working if the table is
        full; None when every connection is working (the caller refuses the new one)."""
        now = self._clock()
        if len(self._connections) >= self.connections_max:
            victim = self._victim(now)
            if victim is None:
                return None
            silent = not victim.authenticated or victim.requests == 0
            if silent:
                self.counts.shed_unauthenticated += 1
            else:
                self.counts.shed_idle += 1
            why = "not authenticated" if not victim.authenticated else "silent since it opened" if silent else "idle"
            self.close(victim, f"the node is at its {self.connections_max} connection limit and this connection "
                               f"was {why}", unread=True)
            self.forget(victim)   # its slot is free now; its task ends at its next checkpoint
        self._next_number += 1
        state = ConnectionState(self._next_number, stream, scope, now, now, authenticated)
        self._connections[state.number] = state
        return state

    def _victim(self, now: float) -> ConnectionState | None:
        """The connection a new one may take the place of: not authenticated or silent since
        it opened, oldest first; else the one idle longest, if idle long enough."""
        idlest, idlest_for = None, SHED_IDLE_S
        for state in self._connections.values():
            if state.closed_reason is not None:
                continue
            if (not state.authenticated or state.requests == 0) and now - state.opened_at >= NEW_GRACE_S:
                return state
            idle = state.idle_for(now) if state.answered_all() else 0.0
            if idle >= idlest_for:
                idlest, idlest_for = state, idle
        return idlest

    def forget(self, state: ConnectionState) -> None:
        """The connection ended: its slot and its bytes are free."""
        if self._connections.pop(state.number, None) is None:
            return
        self.counts.held_bytes -= state.held_bytes
        state.held_bytes = 0
        if state.room is not None:
            state.room.set()
        if state.peak_held_bytes >= TRIM_AFTER_BYTES:
            trim()

    def close(self, state: ConnectionState, reason: str, *, unread: bool) -> None:
        """Close a connection from outside its task: cancel its task, which tells its client
        why as it ends (when nothing was being written, so the notice cannot cut into a reply)."""
        if state.closed_reason is not None:
            return
        state.closed_reason = reason
        log.info("closing client connection %d: %s", state.number, reason)
        if state.writer_busy is None or not state.writer_busy():
            state.notice = protocol.encode_frame(protocol.error_reply(None, ResponseCode.SYSTEM_BUSY, reason,
                                                                      **({"unread": True} if unread else {})))
        state.scope.cancel()

    def touch(self, state: ConnectionState) -> None:
        state.last_active = self._clock()

    # --- memory --------------------------------------------------------------------------
    def hold(self, state: ConnectionState, count: int) -> None:
        """``count`` more bytes held by ``state`` (a reply built, a partial frame grown).
        Past the total bound, the connection holding the most is closed."""
        state.held_bytes += count
        if state.held_bytes > state.peak_held_bytes:
            state.peak_held_bytes = state.held_bytes
        counts = self.counts
        counts.held_bytes += count
        if counts.held_bytes > counts.peak_held_bytes:
            counts.peak_held_bytes = counts.held_bytes
        if counts.held_bytes > self.client_buffer_bytes_max:
            self._close_largest()

    def release(self, state: ConnectionState, count: int) -> None:
        """``count`` bytes of ``state`` written or dropped."""
        if state.number not in self._connections:
            return   # forgotten: its bytes were released all at once
        state.held_bytes -= count
        self.counts.held_bytes -= count
        if state.room is not None:
            state.room.set()   # its waiter looks again (with its own bytes left out)
            state.room = None

    def partial_frame(self, state: ConnectionState, buffered: int) -> None:
        """The decoder of ``state`` now holds ``buffered`` bytes of a frame not yet whole."""
        change = buffered - state.partial_bytes
        if change:
            state.partial_bytes = buffered
            if change > 0:
                self.hold(state, change)
            else:
                self.release(state, -change)

    def over_bound(self, state: ConnectionState, own_bytes: int = 0) -> bool:
        """Whether the replies ``state`` holds (besides ``own_bytes`` of the caller's) reach
        its bound. A partial request frame does not count here (only more reading shrinks
        it), only in the total."""
        return state.held_bytes - state.partial_bytes - own_bytes >= self.connection_reply_bytes_max

    def count_pause(self) -> None:
        """A reader waits for its client to read the replies built before it reads more."""
        self.counts.backpressure_pauses += 1

    async def wait_for_room(self, state: ConnectionState, own_bytes: int = 0) -> None:
        """Until the replies ``state`` holds, besides ``own_bytes``, are under its bound."""
        if self.over_bound(state, own_bytes):
            self.counts.backpressure_pauses += 1
        while self.over_bound(state, own_bytes) and state.number in self._connections:
            if state.room is None:
                state.room = trio.Event()
            await state.room.wait()

    def _close_largest(self) -> None:
        largest = max((s for s in self._connections.values() if s.closed_reason is None),
                      key=lambda s: s.held_bytes, default=None)
        if largest is None or largest.held_bytes == 0:
            return
        self.counts.closed_for_memory += 1
        self.close(largest, f"the node's clients hold over {self.client_buffer_bytes_max} bytes of replies and "
                            f"requests, and this connection the most ({largest.held_bytes}): read your replies",
                   unread=False)
        self.forget(largest)

    # --- idle connections ----------------------------------------------------------------
    def reap(self) -> int:
        """Close the connections idle past the timeout; how many."""
        now = self._clock()
        idle = [s for s in self._connections.values()
                if s.closed_reason is None and s.idle_for(now) >= self.idle_timeout_s]
        for state in idle:
            self.counts.idle_timeouts += 1
            self.close(state, f"idle for {self.idle_timeout_s:g} s (idle_timeout_ms)", unread=state.answered_all())
        return len(idle)

    async def reap_forever(self) -> None:
        """Close idle connections, looking at least every second (run in the server's nursery)."""
        interval = min(REAP_INTERVAL_MAX_S, self.idle_timeout_s / 4)
        while True:
            await trio.sleep(interval)
            self.reap()
