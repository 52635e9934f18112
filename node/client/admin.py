"""Admin: topics, offsets, queries and status over one connection."""

from __future__ import annotations

from contextlib import asynccontextmanager

from ..wire.protocol import RequestCode
from .connection import REQUEST_TIMEOUT_MS, Connection, open_connection
from .values import ReceivedMessage


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

    async def lag_history(self, since_ms: int = 0, slave: str | None = None) -> dict:
        """The replication lag samples this node took while master, since ``since_ms`` (ms since
        the epoch; 0: all it keeps), and its slaves' lag statuses (LAG_HISTORY)."""
        reply = await self.connection.request(RequestCode.LAG_HISTORY, since_ms=since_ms, slave=slave)
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
