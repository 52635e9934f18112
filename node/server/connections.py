"""The client-facing transport: connections, framing, auth, pipelining. Protocol logic lives
in handlers.py; this module only moves frames.

Per connection: a reader task decodes frames and hands each to the handlers, in arrival
order. Replies the handlers give at once (a send under async flush and replication,
queries, status) are joined per read and written by the reader itself when no other
write is under way, so a request's reply leaves before the reader does anything else;
when a write is under way they go to the connection's writer task, which joins whatever
is queued into one write. Replies that take time (long polls, sync flush) run as tasks
of the connection's nursery, bounded by ``in_flight_requests_max``, and write the same
way; a put waiting for sync replication alone has no task: the HA service calls its reply
from the task that learns the outcome, which writes it when the connection is idle (under
the same bound). Replies carry their request's opaque and may leave in any order. A
broken frame gets an error reply, written after every reply queued before it, and the
connection closes; a peer that vanishes only ends its own connection. Before a reader waits for its next request through trio, it busy-polls its
socket for up to ``busy_poll_us`` while nothing else needs the loop (busy_poll.py).

Bounds (client_limits.py): every reply built and not yet written, and every partial
frame, is held against the connection's bound and the node's total; a connection past its
bound reads no further request until its replies leave (backpressure on a client that does
not read), past the total the connection holding the most is closed. Before authentication
a frame is at most ``unauthenticated_frame_bytes_max``. Idle connections are closed, and at
the connection limit a new connection takes the place of one that is idle or unauthenticated.
"""

from __future__ import annotations

import logging
import os
import hmac
from dataclasses import dataclass
from typing import Callable

import trio

from ..wire import protocol
from ..wire.auth import auth_digest
from .busy_poll import BusyPoll
from .client_limits import ClientLimits, ClientLimitsStatistics, ConnectionCounts, ConnectionState
from .config import NodeConfig
from ..errors import FrameError
from .handlers import RequestHandlers
from .put_waits import PendingReply
from .metrics import NodeMetrics
from ..wire.protocol import FrameDecoder, RequestCode, ResponseCode
from ..wire.socket_io import receive_some, write_now

log = logging.getLogger(__name__)

RECEIVE_BYTES = 256 * 1024
NOTICE_TIMEOUT_S = 1         # to tell a connection closed from outside (idle, shed) why
JOIN_BYTES_MAX = 1024 * 1024   # replies of one read are joined into one write up to this size
WRITE_BATCH_FRAMES_MAX = 256
NONCE_BYTES = 32


@dataclass(frozen=True, slots=True)
class ServerStatistics:
    connections: int
    connections_accepted: int
    connections_refused: int
    frame_errors: int
    auth_failures: int
    busy_poll_reads: int       # requests read by busy polling (busy_poll.py)
    busy_poll_seconds: float   # time spent polling


class ClientServer:
    """Serves the client protocol on any trio stream (TCP or in-memory)."""

    def __init__(self, config: NodeConfig, handlers: RequestHandlers, metrics: NodeMetrics,
                 busy_poll: BusyPoll | None = None, counts: ConnectionCounts | None = None) -> None:
        self.config = config
        self.handlers = handlers
        self.metrics = metrics
        self.busy_poll = busy_poll or BusyPoll(0)
        self.counts = counts if counts is not None else ConnectionCounts()
        self.limits = ClientLimits(connections_max=config.connections_max,
                                   connection_reply_bytes_max=config.connection_reply_bytes_max,
                                   client_buffer_bytes_max=config.client_buffer_bytes_max,
                                   idle_timeout_ms=config.idle_timeout_ms, counts=self.counts)
        metrics.watch_clients(self.counts)

    def statistics(self) -> ServerStatistics:
        polled = self.busy_poll.statistics()
        counts = self.counts
        return ServerStatistics(counts.open, counts.accepted, counts.refused_busy, counts.frame_errors,
                                counts.auth_failures, polled.reads, polled.seconds)

    def limits_statistics(self) -> ClientLimitsStatistics:
        """Bytes held for clients, readers paused, connections closed idle, shed or for memory."""
        return self.limits.statistics()

    async def handle_connection(self, stream: trio.abc.Stream) -> None:
        """Serve one connection until it closes; never raises for anything the peer does."""
        counts = self.counts
        scope = trio.CancelScope()
        state = self.limits.open(stream, scope, authenticated=self.config.secret is None)
        if state is None:
            counts.refused_busy += 1
            await _send_and_close(stream, protocol.error_reply(
                None, ResponseCode.SYSTEM_BUSY, f"the node holds {self.config.connections_max} connections, its "
                f"limit, and every one is working; try again later", unread=True))
            return
        counts.open += 1
        counts.accepted += 1
        try:
            with scope:
                await self._serve(stream, state)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the peer went away during auth: nothing of it to keep
        except Exception:  # a bug in this node: it ends this connection, never the node
            log.exception("connection failed")
        finally:
            self.limits.forget(state)
            # closed from outside while no write was under way, but the task may have begun
            # one since (the reply whose bytes went over the total bound): never cut into it
            if state.notice is not None and (state.writer_torn is None or not state.writer_torn()):
                await _send_and_close(stream, state.notice, timeout_s=NOTICE_TIMEOUT_S)
            counts.open -= 1
            await trio.aclose_forcefully(stream)

    async def _serve(self, stream: trio.abc.Stream, state: ConnectionState) -> None:
        early_frames: list = []
        if self.config.secret is not None:
            # before authentication only a small frame: a stranger holds little of this node
            decoder = FrameDecoder(self.config.unauthenticated_frame_bytes_max)
            early_frames = await self._authenticate(stream, decoder)
            if early_frames is None:
                return
            decoder.frame_bytes_max = protocol.FRAME_BYTES_MAX
            state.authenticated = True
            state.requests += 1   # AUTH
        else:
            decoder = FrameDecoder()
        writer = ReplyWriter(stream, self.config.in_flight_requests_max, self.limits, state)
        state.writer_busy = writer.busy
        state.writer_torn = writer.torn
        in_flight = trio.Semaphore(self.config.in_flight_requests_max)
        async with trio.open_nursery() as connection:
            connection.start_soon(writer.run, connection.cancel_scope)
            async with trio.open_nursery() as deferred:
                pending = _PendingReplies(self.limits, writer, in_flight, state, deferred)
                try:
                    ending = await self._read_requests(stream, decoder, early_frames, writer, in_flight, deferred,
                                                       state, pending)
                    if ending == "gone":
                        connection.cancel_scope.cancel()
                    elif ending == "broken":
                        deferred.cancel_scope.cancel()  # the error reply goes out, then the connection closes
                    else:
                        await pending.drained()
                finally:
                    pending.close()   # replies still to come (cancelled, gone, broken) are dropped
            # "eof": the peer half-closed; the writer ends once every deferred reply is sent
            writer.close()

    async def _read_requests(self, stream, decoder: FrameDecoder, frames: list, writer: ReplyWriter,
                             in_flight: trio.Semaphore, deferred: trio.Nursery, state: ConnectionState,
                             pending: _PendingReplies) -> str:
        """Hand frames to the handlers until the peer closes ("eof"), vanishes ("gone") or
        breaks the framing ("broken"). While the connection holds more reply bytes than its
        bound (its client does not read), no further frame is handed over."""
        dispatch = self.handlers.dispatch
        limits = self.limits
        polling = self.busy_poll.reader(stream) if self.busy_poll.enabled and type(stream) is trio.SocketStream \
            else None
        while True:
            replies = []
            replies_bytes = 0
            state.requests += len(frames)
            for payload in frames:
                if replies_bytes and (replies_bytes >= JOIN_BYTES_MAX or limits.over_bound(state)):
                    # the requests read wait until the client takes these: a pause when they
                    # reached the bound, or when the socket does not take them at once
                    over = limits.over_bound(state)
                    if over:
                        limits.count_pause()
                    try:
                        await self._write_replies(writer, replies, None if over else limits.count_pause)
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        return "gone"
                    replies, replies_bytes = [], 0
                if limits.over_bound(state):
                    await limits.wait_for_room(state)
                outcome = dispatch(payload)
                if type(outcome) is dict:
                    reply = _encode_reply(outcome)
                    limits.hold(state, len(reply))
                    replies.append(reply)
                    replies_bytes += len(reply)
                else:
                    try:   # no scheduling point when a place is free: the next read is one
                        in_flight.acquire_nowait()
                    except trio.WouldBlock:
                        await in_flight.acquire()
                    if type(outcome) is PendingReply:   # answered by a callback: no task
                        pending.start(outcome)
                    else:
                        deferred.start_soon(self._run_deferred, outcome, writer, in_flight, state)
            try:
                if replies:   # no further request is read until the client takes these
                    await self._write_replies(writer, replies, limits.count_pause)
                if decoder.error is not None:
                    self.counts.frame_errors += 1
                    code = ResponseCode.FRAME_TOO_LARGE if isinstance(decoder.error, protocol.FrameTooLarge) \
                        else ResponseCode.BAD_FRAME
                    last = protocol.encode_frame(protocol.error_reply(None, code, str(decoder.error)))
                    limits.hold(state, len(last))
                    await writer.write_last(last)
                    return "broken"
                if polling is not None:
                    data = await polling.receive(RECEIVE_BYTES)
                else:
                    data = await receive_some(stream, RECEIVE_BYTES)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return "gone"  # the peer is gone (or the writer stopped because it is)
            if not data:
                return "eof"
            state.last_active = trio.current_time()
            frames = decoder.feed(data)
            if decoder.buffered_bytes != state.partial_bytes:
                limits.partial_frame(state, decoder.buffered_bytes)

    @staticmethod
    async def _write_replies(writer: ReplyWriter, replies: list[bytes], on_wait=None) -> None:
        if len(replies) == 1:
            await writer.write(replies[0], on_wait)
        else:
            await writer.write(b"".join(replies), on_wait)

    async def _run_deferred(self, deferred, writer: ReplyWriter, in_flight: trio.Semaphore,
                            state: ConnectionState) -> None:
        state.in_progress += 1
        try:
            reply = await deferred()
        finally:
            in_flight.release()
            state.in_progress -= 1
        encoded = _encode_reply(reply)
        self.limits.hold(state, len(encoded))
        try:
            await self.limits.wait_for_room(state, own_bytes=len(encoded))
            await writer.write(encoded)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the reader sees the peer gone too and ends the connection

    async def _authenticate(self, stream, decoder: FrameDecoder) -> list | None:
        """Send a nonce; the first frame back must be AUTH with HMAC-SHA256(secret, nonce).

        Returns the frames that arrived right behind AUTH, or None when the peer failed.
        """
        nonce = os.urandom(NONCE_BYTES)
        await stream.send_all(protocol.encode_frame({"code": int(RequestCode.AUTH_CHALLENGE), "opaque": 0,
                                                     "nonce": nonce}))
        frames: list = []
        with trio.move_on_after(self.config.auth_timeout_ms / 1000):
            while not frames:
                data = await stream.receive_some(RECEIVE_BYTES)
                if not data:
                    self.counts.auth_failures += 1  # left without answering (a client with no secret)
                    return None
                try:
                    frames = decoder.feed_strict(data)
                except FrameError as error:
                    self.counts.auth_failures += 1
                    await _send_and_close(stream, protocol.error_reply(None, ResponseCode.BAD_FRAME, str(error)))
                    return None
        if not frames:
            self.counts.auth_failures += 1
            self.counts.auth_timeouts += 1
            await _send_and_close(stream, protocol.error_reply(None, ResponseCode.AUTH_REQUIRED,
                                                               "no AUTH reply to the challenge in time"))
            return None
        first = frames[0]
        opaque = protocol.opaque_of(first)
        if not isinstance(first, dict) or first.get("code") != RequestCode.AUTH:
            self.counts.auth_failures += 1
            await _send_and_close(stream, protocol.error_reply(
                opaque, ResponseCode.AUTH_REQUIRED, "this node requires authentication: answer the challenge first"))
            return None
        digest = first.get("digest")
        if not isinstance(digest, bytes) or not hmac.compare_digest(digest, auth_digest(self.config.secret, nonce)):
            self.counts.auth_failures += 1
            await _send_and_close(stream, protocol.error_reply(opaque, ResponseCode.AUTH_FAILED,
                                                               "wrong secret: HMAC does not match"))
            return None
        await stream.send_all(_encode_reply(protocol.reply(opaque, authenticated=True)))
        return frames[1:]


class _PendingReplies:
    """One connection's replies that arrive by callback (PendingReply: a sync put waiting for
    its replicas, no task of its own). Each holds an in-flight place until answered. The
    task that answers writes the reply when the connection is idle and under its bound;
    otherwise a task of the connection's deferred nursery writes it, as ``_run_deferred``
    does. Once closed (the connection ends), replies still to come are dropped."""

    def __init__(self, limits: ClientLimits, writer: ReplyWriter, in_flight: trio.Semaphore,
                 state: ConnectionState, nursery: trio.Nursery) -> None:
        self._limits = limits
        self._writer = writer
        self._in_flight = in_flight
        self._state = state
        self._nursery = nursery
        self._waiting = 0
        self._closed = False
        self._drained: trio.Event | None = None

    def start(self, outcome: PendingReply) -> None:
        """Wait for ``outcome``'s reply; its in-flight place is taken already."""
        self._waiting += 1
        self._state.in_progress += 1
        outcome.start(self._deliver, encoded=True)

    def _deliver(self, reply: dict | bytes) -> None:
        self._waiting -= 1
        self._state.in_progress -= 1
        self._in_flight.release()
        if self._waiting == 0 and self._drained is not None:
            self._drained.set()
        if self._closed:
            return
        encoded = reply if type(reply) is bytes else _encode_reply(reply)
        limits, state = self._limits, self._state
        limits.hold(state, len(encoded))
        if state.closed_reason is not None:
            return   # closed (by this hold, perhaps: over the total bound): its notice goes instead
        try:
            if not limits.over_bound(state, own_bytes=len(encoded)) and self._writer.write_nowait(encoded):
                return
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return   # the reader sees the peer gone too and ends the connection
        self._nursery.start_soon(self._write, encoded)

    async def _write(self, encoded: bytes) -> None:
        try:
            await self._limits.wait_for_room(self._state, own_bytes=len(encoded))
            await self._writer.write(encoded)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async def drained(self) -> None:
        """Until every reply started here is answered."""
        while self._waiting:
            self._drained = trio.Event()
            await self._drained.wait()

    def close(self) -> None:
        self._closed = True


class ReplyWriter:
    """Writes one connection's replies: at once from the task that has them while the
    stream is idle (straight to the socket when it takes the whole reply), else through a
    bounded queue that ``run`` (the writer task) drains, joining what is queued into one
    write. One write at a time, whoever makes it."""

    def __init__(self, stream: trio.abc.Stream, queued_max: int, limits: ClientLimits | None = None,
                 state: ConnectionState | None = None) -> None:
        """``limits`` and ``state``: the bytes handed to ``write`` were held there by the
        caller; they are released once written."""
        self.stream = stream
        self._writing = trio.Lock()
        self._queue_in, self._queue_out = trio.open_memory_channel[bytes](queued_max)
        self._limits = limits
        self._state = state
        self._torn = False
        self._queued = 0   # replies queued and not yet taken by ``run`` under the lock
        self._rest_queued = False   # write_nowait wrote part of a reply and queued the rest

    def busy(self) -> bool:
        """A write is under way or queued (a notice written now could cut into a reply)."""
        return self._writing.locked() or self._queued > 0

    def torn(self) -> bool:
        """A write stopped part way (cancelled or failed), or the rest of a reply waits for
        ``run``: the stream may end inside a reply, so nothing else may be written to it."""
        return self._torn or self._rest_queued

    def _written(self, count: int) -> None:
        if self._limits is not None:
            self._limits.release(self._state, count)
            self._state.last_active = trio.current_time()

    async def write(self, data: bytes, on_wait: Callable[[], None] | None = None) -> None:
        """Write ``data`` now if no write is under way, else queue it (waiting while the queue
        is full). BrokenResourceError / ClosedResourceError once the peer is gone.
        ``on_wait()`` is called when the write must wait for the peer: the socket did not
        take it whole at once (a stream that is not a socket never says)."""
        if self._writing.locked() or self._queued:
            await self._queue(data)
            return
        # acquire_nowait rather than ``async with``, and the socket tried directly: no
        # scheduling point before the write, so the reply leaves before anything else
        # (another task, the store's dispatch pass) gets in between, and none after it
        # when the socket took it whole (socket_io.py)
        self._writing.acquire_nowait()
        try:
            sent = write_now(self.stream, data)
            if sent < len(data):
                if on_wait is not None and type(self.stream) is trio.SocketStream:
                    on_wait()
                try:
                    await self.stream.send_all(memoryview(data)[sent:] if sent else data)
                except BaseException:
                    self._torn = True
                    raise
            self._written(len(data))
        finally:
            self._writing.release()

    def write_nowait(self, data: bytes) -> bool:
        """``write`` with no scheduling point, from any task: False (nothing written) when
        a write is under way or queued; else the socket takes what it takes at once and the
        rest is queued for ``run`` (ahead of any later reply)."""
        if self._writing.locked() or self._queued:
            return False
        # no lock taken: nothing here yields, so no other write can start before it is done
        sent = write_now(self.stream, data)
        if sent < len(data):
            self._queue_in.send_nowait(memoryview(data)[sent:] if sent else data)   # room: nothing queued
            self._queued += 1
            self._rest_queued = bool(sent)
        if sent:
            self._written(sent)
        return True

    async def write_last(self, data: bytes) -> None:
        """Queue ``data`` behind every reply queued so far (the error before a close)."""
        await self._queue(data)

    async def _queue(self, data: bytes) -> None:
        # counted before it is in the queue, so no write starts ahead of it meanwhile (a
        # reply written in part by write_nowait must not have another queued between its parts)
        self._queued += 1
        try:
            await self._queue_in.send(data)
        except BaseException:
            self._queued -= 1
            raise

    def close(self) -> None:
        """No more replies: ``run`` ends once the queue is written."""
        self._queue_in.close()

    async def run(self, connection_scope: trio.CancelScope) -> None:
        """Drain the queue until ``close``; a broken stream cancels ``connection_scope``."""
        async with self._queue_out:
            try:
                async for frame in self._queue_out:
                    batch = [frame]
                    while len(batch) < WRITE_BATCH_FRAMES_MAX:
                        try:
                            batch.append(self._queue_out.receive_nowait())
                        except (trio.WouldBlock, trio.EndOfChannel):
                            break
                    data = batch[0] if len(batch) == 1 else b"".join(batch)
                    async with self._writing:
                        self._queued -= len(batch)
                        del batch
                        try:
                            await self.stream.send_all(data)
                        except BaseException:
                            self._torn = True
                            raise
                        self._rest_queued = False   # a queued rest is first in the queue: sent
                    self._written(len(data))
                    del data
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                connection_scope.cancel()  # cannot answer any more: stop reading too


def _encode_reply(reply: dict) -> bytes:
    try:
        return protocol.encode_frame(reply)
    except FrameError as error:  # never for replies the handlers bound; answer rather than crash
        return protocol.encode_frame(protocol.error_reply(reply.get("opaque"), ResponseCode.SYSTEM_ERROR, str(error)))


async def _send_and_close(stream, reply: dict | bytes, timeout_s: float = 5) -> None:
    try:
        with trio.move_on_after(timeout_s):
            await stream.send_all(reply if type(reply) is bytes else protocol.encode_frame(reply))
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    await trio.aclose_forcefully(stream)


async def serve_clients(server: ClientServer, listeners: list, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Accept connections on ``listeners`` and serve each until the caller cancels; idle
    connections are closed meanwhile (client_limits.py)."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.limits.reap_forever)
        await trio.serve_listeners(server.handle_connection, listeners, task_status=task_status)
