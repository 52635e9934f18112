"""Consumer: pulls every queue of a topic, hands messages out in per-queue order, commits offsets."""

from __future__ import annotations

from contextlib import asynccontextmanager

import trio


from ..errors import RequestError
from .admin import Admin, open_admin
from .connection import sole_error
from .values import ReceivedMessage


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
            raise sole_error(group) from None
