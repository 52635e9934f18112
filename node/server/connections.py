"""The client-facing transport: connections, framing, auth, pipelining. Protocol logic lives
in handlers.py; this module only moves frames.

Per connection: a reader task decodes frames and hands each to the handlers, in arrival
order. Replies the handlers give at once (a send under async flush and replication,
queries, status) are joined per read and written by the reader itself when no other
write is under way, so a request's reply leaves before the reader does anything else;
when a write is under way they go to the connection's writer task, which joins whatever
is queued into one write. Replies that take time (long polls, sync flush, sync
replication) run as tasks of the connection's nursery, bounded by
``in_flight_requests_max``, and write the same way. Replies carry their request's opaque
and may leave in any order. A broken frame gets an error reply, written after every reply
queued before it, and the connection closes; a peer that vanishes only ends its own
connection. Before a reader waits for its next request through trio, it busy-polls its
socket for up to ``busy_poll_us`` while nothing else needs the loop (busy_poll.py).
"""

from __future__ import annotations

import logging
import os
import hmac
from dataclasses import dataclass

import trio

from ..wire import protocol
from ..wire.auth import auth_digest
from .busy_poll import BusyPoll
from .config import NodeConfig
from ..errors import FrameError
from .handlers import RequestHandlers
from .metrics import NodeMetrics
from ..wire.protocol import FrameDecoder, RequestCode, ResponseCode
from ..wire.socket_io import receive_some, write_now

log = logging.getLogger(__name__)

RECEIVE_BYTES = 256 * 1024
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


@dataclass(slots=True)
class ConnectionCounts:
    """A server's connection counters. Its owner may make them before the server, so that
    a part built ahead of it (the status reply the handlers give) can read them."""

    open: int = 0
    accepted: int = 0
    refused: int = 0
    frame_errors: int = 0
    auth_failures: int = 0


class ClientServer:
    """Serves the client protocol on any trio stream (TCP or in-memory)."""

    def __init__(self, config: NodeConfig, handlers: RequestHandlers, metrics: NodeMetrics,
                 busy_poll: BusyPoll | None = None, counts: ConnectionCounts | None = None) -> None:
        self.config = config
        self.handlers = handlers
        self.metrics = metrics
        self.busy_poll = busy_poll or BusyPoll(0)
        self.counts = counts if counts is not None else ConnectionCounts()

    def statistics(self) -> ServerStatistics:
        polled = self.busy_poll.statistics()
        counts = self.counts
        return ServerStatistics(counts.open, counts.accepted, counts.refused, counts.frame_errors,
                                counts.auth_failures, polled.reads, polled.seconds)

    async def handle_connection(self, stream: trio.abc.Stream) -> None:
        """Serve one connection until it closes; never raises for anything the peer does."""
        counts = self.counts
        if counts.open >= self.config.connections_max:
            counts.refused += 1
            await _send_and_close(stream, protocol.error_reply(
                None, ResponseCode.SYSTEM_BUSY, f"the node holds {counts.open} connections, its limit"))
            return
        counts.open += 1
        counts.accepted += 1
        self.metrics.connections.inc()
        self.metrics.connections_total.inc()
        try:
            await self._serve(stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the peer went away during auth: nothing of it to keep
        except Exception:  # a bug in this node: it ends this connection, never the node
            log.exception("connection failed")
        finally:
            counts.open -= 1
            self.metrics.connections.dec()
            await trio.aclose_forcefully(stream)

    async def _serve(self, stream: trio.abc.Stream) -> None:
        decoder = FrameDecoder()
        early_frames: list = []
        if self.config.secret is not None:
            early_frames = await self._authenticate(stream, decoder)
            if early_frames is None:
                return
        writer = ReplyWriter(stream, self.config.in_flight_requests_max)
        in_flight = trio.Semaphore(self.config.in_flight_requests_max)
        async with trio.open_nursery() as connection:
            connection.start_soon(writer.run, connection.cancel_scope)
            async with trio.open_nursery() as deferred:
                ending = await self._read_requests(stream, decoder, early_frames, writer, in_flight, deferred)
                if ending == "gone":
                    connection.cancel_scope.cancel()
                elif ending == "broken":
                    deferred.cancel_scope.cancel()  # the error reply goes out, then the connection closes
            # "eof": the peer half-closed; the writer ends once every deferred reply is sent
            writer.close()

    async def _read_requests(self, stream, decoder: FrameDecoder, frames: list, writer: ReplyWriter,
                             in_flight: trio.Semaphore, deferred: trio.Nursery) -> str:
        """Hand frames to the handlers until the peer closes ("eof"), vanishes ("gone") or
        breaks the framing ("broken")."""
        dispatch = self.handlers.dispatch
        polling = self.busy_poll.reader(stream) if self.busy_poll.enabled and type(stream) is trio.SocketStream \
            else None
        while True:
            replies = []
            for payload in frames:
                outcome = dispatch(payload)
                if type(outcome) is dict:
                    replies.append(_encode_reply(outcome))
                else:
                    await in_flight.acquire()
                    deferred.start_soon(self._run_deferred, outcome, writer, in_flight)
            try:
                if replies:
                    await writer.write(replies[0] if len(replies) == 1 else b"".join(replies))
                if decoder.error is not None:
                    self.counts.frame_errors += 1
                    code = ResponseCode.FRAME_TOO_LARGE if isinstance(decoder.error, protocol.FrameTooLarge) \
                        else ResponseCode.BAD_FRAME
                    await writer.write_last(protocol.encode_frame(protocol.error_reply(None, code,
                                                                                       str(decoder.error))))
                    return "broken"
                if polling is not None:
                    data = await polling.receive(RECEIVE_BYTES)
                else:
                    data = await receive_some(stream, RECEIVE_BYTES)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return "gone"  # the peer is gone (or the writer stopped because it is)
            if not data:
                return "eof"
            frames = decoder.feed(data)

    async def _run_deferred(self, deferred, writer: ReplyWriter, in_flight: trio.Semaphore) -> None:
        try:
            reply = await deferred()
        finally:
            in_flight.release()
        try:
            await writer.write(_encode_reply(reply))
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


class ReplyWriter:
    """Writes one connection's replies: at once from the task that has them while the
    stream is idle (straight to the socket when it takes the whole reply), else through a
    bounded queue that ``run`` (the writer task) drains, joining what is queued into one
    write. One write at a time, whoever makes it."""

    def __init__(self, stream: trio.abc.Stream, queued_max: int) -> None:
        self.stream = stream
        self._writing = trio.Lock()
        self._queue_in, self._queue_out = trio.open_memory_channel[bytes](queued_max)

    async def write(self, data: bytes) -> None:
        """Write ``data`` now if no write is under way, else queue it (waiting while the queue
        is full). BrokenResourceError / ClosedResourceError once the peer is gone."""
        if self._writing.locked():
            await self._queue_in.send(data)
            return
        # acquire_nowait rather than ``async with``, and the socket tried directly: no
        # scheduling point before the write, so the reply leaves before anything else
        # (another task, the store's dispatch pass) gets in between, and none after it
        # when the socket took it whole (socket_io.py)
        self._writing.acquire_nowait()
        try:
            sent = write_now(self.stream, data)
            if sent < len(data):
                await self.stream.send_all(memoryview(data)[sent:] if sent else data)
        finally:
            self._writing.release()

    async def write_last(self, data: bytes) -> None:
        """Queue ``data`` behind every reply queued so far (the error before a close)."""
        await self._queue_in.send(data)

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
                    async with self._writing:
                        await self.stream.send_all(b"".join(batch))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                connection_scope.cancel()  # cannot answer any more: stop reading too


def _encode_reply(reply: dict) -> bytes:
    try:
        return protocol.encode_frame(reply)
    except FrameError as error:  # never for replies the handlers bound; answer rather than crash
        return protocol.encode_frame(protocol.error_reply(reply.get("opaque"), ResponseCode.SYSTEM_ERROR, str(error)))


async def _send_and_close(stream, reply: dict) -> None:
    try:
        with trio.move_on_after(5):
            await stream.send_all(protocol.encode_frame(reply))
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    await trio.aclose_forcefully(stream)


async def serve_clients(server: ClientServer, listeners: list, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Accept connections on ``listeners`` and serve each until the caller cancels."""
    await trio.serve_listeners(server.handle_connection, listeners, task_status=task_status)
