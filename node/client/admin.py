"""Admin: topics, offsets, queries and status over one connection.

Reads (pull, queries, topic list, status) go to the node the Admin was opened on, slave or
master. Writes (topic create, offset commits) that reach a slave come back NOT_MASTER,
refused before anything was logged; with a nursery to connect in, the Admin follows the
reply to the master it names (at most ``REDIRECTS_MAX`` hops) over a second connection it
keeps for writes, so its reads stay where they were. ``committed_offsets`` goes the writes'
way: only the master's view of a group's offsets is authoritative (``query_offsets`` is the
node's own, which on a slave may lag).
"""

from __future__ import annotations

from contextlib import asynccontextmanager

import trio

from ..errors import ConnectionLostError, NotMasterError
from ..wire.protocol import RequestCode
from .connection import REQUEST_TIMEOUT_MS, Connection, connect, sole_error
from .values import ReceivedMessage

REDIRECTS_MAX = 3


class Admin:
    """Topics, offsets, queries and status over one Connection.

    ``nursery`` and ``secret``: where and how to open a connection to the master when a
    write comes back NOT_MASTER; without a nursery the NotMasterError is raised."""

    def __init__(self, connection: Connection, *, nursery: trio.Nursery | None = None,
                 secret: str | None = None) -> None:
        self.connection = connection
        self._nursery = nursery
        self._secret = secret
        self._master: Connection | None = None   # writes go here once a NOT_MASTER named it

    async def _write(self, code: RequestCode, **fields) -> dict:
        """A write, or a read only the master answers, sent to the master (following NOT_MASTER replies)."""
        for hop in range(REDIRECTS_MAX + 1):
            master = self._master
            connection = master if master is not None and not master.closed else self.connection
            try:
                return await connection.request(code, **fields)
            except NotMasterError as error:
                if hop == REDIRECTS_MAX or self._nursery is None or not error.master_address \
                        or error.master_address == connection.address:
                    raise
                try:
                    await self._use_master(error.master_address)
                except ConnectionLostError as lost:
                    raise NotMasterError(f"{error.message}; the master it names cannot be reached: {lost}",
                                         error.master_address) from None
        raise AssertionError("unreachable: the last hop returns or raises")

    async def _use_master(self, address: str) -> None:
        if self._master is not None:
            await self._master.aclose()
        self._master = None
        self._master = await connect(address, self._nursery, secret=self._secret)

    async def aclose(self) -> None:
        """Close the write connection to the master, if one was opened (not ``connection``)."""
        if self._master is not None:
            await self._master.aclose()
            self._master = None

    async def create_topic(self, topic: str, queue_count: int = 4) -> dict:
        return await self._write(RequestCode.TOPIC_CREATE, topic=topic, queue_count=queue_count)

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
        await self._write(RequestCode.COMMIT_OFFSETS, group=group, topic=topic, offsets=offsets)

    async def committed_offsets(self, group: str, topic: str) -> dict[int, int]:
        """The group's committed offsets as the active master holds them (NotMasterError when
        no master answers: a failover under way, or no nursery to follow the reply in)."""
        reply = await self._write(RequestCode.QUERY_OFFSETS, group=group, topic=topic, master_only=True)
        return reply["offsets"]

    async def query_offsets(self, group: str, topic: str) -> dict[int, int]:
        """This node's view of the group's committed offsets (a slave's may lag the master's)."""
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
    """``async with open_admin(addr) as admin:`` an Admin on ``address`` that follows NOT_MASTER
    for its writes; its connections are closed on exit."""
    try:
        async with trio.open_nursery() as nursery:
            connection = await connect(address, nursery, secret=secret)
            admin = Admin(connection, nursery=nursery, secret=secret)
            try:
                yield admin
            finally:
                await admin.aclose()
                await connection.aclose()
    except BaseExceptionGroup as group:
        raise sole_error(group) from None
