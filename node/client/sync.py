"""Blocking wrappers of the trio client for scripts: SyncAdmin, SyncProducer, SyncConsumer.

    with SyncProducer("127.0.0.1:10911") as producer:
        result = producer.send("orders", b"...", keys=["order-1"])
    with SyncConsumer("127.0.0.1:10911", "orders", "billing", from_beginning=True) as consumer:
        for message in consumer.poll(max_count=100, timeout_ms=1000): ...
        consumer.commit()
    with SyncAdmin("127.0.0.1:10911") as admin:
        admin.status()

Each wrapper owns one thread that runs ``trio.run``; the trio client (Admin, Producer,
Consumer) lives there, opened and closed by one holder task, and every call reaches it
through ``trio.from_thread``. Every call is bounded by ``timeout_ms``: past it the call
raises RequestTimeoutError (its outcome is unknown). Errors are the trio client's own
(node/errors.py). If the connection fails in the background (a consumer's pulls), every
later call raises that error. Not for use from inside a trio run: use node/client/ there.
"""

from __future__ import annotations

import math
import threading
from typing import Any, Awaitable, Callable

import trio

from store.errors import exception_leaves

from ..errors import ClientClosedError, NodeError, RequestTimeoutError
from .admin import open_admin
from .connection import REQUEST_TIMEOUT_MS
from .consumer import open_consumer
from .producer import open_producer
from .values import OutgoingMessage, ReceivedMessage, SendResult

START_TIMEOUT_MS = 30_000
CLOSE_TIMEOUT_MS = 30_000
POLL_COUNT_MAX = 4096


class _TrioThread:
    """One thread running ``trio.run``, holding one async context manager open.

    ``open`` enters ``context_factory()`` in the thread and returns what it yields;
    ``call`` runs an async function there, bounded; ``close`` exits the context manager
    (bounded) and ends the thread.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._token: trio.lowlevel.TrioToken | None = None
        self._ready = threading.Event()
        self._closing: trio.Event | None = None
        self._closed = threading.Event()
        self._value: Any = None
        self._open_error: BaseException | None = None
        self._failure: BaseException | None = None
        self._calls: set[trio.CancelScope] = set()
        self._thread: threading.Thread | None = None

    def open(self, context_factory: Callable[[], Any], timeout_ms: int) -> Any:
        self._thread = threading.Thread(target=self._main, args=(context_factory, timeout_ms), name=self._name,
                                        daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout_ms / 1000 + 5):
            raise RequestTimeoutError(f"{self._name}: not connected within {timeout_ms} ms")
        if self._open_error is not None:
            self._thread.join(5)
            raise self._open_error
        return self._value

    def _main(self, context_factory, timeout_ms: int) -> None:
        try:
            trio.run(self._hold, context_factory, timeout_ms)
        except BaseException as error:  # the holder records what callers need; this is a last resort
            if self._open_error is None and self._failure is None:
                self._failure = error
        finally:
            self._ready.set()
            self._closed.set()

    async def _hold(self, context_factory, timeout_ms: int) -> None:
        self._closing = trio.Event()
        self._token = trio.lowlevel.current_trio_token()
        manager = context_factory()
        opened = False
        try:
            # one scope bounds both the open and the close: scopes nest around the client's own
            with trio.CancelScope(deadline=trio.current_time() + timeout_ms / 1000) as bound:
                self._value = await manager.__aenter__()
                opened = True
                bound.deadline = math.inf
                self._ready.set()
                try:
                    await self._closing.wait()
                except BaseException as error:  # the client failed in the background (or the run ends)
                    if not await manager.__aexit__(type(error), error, error.__traceback__):
                        raise
                    return
                bound.deadline = trio.current_time() + CLOSE_TIMEOUT_MS / 1000
                await manager.__aexit__(None, None, None)
            if bound.cancelled_caught:
                error = RequestTimeoutError(f"{self._name}: not {'closed' if opened else 'connected'} within "
                                            f"{CLOSE_TIMEOUT_MS if opened else timeout_ms} ms")
                if opened:
                    self._failure = error
                else:
                    self._open_error = error
        except Exception as error:
            if not opened:
                self._open_error = _one_error(error)
            else:
                self._fail(error)
        finally:
            self._ready.set()

    def _fail(self, error: BaseException) -> None:
        self._failure = _one_error(error)
        for scope in list(self._calls):
            scope.cancel()

    def call(self, async_fn: Callable[..., Awaitable], *args, timeout_ms: int) -> Any:
        """``await async_fn(*args)`` in the trio thread; RequestTimeoutError after ``timeout_ms``."""
        self._check_usable()

        async def bounded():
            with trio.CancelScope() as scope:
                self._calls.add(scope)
                try:
                    with trio.fail_after(timeout_ms / 1000):
                        return await async_fn(*args)
                except trio.TooSlowError:
                    raise RequestTimeoutError(f"{self._name}: no answer within {timeout_ms} ms; "
                                              f"the outcome is unknown") from None
                finally:
                    self._calls.discard(scope)
            raise self._failure or ClientClosedError(f"{self._name} is closed")
        try:
            return trio.from_thread.run(bounded, trio_token=self._token)
        except trio.RunFinishedError:
            raise ClientClosedError(f"{self._name} is closed") from None

    def _check_usable(self) -> None:
        if self._failure is not None:
            raise self._failure
        if self._token is None or self._closed.is_set():
            raise ClientClosedError(f"{self._name} is closed")
        try:
            trio.lowlevel.current_trio_token()
        except RuntimeError:
            return
        raise RuntimeError(f"{self._name} blocks: inside a trio run use the async client (node/client/)")

    def close(self) -> None:
        """Close the held client and end the thread (bounded); re-raises a close failure."""
        if self._thread is None or self._closed.is_set():
            return
        try:
            trio.from_thread.run_sync(self._closing.set, trio_token=self._token)
        except trio.RunFinishedError:
            pass
        self._thread.join(CLOSE_TIMEOUT_MS / 1000 + 5)
        if self._thread.is_alive():
            raise RequestTimeoutError(f"{self._name}: its thread did not end within {CLOSE_TIMEOUT_MS} ms")
        if isinstance(self._failure, RequestTimeoutError):
            raise self._failure


def _one_error(error: BaseException) -> BaseException:
    """A group of node errors of one kind (say, every queue's pull lost the same
    connection) as its first error, which a script can catch by type; anything else as is."""
    if isinstance(error, BaseExceptionGroup):
        # a Cancelled beside the errors is the client's own teardown, not what went wrong
        leaves = [leaf for leaf in exception_leaves(error) if not isinstance(leaf, trio.Cancelled)]
        if leaves and all(isinstance(leaf, NodeError) for leaf in leaves) and len({type(leaf) for leaf in leaves}) == 1:
            return leaves[0]
    return error


class _SyncClient:
    def __init__(self, name: str, timeout_ms: int) -> None:
        if not 1 <= timeout_ms <= 3_600_000:
            raise ValueError("timeout_ms must be between 1 and 3,600,000")
        self.timeout_ms = timeout_ms
        self._thread = _TrioThread(name)

    def close(self) -> None:
        self._thread.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _call(self, async_fn, *args, timeout_ms: int | None = None):
        return self._thread.call(async_fn, *args, timeout_ms=timeout_ms or self.timeout_ms)


class SyncAdmin(_SyncClient):
    """Topics, offsets, queries and status, blocking; one connection to ``address``."""

    def __init__(self, address: str, *, secret: str | None = None, timeout_ms: int = REQUEST_TIMEOUT_MS) -> None:
        super().__init__(f"SyncAdmin({address})", timeout_ms)
        self._admin = self._thread.open(lambda: open_admin(address, secret=secret), min(timeout_ms, START_TIMEOUT_MS))

    def create_topic(self, topic: str, queue_count: int = 4) -> dict:
        return self._call(self._admin.create_topic, topic, queue_count)

    def list_topics(self, include_system: bool = False) -> dict[str, dict]:
        return self._call(self._admin.list_topics, include_system)

    def status(self) -> dict:
        return self._call(self._admin.status)

    def queue_offsets(self, topic: str, queue_id: int) -> tuple[int, int]:
        return self._call(self._admin.queue_offsets, topic, queue_id)

    def query_by_key(self, topic: str, key: str, begin_ms: int = 0, end_ms: int = 2**63 - 1,
                     max_count: int = 32) -> list[ReceivedMessage]:
        return self._call(self._admin.query_by_key, topic, key, begin_ms, end_ms, max_count)

    def query_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        return self._call(self._admin.query_by_time, topic, queue_id, timestamp_ms)

    def query_by_id(self, message_id: str) -> ReceivedMessage:
        return self._call(self._admin.query_by_id, message_id)

    def commit_offsets(self, group: str, topic: str, offsets: dict[int, int]) -> dict:
        return self._call(self._admin.commit_offsets, group, topic, offsets)

    def query_offsets(self, group: str, topic: str) -> dict[int, int]:
        return self._call(self._admin.query_offsets, group, topic)

    def pull(self, topic: str, queue_id: int, offset: int, max_count: int = 32, timeout_ms: int = 0) -> dict:
        """One pull (long-polling up to ``timeout_ms``); the call's bound grows by that much."""
        return self._call(self._admin.pull, topic, queue_id, offset, max_count, timeout_ms,
                          timeout_ms=self.timeout_ms + timeout_ms)


class SyncProducer(_SyncClient):
    """Sends, blocking. ``send`` is one message in one request (no linger); ``send_batch``
    is many in one frame. Options go to the trio Producer (retries, in_flight_max, ...)."""

    def __init__(self, address: str, *, secret: str | None = None, timeout_ms: int = REQUEST_TIMEOUT_MS,
                 **options) -> None:
        super().__init__(f"SyncProducer({address})", timeout_ms)
        options.setdefault("request_timeout_ms", timeout_ms)
        self._producer = self._thread.open(lambda: open_producer(address, secret=secret, **options),
                                           min(timeout_ms, START_TIMEOUT_MS))

    def send(self, topic: str, body: bytes, *, keys=(), tags: str | None = None,
             properties: dict[str, str] | None = None, queue_id: int | None = None) -> SendResult:
        message = OutgoingMessage(body, tuple(keys), tags, dict(properties or {}), queue_id)
        return self._call(self._producer.send_batch, topic, [message])[0]

    def send_batch(self, topic: str, messages: list[OutgoingMessage]) -> list[SendResult]:
        return self._call(self._producer.send_batch, topic, list(messages))


class SyncConsumer(_SyncClient):
    """Reads a topic as a consumer group, blocking. Pulls run in the background thread
    (long polling) into a bounded buffer; ``poll`` takes what is there."""

    def __init__(self, address: str, topic: str, group: str, *, secret: str | None = None,
                 from_beginning: bool = False, start_offsets: dict[int, int] | None = None,
                 timeout_ms: int = REQUEST_TIMEOUT_MS, **options) -> None:
        super().__init__(f"SyncConsumer({address}, {topic}, {group})", timeout_ms)
        self._consumer = self._thread.open(
            lambda: open_consumer(address, topic, group, secret=secret, from_beginning=from_beginning,
                                  start_offsets=start_offsets, **options), min(timeout_ms, START_TIMEOUT_MS))

    def poll(self, max_count: int = 32, timeout_ms: int = 1000) -> list[ReceivedMessage]:
        """Up to ``max_count`` messages: waits up to ``timeout_ms`` for the first, then takes
        what is buffered. An empty list means none arrived in time."""
        if not 1 <= max_count <= POLL_COUNT_MAX:
            raise ValueError(f"max_count must be between 1 and {POLL_COUNT_MAX}")
        return self._call(self._poll, max_count, timeout_ms, timeout_ms=self.timeout_ms + timeout_ms)

    async def _poll(self, max_count: int, timeout_ms: int) -> list[ReceivedMessage]:
        messages = []
        with trio.move_on_after(timeout_ms / 1000):
            messages.append(await self._consumer.receive())
        while messages and len(messages) < max_count:
            try:
                messages.append(self._consumer.receive_nowait())
            except trio.WouldBlock:
                break
        return messages

    def commit(self) -> dict[int, int]:
        """Commit the positions of the messages polled so far; returns the queues that moved."""
        return self._call(self._consumer.commit)

    @property
    def positions(self) -> dict[int, int]:
        """Per queue, the offset of the next message ``poll`` hands out."""
        return dict(self._consumer.positions)


__all__ = ["SyncAdmin", "SyncProducer", "SyncConsumer", "ClientClosedError"]
