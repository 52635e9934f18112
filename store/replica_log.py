"""The store's log as replication uses it: ``ReplicaLog`` (the replica operations: read a
chunk, append replicated records, cut, reset, publish the confirm offset), whole-record
chunks, their framing check, and a crash-safe cut marker.

    replica = store.replica_log            # what HAService / HAClient are given
    chunk = replica.read(offset, 4 << 20)  # master: whole records, a view of the mapping
    replica.append(offset, chunk)          # slave: exactly at the log's end
    replica.cut(offset)                    # slave: drop a divergent tail
    replica.publish_confirm_offset(offset) # master: what every in-sync replica holds

``ReplicaLog`` satisfies ``replication.store_protocol.ReplicaStore``. It is composed by
MessageStore from the store's parts and holds no reference back to it; the parts that exist
only while the store runs (checkpoint, flush service, retention) are handed over by
``open`` and let go by ``close``.

Chunks. A master streams its log in chunks of whole records that never span two segments.
A segment's closing blank record belongs to the chunk that reaches it, so such a chunk ends
exactly at the segment's end and the slave's segments line up with the master's byte for
byte. ``read_chunk`` returns a read-only view of the mapping rather than a copy, so the
master hands the page cache to the socket directly. A chunk that takes everything up to the
log's end (a caught-up slave's, nearly every one) is whole records by construction: only
its first record header is looked at. One cut short by ``max_bytes`` walks record headers
(size and magic, no CRC) to end on a record: one ``struct`` unpack per record.
``check_chunk`` is the slave's check of the same framing before a byte is written: a chunk
of records that all have one size (a producer's batches of alike messages) in a few numpy
calls, any other by walking its headers.

Cut marker. Cutting a slave's log past the consistent point touches three structures
(CommitLog, ConsumeQueue, IndexFile) and the checkpoint. A crash half way must never leave
a stale tail that recovery takes for valid data, so the store first records the intent
durably in ``{store}/truncate``::

    0  1  kind: 1 = cut the log at offset, 2 = reset: drop the whole log, restart at offset
    1  8  offset (big-endian)
    9  4  crc32 of bytes 0..9

and removes it only when the cut is complete and the checkpoint rewritten. A start that
finds the marker finishes the job before recovery trusts anything.
"""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass

import logging
from typing import TYPE_CHECKING

import numpy as np

from . import codec
from .checkpoint import CheckpointState
from .codec import CorruptMessage
from .config_files import fsync_directory, write_atomically
from .errors import MessageNotFound, StoreClosedError, StoreError, invariant

if TYPE_CHECKING:
    from .checkpoint import Checkpoint
    from .commit_log import CommitLog
    from .dispatcher import ConsumeQueueTable, Dispatcher
    from .flush import FlushService
    from .index_file import IndexService
    from .retention import Retention

log = logging.getLogger(__name__)

MARKER = struct.Struct(">BqI")
assert MARKER.size == 13
CUT = 1
RESET = 2


class ChunkError(StoreError):
    """Replicated bytes that are not whole records where the log expects them."""


def read_chunk(segments, offset: int, end: int, max_bytes: int) -> memoryview:
    """Whole records from ``offset`` (a record boundary below ``end``) within one segment.

    At most ``max_bytes``, but always at least one record; empty when ``offset >= end``.
    A read-only view of the segment's mapping, not a copy: it shows the log's bytes for as
    long as nothing cuts the log under it (a master's log is only ever appended to; a
    reader that cannot rule a cut out checksums the view once and checks that later).
    """
    if offset >= end:
        return memoryview(b"")
    segment = segments.find(offset)
    if segment is None:
        raise ChunkError(f"offset {offset} is not in the commit log")
    mm = segment.mm
    start = position = offset - segment.start_offset
    limit = min(segment.size, end - segment.start_offset)
    budget_end = start + max_bytes
    unpack = codec.BLANK_HEADER.unpack_from
    if limit <= budget_end and end <= segment.end_offset:
        # all of it, up to ``end``: the log's end is always where a record ends (appends and
        # cuts move it by whole records), so only the first record is looked at (``offset``
        # must be one) rather than each; the slave checks every record's framing anyway
        size, magic = unpack(mm, position)
        if magic == codec.BLANK_MAGIC and start + size == segment.size == limit \
                or magic == codec.MESSAGE_MAGIC and 0 < size <= limit - start:
            return memoryview(mm)[start:limit].toreadonly()
        raise ChunkError(f"{segment.path}: no record at offset {offset}")
    while position < limit:
        size, magic = unpack(mm, position)
        if magic == codec.BLANK_MAGIC:
            position = segment.size
            break
        if magic != codec.MESSAGE_MAGIC or size <= 0 or position + size > segment.size:
            raise ChunkError(f"{segment.path}: no record at offset {segment.start_offset + position}")
        if position + size > budget_end and position > start:
            break
        position += size
    return memoryview(mm)[start:position].toreadonly()


def check_chunk(data, offset: int, segment_bytes: int) -> list[int]:
    """Raise ChunkError unless ``data`` is whole records starting at ``offset`` in one segment;
    return where in ``data`` each message record starts (for the dispatcher, which then
    need not walk them again).

    A blank record must close the segment exactly; nothing may follow it in the chunk.
    """
    segment_position = offset % segment_bytes
    if segment_position + len(data) > segment_bytes:
        raise ChunkError(f"chunk at {offset} of {len(data)} bytes crosses a segment boundary")
    unpack = codec.BLANK_HEADER.unpack_from
    if len(data) >= _ALIKE_RECORDS_MIN * codec.HEADER.size:   # else too few records to be worth it
        positions = _alike_positions(data)
        if positions is not None:
            return positions
    positions = []
    add_position = positions.append
    position = 0
    while position < len(data):
        if len(data) - position < codec.BLANK_HEADER.size:
            raise ChunkError(f"chunk at {offset} ends inside a record header")
        size, magic = unpack(data, position)
        if magic == codec.BLANK_MAGIC:
            if segment_position + position + size != segment_bytes or position + size != len(data):
                raise ChunkError(f"blank record at {offset + position} does not close its segment")
            return positions
        if magic != codec.MESSAGE_MAGIC or size < codec.HEADER.size or position + size > len(data):
            raise ChunkError(f"no whole record at {offset + position} (size {size}, magic {magic:#x})")
        add_position(position)
        position += size
    return positions


# a chunk of this many records or more is first tried as records of one size (numpy)
_ALIKE_RECORDS_MIN = 16
# a record header's size and magic, read as one 8-byte integer
_HEAD = np.dtype("<u8")


def _alike_positions(data) -> list[int] | None:
    """``check_chunk``'s positions when ``data`` is message records that all have the
    first one's size (a producer's batches of alike messages: the common chunk), every
    header checked at once with numpy instead of walked one by one; None when it is not
    (then the walk checks it, and says what is wrong)."""
    if len(data) < codec.BLANK_HEADER.size:
        return None
    size, magic = codec.BLANK_HEADER.unpack_from(data, 0)
    if magic != codec.MESSAGE_MAGIC or size < codec.HEADER.size:
        return None
    count, rest = divmod(len(data), size)
    if rest or count < _ALIKE_RECORDS_MIN:
        return None
    # each record's first eight bytes (size, magic) as one integer, a strided view: no copy;
    # all alike when every one equals the first, checked above
    heads = np.ndarray((count,), _HEAD, data, 0, (size,))
    if not (heads == heads[0]).all():
        return None
    return list(range(0, len(data), size))


@dataclass(frozen=True, slots=True)
class CutIntent:
    kind: int
    offset: int


class CutMarker:
    """The ``truncate`` file: a durable record of a cut in progress."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.path = os.path.join(root, "truncate")

    def read(self) -> CutIntent | None:
        """The pending cut, or None. A torn marker means the cut had not started: None."""
        try:
            with open(self.path, "rb") as handle:
                raw = handle.read(MARKER.size + 1)
        except FileNotFoundError:
            return None
        if len(raw) != MARKER.size:
            return None
        kind, offset, crc = MARKER.unpack(raw)
        if zlib.crc32(raw[:9]) != crc or kind not in (CUT, RESET) or offset < 0:
            return None
        return CutIntent(kind, offset)

    def write(self, intent: CutIntent) -> None:
        head = struct.pack(">Bq", intent.kind, intent.offset)
        write_atomically(self.path, head + struct.pack(">I", zlib.crc32(head)), keep_backup=False)

    def clear(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            return
        fsync_directory(self.root)


class ReplicaLog:
    """The replica operations on the store's log and indexes, and the confirm offset.

    Thread-safe as the store is: appends serialise on the CommitLog's write lock; ``cut``
    and ``reset`` stop the background threads while they work.
    """

    def __init__(self, root: str, commit_log: CommitLog, queues: ConsumeQueueTable, index: IndexService,
                 dispatcher: Dispatcher, *, sync_flush: bool) -> None:
        self._commit_log = commit_log
        self._queues = queues
        self._index = index
        self._dispatcher = dispatcher
        self._sync_flush = sync_flush
        self._cut_marker = CutMarker(root)
        self._checkpoint: Checkpoint | None = None
        self._flusher: FlushService | None = None
        self._retention: Retention | None = None
        self._confirm_offset = 0
        # the log grew (or shrank) under replication: each queue's next offset and the last
        # store time must be taken from what was dispatched before this node's own next put
        self.writes_need_catch_up = False

    # --- lifecycle (the store's start and stop) --------------------------------------------
    def pending_cut(self) -> CutIntent | None:
        """The cut or reset a crash interrupted, if any (the store finishes it at start)."""
        return self._cut_marker.read()

    def finish_interrupted_reset(self, start_offset: int, checkpoint: Checkpoint) -> None:
        """At start, before recovery: complete a reset that a crash interrupted."""
        log.warning("finishing an interrupted replica reset to offset %d", start_offset)
        self._drop_everything(start_offset, checkpoint)

    def open(self, checkpoint: Checkpoint, flusher: FlushService, retention: Retention) -> None:
        """Serve replica operations with the running store's parts; the confirm offset starts
        at the checkpoint's, within the recovered log."""
        self._checkpoint = checkpoint
        self._flusher = flusher
        self._retention = retention
        self._confirm_offset = min(checkpoint.state.confirm_phy_offset, self._commit_log.max_offset)

    def finish_interrupted_cut(self) -> None:
        """At start, once recovery has cut the log: put the new end on disk and in the
        checkpoint, then drop the marker."""
        self._flusher.flush_now()
        self._flusher.write_checkpoint()
        self._cut_marker.clear()

    def close(self) -> None:
        """The store stopped: refuse replica operations until the next ``open``."""
        self._checkpoint = self._flusher = self._retention = None

    def _check_open(self) -> None:
        if self._flusher is None:
            raise StoreClosedError("the store is not running: call start()")

    # --- offsets -------------------------------------------------------------------------
    @property
    def min_offset(self) -> int:
        """Start of the CommitLog (retention moves it up)."""
        return self._commit_log.min_offset

    @property
    def max_offset(self) -> int:
        """End of the CommitLog: always a record boundary."""
        return self._commit_log.max_offset

    @property
    def confirm_offset(self) -> int:
        """The least offset every member of the sync-state set holds (kept in the checkpoint)."""
        return self._confirm_offset

    def publish_confirm_offset(self, offset: int) -> None:
        """The master's HAService moves the confirm offset up; it never goes down here (only
        a cut or reset of the log lowers it)."""
        if offset > self._confirm_offset:
            self._confirm_offset = offset

    def store_timestamp_at(self, offset: int) -> int:
        """Store time of the message starting at ``offset``; -1 when there is none."""
        commit_log = self._commit_log
        if not commit_log.min_offset <= offset < commit_log.max_offset:
            return -1
        return commit_log.store_timestamp_at(offset)

    # --- master: reading -----------------------------------------------------------------
    def read(self, offset: int, max_bytes: int) -> memoryview:
        """Whole records from ``offset`` within one segment, at most ``max_bytes`` (at least one
        record); a segment's closing blank record included. Empty at the end of the log. A
        read-only view of the mapping, not a copy (see ``read_chunk``)."""
        self._check_open()
        commit_log = self._commit_log
        if offset < commit_log.min_offset:
            raise MessageNotFound(f"offset {offset} is below the commit log's first offset {commit_log.min_offset}")
        return read_chunk(commit_log.segments, offset, commit_log.max_offset, max_bytes)

    # --- slave: writing ------------------------------------------------------------------
    def append(self, offset: int, data, *, wake_dispatch: bool = True, read_ahead: bool = True) -> int:
        """A replica's write: whole records (bytes-like) exactly at the end of the log. Returns
        the new end. ``read_ahead``: pages ahead of the write are brought in on another thread
        (``CommitLog.append_bytes``), for a replica writing megabytes at a time.

        The framing is checked before a byte lands (ChunkError, a StoreError, otherwise);
        the dispatcher then builds this replica's own ConsumeQueue and IndexFile: at once
        (``wake_dispatch``), or once the caller calls ``wake_dispatch()`` (an HA client
        lets the frames of a few milliseconds share one pass).
        """
        self._check_open()
        commit_log = self._commit_log
        positions = check_chunk(data, offset, commit_log.segment_bytes)
        commit_log.append_bytes(offset, data, positions, read_ahead=read_ahead)
        self.writes_need_catch_up = True
        if wake_dispatch:
            self._dispatcher.wake.set()
        end = commit_log.max_offset
        if self._sync_flush:
            self._flusher.request(end)
        else:
            self._flusher.written()
        return end

    def wake_dispatch(self) -> None:
        """Have the dispatcher index what was appended (cheap; any thread)."""
        self._dispatcher.wake.set()

    def dispatch_now(self, bytes_max: int) -> int | None:
        """Index what was appended in one pass of at most ``bytes_max`` on the calling
        thread (a slave's follow thread, between frames); return the bytes of log still to
        index for the caller: 0 when caught up, or when the dispatcher has a thread of its
        own (woken instead). None: no pass could run now (another thread's is under way, or
        the dispatcher is stopped or failed): the caller tries again later."""
        dispatcher = self._dispatcher
        if dispatcher.threaded:
            dispatcher.wake.set()
            return 0
        if dispatcher.dispatch_pass(bytes_max) is None:
            return None
        return max(0, dispatcher.lag_bytes)

    def catch_up_for_writes(self) -> None:
        """Before a promoted replica's first own put: dispatch everything replicated and take
        each queue's next offset and the last store time from what was dispatched."""
        self._check_open()
        self._dispatcher.catch_up()
        self._commit_log.continue_after({key: queue.max_offset for key, queue in self._queues.queues.items()},
                                        self._dispatcher.last_store_timestamp)
        self.writes_need_catch_up = False

    def cut(self, offset: int) -> None:
        """Cut CommitLog, ConsumeQueue and IndexFile at ``offset`` (a record boundary).

        Crash-safe: the intent is recorded in the ``truncate`` marker first and the marker
        removed only once the cut and a new checkpoint are on disk; a start that finds it
        finishes the cut before trusting anything past ``offset``.
        """
        self._check_open()
        commit_log = self._commit_log
        if offset == commit_log.max_offset:
            return
        if not commit_log.min_offset <= offset < commit_log.max_offset:
            raise StoreError(f"cannot cut at {offset}: the commit log holds [{commit_log.min_offset}, "
                             f"{commit_log.max_offset}); use reset() to replace it")
        self._check_record_boundary(offset)
        self._pause_background()
        try:
            self._cut_marker.write(CutIntent(CUT, offset))
            # the dispatcher's lock: a queue rebuild (a read that found an entry past the
            # shrinking log) waits until the queues are cut instead of replacing one under it
            with self._dispatcher.lock:
                self._dispatcher.dispatched_offset = min(self._dispatcher.dispatched_offset, offset)
                commit_log.set_end(offset)
                for queue in self._queues.all():
                    queue.truncate_physical(offset)
                self._index.rollback(offset, repair=False)
            self._confirm_offset = min(self._confirm_offset, offset)
            self.writes_need_catch_up = True
            self._flusher.flush_now()
            self._flusher.write_checkpoint()
            self._cut_marker.clear()
        finally:
            self._resume_background()
        log.info("commit log cut at %d for replication", offset)

    def reset(self, start_offset: int) -> None:
        """Drop the whole log and its indexes; the log restarts empty at ``start_offset``
        (a segment boundary). For a replica whose master no longer holds its log's start."""
        self._check_open()
        segment_bytes = self._commit_log.segment_bytes
        if start_offset < 0 or start_offset % segment_bytes:
            raise StoreError(f"reset offset {start_offset} is not a segment boundary "
                             f"(segments are {segment_bytes} bytes)")
        self._pause_background()
        try:
            self._cut_marker.write(CutIntent(RESET, start_offset))
            self._drop_everything(start_offset, self._checkpoint)
            self._flusher.write_checkpoint()
            self._cut_marker.clear()
        finally:
            self._resume_background()
        log.info("commit log reset to start at %d for replication", start_offset)

    def _drop_everything(self, start_offset: int, checkpoint: Checkpoint) -> None:
        self._queues.destroy_all()
        self._index.destroy_all()
        commit_log = self._commit_log
        dispatcher = self._dispatcher
        commit_log.segments.reset_to(start_offset)
        commit_log.max_offset = commit_log.flushed_offset = start_offset
        commit_log.written_runs.clear()   # runs of the dropped log: none may be taken for the new one
        commit_log.queue_offsets = {}
        dispatcher.dispatched_offset = start_offset
        self._confirm_offset = start_offset
        checkpoint.write(CheckpointState(
            physic_msg_timestamp=commit_log.last_store_timestamp, logics_msg_timestamp=dispatcher.last_store_timestamp,
            index_msg_timestamp=dispatcher.last_store_timestamp, confirm_phy_offset=start_offset,
            flushed_phy_offset=start_offset, dispatched_phy_offset=start_offset))

    def _check_record_boundary(self, offset: int) -> None:
        segment = self._commit_log.segments.find(offset)
        try:
            invariant(segment is not None, "offset inside the log")
            header = codec.check_record(segment.mm, offset - segment.start_offset, segment.size)
        except (CorruptMessage, AssertionError) as error:
            raise StoreError(f"cannot cut at {offset}: no whole record starts there ({error})") from None
        if header.is_blank:
            raise StoreError(f"cannot cut at {offset}: a segment's closing blank record starts there")

    def _pause_background(self) -> None:
        self._retention.stop()
        self._dispatcher.stop()
        self._flusher.stop()

    def _resume_background(self) -> None:
        self._flusher.start()
        self._dispatcher.start()
        self._retention.start()
