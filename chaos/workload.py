"""Workloads. ``send_workload`` (the failover drill's): one producer sending small unique messages one at a time, recording
each as invoke then ok / fail / info in a History, and following the master when it moves.

Classification (never guessed):

- ok: the reply said PUT_OK for the message.
- fail: refused before anything was written (NOT_MASTER, no connection could be opened,
  or a per-message status that writes nothing: MESSAGE_ILLEGAL, PROPERTIES_SIZE_EXCEEDED).
- info: the request left and no answer came (UnknownOutcomeError), or the master wrote the
  message but could not get it acknowledged (FLUSH_SLAVE_TIMEOUT, IN_SYNC_REPLICAS_NOT_ENOUGH,
  SERVICE_NOT_AVAILABLE, ...): it may or may not survive a failover.

After a fail or an info the producer finds the master again: from NOT_MASTER's
``master_address`` when the node knows it, else with ``locate()`` (ZooKeeper).

``run_load`` (``hastore chaos run``'s): several producers, each sending batches of unique
keys with a few batches in flight (pipelined), classified as above; a consumer group whose
members pull their queues from the committed offsets and commit as they go (``read``,
``commit``, ``offsets`` ops); readers pulling through slaves. Every failed or unknown send
makes its producer find the master again through the ``Locator``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Awaitable, Callable, Protocol

import trio

from node.client import OutgoingMessage, open_admin, open_producer
from node.errors import ConnectionLostError, NodeError, NotMasterError, RequestError, UnknownOutcomeError

from .history import History, Op

# Per-message statuses that write nothing; every other non-PUT_OK status was written on the master.
NOT_WRITTEN_STATUSES = ("MESSAGE_ILLEGAL", "PROPERTIES_SIZE_EXCEEDED")


@dataclass(frozen=True, slots=True)
class WorkloadSettings:
    """Bounds and pacing of a send workload."""

    send_interval_ms: float = 5.0      # pause after each outcome
    retry_interval_ms: float = 50.0    # pause before finding the master again
    count_max: int = 20_000            # invocations at most
    duration_max_s: float = 120.0      # wall time at most
    request_timeout_ms: int = 5_000    # a send without a reply by then is `info`
    body_padding_bytes: int = 64


async def send_workload(topic: str, key_prefix: str, history: History, stop: trio.Event,
                        locate: Callable[[], Awaitable[str | None]], settings: WorkloadSettings = WorkloadSettings(),
                        *, secret: str | None = None) -> None:
    """Send ``{key_prefix}-{n}`` messages to the master until ``stop`` is set (or a bound is hit)."""
    deadline = trio.current_time() + settings.duration_max_s
    sequence = 0
    address: str | None = None
    while sequence < settings.count_max and not stop.is_set() and trio.current_time() < deadline:
        if address is None:
            address = await locate()
            if address is None:
                await trio.sleep(settings.retry_interval_ms / 1000)
                continue
        async with open_producer(address, secret=secret, batch_count_max=1, linger_ms=0, retries_max=0,
                                 in_flight_max=1, request_timeout_ms=settings.request_timeout_ms) as producer:
            while sequence < settings.count_max and not stop.is_set() and trio.current_time() < deadline:
                key = f"{key_prefix}-{sequence}"
                sequence += 1
                moved, next_address = await _send_one(producer, topic, key, address, history, settings)
                if moved:
                    address = next_address
                    break
                await trio.sleep(settings.send_interval_ms / 1000)
        if address is None:
            await trio.sleep(settings.retry_interval_ms / 1000)


async def _send_one(producer, topic: str, key: str, address: str, history: History,
                    settings: WorkloadSettings) -> tuple[bool, str | None]:
    """Send one message and record it; (whether to find the master again, where it is if known)."""
    body = (key + " " + "x" * settings.body_padding_bytes).encode()
    history.record("invoke", key, address)
    try:
        [result] = await producer.send_batch(topic, [OutgoingMessage(body, keys=(key,))])
    except NotMasterError as error:
        history.record("fail", key, address, f"NOT_MASTER (master: {error.master_address or 'unknown'})")
        return True, error.master_address if error.master_address != address else None
    except UnknownOutcomeError as error:
        history.record("info", key, address, str(error))
        return True, None
    except ConnectionLostError as error:     # raised only when no connection could be opened
        history.record("fail", key, address, str(error))
        return True, None
    except RequestError as error:
        history.record("fail", key, address, str(error))
        return True, None
    if result.ok:
        history.record("ok", key, address)
        return False, None
    if result.status in NOT_WRITTEN_STATUSES:
        history.record("fail", key, address, result.status)
        return False, None
    history.record("info", key, address, f"{result.status}: {result.reason}")
    return True, None


# --- the chaos run's workload: concurrent batched producers, a consumer group, slave reads -----

class Locator(Protocol):
    """Where the clients of a chaos run connect (addresses already mapped through proxies)."""

    async def master(self) -> str | None: ...
    async def slaves(self) -> list[str]: ...


@dataclass(frozen=True, slots=True)
class LoadSettings:
    """Shape and bounds of the chaos workload."""

    producers: int = 3
    batch_count: int = 4               # messages per send request
    pipeline_depth: int = 2            # send requests in flight per producer
    send_interval_ms: float = 20.0     # pause of each pipeline lane after an outcome
    consumers: int = 2                 # of one group; consumer i owns queues q with q % consumers == i
    commit_interval_s: float = 0.5
    slave_readers: int = 1
    read_interval_ms: float = 50.0
    messages_max: int = 200_000        # invocations at most, over all producers
    duration_max_s: float = 3600.0
    request_timeout_ms: int = 5_000
    retry_interval_ms: float = 100.0
    consumer_group: str = "chaos-cg"
    body_padding_bytes: int = 48


class Budget:
    """The shared bound on invocations (``left``: how many may still be invoked)."""

    def __init__(self, limit: int) -> None:
        self.left = limit

    def take(self, count: int) -> int:
        taken = max(0, min(count, self.left))
        self.left -= taken
        return taken


async def run_load(topic: str, queue_count: int, run_id: str, history: History, stop: trio.Event,
                   locator: Locator, settings: LoadSettings = LoadSettings(), *, secret: str | None = None,
                   budget: Budget | None = None) -> None:
    """Producers, consumers and slave readers until ``stop`` is set (or a bound is hit); every
    operation recorded in ``history``. ``budget``: the caller's view of the invocations left
    (default: a new one of ``settings.messages_max``)."""
    budget = budget if budget is not None else Budget(settings.messages_max)
    with trio.move_on_after(settings.duration_max_s):
        async with trio.open_nursery() as nursery:
            for index in range(settings.producers):
                nursery.start_soon(_producer, topic, f"{run_id}-p{index}", f"producer-{index}", history, stop,
                                   locator, settings, budget, secret)
            for index in range(settings.consumers):
                queues = [q for q in range(queue_count) if q % settings.consumers == index]
                if queues:
                    nursery.start_soon(_consumer, topic, queues, f"consumer-{index}", history, stop, locator,
                                       settings, secret)
            for index in range(settings.slave_readers):
                nursery.start_soon(_slave_reader, topic, queue_count, f"reader-{index}", history, stop, locator,
                                   settings, secret)


class _NotMasterYet(Exception):
    """The node ZooKeeper names as master has not taken the role yet."""


_CLIENT_ERRORS = (NodeError, OSError, trio.TooSlowError, _NotMasterYet)


async def _producer(topic: str, key_prefix: str, process: str, history: History, stop: trio.Event,
                    locator: Locator, settings: LoadSettings, budget: Budget, secret: str | None) -> None:
    counter = iter(range(10**12))
    while not stop.is_set() and budget.left > 0:
        address = await _locate(locator)
        if address is None:
            await trio.sleep(settings.retry_interval_ms / 1000)
            continue
        moved = trio.Event()
        try:
            async with open_producer(address, secret=secret, batch_count_max=settings.batch_count, linger_ms=0,
                                     retries_max=0, in_flight_max=settings.pipeline_depth,
                                     request_timeout_ms=settings.request_timeout_ms) as producer:
                async with trio.open_nursery() as lanes:
                    for _ in range(settings.pipeline_depth):
                        lanes.start_soon(_lane, producer, topic, key_prefix, counter, process, address, history,
                                         stop, moved, settings, budget)
        except _CLIENT_ERRORS:
            pass   # opening or closing the producer: every send in it has its outcome recorded
        await trio.sleep(settings.retry_interval_ms / 1000)


async def _lane(producer, topic: str, key_prefix: str, counter, process: str, address: str, history: History,
                stop: trio.Event, moved: trio.Event, settings: LoadSettings, budget: Budget) -> None:
    """One pipeline lane: a batch at a time until stop, a move or the budget."""
    while not stop.is_set() and not moved.is_set():
        count = budget.take(settings.batch_count)
        if not count:
            return
        keys = [f"{key_prefix}-{next(counter)}" for _ in range(count)]
        messages = [OutgoingMessage((key + " " + "x" * settings.body_padding_bytes).encode(), keys=(key,))
                    for key in keys]
        for key in keys:
            history.record("invoke", key, address, process=process)
        try:
            results = await producer.send_batch(topic, messages)
        except UnknownOutcomeError as error:
            _record_all(history, "info", keys, address, process, str(error))
            moved.set()
            return
        except (NodeError, OSError) as error:   # refused or never sent: nothing was written
            _record_all(history, "fail", keys, address, process, f"{type(error).__name__}: {error}")
            moved.set()
            return
        for key, result in zip(keys, results):
            if result.ok:
                history.record("ok", key, address, process=process, queue_id=result.queue_id,
                               offset=result.queue_offset)
            elif result.status in NOT_WRITTEN_STATUSES:
                history.record("fail", key, address, result.status, process=process)
            else:
                history.record("info", key, address, f"{result.status}: {result.reason}", process=process)
                moved.set()
        await trio.sleep(settings.send_interval_ms / 1000)


def _record_all(history: History, type_: str, keys: list[str], address: str, process: str, error: str) -> None:
    for key in keys:
        history.record(type_, key, address, error, process=process)


async def _locate(locator: Locator) -> str | None:
    try:
        return await locator.master()
    except _CLIENT_ERRORS:
        return None


async def _consumer(topic: str, queues: list[int], process: str, history: History, stop: trio.Event,
                    locator: Locator, settings: LoadSettings, secret: str | None) -> None:
    """A member of the consumer group: from the committed offsets, pull its queues, commit often.
    After any error it finds the master again and starts over from what that master says is
    committed (the offsets checker holds that answer to every commit acked before)."""
    group = settings.consumer_group
    while not stop.is_set():
        address = await _locate(locator)
        if address is None:
            await trio.sleep(settings.retry_interval_ms / 1000)
            continue
        try:
            with trio.fail_after(settings.request_timeout_ms / 1000 * 4):
                async with open_admin(address, secret=secret) as admin:
                    positions = await _committed_positions(admin, topic, queues, group, address, process, history)
            async with open_admin(address, secret=secret) as admin:
                await _consume(admin, topic, positions, group, address, process, history, stop, settings)
        except _CLIENT_ERRORS:
            pass
        await trio.sleep(settings.retry_interval_ms / 1000)


async def _committed_positions(admin, topic: str, queues: list[int], group: str, address: str, process: str,
                               history: History) -> dict[int, int]:
    """The group's committed offsets, from a node that says it is master. ZooKeeper names a
    new master before it takes the role (replays %SYS%CONFIG); until then it answers as a
    slave, from the records its last known confirm offset covers, which may lag commits the
    old master acked (a slave read, stale by design): a consumer starting there would go back."""
    if (await admin.status()).get("role") != "master":
        raise _NotMasterYet(address)
    committed = await admin.committed_offsets(group, topic)   # master_only: NOT_MASTER if it lost the role
    answered_s = history.now_s()   # the history stays in time order (unavailability bisects it)
    positions = {}
    for queue_id in queues:
        if queue_id in committed:
            history.append(Op("ok", "offsets", group, answered_s, address, process=process, queue_id=queue_id,
                              offset=committed[queue_id]))
            positions[queue_id] = committed[queue_id]
        else:
            positions[queue_id] = (await admin.queue_offsets(topic, queue_id))[0]
    return positions


async def _consume(admin, topic: str, positions: dict[int, int], group: str, address: str, process: str,
                   history: History, stop: trio.Event, settings: LoadSettings) -> None:
    committed = dict(positions)
    next_commit_s = trio.current_time() + settings.commit_interval_s
    while not stop.is_set():
        for queue_id, offset in list(positions.items()):
            with trio.fail_after(settings.request_timeout_ms / 1000):
                reply = await admin.pull(topic, queue_id, offset, max_count=32, timeout_ms=0)
            if reply["messages"]:
                _record_read(history, reply["messages"], address, process)
            if reply["messages"] or reply["status"] in ("OFFSET_TOO_SMALL", "OFFSET_OVERFLOW"):
                positions[queue_id] = reply["next_offset"]
        if trio.current_time() >= next_commit_s:
            changed = {q: o for q, o in positions.items() if committed.get(q) != o}
            if changed:
                await _commit(admin, group, topic, changed, address, process, history, settings)
                committed.update(changed)
            next_commit_s = trio.current_time() + settings.commit_interval_s
        await trio.sleep(settings.read_interval_ms / 1000)


async def _commit(admin, group: str, topic: str, offsets: dict[int, int], address: str, process: str,
                  history: History, settings: LoadSettings) -> None:
    for queue_id, offset in offsets.items():
        history.record("invoke", group, address, f="commit", process=process, queue_id=queue_id, offset=offset)
    try:
        with trio.fail_after(settings.request_timeout_ms / 1000):
            await admin.commit_offsets(group, topic, offsets)
    except BaseException as error:
        # only acked commits bind the checker: anything else is recorded as unknown
        for queue_id, offset in offsets.items():
            history.record("info", group, address, f"{type(error).__name__}: {error}", f="commit", process=process,
                           queue_id=queue_id, offset=offset)
        raise
    for queue_id, offset in offsets.items():
        history.record("ok", group, address, f="commit", process=process, queue_id=queue_id, offset=offset)


def _record_read(history: History, messages, address: str, process: str) -> None:
    first = messages[0]
    history.record("ok", "", address, f="read", process=process, queue_id=first.queue_id, offset=first.queue_offset,
                   keys=tuple(m.keys[0] if m.keys else "" for m in messages))


async def _slave_reader(topic: str, queue_count: int, process: str, history: History, stop: trio.Event,
                        locator: Locator, settings: LoadSettings, secret: str | None) -> None:
    """Reads through slaves: one queue at a time, round robin over slaves and queues, each
    (slave, queue) from where it last read."""
    positions: dict[tuple[str, int], int] = {}
    turn = 0
    while not stop.is_set():
        turn += 1
        try:
            slaves = await locator.slaves()
        except _CLIENT_ERRORS:
            slaves = []
        if not slaves:
            await trio.sleep(settings.retry_interval_ms / 1000)
            continue
        address, queue_id = slaves[turn % len(slaves)], turn % queue_count
        try:
            with trio.fail_after(settings.request_timeout_ms / 1000):
                async with open_admin(address, secret=secret) as admin:
                    offset = positions.get((address, queue_id), 0)
                    reply = await admin.pull(topic, queue_id, offset, max_count=32, timeout_ms=0)
            if reply["messages"]:
                _record_read(history, reply["messages"], address, process)
            if reply["messages"] or reply["status"] in ("OFFSET_TOO_SMALL", "OFFSET_OVERFLOW"):
                positions[(address, queue_id)] = reply["next_offset"]
        except _CLIENT_ERRORS:
            pass
        await trio.sleep(settings.read_interval_ms / 1000)
