"""Reads of the store: pull by queue, query by key, by time and by message id, each queue's
offsets, the topics.

    reads = StoreReads(commit_log, queues, index, dispatcher, integrity, replica_log, check_crc=True)
    result = reads.pull("orders", 0, queue_offset, max_count=32)   # GetResult

MessageStore composes it and answers its read calls with it (after checking that it runs).
A reader sees a message once it is dispatched; with ``limit_to_confirm_offset(True)`` (a
master or slave under a controller) it sees only messages wholly below the confirm offset:
a pull stops before the first one that is not, a key or message-id query leaves it out, a
time query answers as if it were not stored yet. A pull reads through Integrity: a record
whose CRC fails is skipped and named, a ConsumeQueue that disagrees with the log is rebuilt
from it.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import codec
from .codec import StoredMessage
from .errors import MessageNotFound, StoreCorruptError
from .integrity import CorruptRecord

if TYPE_CHECKING:
    from .commit_log import CommitLog
    from .dispatcher import ConsumeQueueTable, Dispatcher
    from .index_file import IndexService
    from .integrity import Integrity
    from .replica_log import ReplicaLog

log = logging.getLogger(__name__)

PULL_BATCH_MAX = 1024


class GetStatus(enum.Enum):
    """How a pull went (RocketMQ's GetMessageStatus, the cases hastore has)."""

    FOUND = "FOUND"
    NO_NEW_MESSAGE = "NO_NEW_MESSAGE"
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    OFFSET_OVERFLOW = "OFFSET_OVERFLOW"


@dataclass(frozen=True, slots=True)
class GetResult:
    """A pull's answer: the messages and where the next pull should start."""

    status: GetStatus
    messages: list[StoredMessage]
    next_offset: int
    min_offset: int
    max_offset: int
    # records of this range that cannot be served (CRC failed, or lost): skipped, each named
    # by queue offset, so a consumer moves past them knowingly (store/integrity.py)
    corrupt: tuple[CorruptRecord, ...] = ()


class StoreReads:
    """The read side of the store over its parts; holds none of them but by reference."""

    def __init__(self, commit_log: CommitLog, queues: ConsumeQueueTable, index: IndexService, dispatcher: Dispatcher,
                 integrity: Integrity, replica_log: ReplicaLog, *, check_crc: bool) -> None:
        self._commit_log = commit_log
        self._queues = queues
        self._index = index
        self._dispatcher = dispatcher
        self._integrity = integrity
        self._replica_log = replica_log
        self._check_crc = check_crc
        # under a controller, consumers read only what every in-sync replica holds: pulls
        # stop before the first message not wholly below the confirm offset
        self._up_to_confirm_offset = False

    def limit_to_confirm_offset(self, enabled: bool) -> None:
        """Whether reads (pulls and queries) see only messages wholly below the confirm offset."""
        self._up_to_confirm_offset = enabled

    def _read_limit(self) -> int | None:
        """The CommitLog offset no message served may reach past, or None for no limit."""
        return self._replica_log.confirm_offset if self._up_to_confirm_offset else None

    def pull(self, topic: str, queue_id: int, queue_offset: int, max_count: int = 32,
             max_bytes: int = 8 * 1024 * 1024) -> GetResult:
        """Messages of one queue from ``queue_offset``, at most ``max_count`` and about ``max_bytes``."""
        queue = self._queues.get(topic, queue_id)
        if queue is None:
            return GetResult(GetStatus.NO_MATCHED_LOGIC_QUEUE, [], 0, 0, 0)
        min_offset, max_offset = self._queue_min(queue), queue.max_offset
        if queue_offset < min_offset:
            return GetResult(GetStatus.OFFSET_TOO_SMALL, [], min_offset, min_offset, max_offset)
        if queue_offset > max_offset:
            return GetResult(GetStatus.OFFSET_OVERFLOW, [], max_offset, min_offset, max_offset)
        if queue_offset == max_offset:
            return GetResult(GetStatus.NO_NEW_MESSAGE, [], queue_offset, min_offset, max_offset)
        read_limit = self._read_limit()
        count = min(max_count, PULL_BATCH_MAX)
        read = self._integrity.read_queue(queue, queue_offset, count, check_crc=self._check_crc,
                                         read_limit=read_limit, max_bytes=max_bytes)
        if read.damaged:   # the consume queue disagrees with the log: rebuilt from it, read again
            log.warning("consume queue %s/%d: %s; rebuilding it from the log", topic, queue_id, read.damaged)
            self._integrity.rebuild_queues({(topic, queue_id)})
            queue = self._queues.get(topic, queue_id)
            read = self._integrity.read_queue(queue, queue_offset, count, check_crc=self._check_crc,
                                             read_limit=read_limit, max_bytes=max_bytes)
            if read.damaged:
                raise StoreCorruptError(f"consume queue {topic}/{queue_id} still disagrees with the log after "
                                        f"a rebuild: {read.damaged}")
        messages, next_offset = read.messages, read.next_offset
        status = GetStatus.FOUND if messages else GetStatus.NO_NEW_MESSAGE
        return GetResult(status, messages, next_offset, min_offset, max_offset, tuple(read.corrupt))

    def get(self, topic: str, queue_id: int, queue_offset: int, max_count: int = 32) -> list[StoredMessage]:
        """Decoded messages of one queue from ``queue_offset`` (see ``pull`` for the details)."""
        return self.pull(topic, queue_id, queue_offset, max_count).messages

    def query_by_key(self, topic: str, key: str, begin_ms: int = 0, end_ms: int = 2**63 - 1,
                     max_count: int = 32) -> list[StoredMessage]:
        """Messages of ``topic`` whose KEYS hold ``key`` (or whose UNIQ_KEY is it), stored in
        [begin_ms, end_ms]; the newest ``max_count``, returned oldest first.

        Every index entry the query visits is checked against the record it points at: one
        that names no record, or a record none of whose keys has the entry's hash, means the
        index is damaged (start checks follow only a sample of entries). The index is then
        rebuilt from the log (logged at WARNING, counted in the integrity statistics) and the
        query answered from the rebuilt one."""
        key_hash = codec.index_key_hash(f"{topic}#{key}")
        found, damage = self._query_index(topic, key, key_hash, begin_ms, end_ms, max_count)
        if damage:
            log.warning("index: %s; rebuilding the index from the log", damage)
            self._integrity.rebuild_index()
            found, damage = self._query_index(topic, key, key_hash, begin_ms, end_ms, max_count)
            if damage:
                raise StoreCorruptError(f"the index still disagrees with the log after a rebuild: {damage}")
        return [found[offset] for offset in sorted(found)]

    def _query_index(self, topic: str, key: str, key_hash: int, begin_ms: int, end_ms: int,
                     max_count: int) -> tuple[dict[int, StoredMessage], str]:
        """The messages found for the key by offset, and the first damage met ('' for none)."""
        found: dict[int, StoredMessage] = {}
        limit = self._read_limit()
        commit_log = self._commit_log
        checked: set[tuple[int, int]] = set()
        for entry_hash, offset, wanted in self._index.chain(key_hash, begin_ms, end_ms):
            if offset in found or (entry_hash, offset) in checked or offset < commit_log.min_offset \
                    or offset >= self._dispatcher.dispatched_offset:
                continue   # before the log (retention) or past what dispatch wrote (in flight)
            checked.add((entry_hash, offset))
            try:
                message = commit_log.read_message(offset, check_crc=self._check_crc and wanted)
            except MessageNotFound:
                continue
            except StoreCorruptError:
                if commit_log.record_starts_at(offset) or commit_log.boundary_at(offset + _size_field(commit_log, offset)):
                    continue   # the record is damaged, not the entry: scrub and repair see to it
                return found, f"an entry of key hash {entry_hash} points at {offset}, where no record starts"
            if entry_hash not in _key_hashes(message):
                if _fails_its_crc(commit_log, offset):
                    continue   # a flipped bit in the record's keys, not in the index: scrub and repair see to it
                return found, (f"an entry of key hash {entry_hash} points at {offset}, whose record "
                               f"({message.topic}) has no key with that hash")
            if not wanted or (limit is not None and offset + message.total_size > limit):
                continue
            if message.topic == topic and begin_ms <= message.store_timestamp <= end_ms and \
                    (key in message.keys or message.uniq_key == key):
                found[offset] = message
                if len(found) >= max_count:
                    break
        return found, ""

    def offset_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The queue offset of the first message stored at or after ``timestamp_ms``
        (max offset if every message is older). Binary search over the ConsumeQueue."""
        queue = self._queues.get(topic, queue_id)
        if queue is None:
            return 0
        low, high = self._queue_min(queue), self._readable_max(queue)
        while low < high:
            middle = (low + high) // 2
            stored_at = self._commit_log.store_timestamp_at(queue.physical_offset_at(middle))
            if stored_at < timestamp_ms:
                low = middle + 1
            else:
                high = middle
        return low

    def min_offset(self, topic: str, queue_id: int) -> int:
        """The first queue offset whose message still exists (0 for an unknown queue)."""
        queue = self._queues.get(topic, queue_id)
        return self._queue_min(queue) if queue else 0

    def max_offset(self, topic: str, queue_id: int) -> int:
        """The queue offset the queue's next dispatched message gets (0 for an unknown queue)."""
        queue = self._queues.get(topic, queue_id)
        return queue.max_offset if queue else 0

    def _readable_max(self, queue) -> int:
        """The queue's max offset; under the confirm-offset limit, its first entry whose message
        is not wholly below the confirm offset (entries' log offsets rise with queue offsets)."""
        limit = self._read_limit()
        low, high = self._queue_min(queue), queue.max_offset
        last = queue.entry(high - 1) if limit is not None and low < high else None
        if last is None or last.physical_offset + last.size <= limit:
            return high
        while low < high:
            middle = (low + high) // 2
            entry = queue.entry(middle)   # None: a filler for an unreadable record, judged by its start
            end = entry.physical_offset + entry.size if entry else queue.physical_offset_at(middle) + 1
            if end <= limit:
                low = middle + 1
            else:
                high = middle
        return low

    def _queue_min(self, queue) -> int:
        """First entry whose message still exists (retention may have cut the log under it)."""
        low, high = queue.min_offset, queue.max_offset
        floor = self._commit_log.min_offset
        if low >= high or queue.physical_offset_at(low) >= floor:
            return low
        while low < high:
            middle = (low + high) // 2
            if queue.physical_offset_at(middle) < floor:
                low = middle + 1
            else:
                high = middle
        return low

    def get_by_message_id(self, message_id: str) -> StoredMessage:
        """The message an offset message id names; MessageNotFound if it is not here."""
        try:
            host, offset = codec.parse_message_id(message_id)
        except ValueError as error:
            raise MessageNotFound(str(error)) from None
        limit = self._read_limit()
        if offset >= self._dispatcher.dispatched_offset or (limit is not None and offset >= limit):
            raise MessageNotFound(f"no message at offset {offset} yet")
        try:
            message = self._commit_log.read_message(offset, check_crc=self._check_crc)
        except StoreCorruptError:
            if not self._commit_log.record_starts_at(offset):   # a made-up id, not a damaged record
                raise MessageNotFound(f"message id {message_id}: no message starts at offset {offset}") from None
            raise
        if message.physical_offset != offset or message.store_host != host:
            raise MessageNotFound(f"message id {message_id} names {host} offset {offset}, which holds another message")
        if limit is not None and offset + message.total_size > limit:
            raise MessageNotFound(f"no message at offset {offset} yet")
        return message

    def topics(self) -> dict[str, list[int]]:
        """Topics with their queue ids, as the ConsumeQueues know them."""
        return self._queues.topics()


def _key_hashes(message: StoredMessage) -> set[int]:
    """The index hashes the dispatcher writes for ``message``: each key and the unique key."""
    keys = list(message.keys) + ([message.uniq_key] if message.uniq_key else [])
    return {codec.index_key_hash(f"{message.topic}#{key}") for key in keys}


def _fails_its_crc(commit_log, offset: int) -> bool:
    """Whether the record at ``offset`` fails its CRCs (a read without the check took it)."""
    try:
        commit_log.read_message(offset, check_crc=True)
    except StoreCorruptError:
        return True
    return False


def _size_field(commit_log: CommitLog, offset: int) -> int:
    """The TOTALSIZE field at ``offset`` (0 when outside the log)."""
    segment = commit_log.segments.find(offset)
    if segment is None or offset - segment.start_offset + 4 > segment.size:
        return 0
    return int.from_bytes(segment.mm[offset - segment.start_offset:offset - segment.start_offset + 4], "big", signed=True)
