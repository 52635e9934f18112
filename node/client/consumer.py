"""Consumer: pulls every queue of a topic, hands messages out in per-queue order, commits offsets.

A message the node could not serve intact (its record fails its CRCs there and no replica
gave an intact copy in time) comes back in the pull reply's ``corrupt`` list, by queue
offset. The consumer never skips it silently: ``receive`` raises CorruptRecordError for it,
in its place in the queue's order, and the consumer's position moves past it (so the next
``receive`` goes on with the queue). Every such error is also kept in ``corrupt``.

Messages may come from any node, slave or master; the group's committed offsets come from
the master only (``Admin.committed_offsets``): a slave's view, or that of a node ZooKeeper
already names master but that has not taken the role yet (30 to 180 ms in the chaos soak),
covers only its last known confirm offset and may lag commits the old master acked, and
starting there would hand out again what the group had consumed. While a failover leaves no
master to answer, the start waits up to ``master_wait_s``.
"""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager

import trio

from ..errors import CorruptRecordError, RequestError
from .admin import Admin, open_admin
from .connection import sole_error
from .values import ReceivedMessage

log = logging.getLogger(__name__)

MASTER_WAIT_S = 10.0
RETRY_PAUSE_S_MIN = 0.05
RETRY_PAUSE_S_MAX = 1.0
FAILOVER_CODES = ("NOT_MASTER", "SERVICE_NOT_AVAILABLE")   # no active master answers yet


class Consumer:
    """Pulls every queue of a topic (one long-polling loop per queue, all on one connection)
    and hands messages out in per-queue order. ``commit`` stores the positions of the
    messages handed out so far as the group's consumer offsets."""

    def __init__(self, admin: Admin, topic: str, group: str, *, max_count: int = 32,
                 long_poll_ms: int = 5_000, buffer_messages_max: int = 4096,
                 master_wait_s: float = MASTER_WAIT_S) -> None:
        self.admin = admin
        self.topic = topic
        self.group = group
        self.max_count = max_count
        self.long_poll_ms = long_poll_ms
        self.master_wait_s = master_wait_s
        self.positions: dict[int, int] = {}
        self._committed: dict[int, int] = {}
        self.corrupt: list[CorruptRecordError] = []     # every corrupt message handed out, oldest first
        self._send, self._receive = trio.open_memory_channel[ReceivedMessage | CorruptRecordError](
            buffer_messages_max)

    async def start_positions(self, from_beginning: bool, start_offsets: dict[int, int] | None) -> None:
        topics = await self.admin.list_topics()
        if self.topic not in topics:
            raise RequestError("TOPIC_NOT_EXIST", f"topic {self.topic!r} does not exist")
        queue_count = topics[self.topic]["queue_count"]
        given = start_offsets or {}
        # offsets given for every queue need nothing from the master (which may be away)
        committed = {} if all(q in given for q in range(queue_count)) else await self.committed_offsets()
        for queue_id in range(queue_count):
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

    async def committed_offsets(self) -> dict[int, int]:
        """The group's committed offsets as the master holds them; while no master answers (a
        failover), asked again with a doubling pause for up to ``master_wait_s``. After that,
        the connected node's own view, with a warning: a slave's may lag the master's, so
        messages may be delivered again, never skipped (a consumer still starts with its
        group's master away)."""
        deadline = trio.current_time() + self.master_wait_s
        pause_s = RETRY_PAUSE_S_MIN
        while True:
            try:
                return await self.admin.committed_offsets(self.group, self.topic)
            except RequestError as error:
                if error.code not in FAILOVER_CODES:
                    raise
                if trio.current_time() + pause_s > deadline:
                    log.warning("no master answered for group %s within %g s (%s): starting from the "
                                "connected node's committed offsets, which may lag (messages may come again)",
                                self.group, self.master_wait_s, error.code)
                    return await self.admin.query_offsets(self.group, self.topic)
            await trio.sleep(pause_s)
            pause_s = min(RETRY_PAUSE_S_MAX, pause_s * 2)

    async def pull_queue(self, queue_id: int, offset: int) -> None:
        """Pull one queue forever from ``offset`` into the consumer's buffer."""
        while True:
            reply = await self.admin.pull(self.topic, queue_id, offset, self.max_count, self.long_poll_ms)
            corrupt = reply.get("corrupt") or []
            items = reply["messages"]
            if corrupt:
                items = sorted([*items, *(self._corrupt_item(queue_id, record) for record in corrupt)],
                               key=lambda item: item.queue_offset)
            for item in items:
                await self._send.send(item)
            if reply["status"] in ("OFFSET_TOO_SMALL", "OFFSET_OVERFLOW") or reply["messages"] or corrupt:
                offset = reply["next_offset"]

    def _corrupt_item(self, queue_id: int, record: dict) -> CorruptRecordError:
        return CorruptRecordError(self.topic, queue_id, record["queue_offset"], record["physical_offset"],
                                  record.get("reason", ""))

    def _hand_out(self, item: ReceivedMessage | CorruptRecordError) -> ReceivedMessage:
        self.positions[item.queue_id] = item.queue_offset + 1
        if isinstance(item, CorruptRecordError):
            self.corrupt.append(item)
            raise item
        return item

    async def receive(self) -> ReceivedMessage:
        """The next message of any queue (per-queue order kept); CorruptRecordError for a
        message the node could not serve intact (the position moves past it)."""
        return self._hand_out(await self._receive.receive())

    def receive_nowait(self) -> ReceivedMessage:
        """The next message already buffered; trio.WouldBlock when there is none
        (CorruptRecordError as ``receive``)."""
        return self._hand_out(self._receive.receive_nowait())

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

    Starts from ``start_offsets``, else the group's committed offsets (asked of the master,
    whatever node ``bootstrap`` is), else the queue's first (``from_beginning``) or next message.
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
            raise sole_error(group) from None
