"""Producer: batching, bounded retries of what surely did not leave, unknown outcomes never guessed."""

from __future__ import annotations

import itertools
from contextlib import asynccontextmanager
from dataclasses import dataclass

import trio

from store.errors import invariant

from ..errors import (AuthError, ConnectionLostError, NotMasterError, RequestError, RequestTimeoutError,
                      UnknownOutcomeError, UnsentError)
from ..wire import protocol
from ..wire.protocol import RequestCode
from .connection import REQUEST_TIMEOUT_MS, Connection, checked_busy_poll_us, sole_error, connect
from .values import OutgoingMessage, SendResult, send_fields

BUSY_POLL_US = 0   # the Producer's busy_poll_us: off unless asked for (README, Busy polling)
RETRYABLE_CODES = ("NOT_MASTER", "SYSTEM_BUSY", "SERVICE_NOT_AVAILABLE")
_RESULT_COLUMNS = ("status", "queue_id", "queue_offset", "physical_offset", "message_id", "reason")
_new_tuple = tuple.__new__   # SendResult rows from zipped columns, without a call per field


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

    ``busy_poll_us`` (0 by default, at most 1,000): a caller that sends one request at a
    time polls its socket for its reply this long before it sleeps, giving its CPU way after
    each empty poll (node/wire/loop_view.py ``busy_poll``), except for a request long after
    its last one, and for a while after polls that kept missing their reply (``ReplyPoll``).
    A lower median round trip for up to that much CPU a send, and, on a machine with few
    CPUs, a longer tail: see README, "Busy polling". A pipelining caller never polls.
    """

    def __init__(self, bootstrap: str, nursery: trio.Nursery, *, secret: str | None = None,
                 batch_count_max: int = 64, batch_bytes_max: int = 1024 * 1024, linger_ms: float = 2,
                 in_flight_max: int = 16, retries_max: int = 3, retry_backoff_ms: int = 100,
                 request_timeout_ms: int = REQUEST_TIMEOUT_MS, busy_poll_us: int = BUSY_POLL_US) -> None:
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
        self.busy_poll_us = checked_busy_poll_us(busy_poll_us)   # before any connection
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
                self._connection = await connect(self.address, self._nursery, secret=self._secret,
                                                 busy_poll_us=self.busy_poll_us)
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
                except AuthError as error:
                    self._fail(batch, error)   # a wrong or missing secret: no retry helps
                    return
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
                except AuthError as error:
                    self._fail(batch, error)   # the node read nothing before authentication
                    return
                except UnsentError as error:
                    if attempt == self.retries_max:
                        self._fail(batch, error)
                        return
                    await self._back_off(attempt)
                    continue  # surely took no effect: safe to retry
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
        """Send from now on to ``address`` (the master a NOT_MASTER named). The old connection
        closes once the requests still on it are answered (refused too, most likely, and
        then retried here), so none of them becomes an unknown outcome."""
        async with self._connect_lock:
            old = self._connection
            if old is not None and old.address != address:
                self._connection = None
                self._nursery.start_soon(old.aclose_when_answered, self.request_timeout_ms)
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
        # the columns' lengths mapped in C (no frame per column, as a generator would take)
        invariant(set(map(len, map(columns.__getitem__, _RESULT_COLUMNS))) == {len(batch.messages)},
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
        raise sole_error(group) from None
