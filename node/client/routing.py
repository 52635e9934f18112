"""Routing clients: a topic whose queues are spread over several groups.

A topic's route names, per group, the queue ids that group holds (numbered from 0 in each
group, as RocketMQ's QueueData): a message queue is the pair (group, queue id). Routes live
in ZooKeeper at ``/hastore/{cluster}/topics/{topic}`` (controller/routes.py writes them,
``hastore topic create T --zk HOSTS``). Clients reach routes and masters through a
directory:

- ``ZooKeeperDirectory(zk_hosts, cluster)``: routes and each group's live master from
  ZooKeeper. kazoo (through the controller package) is imported when it is first used, not
  by ``import node.client``; its blocking calls run in a worker thread.
- ``NodeDirectory(routes, nodes)``: routes given by the caller, masters asked of the
  group's nodes (a node's status names its role and its master's address).

``RoutedProducer`` holds one Producer per group. Each send picks the next message queue in
turn over all the topic's groups (interleaved: g1/0, g2/0, g1/1, ...), passing over a group
that failed its last send and has not been found a master since (GroupHealth). A batch
refused before any write (NOT_MASTER, SYSTEM_BUSY, no connection) goes to another group's
queue; a batch whose outcome is unknown (the connection died after it left) is never sent
again: UnknownOutcomeError, as the Producer does. A failed group is looked up again in the
directory in the background, after a pause that doubles up to ``pause_ms_max``, and comes
back once it has a master. So one group failing over never holds up the others.

``RoutedConsumer`` pulls every queue of the topic from the group that holds it (one
connection and one task per group, a long-polling loop per queue), hands messages out as
RoutedMessage (the message and its group), and commits each group's offsets to that group.
A group whose master dies is looked up again and its queues resume from the next offset
fetched; other groups keep being read meanwhile.
"""

from __future__ import annotations

import itertools
import logging
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Callable, Mapping, Protocol, Sequence

import trio

from ..errors import (ConnectionLostError, GroupUnavailableError, NodeError, NoRouteError, RequestError, RouteError,
                      UnknownOutcomeError, UnsentError)
from .admin import Admin
from .connection import CONNECT_TIMEOUT_MS, connect, sole_error
from .producer import Producer
from .values import OutgoingMessage, SendResult

log = logging.getLogger(__name__)

Route = Mapping[str, Sequence[int]]        # group -> queue ids the group holds
REROUTE_CODES = ("NOT_MASTER", "SYSTEM_BUSY")   # refused before any write: safe to send elsewhere
PAUSE_MS_MIN = 100
PAUSE_MS_MAX = 1_000
DIRECTORY_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True, order=True)
class MessageQueue:
    """One queue of a topic: the group that holds it and its id in that group."""

    group: str
    queue_id: int

    def __str__(self) -> str:
        return f"{self.group}/{self.queue_id}"


def message_queues(route: Route) -> list[MessageQueue]:
    """The route's queues interleaved across groups (g1/0, g2/0, g1/1, g2/1, ...), so that
    taking them in turn alternates groups."""
    columns = [[MessageQueue(group, queue_id) for queue_id in ids] for group, ids in route.items()]
    return [queue for row in itertools.zip_longest(*columns) for queue in row if queue is not None]


class GroupHealth:
    """Which groups a routed client passes over now (pure: times are given, in seconds).

    A failed send pauses its group for ``pause_ms_min``, doubled on each failure in a row up
    to ``pause_ms_max``; finding the group a master (``recovered``) or a send it acks ends
    the pause."""

    def __init__(self, *, pause_ms_min: int = PAUSE_MS_MIN, pause_ms_max: int = PAUSE_MS_MAX) -> None:
        self.pause_ms_min = pause_ms_min
        self.pause_ms_max = pause_ms_max
        self._until: dict[str, float] = {}
        self._failures: dict[str, int] = {}

    def available(self, group: str, now: float) -> bool:
        return now >= self._until.get(group, float("-inf"))

    def failed(self, group: str, now: float) -> float:
        """Pause ``group``; the pause's length in seconds."""
        failures = self._failures.get(group, 0)
        self._failures[group] = failures + 1
        pause_s = min(self.pause_ms_max, self.pause_ms_min * 2 ** min(failures, 20)) / 1000
        self._until[group] = now + pause_s
        return pause_s

    def recovered(self, group: str) -> None:
        self._until.pop(group, None)
        self._failures.pop(group, None)

    def pause_left_s(self, group: str, now: float) -> float:
        """Seconds until ``group`` is tried again (0 when it is available)."""
        return max(0.0, self._until.get(group, now) - now)

    def paused(self, now: float) -> list[str]:
        return sorted(group for group, until in self._until.items() if now < until)


class QueueSelector:
    """The topic's message queues taken in turn, passing over groups not available now."""

    def __init__(self, topic: str, route: Route) -> None:
        self.topic = topic
        self.queues = message_queues(route)
        if not self.queues:
            raise NoRouteError(f"the route of topic {topic} names no queue; recreate it with `hastore topic create`")
        self._next = 0

    def next(self, available: Callable[[str], bool], exclude: frozenset[str] | set[str] = frozenset()) -> MessageQueue:
        """The next queue whose group is available and not excluded; GroupUnavailableError
        (naming the first such group) when there is none."""
        for step in range(len(self.queues)):
            queue = self.queues[(self._next + step) % len(self.queues)]
            if queue.group not in exclude and available(queue.group):
                self._next = (self._next + step + 1) % len(self.queues)
                return queue
        groups = sorted({queue.group for queue in self.queues})
        raise GroupUnavailableError(f"no group of topic {self.topic} can take a send now (groups {', '.join(groups)} "
                                    f"failed or have no master); retry after their failover", groups[0])


# --- directories ----------------------------------------------------------------------------
class Directory(Protocol):
    """Where a routed client learns a topic's route and a group's master."""

    async def route(self, topic: str) -> dict[str, tuple[int, ...]]: ...
    async def master_address(self, group: str) -> str: ...
    async def aclose(self) -> None: ...


class ZooKeeperDirectory:
    """Routes and masters read from ZooKeeper over one kazoo session, opened on first use."""

    def __init__(self, zk_hosts: str, cluster: str = "hastore", *, timeout_s: float = DIRECTORY_TIMEOUT_S) -> None:
        self.zk_hosts = zk_hosts
        self.cluster = cluster
        self.timeout_s = timeout_s
        self._client = None
        self._lock = trio.Lock()

    async def _call(self, function, *args):
        from controller.errors import ControllerError  # kazoo only once ZooKeeper is used
        try:
            async with self._lock:
                if self._client is None:
                    self._client = await trio.to_thread.run_sync(self._start)
            return await trio.to_thread.run_sync(function, self._client, *args)
        except ControllerError as error:
            raise _Unavailable(str(error)) from error

    def _start(self):
        from controller.znodes import make_client, start_client
        client = make_client(self.zk_hosts, session_timeout_ms=max(2000, int(self.timeout_s * 1000)))
        start_client(client, self.timeout_s, "a routing client")
        return client

    async def route(self, topic: str) -> dict[str, tuple[int, ...]]:
        from controller.routes import read_route
        try:
            route = await self._call(read_route, self.cluster, topic, self.timeout_s)
        except _Unavailable as error:
            raise RouteError(f"cannot read the route of topic {topic} from ZooKeeper {self.zk_hosts}: {error}") from None
        if route is None:
            raise NoRouteError(f"topic {topic} has no route in cluster {self.cluster} (ZooKeeper {self.zk_hosts}); "
                               f"create it with `hastore topic create {topic} --zk {self.zk_hosts}`")
        return route.as_mapping()

    async def master_address(self, group: str) -> str:
        from controller.znodes import find_master_with_client
        try:
            record = await self._call(find_master_with_client, self.cluster, group, self.timeout_s)
        except _Unavailable as error:
            raise GroupUnavailableError(str(error), group) from None
        return record.client_address

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            def stop() -> None:
                client.stop()
                client.close()
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(stop)


class _Unavailable(Exception):
    """A controller error, carried out of ZooKeeperDirectory._call without naming its type."""


class NodeDirectory:
    """Routes given by the caller; a group's master asked of its nodes, in order (a master
    answers for itself, a slave names its master)."""

    def __init__(self, routes: Mapping[str, Route], nodes: Mapping[str, Sequence[str]], *,
                 secret: str | None = None, timeout_ms: int = CONNECT_TIMEOUT_MS) -> None:
        self.routes = {topic: {g: tuple(ids) for g, ids in route.items()} for topic, route in routes.items()}
        self.nodes = {group: list(addresses) for group, addresses in nodes.items()}
        self.secret = secret
        self.timeout_ms = timeout_ms

    async def route(self, topic: str) -> dict[str, tuple[int, ...]]:
        if topic not in self.routes:
            raise NoRouteError(f"no route of topic {topic} was given (known: {', '.join(sorted(self.routes)) or 'none'})")
        return dict(self.routes[topic])

    async def master_address(self, group: str) -> str:
        seen = []
        for address in self.nodes.get(group, ()):
            try:
                with trio.fail_after(self.timeout_ms / 1000):
                    async with trio.open_nursery() as nursery:
                        connection = await connect(address, nursery, secret=self.secret)
                        try:
                            status = await Admin(connection).status()
                        finally:
                            await connection.aclose()
            except (NodeError, trio.TooSlowError) as error:
                seen.append(f"{address}: {error or 'no answer'}")
                continue
            except BaseExceptionGroup as failures:
                seen.append(f"{address}: {sole_error(failures)}")
                continue
            if status.get("role") == "master":
                return address
            if status.get("master_address"):
                return status["master_address"]
            seen.append(f"{address}: {status.get('role')} without a master")
        raise GroupUnavailableError(f"no node of group {group} names a master now ({'; '.join(seen) or 'no node given'})",
                                    group)

    async def aclose(self) -> None:
        return None


# --- producer -------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class RoutedResults:
    """A batch's outcome: the queue it went to and one SendResult per message."""

    queue: MessageQueue
    results: list[SendResult]


@dataclass(frozen=True, slots=True)
class RoutedProducerStatistics:
    acked_by_group: dict[str, int]
    rerouted_batches: int
    group_failures: dict[str, int]
    producer_swaps: int


class RoutedProducer:
    """One Producer per group, chosen per batch by the topic's route. See the module docstring."""

    def __init__(self, directory: Directory, nursery: trio.Nursery, *, secret: str | None = None,
                 health: GroupHealth | None = None, **producer_options) -> None:
        self.directory = directory
        self._nursery = nursery
        self._secret = secret
        self.health = health or GroupHealth()
        # fail fast inside a group: the router sends elsewhere instead of waiting on a dead master
        self._producer_options = {"retries_max": 1, "retry_backoff_ms": 50, **producer_options}
        self._producers: dict[str, Producer] = {}
        self._scopes: dict[str, trio.CancelScope] = {}
        self._selectors: dict[str, QueueSelector] = {}
        self._recovering: set[str] = set()
        self._group_lock = trio.Lock()
        self._route_lock = trio.Lock()
        self._acked: dict[str, int] = {}
        self._failures: dict[str, int] = {}
        self._rerouted = self._swaps = 0

    def statistics(self) -> RoutedProducerStatistics:
        return RoutedProducerStatistics(dict(self._acked), self._rerouted, dict(self._failures), self._swaps)

    async def route(self, topic: str) -> QueueSelector:
        """The topic's queue selector (its route read once from the directory)."""
        selector = self._selectors.get(topic)
        if selector is None:
            async with self._route_lock:     # one selector per topic, however many sends start at once
                if topic not in self._selectors:
                    self._selectors[topic] = QueueSelector(topic, await self.directory.route(topic))
            selector = self._selectors[topic]
        return selector

    async def send(self, topic: str, body: bytes, *, keys=(), tags: str | None = None,
                   properties: dict[str, str] | None = None) -> SendResult:
        """Send one message to the next queue; its SendResult (one-message batch)."""
        outcome = await self.send_routed(topic, [OutgoingMessage(body, tuple(keys), tags, dict(properties or {}))])
        return outcome.results[0]

    async def send_batch(self, topic: str, messages: list[OutgoingMessage]) -> list[SendResult]:
        """Send the messages as one frame to one queue; one SendResult each (Producer.send_batch's contract)."""
        return (await self.send_routed(topic, messages)).results

    async def send_routed(self, topic: str, messages: list[OutgoingMessage]) -> RoutedResults:
        """Send ``messages`` to one queue of ``topic`` and say which. A refusal that wrote
        nothing goes to another group (each group tried once); UnknownOutcomeError is raised
        as it is; GroupUnavailableError when no group could take it."""
        selector = await self.route(topic)
        tried: set[str] = set()
        last_error: Exception | None = None
        for _ in range(len(selector.queues)):
            try:
                queue = selector.next(lambda group: self.health.available(group, trio.current_time()), tried)
            except GroupUnavailableError as error:
                if last_error is not None:
                    raise GroupUnavailableError(f"{error}; last refusal: {last_error}", error.group) from None
                raise
            tried.add(queue.group)
            try:
                producer = await self._producer_of(queue.group)
                results = await producer.send_batch(topic, [_to_queue(m, queue.queue_id) for m in messages])
            except UnknownOutcomeError:
                self._group_failed(queue.group)
                raise
            except (ConnectionLostError, UnsentError, GroupUnavailableError) as error:   # surely not written: reroute
                last_error = error
            except RequestError as error:
                if error.code not in REROUTE_CODES:
                    raise
                last_error = error
            else:
                self.health.recovered(queue.group)
                self._acked[queue.group] = self._acked.get(queue.group, 0) + sum(r.ok for r in results)
                return RoutedResults(queue, results)
            self._group_failed(queue.group)
            self._rerouted += 1
        raise GroupUnavailableError(f"every group of topic {topic} refused the batch; last: {last_error}",
                                    sorted(tried)[0])

    async def flush(self) -> None:
        for producer in list(self._producers.values()):
            await producer.flush()

    # --- groups ----------------------------------------------------------------------------
    async def _producer_of(self, group: str) -> Producer:
        producer = self._producers.get(group)
        if producer is not None:
            return producer
        async with self._group_lock:
            if group not in self._producers:
                await self._open_producer(group, await self.directory.master_address(group))
            return self._producers[group]

    async def _open_producer(self, group: str, address: str) -> None:
        old = self._producers.get(group)
        if old is not None and old.address == address:
            return

        async def run_producer(task_status=trio.TASK_STATUS_IGNORED) -> None:
            with trio.CancelScope() as scope:
                async with trio.open_nursery() as nursery:
                    producer = Producer(address, nursery, secret=self._secret, **self._producer_options)
                    await nursery.start(producer.run)
                    task_status.started((producer, scope))
                    await trio.sleep_forever()
        producer, scope = await self._nursery.start(run_producer)
        self._producers[group], old_scope = producer, self._scopes.get(group)
        self._scopes[group] = scope
        if old is not None:
            self._swaps += 1
            self._nursery.start_soon(self._retire, old, old_scope)

    async def _retire(self, producer: Producer, scope: trio.CancelScope | None) -> None:
        with trio.move_on_after(producer.request_timeout_ms / 1000):
            await producer.aclose()
        if scope is not None:
            scope.cancel()

    def _group_failed(self, group: str) -> None:
        self._failures[group] = self._failures.get(group, 0) + 1
        self.health.failed(group, trio.current_time())
        if group not in self._recovering:
            self._recovering.add(group)
            self._nursery.start_soon(self._recover, group)

    async def _recover(self, group: str) -> None:
        """Look ``group``'s master up again after each pause until one answers; then point the
        group's Producer at it and end the pause. Ends with the producer (its nursery)."""
        try:
            while True:
                await trio.sleep(min(self.health.pause_ms_max / 1000,
                                     self.health.pause_left_s(group, trio.current_time())))
                try:
                    address = await self.directory.master_address(group)
                except (GroupUnavailableError, RouteError) as error:
                    log.info("group %s still has no master: %s", group, error)
                    self.health.failed(group, trio.current_time())
                    continue
                async with self._group_lock:
                    await self._open_producer(group, address)
                self.health.recovered(group)
                return
        finally:
            self._recovering.discard(group)

    async def aclose(self) -> None:
        for group, producer in list(self._producers.items()):
            with trio.move_on_after(producer.request_timeout_ms / 1000):
                await producer.aclose()
            self._scopes[group].cancel()


def _to_queue(message: OutgoingMessage, queue_id: int) -> OutgoingMessage:
    """The message bound for ``queue_id``, its UNIQ_KEY kept (the caller's object is left as it is)."""
    return OutgoingMessage(message.body, message.keys, message.tags, message.properties, queue_id, message.uniq_key)


@asynccontextmanager
async def open_routed_producer(directory: Directory, **options):
    """``async with open_routed_producer(ZooKeeperDirectory(hosts)) as producer:`` (the directory
    is closed on exit)."""
    try:
        async with trio.open_nursery() as nursery:
            producer = RoutedProducer(directory, nursery, **options)
            try:
                yield producer
            finally:
                with trio.CancelScope(shield=True):
                    await producer.aclose()
                    await directory.aclose()
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        raise sole_error(group) from None
