"""CommitLog: every message of every topic, appended in arrival order (RocketMQ v1 layout).

    commitlog/{start offset, 20 digits}   fixed-size segments (default 1 GiB)

Record layout: see ``codec``. A segment that cannot hold the next message plus an 8-byte
blank record is closed with a blank record (TOTALSIZE = remaining bytes, magic 0xCBD43194)
and the message goes to the next segment, so no message ever spans two segments.

One writer at a time (``_write_lock``) assigns physical offsets, per topic/queue queue
offsets and store timestamps. ``max_offset`` moves only after a message's bytes are in the
mapping, so any reader below it sees whole messages. The log is the truth: ConsumeQueue
and IndexFile are rebuilt from it by the dispatcher.
"""

from __future__ import annotations

import logging
import threading
import time
from bisect import bisect_left, bisect_right
from collections import deque
from itertools import accumulate, repeat
from operator import add
from typing import Callable, Iterator, NamedTuple

from . import codec
from .codec import CorruptMessage, StoredMessage
from .errors import DiskFullError, MessageNotFound, StoreCorruptError, StoreError, invariant
from .mapped_file import WRITE_MAPPED_BYTES_MAX
from .mapped_file_queue import MappedFileQueue
from .message import PutColumns, PutResult, PutStatus
from .put_batch import BatchColumns, encode_run, queue_offsets_for

log = logging.getLogger(__name__)


class PreparedMessage(NamedTuple):
    """A validated message with everything computed that does not need the write lock:
    the body's CRC and the record's tail (topic and properties, ``codec.encode_tail``).

    A NamedTuple: a batch builds one per message and the writer unpacks it in its hot loop.
    """

    topic: str
    queue_id: int
    body: bytes
    body_crc: int
    tail: bytes
    flag: int
    sys_flag: int
    born_timestamp: int
    born_host: bytes
    reconsume_times: int
    prepared_transaction_offset: int
    size: int


# how far the writer goes between asking for the window of pages ahead of it
POPULATE_CHECK_BYTES = 2 * 1024 * 1024
# A replica's small writes (a caught-up slave's frames of a few records, copied into the
# mapping) have a smaller window, asked for more often: with the puts' 16 MiB, a slave that
# had written megabytes by ``pwrite`` faulted in 16 MiB when one-at-a-time sends began, up to
# 40-90 µs of its CPU a send over a bench round of 1,000 of them.
REPLICA_WRITE_WINDOW_BYTES = 1024 * 1024
REPLICA_WRITE_CHECK_BYTES = 256 * 1024


# the writer's record of where its records went, for the dispatcher: at most this many runs
WRITTEN_RUNS_MAX = 4096
# A flush lets the page cache go of the log behind ``cache_bytes`` once this much more is
# behind it: a sync flush (one per put) does not pay the system calls each time.
RELEASE_STEP_BYTES = 4 * 1024 * 1024


class WrittenRuns:
    """Where the writer's appends placed their records: runs of (first offset, end offset,
    each record's offset), in log order.

    The dispatcher takes record offsets from here instead of walking the headers one by
    one (a quarter of its time). What this process appended is here, and what a slave
    appended by replication (its check of the chunk found the records); the log found by
    recovery is walked. Bounded: when the dispatcher falls far
    behind, the oldest runs are dropped and it walks those records instead. Appended by
    the writer under its lock, taken by the dispatcher under its own: a deque's ``append``
    and ``popleft`` need no lock between the two. ``runs_max`` bounds the runs kept.
    """

    def __init__(self, runs_max: int = WRITTEN_RUNS_MAX) -> None:
        self._runs: deque[tuple[int, int, list[int]]] = deque(maxlen=runs_max)

    def add(self, offsets: list[int], end: int) -> None:
        if offsets:
            self._runs.append((offsets[0], end, offsets))

    def clear(self) -> None:
        self._runs.clear()

    def take(self, start: int, limit: int) -> tuple[list[int], int] | None:
        """The offsets of the records starting in [start, limit) and the offset just after
        the last of them, if the runs cover the log from ``start`` on; None (walk) if not."""
        runs = self._runs
        while runs and runs[0][1] <= start:   # dispatched already (or cut off the log)
            runs.popleft()
        offsets: list[int] = []
        cursor = start
        while runs and cursor < limit:
            first, end, run = runs[0]
            if first != cursor:
                if first < cursor:   # the dispatcher stopped inside this run: keep its rest
                    run = run[bisect_left(run, cursor):]
                    if not run or run[0] != cursor:
                        break
                else:
                    break
            taken = bisect_left(run, limit)
            offsets.extend(run[:taken] if taken < len(run) else run)
            if taken < len(run):
                cursor = run[taken]
                break
            runs.popleft()
            cursor = end
        return (offsets, cursor) if offsets else None


def now_ms() -> int:
    """Wall-clock time in milliseconds: the store time of what is written now."""
    return time.time_ns() // 1_000_000


class CommitLog:
    """Append-only message log over a MappedFileQueue of segments. ``clock`` gives the
    store time in milliseconds (tests pass a fixed one to compare bytes)."""

    def __init__(self, directory: str, segment_bytes: int, store_host: str, *, preallocate: bool = True,
                 cache_bytes: int = 0, clock: Callable[[], int] = now_ms) -> None:
        """``cache_bytes``: how much of the log, back from its flushed end, stays in the page
        cache; older pages are let go after a flush (0: all stay, the kernel decides)."""
        self.clock = clock
        self.cache_bytes = cache_bytes
        self.segments = MappedFileQueue(directory, segment_bytes, preallocate=preallocate)
        self.segment_bytes = segment_bytes
        self.store_host = store_host
        self.store_host_bytes = codec.encode_host(store_host)
        self._message_id_prefix = self.store_host_bytes.hex().upper()
        self.max_offset = 0            # end of the last whole record
        self.flushed_offset = 0        # everything below is on disk
        self.queue_offsets: dict[tuple[str, int], int] = {}
        self.last_store_timestamp = 0
        self.flushed_store_timestamp = 0   # no later than the store time of the last flushed message
        self.put_messages = 0          # written by append (not by replication)
        self.put_bytes = 0
        self._write_lock = threading.Lock()
        self._closed = False
        self._populate_at = 0          # ask for the window ahead again once max_offset passes this
        self.written_runs = WrittenRuns()
        # told (first offset, bytes) of each run of records ``append`` placed, as soon as it is
        # in the log, under the write lock: a master sends it to its slaves before the rest of
        # the put's work (replication/log_sender.py, ``appended_run``). It must not raise.
        self.run_listener: Callable[[int, bytes], None] | None = None

    # --- lifecycle -----------------------------------------------------------------------
    def load(self) -> None:
        self.segments.load()

    def close(self) -> None:
        self._closed = True
        self.segments.close()

    @property
    def min_offset(self) -> int:
        return self.segments.min_offset

    # --- writing -------------------------------------------------------------------------
    def append(self, batch: list[PreparedMessage]) -> list[PutResult]:
        """Write a batch with as few copies as the segment boundaries allow."""
        with self._write_lock:
            store_timestamp = self._store_timestamp()
            results: list[PutResult] = []
            index = 0
            while index < len(batch):
                try:
                    segment = self._writable_segment()
                except DiskFullError as error:
                    reason = str(error)
                    results.extend(PutResult(PutStatus.SERVICE_NOT_AVAILABLE, reason=reason) for _ in batch[index:])
                    break
                index = self._append_to_segment(segment, batch, index, store_timestamp, results)
            self._populate_ahead()
            return results

    def _store_timestamp(self) -> int:
        """The store time of the batch being written (under the write lock): never earlier
        than the last one, so store times follow the log's order."""
        if self._closed:
            raise StoreError("commit log is closed")
        self.last_store_timestamp = max(self.clock(), self.last_store_timestamp)
        return self.last_store_timestamp

    def _populate_ahead(self, window: int | None = None, check_bytes: int = POPULATE_CHECK_BYTES) -> None:
        """Keep the pages ahead of the writer faulted in by the preallocator's thread
        (``window`` bytes of them, or the default); asked every ``check_bytes``, it costs a
        look-up per batch."""
        if self.max_offset >= self._populate_at:
            self._populate_at = self.max_offset + check_bytes
            self.segments.populate_ahead(self.max_offset, for_write=True, window=window)

    def _writable_segment(self):
        last = self.segments.last
        if last is None or self.max_offset >= last.end_offset:
            start = self.max_offset if last is None else last.end_offset
            if last is None and start % self.segment_bytes:
                start -= start % self.segment_bytes
            last = self.segments.roll(start)
        return last

    def _append_to_segment(self, segment, batch, index, store_timestamp, results) -> int:
        """Write batch[index:] while it fits the segment; return the first index not written.

        The hot loop of every put: per message one header pack, one CRC over header and
        tail, one result; the pieces of the whole run are joined and copied once.
        """
        position = self.max_offset
        segment_end = segment.end_offset
        pieces: list[bytes] = []
        add_pieces = pieces.extend
        add_result = results.append
        pending_offsets: dict[tuple[str, int], int] = {}
        positions: list[int] = []
        add_position = positions.append
        queue_offsets = self.queue_offsets
        store_host = self.store_host_bytes
        id_prefix = self._message_id_prefix
        pack = codec.HEADER.pack
        seal = codec.seal
        magic = codec.MESSAGE_MAGIC
        ok = PutStatus.PUT_OK
        new_result = tuple.__new__
        room = segment_end - codec.END_OF_SEGMENT_MIN_BLANK
        count = len(batch)
        first = index
        while index < count:
            (topic, queue_id, body, body_crc, tail, flag, sys_flag, born_timestamp, born_host, reconsume_times,
             prepared_transaction_offset, size) = batch[index]
            if position + size > room:
                break
            queue_key = (topic, queue_id)
            queue_offset = pending_offsets.get(queue_key)
            if queue_offset is None:
                queue_offset = queue_offsets.get(queue_key, 0)
            pending_offsets[queue_key] = queue_offset + 1
            header = pack(size, magic, body_crc, queue_id, flag, queue_offset, position, sys_flag,
                          born_timestamp or store_timestamp, born_host, store_timestamp, store_host,
                          reconsume_times, prepared_transaction_offset, len(body))
            add_pieces((header, body, tail, seal(header, body, tail)))
            add_position(position)
            add_result(new_result(PutResult, (ok, position, queue_offset, f"{id_prefix}{position:016X}",
                                              store_timestamp, size, "")))
            position += size
            index += 1
        if pieces:
            data = b"".join(pieces)
            start = self.max_offset - segment.start_offset
            segment.mm[start:start + len(data)] = data
            queue_offsets.update(pending_offsets)
            self.put_messages += index - first
            self.put_bytes += position - self.max_offset
            self.written_runs.add(positions, position)
        self.max_offset = position
        if pieces and self.run_listener is not None:
            self.run_listener(position - len(data), data)
        if index < count:
            self._close_segment(segment)
        return index

    def _close_segment(self, segment) -> None:
        """The next message does not fit: close the segment with a blank record."""
        blank_at = self.max_offset - segment.start_offset
        segment.mm[blank_at:blank_at + codec.BLANK_HEADER.size] = codec.encode_blank(segment.size - blank_at)
        self.max_offset = segment.end_offset

    def append_columns(self, columns: BatchColumns) -> PutColumns | list[PutResult]:
        """Write a regular batch (``put_batch``): the same records ``append`` writes for the
        same messages, placed a segment's worth of messages at a time without a Python loop
        per message. Their results as PutColumns when every message was written; a list of
        PutResults when a full disk refused the rest."""
        with self._write_lock:
            store_timestamp = self._store_timestamp()
            positions: list[int] = []
            queue_offsets: list[int] = []
            total = len(columns.sizes)
            start = 0
            refusal = None
            while start < total:
                try:
                    segment = self._writable_segment()
                except DiskFullError as error:
                    refusal = str(error)
                    break
                room = segment.end_offset - codec.END_OF_SEGMENT_MIN_BLANK - self.max_offset
                end = start + bisect_right(list(accumulate(columns.sizes[start:])), room)
                if end > start:
                    run = columns if start == 0 and end == total else columns.run(start, end)
                    run_positions, run_queue_offsets = self._write_run(segment, run, store_timestamp)
                    if positions:   # new lists: the written runs keep the first run's own
                        positions = positions + run_positions
                        queue_offsets = queue_offsets + run_queue_offsets
                    else:
                        positions, queue_offsets = run_positions, run_queue_offsets
                if end < total:
                    self._close_segment(segment)
                start = end
            self._populate_ahead()
        written = PutColumns(positions, queue_offsets, columns.sizes if start == total else columns.sizes[:start],
                             store_timestamp, self._message_id_prefix)
        if refusal is None:
            return written
        refused = PutResult(PutStatus.SERVICE_NOT_AVAILABLE, reason=refusal)
        return (written.results() if positions else []) + [refused] * (total - len(positions))

    def _write_run(self, segment, run: BatchColumns, store_timestamp: int) -> tuple[list[int], list[int]]:
        """Place ``run`` (it fits) at the end of ``segment``; its physical and queue offsets."""
        queue_offsets, next_offsets = queue_offsets_for(run.topics, run.queue_ids, self.queue_offsets)
        data, positions = encode_run(run, self.max_offset, queue_offsets, store_timestamp, self.store_host_bytes)
        at = self.max_offset - segment.start_offset
        segment.mm[at:at + len(data)] = data
        self.queue_offsets.update(next_offsets)
        self.put_messages += len(positions)
        self.put_bytes += len(data)
        self.max_offset += len(data)
        self.written_runs.add(positions, self.max_offset)
        if self.run_listener is not None:
            self.run_listener(positions[0], data)
        return positions, queue_offsets

    def append_bytes(self, offset: int, data, positions: list[int] | None = None, *,
                     read_ahead: bool = True) -> None:
        """Append raw records (bytes-like) at exactly ``offset`` (replication). They must be
        whole records. Written with ``pwrite``, which releases the GIL (see MappedFile.write),
        with the pages ahead brought in by the preallocator meanwhile (``read_ahead``; without
        it ``pwrite`` allocates its pages itself, and a write small enough to be copied into
        the mapping has them faulted in writable ahead, as a put does). ``positions``: where
        in ``data`` each message record starts, as the caller's check of the framing found
        them (``replica_log.check_chunk``); kept in ``written_runs`` for the dispatcher."""
        view = memoryview(data).cast("B")
        with self._write_lock:
            if offset != self.max_offset:
                raise StoreError(f"append at {offset} but the commit log ends at {self.max_offset}")
            written = 0
            while written < len(view):
                segment = self._writable_segment()
                position = self.max_offset - segment.start_offset
                step = min(len(view) - written, segment.size - position)
                segment.write(position, view[written:written + step], populate=read_ahead)
                written += step
                self.max_offset += step
            # kept only once written: a write that failed (no room for the next segment, a
            # full disk) must leave no run behind for other bytes later written at ``offset``.
            # A dispatcher that ran meanwhile walked these records itself; a run it has
            # passed is dropped by ``take``.
            if positions:
                last = positions[-1]
                run_end = offset + last + codec.BLANK_HEADER.unpack_from(view, last)[0]
                self.written_runs.add(list(map(add, positions, repeat(offset))), run_end)
            if read_ahead:
                self.segments.populate_ahead(self.max_offset)
            elif len(view) <= WRITE_MAPPED_BYTES_MAX:
                # a small write goes through the mapping (MappedFile.write): pages faulted in
                # writable ahead of it, as ahead of a put, spare it a fault a page
                self._populate_ahead(REPLICA_WRITE_WINDOW_BYTES, REPLICA_WRITE_CHECK_BYTES)

    # --- flushing ------------------------------------------------------------------------
    def flush(self) -> int:
        """Sync everything written since the last flush (the range only: MappedFile.flush_range);
        return the new flushed offset."""
        # read before the end: every message stored at or before this time is below it
        timestamp = self.last_store_timestamp
        target = self.max_offset
        if target > self.flushed_offset:
            self.segments.flush_range(self.flushed_offset, target)
            self.flushed_offset = target
            self.flushed_store_timestamp = max(self.flushed_store_timestamp, timestamp)
            if self.cache_bytes and target - self.cache_bytes - self.segments.released_offset >= RELEASE_STEP_BYTES:
                self.segments.release_before(target - self.cache_bytes)
        return target

    # --- reading -------------------------------------------------------------------------
    def read(self, offset: int, size: int) -> bytes:
        """Raw bytes [offset, offset + size) of one segment."""
        segment = self.segments.find(offset)
        if segment is None or offset + size > self.max_offset:
            raise MessageNotFound(f"offset {offset} (+{size}) is outside the commit log "
                                  f"[{self.min_offset}, {self.max_offset})")
        position = offset - segment.start_offset
        invariant(position + size <= segment.size, "a record never spans two segments")
        return segment.mm[position:position + size]

    def read_message(self, offset: int, *, check_crc: bool = True) -> StoredMessage:
        """Decode the message starting at ``offset``."""
        segment = self.segments.find(offset)
        if segment is None or offset >= self.max_offset:
            raise MessageNotFound(f"offset {offset} is outside the commit log [{self.min_offset}, {self.max_offset})")
        position = offset - segment.start_offset
        size = codec.BLANK_HEADER.unpack_from(segment.mm, position)[0]
        if size <= 0 or position + size > segment.size:
            raise StoreCorruptError(f"{segment.path}: no message at offset {offset}")
        try:
            return codec.decode_message(segment.mm[position:position + size], 0, check_crc=check_crc)
        except CorruptMessage as error:
            raise StoreCorruptError(f"{segment.path}: message at offset {offset} is corrupt: {error}") from None

    def record_starts_at(self, offset: int) -> bool:
        """Whether a message record starts at ``offset``: its magic is there and its own
        PHYSICALOFFSET field names ``offset`` (bytes inside a body almost never do both)."""
        segment = self.segments.find(offset)
        if segment is None or offset >= self.max_offset:
            return False
        position = offset - segment.start_offset
        if position + codec.BODY_LENGTH_AT > segment.size:
            return False
        magic = int.from_bytes(segment.mm[position + 4:position + 8], "big")
        physical_offset = int.from_bytes(segment.mm[position + codec.PHYSICAL_OFFSET_AT:
                                                    position + codec.PHYSICAL_OFFSET_AT + 8], "big")
        return magic == codec.MESSAGE_MAGIC and physical_offset == offset

    def boundary_at(self, offset: int) -> bool:
        """Whether a record ends at ``offset`` as far as what follows says: a message record
        or a blank one starts there, or it is the end of a segment or of the log. A record
        whose own magic or offset field is damaged is still known by where its successor starts."""
        if offset == self.max_offset:
            return True
        segment = self.segments.find(offset)
        if segment is None or offset > self.max_offset:
            return False
        position = offset - segment.start_offset
        if position == 0 or self.record_starts_at(offset):
            return True
        return position + 8 <= segment.size and \
            int.from_bytes(segment.mm[position + 4:position + 8], "big") == codec.BLANK_MAGIC

    def store_timestamp_at(self, offset: int) -> int:
        """STORETIMESTAMP of the message at ``offset``; -1 if unreadable, or where a segment's
        closing blank record starts (it has no store time, and may be too short to hold one)."""
        segment = self.segments.find(offset)
        if segment is None:
            return -1
        position = offset - segment.start_offset
        if position + codec.STORE_TIMESTAMP_AT + 8 > segment.size or \
                codec.BLANK_HEADER.unpack_from(segment.mm, position)[1] == codec.BLANK_MAGIC:
            return -1
        return codec.struct.unpack_from(">q", segment.mm, position + codec.STORE_TIMESTAMP_AT)[0]

    def records(self, start: int, end: int) -> Iterator[tuple[object, int, int, bool]]:
        """(mapping, position, size, is_blank) of each record in [start, end), no CRC check.

        ``start`` must be a record boundary; records below ``max_offset`` are whole.
        """
        offset = start
        while offset < end:
            segment = self.segments.find(offset)
            if segment is None:
                return
            mm = segment.mm
            position = offset - segment.start_offset
            limit = min(segment.size, end - segment.start_offset)
            next_offset = None
            while position < limit:
                size, magic = codec.BLANK_HEADER.unpack_from(mm, position)
                if magic == codec.BLANK_MAGIC:
                    yield mm, position, size, True
                    next_offset = segment.end_offset
                    break
                invariant(magic == codec.MESSAGE_MAGIC and size > 0,
                          f"{segment.path}: no record at offset {segment.start_offset + position}")
                yield mm, position, size, False
                position += size
            offset = next_offset if next_offset is not None else segment.start_offset + position

    # --- recovery ------------------------------------------------------------------------
    def scan_valid_end(self, start: int) -> tuple[int, int, str]:
        """CRC-check every record from ``start``; return (end of the last valid record,
        store timestamp of the last valid message, why the scan stopped)."""
        offset = start
        last_timestamp = 0
        files = self.segments.files
        for segment in files:
            if segment.end_offset <= offset:
                continue
            mm = segment.mm
            position = offset - segment.start_offset
            while True:
                if position >= segment.size:
                    break
                try:
                    header = codec.check_record(mm, position, segment.size)
                except CorruptMessage as error:
                    unwritten = mm[position:position + 4] == b"\0\0\0\0"
                    reason = "end of data" if unwritten else f"{segment.path}: {error}"
                    return segment.start_offset + position, last_timestamp, reason
                if header.is_blank:
                    position = segment.size
                    break
                last_timestamp = codec.struct.unpack_from(">q", mm, position + codec.STORE_TIMESTAMP_AT)[0]
                position += header.total_size
            offset = segment.end_offset
        return offset if files else start, last_timestamp, "end of files"

    def continue_after(self, queue_offsets: dict[tuple[str, int], int], last_store_timestamp: int) -> None:
        """Take each queue's next offset and the last store time from a log that grew by
        replication (``append_bytes``), so the next own append carries on from there."""
        with self._write_lock:
            self.queue_offsets = queue_offsets
            self.last_store_timestamp = max(self.last_store_timestamp, last_store_timestamp)

    def set_end(self, offset: int) -> None:
        """After recovery or replication truncation: cut the log at ``offset`` (a record boundary)."""
        with self._write_lock:
            self.max_offset = offset  # first: a reader then finds a cut record missing, never zeros inside the log
            self.segments.truncate(offset)
            self.flushed_offset = min(self.flushed_offset, offset)
            self._populate_at = 0
            self.written_runs.clear()
            self.segments.request_ahead()
