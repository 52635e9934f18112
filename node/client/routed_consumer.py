"""RoutedConsumer: every queue of a routed topic, pulled from the group that holds it.

One task per group holds a connection to the group's master (found through the directory,
see routing.py), reads the consumer group's committed offsets there, and runs a
long-polling loop per queue on that connection. When the connection dies or the node stops
serving reads (a failover), the group's task pauses (GroupHealth), finds the master again
and resumes every queue from the next offset it had fetched; the other groups' tasks go on
meanwhile. The committed offsets are asked with ``master_only``: a node the directory names
before it has taken the master role (ZooKeeper is 30 to 180 ms ahead of the node in a
failover) answers NOT_MASTER instead of its own view, which may lag commits the old master
acked, and the group's task looks its master up again. Offsets are committed per group, to
the group that holds the queue: a commit for a group that has no master now stays pending and
goes with the next commit.
"""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager
from dataclasses import dataclass

import trio

from ..errors import ConnectionLostError, GroupUnavailableError, RequestError, RequestTimeoutError, UnsentError
from .admin import Admin
from .connection import connect, sole_error
from .routing import Directory, GroupHealth, MessageQueue
from .values import ReceivedMessage

log = logging.getLogger(__name__)

TRANSIENT_CODES = ("SERVICE_NOT_AVAILABLE", "NOT_MASTER", "SYSTEM_BUSY")
START_TIMEOUT_S = 10.0


def _group_down(error: BaseException) -> bool:
    """Whether ``error`` says the group is failing over (look its master up again), not a bug or misuse:
    among them a request its dying master never read (UnsentError: the write met a broken pipe)."""
    if isinstance(error, RequestError):
        return error.code in TRANSIENT_CODES
    return isinstance(error, (ConnectionLostError, UnsentError, RequestTimeoutError, GroupUnavailableError))


@dataclass(frozen=True, slots=True)
class RoutedMessage:
    """A received message and the group it came from; other attributes are the message's."""

    group: str
    message: ReceivedMessage

    @property
    def queue(self) -> MessageQueue:
        return MessageQueue(self.group, self.message.queue_id)

    def __getattr__(self, name: str):
        return getattr(self.message, name)

    def to_json(self) -> dict:
        return {"group": self.group, **self.message.to_json()}


class RoutedConsumer:
    """Pulls every (group, queue) of ``topic`` and hands messages out in per-queue order;
    ``commit`` stores, in each group, the positions of the messages handed out so far."""

    def __init__(self, directory: Directory, nursery: trio.Nursery, topic: str, consumer_group: str, *,
                 secret: str | None = None, from_beginning: bool = False,
                 start_offsets: dict[MessageQueue, int] | None = None, max_count: int = 32,
                 long_poll_ms: int = 5_000, buffer_messages_max: int = 4096, health: GroupHealth | None = None) -> None:
        self.directory = directory
        self.topic = topic
        self.consumer_group = consumer_group
        self.max_count = max_count
        self.long_poll_ms = long_poll_ms
        self.health = health or GroupHealth()
        self.positions: dict[MessageQueue, int] = {}      # next offset to hand out
        self._nursery = nursery
        self._secret = secret
        self._from_beginning = from_beginning
        self._start_offsets = dict(start_offsets or {})
        self._fetched: dict[MessageQueue, int] = {}       # next offset to pull
        self._committed: dict[MessageQueue, int] = {}
        self._admins: dict[str, Admin] = {}
        self._started: dict[str, trio.Event] = {}
        self.route: dict[str, tuple[int, ...]] = {}
        self._send, self._receive = trio.open_memory_channel[RoutedMessage](buffer_messages_max)

    async def start(self, timeout_s: float = START_TIMEOUT_S) -> list[str]:
        """Read the route and start every group's task; wait up to ``timeout_s`` for each group
        to fix its queues' start offsets. The groups not started yet (no master now): they
        start once they have one."""
        self.route = await self.directory.route(self.topic)
        for group, queue_ids in self.route.items():
            self._started[group] = trio.Event()
            self._nursery.start_soon(self._run_group, group, tuple(queue_ids))
        with trio.move_on_after(timeout_s):
            for event in self._started.values():
                await event.wait()
        return sorted(group for group, event in self._started.items() if not event.is_set())

    async def _run_group(self, group: str, queue_ids: tuple[int, ...]) -> None:
        while True:
            try:
                address = await self.directory.master_address(group)
                async with trio.open_nursery() as nursery:
                    admin = Admin(await connect(address, nursery, secret=self._secret))
                    if not self._started[group].is_set():
                        await self._start_positions(admin, group, queue_ids)
                        self._started[group].set()
                    self._admins[group] = admin
                    self.health.recovered(group)
                    for queue_id in queue_ids:
                        nursery.start_soon(self._pull, admin, MessageQueue(group, queue_id))
            except BaseException as error:
                leaves = [error] if not isinstance(error, BaseExceptionGroup) else _leaves(error)
                if not all(_group_down(leaf) for leaf in leaves):
                    raise
                self._admins.pop(group, None)
                pause_s = self.health.failed(group, trio.current_time())
                log.info("group %s of topic %s: %s; looking for its master again in %.2f s", group, self.topic,
                         leaves[0], pause_s)
                await trio.sleep(pause_s)

    async def _start_positions(self, admin: Admin, group: str, queue_ids: tuple[int, ...]) -> None:
        committed = await admin.committed_offsets(self.consumer_group, self.topic)
        for queue_id in queue_ids:
            queue = MessageQueue(group, queue_id)
            if queue in self._start_offsets:
                offset = self._start_offsets[queue]
            elif queue_id in committed:
                offset = committed[queue_id]
            else:
                low, high = await admin.queue_offsets(self.topic, queue_id)
                offset = low if self._from_beginning else high
            self.positions[queue] = self._fetched[queue] = offset
            if committed.get(queue_id) == offset:
                self._committed[queue] = offset   # only what the group holds counts as committed

    async def _pull(self, admin: Admin, queue: MessageQueue) -> None:
        """Pull one queue until the connection fails, from the next offset not fetched yet."""
        while True:
            offset = self._fetched[queue]
            reply = await admin.pull(self.topic, queue.queue_id, offset, self.max_count, self.long_poll_ms)
            for message in reply["messages"]:
                await self._send.send(RoutedMessage(queue.group, message))
                self._fetched[queue] = message.queue_offset + 1
            if reply["status"] in ("OFFSET_TOO_SMALL", "OFFSET_OVERFLOW") or reply["messages"]:
                self._fetched[queue] = reply["next_offset"]

    async def receive(self) -> RoutedMessage:
        """The next message of any queue (per-queue order kept)."""
        message = await self._receive.receive()
        self.positions[message.queue] = message.message.queue_offset + 1
        return message

    def receive_nowait(self) -> RoutedMessage:
        """The next message already buffered; trio.WouldBlock when there is none."""
        message = self._receive.receive_nowait()
        self.positions[message.queue] = message.message.queue_offset + 1
        return message

    def __aiter__(self):
        return self

    async def __anext__(self) -> RoutedMessage:
        return await self.receive()

    def pending_commits(self) -> dict[MessageQueue, int]:
        """Positions not committed yet (their group had no master at the last commit, or moved since)."""
        return {queue: offset for queue, offset in self.positions.items() if self._committed.get(queue) != offset}

    async def commit(self) -> dict[MessageQueue, int]:
        """Commit each group's moved positions to that group; what was committed. A group
        without a connection now keeps its positions pending for the next commit."""
        done: dict[MessageQueue, int] = {}
        for group in self.route:
            changed = {queue: offset for queue, offset in self.pending_commits().items() if queue.group == group}
            admin = self._admins.get(group)
            if not changed or admin is None:
                continue
            try:
                await admin.commit_offsets(self.consumer_group, self.topic,
                                           {queue.queue_id: offset for queue, offset in changed.items()})
            except (RequestError, ConnectionLostError, UnsentError, RequestTimeoutError) as error:
                if not _group_down(error):
                    raise
                log.info("commit to group %s deferred: %s", group, error)
                continue
            self._committed.update(changed)
            done.update(changed)
        return done


def _leaves(group: BaseExceptionGroup) -> list[BaseException]:
    leaves = []
    for error in group.exceptions:
        leaves.extend(_leaves(error) if isinstance(error, BaseExceptionGroup) else [error])
    return leaves


@asynccontextmanager
async def open_routed_consumer(directory: Directory, topic: str, consumer_group: str, **options):
    """``async with open_routed_consumer(ZooKeeperDirectory(hosts), topic, group) as consumer:``

    Starts from ``start_offsets`` ({MessageQueue: offset}), else the group's committed offsets,
    else each queue's first (``from_beginning``) or next message. The directory is closed on exit."""
    try:
        async with trio.open_nursery() as nursery:
            consumer = RoutedConsumer(directory, nursery, topic, consumer_group, **options)
            try:
                await consumer.start()
                yield consumer
            finally:
                nursery.cancel_scope.cancel()
                with trio.CancelScope(shield=True):
                    await directory.aclose()
    except BaseExceptionGroup as group:
        raise sole_error(group) from None
