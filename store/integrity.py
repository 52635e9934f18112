"""Integrity: the log is the truth. ConsumeQueue and IndexFile are checked against the
CommitLog and rebuilt from it; a corrupt record is reported by offset and stepped over.

- At start (after recovery), ``repair_at_start`` checks every ConsumeQueue against the
  records its entries point at (vectorised: magic, TOTALSIZE, queue id, queue offset and
  physical offset of each record; entries in log order), and rebuilds from the log every
  queue that fails, the whole ConsumeQueue tree when it is missing, and the IndexFile
  when its directory is missing or a file of it had to be deleted.
- On read, ``read_queue`` decodes each message (CRC-checked) and compares it with the
  entry (topic, queue id, queue offset, size): a mismatch means the ConsumeQueue is
  damaged, and the owner rebuilds the queue (``rebuild_queues``) and reads again; a record
  whose CRC fails is a ``CorruptRecord``: skipped, reported with its queue and physical
  offsets, counted, so no corrupt record is served and none blocks its queue.

Every rebuild is logged at WARNING and counted in ``statistics()``. Nothing here tells
anyone to remove a file. Rebuilds walk the log with the dispatcher's parser, so a rebuilt
queue holds the bytes a fresh dispatch would write.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections import deque
from dataclasses import dataclass

import numpy as np

from . import codec
from .codec import StoredMessage
from .commit_log import CommitLog
from .config_files import fsync_directory, write_atomically
from .config_rebuild import SYS_CONFIG_TOPIC, rebuild_configs
from .consume_queue import ENTRY_BYTES, FILLER_SIZE, ConsumeQueue, QueueEntry
from .dispatch_batch import DispatchParser
from .dispatcher import ConsumeQueueTable, Dispatcher, _walk
from .errors import MessageNotFound, StoreCorruptError
from .index_file import IndexService

log = logging.getLogger(__name__)

CORRUPT_OFFSETS_KEPT = 64
REBUILD_MARKER = ".rebuilding"     # in consumequeue/ or index/ while a rebuild runs          # the newest corrupt records named in statistics
_ENTRY_DTYPE = np.dtype([("offset", ">i8"), ("size", ">i4"), ("tags", ">i8")])
# Start checks read every ConsumeQueue and index entry (their own files, cheap), but check
# against the records in the log only the newest entries and an even sample of the rest:
# following every entry into the log touches every record header of the store, a full
# rescan (4 s -> 15 s at start for a 2 GiB store). Damage anywhere else is still found by a
# read, which checks each entry against its record, and by the background scrub.
START_CHECK_TAIL_ENTRIES = 4096
START_CHECK_SAMPLE_ENTRIES = 4096
assert _ENTRY_DTYPE.itemsize == ENTRY_BYTES


@dataclass(frozen=True, slots=True)
class CorruptRecord:
    """A record a read could not serve: its queue offset (where the consumer goes on from
    ``queue_offset + 1``), its physical offset and why."""

    topic: str
    queue_id: int
    queue_offset: int
    physical_offset: int
    reason: str


@dataclass(frozen=True, slots=True)
class IntegrityStatistics:
    """Repairs and damage found since start, for status and metrics."""

    consume_queues_rebuilt: int
    index_rebuilds: int
    config_files_rebuilt: int
    corrupt_records_found: int                     # distinct corrupt records seen and not since repaired
    corrupt_records: tuple[CorruptRecord, ...]     # the newest, at most CORRUPT_OFFSETS_KEPT
    ranges_repaired: int
    repairs: tuple[str, ...]                       # what start repaired, in words


@dataclass(slots=True)
class QueueRead:
    """What ``read_queue`` found: messages to serve, where the next read starts, corrupt
    records skipped, and whether the queue itself disagrees with the log."""

    messages: list[StoredMessage]
    next_offset: int
    corrupt: list[CorruptRecord]
    damaged: str = ""


class Integrity:
    """Checks and repairs of the derived files; counters of what it did."""

    def __init__(self, commit_log: CommitLog, queues: ConsumeQueueTable, index: IndexService,
                 dispatcher: Dispatcher) -> None:
        self.commit_log = commit_log
        self.queues = queues
        self.index = index
        self.dispatcher = dispatcher
        self._lock = threading.Lock()
        self._corrupt: deque[CorruptRecord] = deque(maxlen=CORRUPT_OFFSETS_KEPT)
        self._corrupt_seen: set[tuple[str, int, int]] = set()
        self.consume_queues_rebuilt = 0
        self.index_rebuilds = 0
        self.config_files_rebuilt = 0
        self.ranges_repaired = 0        # ranges written back from an intact copy
        self.repairs: list[str] = []
        self._queue_marker = os.path.join(queues.root, REBUILD_MARKER)
        self._index_marker = os.path.join(index.directory, REBUILD_MARKER)

    # --- start ---------------------------------------------------------------------------
    def repair_at_start(self, *, index_missing: bool) -> list[str]:
        """After recovery: rebuild from the log whatever derived file disagrees with it."""
        commit_log = self.commit_log
        end = self.dispatcher.dispatched_offset
        repairs = list(commit_log.segments.repairs) + list(self.index.repairs)
        has_log = end > commit_log.min_offset
        interrupted = _read_marker(self._queue_marker)
        if interrupted is not None:
            self._warn(repairs, "a consume queue rebuild was interrupted by a crash: doing it again")
            self.rebuild_queues(None if interrupted == "all" else {tuple(key) for key in interrupted})
        elif has_log and not self.queues.queues:
            self._warn(repairs, "no consume queue at all for a non-empty commit log: rebuilding them from the log")
            self.rebuild_queues(None)
        else:
            damaged = {}
            for queue in self.queues.all():
                reason = queue.suspect or queue_damage(commit_log, queue)
                if reason:
                    damaged[(queue.topic, queue.queue_id)] = reason
            if damaged:
                for (topic, queue_id), reason in sorted(damaged.items()):
                    self._warn(repairs, f"consume queue {topic}/{queue_id} disagrees with the log ({reason}): "
                                        "rebuilding it from the log")
                self.rebuild_queues(set(damaged))
        index_reason = "index files missing or deleted" if index_missing or self.index.repairs else ""
        if _read_marker(self._index_marker) is not None:
            index_reason = "an index rebuild was interrupted by a crash"
        for index_file in self.index.files:
            index_reason = index_reason or index_damage(commit_log, index_file)
        if has_log and index_reason:
            self._warn(repairs, f"{index_reason}: rebuilding the index from the log")
            self.rebuild_index()
        self.repairs.extend(repairs)
        return repairs

    @staticmethod
    def _warn(repairs: list[str], text: str) -> None:
        log.warning("%s", text)
        repairs.append(text)

    # --- rebuilding ----------------------------------------------------------------------
    def rebuild_queues(self, keys: set[tuple[str, int]] | None) -> int:
        """Rebuild the ConsumeQueues ``keys`` (None: every queue the log holds) from the
        log, up to the dispatched offset. Holds the dispatcher's lock: no pass runs
        meanwhile. Returns how many queues were written."""
        with self.dispatcher.lock:
            # a crash half way leaves a queue that looks whole but ends early: the marker
            # makes the next start rebuild it again
            _write_marker(self._queue_marker, "all" if keys is None else sorted(keys))
            start, end = self.commit_log.min_offset, self.dispatcher.dispatched_offset
            runs: dict[tuple[str, int], list[tuple[int, bytes]]] = {}
            for batch in _batches(self.commit_log, start, end):
                for queue_key, first, entries in batch.queue_runs:
                    if keys is None or queue_key in keys:
                        runs.setdefault(queue_key, []).append((first, entries))
            targets = set(runs) | (keys or set())
            for queue_key in targets:
                self._replace_queue(queue_key, runs.get(queue_key, []))
            _clear_marker(self._queue_marker)
            self.consume_queues_rebuilt += len(targets)
        return len(targets)

    def _replace_queue(self, queue_key: tuple[str, int], runs: list[tuple[int, bytes]]) -> None:
        table = self.queues
        old = table.queues.get(queue_key)
        if old is not None:
            for mapped in reversed(old.files.files):
                mapped.destroy()
            old.files.files = []
        queue = ConsumeQueue(table.root, queue_key[0], queue_key[1], table.entries_per_file)
        queue.load()
        for first, entries in runs:
            if queue.max_offset != queue.min_offset and first > queue.max_offset:
                # a record of this queue the walk could not read: filler keeps offsets in place,
                # and reads report those offsets as lost
                missing = first - queue.max_offset
                queue.append_entries(queue.max_offset, _FILLER_RUN * missing)
            queue.append_entries(first, entries)
        queue.flush()
        table.queues = {**table.queues, queue_key: queue}

    def rebuild_index(self) -> None:
        """Drop every index file and add the keys of every message of the log again."""
        with self.dispatcher.lock:
            _write_marker(self._index_marker, "all")
            self.index.destroy_all()
            start, end = self.commit_log.min_offset, self.dispatcher.dispatched_offset
            for batch in _batches(self.commit_log, start, end):
                if len(batch.key_hashes):
                    self.index.put_many(batch.key_hashes, batch.key_offsets, batch.key_timestamps)
            self.index.flush()
            _clear_marker(self._index_marker)
            self.index_rebuilds += 1

    def rebuild_configs(self, configs) -> list[str]:
        """topics.json / consumerOffset.json unreadable in both copies, or missing while the
        log holds %SYS%CONFIG records: rebuilt from those records (``config_rebuild``)."""
        queue = self.queues.get(SYS_CONFIG_TOPIC, 0)
        low, high = (queue.min_offset, queue.max_offset) if queue is not None else (0, 0)

        def pull(queue_offset: int, count: int) -> QueueRead:
            return self.read_queue(queue, queue_offset, count, check_crc=True, read_limit=None, max_bytes=1 << 24)

        names = rebuild_configs(configs, pull, low, high)
        if names:
            self.config_files_rebuilt += len(names)
            self.repairs.extend(f"{name} rebuilt from the {SYS_CONFIG_TOPIC} records of the log" for name in names)
        return names

    # --- reading -------------------------------------------------------------------------
    def read_queue(self, queue: ConsumeQueue, queue_offset: int, max_count: int, *, check_crc: bool,
                   read_limit: int | None, max_bytes: int) -> QueueRead:
        """Messages of ``queue`` from ``queue_offset``, each checked against its entry."""
        result = QueueRead([], queue_offset, [])
        total_bytes = 0
        for entry in queue.entries(queue_offset, max_count):
            if read_limit is not None and entry.physical_offset + entry.size > read_limit:
                break  # not yet on every in-sync replica: a failover could still drop it
            if entry.size == FILLER_SIZE:
                self._report(result, queue, entry, "lost: no readable record of this queue offset in the log")
                continue
            try:
                message = self.commit_log.read_message(entry.physical_offset, check_crc=check_crc)
            except MessageNotFound:
                disorder = _out_of_log_order(queue, entry)
                if disorder:   # neither a cut nor retention leaves this: the entry is damaged
                    result.damaged = disorder
                    return result
                if entry.physical_offset >= self.commit_log.max_offset:
                    break  # a cut of the log is under way: the queue's entry goes next
                result.next_offset = entry.queue_offset + 1  # deleted by retention meanwhile
                continue
            except StoreCorruptError as error:
                if entry.physical_offset >= self.commit_log.max_offset:
                    break  # the cut zeroed the record after this read began: not damage
                if not self.commit_log.record_starts_at(entry.physical_offset) and \
                        not self.commit_log.boundary_at(entry.physical_offset + entry.size):
                    # the entry names no record (a record whose own magic or offset field is
                    # damaged still ends where its successor starts: that one is reported below)
                    result.damaged = f"entry {entry.queue_offset} points at {entry.physical_offset}, no record starts there"
                    return result
                self._report(result, queue, entry, str(error))
                continue
            if (message.topic, message.queue_id, message.queue_offset, message.total_size) != \
                    (queue.topic, queue.queue_id, entry.queue_offset, entry.size):
                result.damaged = (f"entry {entry.queue_offset} points at {entry.physical_offset}, which holds "
                                  f"{message.topic}/{message.queue_id} queue offset {message.queue_offset}")
                return result
            result.messages.append(message)
            result.next_offset = entry.queue_offset + 1
            total_bytes += message.total_size
            if total_bytes >= max_bytes:
                break
        return result

    def _report(self, result: QueueRead, queue: ConsumeQueue, entry: QueueEntry, reason: str) -> None:
        record = CorruptRecord(queue.topic, queue.queue_id, entry.queue_offset, entry.physical_offset, reason)
        result.corrupt.append(record)
        result.next_offset = entry.queue_offset + 1
        key = (queue.topic, queue.queue_id, entry.queue_offset)
        with self._lock:
            if key not in self._corrupt_seen:
                self._corrupt_seen.add(key)
                self._corrupt.append(record)
                log.warning("corrupt record not served: %s/%d queue offset %d, commit log offset %d: %s",
                            record.topic, record.queue_id, record.queue_offset, record.physical_offset, reason)

    def note_corrupt_physical(self, physical_offset: int, reason: str) -> None:
        """A corrupt record found outside a queue read (the scrub): counted and named."""
        key = ("", -1, physical_offset)
        with self._lock:
            if key not in self._corrupt_seen:
                self._corrupt_seen.add(key)
                self._corrupt.append(CorruptRecord("", -1, -1, physical_offset, reason))
                log.warning("corrupt record in the commit log at offset %d: %s", physical_offset, reason)

    def forget_corrupt(self, start: int, end: int) -> None:
        """Records in [start, end) were repaired (``repair.overwrite_range``): no longer named."""
        with self._lock:
            repaired = [r for r in self._corrupt if start <= r.physical_offset < end]
            for record in repaired:
                self._corrupt.remove(record)
                self._corrupt_seen.discard((record.topic, record.queue_id, record.queue_offset))
                self._corrupt_seen.discard(("", -1, record.physical_offset))
            self.ranges_repaired += 1

    def statistics(self) -> IntegrityStatistics:
        with self._lock:
            return IntegrityStatistics(self.consume_queues_rebuilt, self.index_rebuilds, self.config_files_rebuilt,
                                       len(self._corrupt_seen), tuple(self._corrupt), self.ranges_repaired,
                                       tuple(self.repairs))


_FILLER_RUN = codec.struct.pack(">qiq", 0, FILLER_SIZE, 0)


def _batches(commit_log: CommitLog, start: int, end: int):
    """DispatchBatches of the records in [start, end), segment by segment (no CRC check)."""
    parser = DispatchParser()
    offset = start
    while offset < end:
        segment = commit_log.segments.find(offset)
        if segment is None:
            return
        limit = min(segment.end_offset, end) - segment.start_offset
        positions, stop, blank = _walk(segment, offset - segment.start_offset, limit)
        if positions:
            yield parser.parse_each(segment.mm, positions)
        offset = segment.end_offset if blank else segment.start_offset + stop
        if not blank and stop < limit:
            return


def queue_damage(commit_log: CommitLog, queue: ConsumeQueue) -> str:
    """Why ``queue`` disagrees with the log ('' when it agrees): every entry from its min
    offset must name a record whose TOTALSIZE, magic, queue id, queue offset and physical
    offset match, in log order. Entries below the log's first offset (retention) are skipped."""
    entries = _entries_array(queue)
    if entries is None or not len(entries):
        return ""
    offsets = entries["offset"].astype(np.int64)
    sizes = entries["size"].astype(np.int64)
    filler = sizes == FILLER_SIZE
    if bool((sizes <= 0).any()):
        return f"a hole at queue offset {queue.min_offset + int(np.argmax(sizes <= 0))}"
    real = ~filler
    if bool((offsets[real] < 0).any()) or bool((offsets[real] + sizes[real] > commit_log.max_offset).any()):
        return "an entry points outside the commit log"
    real_offsets = offsets[real]
    if len(real_offsets) > 1 and bool((real_offsets[1:] <= real_offsets[:-1]).any()):
        return "entries out of log order"
    numbers = np.arange(queue.min_offset, queue.min_offset + len(entries), dtype=np.int64)
    keep = real & (offsets >= commit_log.min_offset) & _start_check_sample(len(entries))
    for segment in commit_log.segments.files:
        inside = keep & (offsets >= segment.start_offset) & (offsets < segment.end_offset)
        if not inside.any():
            continue
        positions = offsets[inside] - segment.start_offset
        if bool((positions + codec.BODY_LENGTH_AT > segment.size).any()):
            return "an entry points at the end of a segment"
        raw = np.frombuffer(segment.mm, np.uint8)
        try:
            fields = _gather(raw, positions)
        finally:
            del raw
        want = np.stack([sizes[inside], np.full(len(positions), codec.MESSAGE_MAGIC), np.full(len(positions), queue.queue_id),
                         numbers[inside], offsets[inside]], axis=1)
        bad = (fields != want).any(axis=1)
        if bad.any():
            at = int(np.argmax(bad))
            return (f"entry {int(numbers[inside][at])} points at {int(offsets[inside][at])}, "
                    "where its record is not")
    return ""


def _out_of_log_order(queue: ConsumeQueue, entry: QueueEntry) -> str:
    """Why ``entry`` (whose record is outside the log) is out of log order with its
    neighbours ('' when it is not): a cut drops an entry together with every later one,
    retention every earlier one, so an entry past the log's end ahead of a later entry
    inside it, or one before the log's start behind an earlier entry, is damage."""
    last = queue.max_offset - 1     # read once: a cut may shrink the queue meanwhile
    if entry.queue_offset < last:
        later = _physical_offset_at(queue, last)
        if later is not None and entry.physical_offset > later:
            return f"entry {entry.queue_offset} points at {entry.physical_offset}, past the queue's last entry ({later})"
    if entry.physical_offset < 0:
        return f"entry {entry.queue_offset} points at {entry.physical_offset}"
    if queue.min_offset < entry.queue_offset <= last:
        earlier = _physical_offset_at(queue, entry.queue_offset - 1)
        if earlier is not None and 0 < earlier and entry.physical_offset <= earlier:   # a filler names 0
            return f"entry {entry.queue_offset} points at {entry.physical_offset}, not after the entry before it ({earlier})"
    return ""


def _physical_offset_at(queue: ConsumeQueue, queue_offset: int) -> int | None:
    """The physical offset of an entry, or None when a cut removed its file meanwhile."""
    mapped = queue.files.find(queue_offset * ENTRY_BYTES)
    if mapped is None:
        return None
    return codec.struct.unpack_from(">q", mapped.mm, queue_offset * ENTRY_BYTES - mapped.start_offset)[0]


def _start_check_sample(count: int) -> np.ndarray:
    """Which of ``count`` entries a start check follows into the log: the newest
    START_CHECK_TAIL_ENTRIES and START_CHECK_SAMPLE_ENTRIES spread evenly over the rest."""
    chosen = np.zeros(count, bool)
    chosen[max(0, count - START_CHECK_TAIL_ENTRIES):] = True
    older = count - START_CHECK_TAIL_ENTRIES
    if older > 0:
        chosen[np.linspace(0, older - 1, min(older, START_CHECK_SAMPLE_ENTRIES)).astype(np.int64)] = True
    return chosen


def _gather(raw: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """TOTALSIZE, MAGIC, QUEUEID, QUEUEOFFSET, PHYSICALOFFSET of the records at ``positions``."""
    def field(at: int, width: int) -> np.ndarray:
        columns = raw[positions[:, None] + np.arange(at, at + width)]
        value = np.zeros(len(positions), np.uint64)
        for byte in range(width):
            value = (value << np.uint64(8)) | columns[:, byte].astype(np.uint64)
        if width == 4:
            return value.astype(np.int64)   # TOTALSIZE/QUEUEID are non-negative; MAGIC stays unsigned
        return value.view(np.int64)
    return np.stack([field(0, 4), field(4, 4), field(codec.QUEUE_ID_AT, 4), field(codec.QUEUE_OFFSET_AT, 8),
                     field(codec.PHYSICAL_OFFSET_AT, 8)], axis=1)


def _entries_array(queue: ConsumeQueue):
    """The entries [min_offset, max_offset) of ``queue`` as one structured array."""
    if queue.max_offset <= queue.min_offset:
        return None
    parts = []
    for mapped in queue.files.files:
        first = max(queue.min_offset * ENTRY_BYTES, mapped.start_offset)
        last = min(queue.max_offset * ENTRY_BYTES, mapped.end_offset)
        if first >= last:
            continue
        parts.append(np.frombuffer(mapped.mm[first - mapped.start_offset:last - mapped.start_offset], _ENTRY_DTYPE))
    return np.concatenate(parts) if parts else None


def index_damage(commit_log: CommitLog, index_file) -> str:
    """Why ``index_file`` disagrees with the log ('' when it agrees): a header count out of
    range, a slot naming no entry, entries out of log order, or an entry not naming a record."""
    header = index_file.header
    raw_count = codec.struct.unpack_from(">i", index_file.mm, 36)[0]
    if not 1 <= raw_count <= index_file.max_entries:
        return f"{index_file.path}: header count {raw_count} out of range"
    if not index_file.slots_consistent():
        return f"{index_file.path}: a slot names an entry past the last one"
    count = header.index_count
    if count <= 1:
        return ""
    entries = np.frombuffer(index_file.mm, _INDEX_ENTRY_DTYPE, count - 1,
                            index_file._entries_at + _INDEX_ENTRY_DTYPE.itemsize)
    try:
        offsets = entries["offset"].astype(np.int64)
        previous = entries["previous"].astype(np.int64)
    finally:
        del entries
    numbers = np.arange(1, count, dtype=np.int64)
    if bool((previous < 0).any()) or bool((previous >= numbers).any()):
        return f"{index_file.path}: an entry's chain points forward"
    if len(offsets) > 1 and bool((offsets[1:] < offsets[:-1]).any()):
        return f"{index_file.path}: entries out of log order"
    if bool((offsets < 0).any()) or bool((offsets >= max(commit_log.max_offset, 1)).any()):
        return f"{index_file.path}: an entry points outside the commit log"
    for segment in commit_log.segments.files:
        inside = (offsets >= max(segment.start_offset, commit_log.min_offset)) & (offsets < segment.end_offset)
        if not inside.any():
            continue
        positions = np.unique(offsets[inside & _start_check_sample(len(offsets))]) - segment.start_offset
        if not len(positions):
            continue
        if bool((positions + codec.BODY_LENGTH_AT > segment.size).any()):
            return f"{index_file.path}: an entry points at the end of a segment"
        raw = np.frombuffer(segment.mm, np.uint8)
        try:
            fields = _gather(raw, positions)
        finally:
            del raw
        if bool((fields[:, 1] != codec.MESSAGE_MAGIC).any()) or \
                bool((fields[:, 4] != positions + segment.start_offset).any()):
            return f"{index_file.path}: an entry names an offset where no record starts"
    return ""


_INDEX_ENTRY_DTYPE = np.dtype([("key_hash", ">i4"), ("offset", ">i8"), ("time_diff", ">i4"), ("previous", ">i4")])
assert _INDEX_ENTRY_DTYPE.itemsize == 20


def _write_marker(path: str, content) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_atomically(path, json.dumps(content).encode(), keep_backup=False)


def _read_marker(path: str):
    """The marker's content, None without one ("all" when it is unreadable)."""
    try:
        with open(path, "rb") as handle:
            return json.loads(handle.read())
    except FileNotFoundError:
        return None
    except ValueError:
        return "all"


def _clear_marker(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        return
    fsync_directory(os.path.dirname(path))
