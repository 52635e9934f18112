"""The trio client library: Connection (pipelined requests), Admin, Producer, Consumer.

    async with open_admin("127.0.0.1:10911") as admin:
        await admin.create_topic("orders", queue_count=4)
    async with open_producer("127.0.0.1:10911") as producer:
        result = await producer.send("orders", b"...", keys=["order-1"])
    async with open_consumer("127.0.0.1:10911", "orders", "billing", from_beginning=True) as consumer:
        async for message in consumer: ...; await consumer.commit()

Outcomes are never guessed. A send the node refused before writing (NOT_MASTER, busy, no
connection) is retried, bounded; a send whose request left but whose reply never came
(connection lost, timeout) raises UnknownOutcomeError with the messages' UNIQ_KEYs and is
never retried, so a retry can never silently store a message twice.
"""

from __future__ import annotations

import itertools
import math
import os
import select
from collections import deque
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import NamedTuple

import trio

from store.errors import exception_leaves, invariant

from . import protocol
from .config import split_address
from .errors import (AuthError, ConnectionLostError, FrameError, NotMasterError, RequestError, RequestTimeoutError,
                     UnknownOutcomeError)
from .protocol import FrameDecoder, RequestCode, ResponseCode
from .server import auth_digest
from .socket_io import read_now, receive_some, write_now

RECEIVE_BYTES = 256 * 1024
CONNECT_TIMEOUT_MS = 5_000
REQUEST_TIMEOUT_MS = 30_000
SEND_TIMEOUT_MS = 30_000    # to write one request frame (a node that stops reading)
RETRYABLE_CODES = ("NOT_MASTER", "SYSTEM_BUSY", "SERVICE_NOT_AVAILABLE")
_RESULT_COLUMNS = ("status", "queue_id", "queue_offset", "physical_offset", "message_id", "reason")
_new_tuple = tuple.__new__   # SendResult rows from zipped columns, without a call per field


# --- values ------------------------------------------------------------------------------
class SendResult(NamedTuple):
    """One message's outcome as the node reported it. A named tuple rather than a frozen
    dataclass: a batch's results are made from the reply's columns in one C-level pass
    (see Producer._resolve), where a frozen dataclass costs ~0.7 µs per message."""

    status: str
    queue_id: int
    queue_offset: int
    physical_offset: int
    message_id: str
    uniq_key: str
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "PUT_OK"


@dataclass(frozen=True, slots=True)
class ReceivedMessage:
    """A message as pulled or queried."""

    topic: str
    queue_id: int
    queue_offset: int
    physical_offset: int
    message_id: str
    body: bytes
    properties: dict
    born_timestamp: int
    store_timestamp: int
    born_host: str = ""
    store_host: str = ""
    flag: int = 0

    @property
    def keys(self) -> list[str]:
        return [key for key in self.properties.get("KEYS", "").split(" ") if key]

    @property
    def tags(self) -> str | None:
        return self.properties.get("TAGS")

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get("UNIQ_KEY")

    @classmethod
    def from_wire(cls, item: dict) -> "ReceivedMessage":
        return cls(item["topic"], item["queue_id"], item["queue_offset"], item["physical_offset"],
                   item["message_id"], item["body"], item.get("properties", {}), item["born_timestamp"],
                   item["store_timestamp"], item.get("born_host", ""), item.get("store_host", ""),
                   item.get("flag", 0))

    def to_json(self) -> dict:
        body = self.body.decode("utf-8", errors="replace")
        return {"topic": self.topic, "queue_id": self.queue_id, "queue_offset": self.queue_offset,
                "physical_offset": self.physical_offset, "message_id": self.message_id, "keys": self.keys,
                "tags": self.tags, "uniq_key": self.uniq_key, "born_timestamp": self.born_timestamp,
                "store_timestamp": self.store_timestamp, "body_bytes": len(self.body), "body": body}


# UNIQ_KEY, the client's id of a message, made as RocketMQ's client makes it: a prefix
# unique to the process and a counter, 32 hex digits. The prefix is 64 random bits (drawn
# again in a forked child), so keys of different processes collide with odds of about
# processes**2 / 2**65; one process never repeats a key. Far cheaper than 16 random bytes
# per message (a system call each).
_uniq_key_prefix = os.urandom(8).hex().upper()
_uniq_key_counter = itertools.count()


def new_uniq_key() -> str:
    """A fresh UNIQ_KEY (32 upper-case hex digits)."""
    return f"{_uniq_key_prefix}{next(_uniq_key_counter):016X}"


def _new_uniq_key_prefix() -> None:
    global _uniq_key_prefix
    _uniq_key_prefix = os.urandom(8).hex().upper()


os.register_at_fork(after_in_child=_new_uniq_key_prefix)


@dataclass(slots=True, init=False)
class OutgoingMessage:
    """A message to send. ``queue_id`` None lets the node pick (round robin);
    ``uniq_key`` None gets a new one (new_uniq_key)."""

    body: bytes
    keys: list[str] | tuple[str, ...]
    tags: str | None
    properties: dict[str, str]
    queue_id: int | None
    uniq_key: str

    # written out: the generated __init__'s default factories cost as much as the rest of it
    def __init__(self, body: bytes, keys: list[str] | tuple[str, ...] = (), tags: str | None = None,
                 properties: dict[str, str] | None = None, queue_id: int | None = None,
                 uniq_key: str | None = None) -> None:
        self.body = body
        self.keys = keys
        self.tags = tags
        self.properties = {} if properties is None else properties
        self.queue_id = queue_id
        self.uniq_key = f"{_uniq_key_prefix}{next(_uniq_key_counter):016X}" if uniq_key is None else uniq_key

    def to_wire(self) -> dict:
        item: dict = {"body": self.body, "properties": self.wire_properties()}
        if self.keys:
            item["keys"] = list(self.keys)
        if self.tags:
            item["tags"] = self.tags
        if self.queue_id is not None:
            item["queue_id"] = self.queue_id
        return item

    def wire_properties(self) -> dict[str, str]:
        """The properties as sent: the message's own and its UNIQ_KEY."""
        properties = self.properties
        return {**properties, "UNIQ_KEY": self.uniq_key} if properties else {"UNIQ_KEY": self.uniq_key}

    @property
    def size_bytes(self) -> int:
        return len(self.body) + 64


def send_fields(messages: list[OutgoingMessage]) -> dict:
    """A SEND's messages: ``message_columns`` (a list per field) when every one is plain, a
    body and properties; ``messages`` (a map each) when any carries keys, tags or a queue."""
    if any(message.keys or message.tags or message.queue_id is not None for message in messages):
        return {"messages": [message.to_wire() for message in messages]}
    return {"message_columns": {"body": [message.body for message in messages],
                                "properties": [message.wire_properties() for message in messages]}}


def error_from_reply(reply: dict) -> RequestError:
    """The typed exception for an error reply."""
    try:
        name = ResponseCode(reply.get("code")).name
    except ValueError:
        name = f"CODE_{reply.get('code')}"
    message = str(reply.get("error", ""))
    if name == "NOT_MASTER":
        return NotMasterError(message, reply.get("master_address"))
    return RequestError(name, message)


@dataclass(frozen=True, slots=True)
class ConnectionStatistics:
    """How a connection's replies were read: by the waiting callers themselves (leaders),
    or by its background task after a leader handed the role over."""

    requests_submitted: int
    reads_by_callers: int
    reads_in_background: int
    handovers: int


# --- connection --------------------------------------------------------------------------
# Who reads a connection's replies. One task at a time reads (trio's rule for a stream):
#
#   None         nobody: the next caller that waits for a reply reads itself (the leader)
#   a _Pending   that request's caller reads until its own reply is in, handing the
#                replies of others to their waiters, then gives the role up
#   _BACKGROUND  the connection's own task (Connection.run) reads for the waiters
#
# A caller alone on the connection so gets its reply with one wake-up (the socket's)
# instead of two (the reading task's, then its own). A leader that leaves while other
# requests wait for replies (answered, timed out, cancelled) hands the role to the
# background task, which reads while any request waits and then gives it up.
_BACKGROUND = "background"


class _Pending:
    __slots__ = ("opaque", "connection", "event", "reply", "error", "timeout_ms")

    def __init__(self, opaque: int, connection: "Connection") -> None:
        self.opaque = opaque
        self.connection = connection
        self.event = trio.Event()
        self.reply: dict | None = None
        self.error: Exception | None = None
        self.timeout_ms: int | None = None   # set while the connection's deadline task watches it

    async def wait(self, timeout_ms: int | None = REQUEST_TIMEOUT_MS) -> dict:
        """The SUCCESS reply's map; raises the typed error, or RequestTimeoutError."""
        if not self.event.is_set():
            connection = self.connection
            if timeout_ms is not None:
                connection._watch_deadline(self, timeout_ms)
            if connection._reader is None:
                await connection._read_until_answered(self)
            else:
                await self.event.wait()
        if self.error is not None:
            raise self.error
        if self.reply.get("code") != ResponseCode.SUCCESS:
            raise error_from_reply(self.reply)
        return self.reply


class Connection:
    """One connection to a node; many requests in flight at once, matched by opaque."""

    def __init__(self, stream: trio.abc.Stream, address: str, decoder: FrameDecoder) -> None:
        self.stream = stream
        self.address = address
        self._decoder = decoder
        # a socket stream is read and written here without trio's stream wrapper
        self._socket = stream.socket if type(stream) is trio.SocketStream else None
        self._idle_poll = select.poll()   # has the node sent anything (or closed) since the last read?
        if self._socket is not None:
            self._idle_poll.register(self._socket.fileno(), select.POLLIN)
        self._pending: dict[int, _Pending] = {}
        self._reader: _Pending | str | None = None      # who reads replies (see above)
        self._leader_scope: trio.CancelScope | None = None
        self._background_wanted = trio.lowlevel.ParkingLot()
        # reply deadlines: per timeout, (deadline, opaque) in the order they were set, so each
        # queue's head expires first; one task sleeps until the earliest head (see run)
        self._deadlines: dict[int, deque[tuple[float, int]]] = {}
        self._deadline_scope: trio.CancelScope | None = None
        self._deadline_idle_s = math.inf
        self._next_opaque = 1
        self._send_lock = trio.Lock()
        self._scope: trio.CancelScope | None = None
        self.closed_error: Exception | None = None
        self._caller_reads = self._background_reads = self._handovers = 0

    def statistics(self) -> ConnectionStatistics:
        return ConnectionStatistics(self._next_opaque - 1, self._caller_reads, self._background_reads,
                                    self._handovers)

    @property
    def closed(self) -> bool:
        return self.closed_error is not None

    async def submit(self, code: RequestCode, **fields) -> _Pending:
        """Send one request; returns its pending reply. Raises ConnectionLostError if not sent.

        A frame is written whole or the connection fails: a write cut short would garble
        every later frame, so the write is shielded from the caller's cancellation and
        bounded by SEND_TIMEOUT_MS instead. While no other write is under way the socket
        is tried directly first (socket_io.py): a frame it takes whole leaves with no
        scheduling point and no cancel scope (the wait for the reply is the checkpoint).

        While nobody reads the connection, what the node sent since the last read is
        looked at first: a connection the node closed is found here, before the request
        is written (so it is surely not sent), not after it (its outcome unknown).
        """
        if self._reader is None and self._socket is not None and self.closed_error is None \
                and self._idle_poll.poll(0):
            self._read_while_idle()
        if self.closed_error is not None:
            raise ConnectionLostError(f"connection to {self.address} is closed: {self.closed_error}")
        opaque = self._next_opaque
        self._next_opaque += 1
        frame = protocol.encode_frame({"code": int(code), "opaque": opaque, **fields})
        # The send lock orders writes that wait. One that does not wait (the socket takes
        # the frame whole, with no checkpoint in between) needs no lock: nobody can see it.
        locked = self._send_lock.locked()
        if locked:
            await self._send_lock.acquire()   # a write is under way: queue behind it, in order
        pending = self._pending[opaque] = _Pending(opaque, self)
        try:
            sent = write_now(self.stream, frame)
            if sent == len(frame):
                return pending
            if not locked:
                self._send_lock.acquire_nowait()  # free: no checkpoint since it was looked at
                locked = True
            with trio.CancelScope(shield=True) as scope:
                scope.deadline = trio.current_time() + SEND_TIMEOUT_MS / 1000
                await self._write_rest(memoryview(frame)[sent:])
            if scope.cancelled_caught:
                self._fail_all(ConnectionLostError(f"connection to {self.address}: a request could not be "
                                                   f"written within {SEND_TIMEOUT_MS} ms"))
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as error:
            self._fail_all(ConnectionLostError(f"connection to {self.address} lost while sending: {error}"))
        finally:
            if locked:
                self._send_lock.release()
        return pending

    async def _write_rest(self, data: memoryview) -> None:
        """Write what the socket did not take at once (the caller holds the send lock)."""
        socket = self._socket
        if socket is None:
            await self.stream.send_all(data)
            return
        while data:
            try:
                await trio.lowlevel.wait_writable(socket)
            except trio.ClosedResourceError:
                if socket.fileno() < 0:
                    raise
                continue  # a leader was woken on this socket (see _wake): not closed, wait again
            data = data[write_now(self.stream, data):]

    def forget(self, pending: _Pending) -> None:
        """Stop waiting for ``pending``'s reply (answered, timed out or given up)."""
        self._pending.pop(pending.opaque, None)

    async def request(self, code: RequestCode, reply_timeout_ms: int | None = REQUEST_TIMEOUT_MS, **fields) -> dict:
        """Send a request and wait for its SUCCESS reply (typed errors otherwise)."""
        pending = await self.submit(code, **fields)
        try:
            return await pending.wait(reply_timeout_ms)
        finally:
            self.forget(pending)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Read replies while requests wait and no caller reads (run in a nursery; ``aclose``
        stops it), and time out the requests whose reply is late."""
        with trio.CancelScope() as scope:
            self._scope = scope
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._expire_deadlines)
                task_status.started()
                try:
                    while True:
                        while self._reader is not _BACKGROUND:
                            await self._background_wanted.park()
                        while self._pending:
                            data = await receive_some(self.stream, RECEIVE_BYTES)
                            self._background_reads += 1
                            self._take(data)
                        self._reader = None
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError,
                        ConnectionLostError, FrameError) as error:
                    self._fail_all(self._lost_error(error))
                nursery.cancel_scope.cancel()
        if self.closed_error is None:
            self._fail_all(ConnectionLostError("connection closed by the client"))

    # --- reading -------------------------------------------------------------------------
    async def _read_until_answered(self, pending: _Pending) -> None:
        """Read as the leader until ``pending`` is answered, failed or timed out; then give
        the role up, to the background task if other requests still wait.

        Bytes read are decoded and their replies handed out before the next checkpoint, so
        a leader that is cancelled loses nobody's reply. The deadline task and
        ``_fail_all`` wake a leader that waits for bytes (see ``_wake``).
        """
        self._reader = pending
        socket = self._socket
        try:
            if socket is not None:
                while not pending.event.is_set():
                    # the reply cannot be there yet (the request just left): wait, then read
                    try:
                        await trio.lowlevel.wait_readable(socket)
                    except trio.ClosedResourceError:
                        if socket.fileno() < 0:
                            raise
                        continue  # woken by _wake while the socket is open: the loop's condition says why
                    data = read_now(socket, RECEIVE_BYTES)
                    if data is not None:
                        self._caller_reads += 1
                        self._take(data)
            else:
                with trio.CancelScope() as self._leader_scope:
                    while not pending.event.is_set():
                        data = await self.stream.receive_some(RECEIVE_BYTES)
                        self._caller_reads += 1
                        self._take(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError,
                ConnectionLostError, FrameError) as error:
            self._fail_all(self._lost_error(error))
        finally:
            self._leader_scope = None
            self._reader = None
            if self.closed_error is None and len(self._pending) > (pending.opaque in self._pending):
                self._reader = _BACKGROUND
                self._handovers += 1
                self._background_wanted.unpark()

    def _read_while_idle(self) -> None:
        """With nobody reading: take what the node sent (frames, or its close) without waiting."""
        try:
            data = read_now(self._socket, RECEIVE_BYTES)
            if data is not None:
                self._take(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError,
                ConnectionLostError, FrameError) as error:
            self._fail_all(self._lost_error(error))

    def _take(self, data: bytes) -> None:
        """Hand out the replies in ``data``; ConnectionLostError at the end of the stream."""
        if not data:
            raise ConnectionLostError(f"{self.address} closed the connection")
        for reply in self._decoder.feed_strict(data):
            self._on_reply(reply)

    def _lost_error(self, error: Exception) -> ConnectionLostError:
        if isinstance(error, ConnectionLostError):
            return error
        if isinstance(error, FrameError):
            return ConnectionLostError(f"{self.address} sent a broken frame: {error}")
        return ConnectionLostError(f"connection to {self.address} lost: {error}")

    # --- reply deadlines -----------------------------------------------------------------
    # A cancel scope per request (trio.move_on_after) costs more than the rest of a small
    # request's bookkeeping. Requests of one timeout expire in the order they were sent, so
    # a queue per timeout and one task that sleeps until the earliest head do the same
    # work: in steady traffic that task wakes about once per timeout period, and a new
    # deadline never moves its wake-up (it is later than every earlier one of its timeout).
    def _watch_deadline(self, pending: _Pending, timeout_ms: int) -> None:
        deadline = trio.current_time() + timeout_ms / 1000
        pending.timeout_ms = timeout_ms
        queue = self._deadlines.get(timeout_ms)
        if queue is None:
            queue = self._deadlines[timeout_ms] = deque()
            # with nothing to watch the task sleeps this long: no new deadline is earlier
            self._deadline_idle_s = min(self._deadline_idle_s, timeout_ms / 1000)
        queue.append((deadline, pending.opaque))
        scope = self._deadline_scope
        if scope is not None and deadline < scope.deadline:
            scope.deadline = deadline

    def _drop_answered(self, timeout_ms: int) -> None:
        """Pop the heads of a deadline queue whose requests are answered or forgotten."""
        queue = self._deadlines.get(timeout_ms)
        pending = self._pending
        while queue and queue[0][1] not in pending:
            queue.popleft()

    async def _expire_deadlines(self) -> None:
        while True:
            now = trio.current_time()
            wake_at = now + self._deadline_idle_s  # no deadline set after now is earlier
            for timeout_ms, queue in self._deadlines.items():
                self._drop_answered(timeout_ms)
                while queue and queue[0][0] <= now:
                    _, opaque = queue.popleft()
                    pending = self._pending.pop(opaque, None)
                    if pending is not None:
                        pending.error = RequestTimeoutError(f"no reply within {timeout_ms} ms; the outcome is unknown")
                        self._wake(pending)
                    self._drop_answered(timeout_ms)
                if queue:
                    wake_at = min(wake_at, queue[0][0])
            with trio.CancelScope(deadline=wake_at) as scope:
                self._deadline_scope = scope
                await trio.sleep_forever()
            self._deadline_scope = None

    def _wake(self, pending: _Pending) -> None:
        """Wake ``pending``'s caller: from its event, or from its read if it is the leader.

        A leader on a socket waits in ``wait_readable``; a cancel scope around each such
        wait would cost more than the rest of a request's bookkeeping, so it is woken with
        ``notify_closing``, which wakes the socket's waiters with ClosedResourceError and
        closes nothing. Nobody else waits on the socket then: the background task reads
        only while no leader does, and a write that waits (``_write_rest``) waits again.
        """
        pending.event.set()
        if self._reader is pending:
            if self._socket is not None:
                trio.lowlevel.notify_closing(self._socket)
            else:
                self._leader_scope.cancel()

    def _on_reply(self, reply: object) -> None:
        if not isinstance(reply, dict):
            raise FrameError("a reply is not a map")
        opaque = reply.get("opaque")
        pending = self._pending.pop(opaque, None) if isinstance(opaque, int) else None
        if pending is not None:
            pending.reply = reply
            pending.event.set()   # a leader reading its own reply sees it when its read returns
            if pending.timeout_ms is not None:
                self._drop_answered(pending.timeout_ms)
        elif opaque is None and reply.get("code") != ResponseCode.SUCCESS:
            # a connection-level error (bad frame, busy, auth): the node closes the connection
            self._fail_all(error_from_reply(reply))

    def _fail_all(self, error: Exception) -> None:
        if self.closed_error is None:
            self.closed_error = error
        pending, self._pending = self._pending, {}
        for item in pending.values():
            item.error = error
            self._wake(item)

    async def aclose(self) -> None:
        if self._scope is not None:
            self._scope.cancel()
        self._fail_all(ConnectionLostError("connection closed by the client"))
        await trio.aclose_forcefully(self.stream)


def _sole_error(group: BaseExceptionGroup) -> BaseException:
    """The one exception inside nested groups, or the group itself if there are several.

    The client's context managers run internal nurseries; a caller should see the
    NotMasterError or AuthError it can act on, not a group around it.
    """
    leaves = exception_leaves(group)
    return leaves[0] if len(leaves) == 1 else group


async def connect(address: str, nursery: trio.Nursery, *, secret: str | None = None,
                  connect_timeout_ms: int = CONNECT_TIMEOUT_MS) -> Connection:
    """Open a Connection whose reply reader runs in ``nursery``. ConnectionLostError if none."""
    host, port = split_address(address)
    try:
        with trio.fail_after(connect_timeout_ms / 1000):
            stream = await trio.open_tcp_stream(host, port)
    except (OSError, trio.TooSlowError) as error:
        raise ConnectionLostError(f"cannot connect to {address}: {error or 'timed out'}") from None
    return await connect_stream(stream, address, nursery, secret=secret, auth_timeout_ms=connect_timeout_ms)


async def connect_stream(stream: trio.abc.Stream, address: str, nursery: trio.Nursery, *,
                         secret: str | None = None, auth_timeout_ms: int = CONNECT_TIMEOUT_MS) -> Connection:
    """A Connection over any trio stream (in-memory streams in tests); answers the auth challenge."""
    decoder = FrameDecoder()
    if secret is not None:
        try:
            with trio.fail_after(auth_timeout_ms / 1000):
                await _answer_challenge(stream, decoder, secret)
        except (trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError, OSError) as error:
            await trio.aclose_forcefully(stream)
            raise AuthError(f"authentication with {address} failed: {type(error).__name__} {error}") from None
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise
    connection = Connection(stream, address, decoder)
    await nursery.start(connection.run)
    return connection


async def _answer_challenge(stream, decoder: FrameDecoder, secret: str) -> None:
    frames: list = []

    async def next_frame() -> dict:
        while not frames:
            data = await stream.receive_some(RECEIVE_BYTES)
            if not data:
                raise AuthError("the node closed the connection during authentication")
            frames.extend(decoder.feed_strict(data))
        return frames.pop(0)

    challenge = await next_frame()
    if challenge.get("code") != RequestCode.AUTH_CHALLENGE or not isinstance(challenge.get("nonce"), bytes):
        raise AuthError("the node sent no auth challenge (is a secret set on it?)")
    await stream.send_all(protocol.encode_frame({"code": int(RequestCode.AUTH), "opaque": 0,
                                                 "digest": auth_digest(secret, challenge["nonce"])}))
    answer = await next_frame()
    if answer.get("code") != ResponseCode.SUCCESS:
        raise AuthError(f"authentication refused: {answer.get('error')}")


@asynccontextmanager
async def open_connection(address: str, *, secret: str | None = None, connect_timeout_ms: int = CONNECT_TIMEOUT_MS):
    """``async with open_connection(addr) as connection:`` one Connection, closed on exit."""
    try:
        async with trio.open_nursery() as nursery:
            connection = await connect(address, nursery, secret=secret, connect_timeout_ms=connect_timeout_ms)
            try:
                yield connection
            finally:
                await connection.aclose()
    except BaseExceptionGroup as group:
        raise _sole_error(group) from None


# --- admin -------------------------------------------------------------------------------
class Admin:
    """Topics, offsets, queries and status over one Connection."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    async def create_topic(self, topic: str, queue_count: int = 4) -> dict:
        return await self.connection.request(RequestCode.TOPIC_CREATE, topic=topic, queue_count=queue_count)

    async def list_topics(self, include_system: bool = False) -> dict[str, dict]:
        reply = await self.connection.request(RequestCode.TOPIC_LIST, include_system=include_system)
        return reply["topics"]

    async def status(self) -> dict:
        reply = await self.connection.request(RequestCode.STATUS)
        return {k: v for k, v in reply.items() if k not in ("code", "opaque", "flags")}

    async def queue_offsets(self, topic: str, queue_id: int) -> tuple[int, int]:
        reply = await self.connection.request(RequestCode.QUEUE_OFFSETS, topic=topic, queue_id=queue_id)
        return reply["min_offset"], reply["max_offset"]

    async def query_by_key(self, topic: str, key: str, begin_ms: int = 0, end_ms: int = 2**63 - 1,
                           max_count: int = 32) -> list[ReceivedMessage]:
        reply = await self.connection.request(RequestCode.QUERY_BY_KEY, topic=topic, key=key, begin_ms=begin_ms,
                                              end_ms=end_ms, max_count=max_count)
        return [ReceivedMessage.from_wire(item) for item in reply["messages"]]

    async def query_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        reply = await self.connection.request(RequestCode.QUERY_BY_TIME, topic=topic, queue_id=queue_id,
                                              timestamp_ms=timestamp_ms)
        return reply["offset"]

    async def query_by_id(self, message_id: str) -> ReceivedMessage:
        reply = await self.connection.request(RequestCode.QUERY_BY_ID, message_id=message_id)
        return ReceivedMessage.from_wire(reply["message"])

    async def commit_offsets(self, group: str, topic: str, offsets: dict[int, int]) -> None:
        await self.connection.request(RequestCode.COMMIT_OFFSETS, group=group, topic=topic, offsets=offsets)

    async def query_offsets(self, group: str, topic: str) -> dict[int, int]:
        reply = await self.connection.request(RequestCode.QUERY_OFFSETS, group=group, topic=topic)
        return reply["offsets"]

    async def pull(self, topic: str, queue_id: int, offset: int, max_count: int = 32, timeout_ms: int = 0,
                   max_bytes: int = 4 * 1024 * 1024) -> dict:
        """One pull; ``messages`` in the reply are ReceivedMessage. Long-polls up to ``timeout_ms``."""
        reply = await self.connection.request(RequestCode.PULL, reply_timeout_ms=timeout_ms + REQUEST_TIMEOUT_MS,
                                              timeout_ms=timeout_ms, topic=topic, queue_id=queue_id, offset=offset,
                                              max_count=max_count, max_bytes=max_bytes)
        reply["messages"] = [ReceivedMessage.from_wire(item) for item in reply["messages"]]
        return reply


@asynccontextmanager
async def open_admin(address: str, *, secret: str | None = None):
    async with open_connection(address, secret=secret) as connection:
        yield Admin(connection)


# --- producer ----------------------------------------------------------------------------
class _Batch:
    """Messages of one topic that travel in one request, and their outcome (one event for
    the whole batch: a waiter wakes once, however many messages it holds)."""

    __slots__ = ("topic", "messages", "size_bytes", "done", "results", "errors")

    def __init__(self, topic: str, messages: list[OutgoingMessage]) -> None:
        self.topic = topic
        self.messages = messages
        self.size_bytes = 0   # of the messages added (only send's batches are closed by size)
        self.done = trio.Event()
        self.results: list[SendResult] | None = None
        self.errors: list[Exception] | None = None

    def add(self, message: OutgoingMessage) -> int:
        """Add a message; its index in the batch."""
        self.messages.append(message)
        self.size_bytes += message.size_bytes
        return len(self.messages) - 1

    def resolve(self, results: list[SendResult]) -> None:
        self.results = results
        self.done.set()

    def fail(self, errors: list[Exception]) -> None:
        """One error per message, in order."""
        self.errors = errors
        self.done.set()

    def outcome(self, index: int) -> SendResult:
        """Message ``index``'s SendResult, or its error raised; the batch must be done."""
        invariant(self.done.is_set(), "a batch's outcome is read only once it is done")
        if self.errors is not None:
            raise self.errors[index]
        return self.results[index]

    def outcomes(self) -> list[SendResult]:
        """Every message's SendResult, or the first message's error raised."""
        invariant(self.done.is_set(), "a batch's outcome is read only once it is done")
        if self.errors is not None:
            raise self.errors[0]
        return self.results


@dataclass(frozen=True, slots=True)
class ProducerStatistics:
    sent_messages: int
    failed_messages: int
    unknown_messages: int
    batches: int
    retries: int
    sent_at_once: int   # batches sent from the caller's task, without the batching tasks


class Producer:
    """Batches messages per topic (by count, bytes and linger), pipelines batches on one
    connection (at most ``in_flight_max`` unanswered), and retries only what was surely
    not written. Batches leave in the order they were closed.

    Fast path: a ``send`` to a topic with no open batch and no request in flight, or a
    ``send_batch``, while no closed batch waits to leave and the in-flight window has room,
    is sent from the caller's own task at once, with no linger and no hop through the
    batching tasks; concurrent sends to a busy topic still gather into batches.
    """

    def __init__(self, bootstrap: str, nursery: trio.Nursery, *, secret: str | None = None,
                 batch_count_max: int = 64, batch_bytes_max: int = 1024 * 1024, linger_ms: float = 2,
                 in_flight_max: int = 16, retries_max: int = 3, retry_backoff_ms: int = 100,
                 request_timeout_ms: int = REQUEST_TIMEOUT_MS) -> None:
        if not 1 <= batch_count_max <= protocol.BATCH_COUNT_MAX:
            raise ValueError(f"batch_count_max must be in [1, {protocol.BATCH_COUNT_MAX}]")
        self.address = bootstrap
        self._nursery = nursery
        self._secret = secret
        self.batch_count_max = batch_count_max
        self.batch_bytes_max = min(batch_bytes_max, protocol.FRAME_BYTES_MAX // 2)
        self.linger_ms = linger_ms
        self.retries_max = retries_max
        self.retry_backoff_ms = retry_backoff_ms
        self.request_timeout_ms = request_timeout_ms
        self.in_flight_max = in_flight_max
        self._in_flight = trio.Semaphore(in_flight_max)
        self._open: dict[str, _Batch] = {}
        self._send_batches, self._batches = trio.open_memory_channel[_Batch](in_flight_max)
        self._closed_unsent = 0                # batches closed whose request has not left yet
        self._topics_in_flight: dict[str, int] = {}
        self._closing = False
        self._connection: Connection | None = None
        self._connect_lock = trio.Lock()
        self._sent = self._failed = self._unknown = self._batch_count = self._retries = self._at_once = 0

    def statistics(self) -> ProducerStatistics:
        return ProducerStatistics(self._sent, self._failed, self._unknown, self._batch_count, self._retries,
                                  self._at_once)

    # --- public --------------------------------------------------------------------------
    async def send(self, topic: str, body: bytes, *, keys=(), tags: str | None = None,
                   properties: dict[str, str] | None = None, queue_id: int | None = None) -> SendResult:
        """Send one message (batched with others); its SendResult, or UnknownOutcomeError / RequestError."""
        message = OutgoingMessage(body, tuple(keys), tags, dict(properties or {}), queue_id)
        batch = self._open.get(topic)
        if batch is None and not self._topics_in_flight.get(topic) and self._may_send_at_once():
            batch = _Batch(topic, [message])
            await self._send_at_once(batch)
            return batch.outcome(0)
        if batch is None:
            batch = self._open[topic] = _Batch(topic, [])
            self._nursery.start_soon(self._linger, batch)
        index = batch.add(message)
        if len(batch.messages) >= self.batch_count_max or batch.size_bytes >= self.batch_bytes_max:
            await self._close_batch(topic)
        await batch.done.wait()
        return batch.outcome(index)

    async def send_batch(self, topic: str, messages: list[OutgoingMessage]) -> list[SendResult]:
        """Send these messages as one frame (no linger); one SendResult each, in order (the
        first message's error raised if the batch failed)."""
        batch = _Batch(topic, list(messages))
        if self._may_send_at_once():
            await self._send_at_once(batch)
        else:
            await self._enqueue(batch)
            await batch.done.wait()
        return batch.outcomes()

    async def flush(self) -> None:
        """Close every open batch now."""
        for topic in list(self._open):
            await self._close_batch(topic)

    # --- batching ------------------------------------------------------------------------
    def _may_send_at_once(self) -> bool:
        # nothing closed before waits to leave (batches leave in the order they were
        # closed) and the in-flight window has room (so taking a slot never waits)
        return self._closed_unsent == 0 and self._in_flight.value > 0 and not self._closing

    async def _send_at_once(self, batch: _Batch) -> None:
        self._in_flight.acquire_nowait()
        self._closed_unsent += 1
        self._at_once += 1
        await self._send_with_retries(batch)

    async def _linger(self, batch: _Batch) -> None:
        await trio.sleep(self.linger_ms / 1000)
        if self._open.get(batch.topic) is batch:
            await self._close_batch(batch.topic)

    async def _close_batch(self, topic: str) -> None:
        batch = self._open.pop(topic, None)
        if batch is not None and batch.messages:
            await self._enqueue(batch)

    async def _enqueue(self, batch: _Batch) -> None:
        self._closed_unsent += 1
        try:
            await self._send_batches.send(batch)
        except BaseException:
            self._closed_unsent -= 1
            raise

    # --- sending -------------------------------------------------------------------------
    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Send closed batches in order (run in the producer's nursery)."""
        task_status.started()
        async with self._batches:
            async for batch in self._batches:
                await self._in_flight.acquire()
                self._nursery.start_soon(self._send_with_retries, batch)

    async def _current_connection(self) -> Connection:
        connection = self._connection
        if connection is not None and not connection.closed and not self._connect_lock.locked():
            return connection
        async with self._connect_lock:
            if self._connection is None or self._connection.closed:
                self._connection = await connect(self.address, self._nursery, secret=self._secret)
            return self._connection

    async def _send_with_retries(self, batch: _Batch) -> None:
        """Send ``batch`` (holding an in-flight slot, counted in ``_closed_unsent``) and
        resolve it; retries only refusals that were surely not written."""
        topic = batch.topic
        self._topics_in_flight[topic] = self._topics_in_flight.get(topic, 0) + 1
        unsent = True
        try:
            self._batch_count += 1
            wire = send_fields(batch.messages)
            for attempt in range(self.retries_max + 1):
                try:
                    connection = await self._current_connection()
                    pending = await connection.submit(RequestCode.SEND, topic=topic, result_columns=True, **wire)
                except ConnectionLostError as error:
                    if attempt == self.retries_max:
                        self._fail(batch, error)
                        return
                    await self._back_off(attempt)
                    continue  # nothing was sent (submit raises only before writing): safe to retry
                if unsent:
                    unsent = False
                    self._closed_unsent -= 1
                try:
                    reply = await pending.wait(self.request_timeout_ms)
                except (ConnectionLostError, RequestTimeoutError) as error:
                    self._unknown_outcome(batch, connection.address, str(error))
                    return
                except RequestError as error:
                    if error.code not in RETRYABLE_CODES or attempt == self.retries_max:
                        self._fail(batch, error)
                        return
                    if isinstance(error, NotMasterError) and error.master_address:
                        await self._switch_to(error.master_address)
                    await self._back_off(attempt)
                    continue  # refused before any write: safe to retry
                except trio.Cancelled:
                    # the caller gave up (fast path): the request left, so its outcome is unknown
                    self._unknown_outcome(batch, connection.address, "the sending task was cancelled")
                    raise
                finally:
                    connection.forget(pending)
                self._resolve(batch, reply)
                return
        finally:
            if unsent:
                self._closed_unsent -= 1
            self._topics_in_flight[topic] -= 1
            if not self._topics_in_flight[topic]:
                del self._topics_in_flight[topic]
            self._in_flight.release()

    async def _switch_to(self, address: str) -> None:
        async with self._connect_lock:
            if self._connection is not None and self._connection.address != address:
                await self._connection.aclose()
                self._connection = None
            self.address = address

    async def _back_off(self, attempt: int) -> None:
        self._retries += 1
        await trio.sleep(self.retry_backoff_ms * (2 ** attempt) / 1000)

    def _fail(self, batch: _Batch, error: Exception) -> None:
        self._failed += len(batch.messages)
        batch.fail([error] * len(batch.messages))

    def _unknown_outcome(self, batch: _Batch, address: str, why: str) -> None:
        self._unknown += len(batch.messages)
        keys = [message.uniq_key for message in batch.messages]
        batch.fail([UnknownOutcomeError(f"send to {address} has an unknown outcome ({why}); "
                                        f"query key {message.uniq_key} to find out", keys)
                    for message in batch.messages])

    def _resolve(self, batch: _Batch, reply: dict) -> None:
        columns = reply.get("result_columns")
        if columns is None:  # a node that answers with one map per message
            results = reply["results"]
            columns = {name: [item.get(name, "") for item in results] for name in _RESULT_COLUMNS}
        statuses = columns["status"]
        invariant(all(len(columns[name]) == len(batch.messages) for name in _RESULT_COLUMNS),
                  "a send reply has one result per message in each column")
        uniq_keys = [message.uniq_key for message in batch.messages]
        rows = zip(statuses, columns["queue_id"], columns["queue_offset"], columns["physical_offset"],
                   columns["message_id"], uniq_keys, columns["reason"])
        outcomes = list(map(_new_tuple, itertools.repeat(SendResult), rows))
        sent = statuses.count("PUT_OK")
        self._sent += sent
        self._failed += len(statuses) - sent
        batch.resolve(outcomes)

    async def aclose(self) -> None:
        await self.flush()
        self._closing = True
        await self._send_batches.aclose()
        if self._connection is not None:
            # wait for the answers in flight before closing their connection
            while self._in_flight.value < self.in_flight_max:
                await trio.sleep(0.001)
            await self._connection.aclose()


@asynccontextmanager
async def open_producer(bootstrap: str, **options):
    """``async with open_producer(addr, batch_count_max=64, linger_ms=2) as producer:``"""
    try:
        async with trio.open_nursery() as nursery:
            producer = Producer(bootstrap, nursery, **options)
            await nursery.start(producer.run)
            try:
                yield producer
            finally:
                with trio.CancelScope(shield=True), trio.move_on_after(producer.request_timeout_ms / 1000):
                    await producer.aclose()
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        raise _sole_error(group) from None


# --- consumer ----------------------------------------------------------------------------
class Consumer:
    """Pulls every queue of a topic (one long-polling loop per queue, all on one connection)
    and hands messages out in per-queue order. ``commit`` stores the positions of the
    messages handed out so far as the group's consumer offsets."""

    def __init__(self, admin: Admin, topic: str, group: str, *, max_count: int = 32,
                 long_poll_ms: int = 5_000, buffer_messages_max: int = 4096) -> None:
        self.admin = admin
        self.topic = topic
        self.group = group
        self.max_count = max_count
        self.long_poll_ms = long_poll_ms
        self.positions: dict[int, int] = {}
        self._committed: dict[int, int] = {}
        self._send, self._receive = trio.open_memory_channel[ReceivedMessage](buffer_messages_max)

    async def start_positions(self, from_beginning: bool, start_offsets: dict[int, int] | None) -> None:
        topics = await self.admin.list_topics()
        if self.topic not in topics:
            raise RequestError("TOPIC_NOT_EXIST", f"topic {self.topic!r} does not exist")
        committed = await self.admin.query_offsets(self.group, self.topic)
        for queue_id in range(topics[self.topic]["queue_count"]):
            if start_offsets and queue_id in start_offsets:
                self.positions[queue_id] = start_offsets[queue_id]
            elif queue_id in committed:
                self.positions[queue_id] = committed[queue_id]
            else:
                low, high = await self.admin.queue_offsets(self.topic, queue_id)
                self.positions[queue_id] = low if from_beginning else high
        # only what the node holds counts as committed: the first commit stores every
        # queue's start, so a restart never skips a queue's unread messages
        self._committed = {q: o for q, o in committed.items() if self.positions.get(q) == o}

    async def pull_queue(self, queue_id: int, offset: int) -> None:
        """Pull one queue forever from ``offset`` into the consumer's buffer."""
        while True:
            reply = await self.admin.pull(self.topic, queue_id, offset, self.max_count, self.long_poll_ms)
            for message in reply["messages"]:
                await self._send.send(message)
            if reply["status"] in ("OFFSET_TOO_SMALL", "OFFSET_OVERFLOW") or reply["messages"]:
                offset = reply["next_offset"]

    async def receive(self) -> ReceivedMessage:
        """The next message of any queue (per-queue order kept)."""
        message = await self._receive.receive()
        self.positions[message.queue_id] = message.queue_offset + 1
        return message

    def receive_nowait(self) -> ReceivedMessage:
        """The next message already buffered; trio.WouldBlock when there is none."""
        message = self._receive.receive_nowait()
        self.positions[message.queue_id] = message.queue_offset + 1
        return message

    def __aiter__(self):
        return self

    async def __anext__(self) -> ReceivedMessage:
        return await self.receive()

    async def commit(self) -> dict[int, int]:
        """Commit the positions that moved since the last commit; returns them."""
        changed = {q: o for q, o in self.positions.items() if self._committed.get(q) != o}
        if changed:
            await self.admin.commit_offsets(self.group, self.topic, changed)
            self._committed.update(changed)
        return changed


@asynccontextmanager
async def open_consumer(bootstrap: str, topic: str, group: str, *, secret: str | None = None,
                        from_beginning: bool = False, start_offsets: dict[int, int] | None = None, **options):
    """``async with open_consumer(addr, topic, group) as consumer: async for m in consumer: ...``

    Starts from ``start_offsets``, else the group's committed offsets, else the queue's
    first (``from_beginning``) or next message.
    """
    async with open_admin(bootstrap, secret=secret) as admin:
        consumer = Consumer(admin, topic, group, **options)
        await consumer.start_positions(from_beginning, start_offsets)
        try:
            async with trio.open_nursery() as nursery:
                for queue_id, offset in consumer.positions.items():
                    nursery.start_soon(consumer.pull_queue, queue_id, offset)
                try:
                    yield consumer
                finally:
                    nursery.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            raise _sole_error(group) from None
