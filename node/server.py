"""The client-facing transport: connections, framing, auth, pipelining. Protocol logic lives
in handlers.py; this module only moves frames.

Per connection: a reader task decodes frames and hands each to the handlers, in arrival
order; replies that take time (long polls, sync flush) run as tasks of the connection's
nursery, bounded by ``in_flight_requests_max``; one writer task sends replies as they
come, joining whatever is ready into one write. A broken frame gets an error reply and
the connection closes; a peer that vanishes only ends its own connection.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
from dataclasses import dataclass

import trio

from . import protocol
from .config import NodeConfig
from .errors import FrameError
from .handlers import RequestHandlers
from .metrics import NodeMetrics
from .protocol import FrameDecoder, RequestCode, ResponseCode

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


def auth_digest(secret: str, nonce: bytes) -> bytes:
    """HMAC-SHA256(secret, nonce): what a client answers the challenge with."""
    return hmac.new(secret.encode("utf-8"), nonce, hashlib.sha256).digest()


class ClientServer:
    """Serves the client protocol on any trio stream (TCP or in-memory)."""

    def __init__(self, config: NodeConfig, handlers: RequestHandlers, metrics: NodeMetrics) -> None:
        self.config = config
        self.handlers = handlers
        self.metrics = metrics
        self.connections = 0
        self._accepted = self._refused = self._frame_errors = self._auth_failures = 0

    def statistics(self) -> ServerStatistics:
        return ServerStatistics(self.connections, self._accepted, self._refused, self._frame_errors,
                                self._auth_failures)

    async def handle_connection(self, stream: trio.abc.Stream) -> None:
        """Serve one connection until it closes; never raises for anything the peer does."""
        if self.connections >= self.config.connections_max:
            self._refused += 1
            await _send_and_close(stream, protocol.error_reply(
                None, ResponseCode.SYSTEM_BUSY, f"the node holds {self.connections} connections, its limit"))
            return
        self.connections += 1
        self._accepted += 1
        self.metrics.connections.inc()
        self.metrics.connections_total.inc()
        try:
            await self._serve(stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the peer went away during auth: nothing of it to keep
        except Exception:  # a bug in this node: it ends this connection, never the node
            log.exception("connection failed")
        finally:
            self.connections -= 1
            self.metrics.connections.dec()
            await trio.aclose_forcefully(stream)

    async def _serve(self, stream: trio.abc.Stream) -> None:
        decoder = FrameDecoder()
        early_frames: list = []
        if self.config.secret is not None:
            early_frames = await self._authenticate(stream, decoder)
            if early_frames is None:
                return
        send_replies, replies = trio.open_memory_channel[bytes](self.config.in_flight_requests_max)
        in_flight = trio.Semaphore(self.config.in_flight_requests_max)
        async with trio.open_nursery() as connection:
            connection.start_soon(self._write_replies, stream, replies, connection.cancel_scope)
            async with send_replies:
                async with trio.open_nursery() as deferred:
                    ending = await self._read_requests(stream, decoder, early_frames, send_replies, in_flight,
                                                       deferred)
                    if ending == "gone":
                        connection.cancel_scope.cancel()
                    elif ending == "broken":
                        deferred.cancel_scope.cancel()  # the error reply goes out, then the connection closes
            # "eof": the peer half-closed; the writer ends once every deferred reply is sent

    async def _read_requests(self, stream, decoder: FrameDecoder, frames: list, send_replies,
                             in_flight: trio.Semaphore, deferred: trio.Nursery) -> str:
        """Hand frames to the handlers until the peer closes ("eof"), vanishes ("gone") or
        breaks the framing ("broken")."""
        while True:
            for payload in frames:
                outcome = self.handlers.dispatch(payload)
                if isinstance(outcome, dict):
                    try:
                        await send_replies.send(_encode_reply(outcome))
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        return "gone"  # the writer stopped: the peer is gone
                else:
                    await in_flight.acquire()
                    deferred.start_soon(self._run_deferred, outcome, send_replies.clone(), in_flight)
            if decoder.error is not None:
                self._frame_errors += 1
                code = ResponseCode.FRAME_TOO_LARGE if isinstance(decoder.error, protocol.FrameTooLarge) \
                    else ResponseCode.BAD_FRAME
                try:
                    await send_replies.send(protocol.encode_frame(protocol.error_reply(None, code,
                                                                                       str(decoder.error))))
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return "gone"
                return "broken"
            try:
                data = await stream.receive_some(RECEIVE_BYTES)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return "gone"
            if not data:
                return "eof"
            frames = decoder.feed(data)

    async def _run_deferred(self, deferred, send_replies, in_flight: trio.Semaphore) -> None:
        async with send_replies:
            try:
                reply = await deferred()
            finally:
                in_flight.release()
            try:
                await send_replies.send(_encode_reply(reply))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass

    async def _write_replies(self, stream, replies, connection_scope: trio.CancelScope) -> None:
        async with replies:
            try:
                async for frame in replies:
                    batch = [frame]
                    while len(batch) < WRITE_BATCH_FRAMES_MAX:
                        try:
                            batch.append(replies.receive_nowait())
                        except (trio.WouldBlock, trio.EndOfChannel):
                            break
                    await stream.send_all(b"".join(batch))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                connection_scope.cancel()  # cannot answer any more: stop reading too

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
                    return None
                try:
                    frames = decoder.feed_strict(data)
                except FrameError as error:
                    self._auth_failures += 1
                    await _send_and_close(stream, protocol.error_reply(None, ResponseCode.BAD_FRAME, str(error)))
                    return None
        if not frames:
            self._auth_failures += 1
            await _send_and_close(stream, protocol.error_reply(None, ResponseCode.AUTH_REQUIRED,
                                                               "no AUTH reply to the challenge in time"))
            return None
        first = frames[0]
        opaque = protocol.opaque_of(first)
        if not isinstance(first, dict) or first.get("code") != RequestCode.AUTH:
            self._auth_failures += 1
            await _send_and_close(stream, protocol.error_reply(
                opaque, ResponseCode.AUTH_REQUIRED, "this node requires authentication: answer the challenge first"))
            return None
        digest = first.get("digest")
        if not isinstance(digest, bytes) or not hmac.compare_digest(digest, auth_digest(self.config.secret, nonce)):
            self._auth_failures += 1
            await _send_and_close(stream, protocol.error_reply(opaque, ResponseCode.AUTH_FAILED,
                                                               "wrong secret: HMAC does not match"))
            return None
        await stream.send_all(_encode_reply(protocol.reply(opaque, authenticated=True)))
        return frames[1:]


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
