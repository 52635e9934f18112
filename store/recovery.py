"""Recovery: bring CommitLog, ConsumeQueue and IndexFile back to one consistent state at start.

The CommitLog is the truth. Recovery

1. picks a scan start: the checkpoint's min(flushed offset F, dispatched offset D) when the
   checkpoint is valid (bytes below F were fsynced before it was written, so only the
   tail after F can be torn); otherwise RocketMQ's rule: the start of the third-last
   segment. A scan start that lands on bytes that are no record (a checkpoint from some
   other store) falls back to the start of its segment, and so does one past the data of
   a truncated last segment that load extended with zeros (the file lost bytes F counted);
2. CRC-checks every record from there (BODYCRC and HCRC, every length) and cuts the log
   after the last whole valid message, zeroing the cut tail so it can never look valid;
3. rolls ConsumeQueue and IndexFile back to R = min(D, end) (or to the scan start without
   a checkpoint): every entry pointing at or past R goes; after an abnormal stop the
   IndexFile's slot table is checked and its chains rebuilt if a kill tore a put;
4. re-dispatches [R, end) and rebuilds the per-queue offset table from the queues.

Normal (no ``abort`` file) and abnormal recovery run the same steps; they differ in trust:
after an abnormal stop the index repair runs. Nothing healthy is rescanned from the start.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from . import codec
from .checkpoint import Checkpoint
from .commit_log import CommitLog
from .dispatcher import ConsumeQueueTable, Dispatcher
from .index_file import IndexService

log = logging.getLogger(__name__)

SEGMENTS_SCANNED_WITHOUT_CHECKPOINT = 3


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    abnormal: bool
    checkpoint_valid: bool
    scan_start_offset: int
    end_offset: int
    truncated_bytes: int
    stop_reason: str
    rollback_offset: int
    redispatched_messages: int
    duration_ms: float


def recover(commit_log: CommitLog, queues: ConsumeQueueTable, index: IndexService, dispatcher: Dispatcher,
            checkpoint: Checkpoint, *, abnormal: bool, cut_offset: int | None = None) -> RecoveryReport:
    """Recover the store; ``cut_offset`` (a replication cut that a crash interrupted) caps the log."""
    started = time.perf_counter()
    files = commit_log.segments.files
    data_end = files[-1].end_offset if files else 0
    state = checkpoint.state
    usable = checkpoint.valid and files and state.flushed_phy_offset >= commit_log.min_offset
    if usable:
        scan_start = max(commit_log.min_offset, min(state.flushed_phy_offset, state.dispatched_phy_offset, data_end))
    else:
        first = max(0, len(files) - SEGMENTS_SCANNED_WITHOUT_CHECKPOINT)
        scan_start = files[first].start_offset if files else 0
    extended = commit_log.segments.extended_last
    if extended is not None and scan_start > extended[0] + extended[1]:
        # the last segment lost its tail (load extended it with zeros) below the checkpoint's
        # offsets: a scan from there would stop at once on the zeros and keep the torn record
        # before them inside the log. Scan the segment from its start instead.
        log.warning("checkpoint offset %d is past the %d bytes the truncated segment at %d still holds; "
                    "scanning it from its start", scan_start, extended[1], extended[0])
        scan_start = max(commit_log.min_offset, extended[0])
    if cut_offset is not None and files:
        cut_offset = max(cut_offset, commit_log.min_offset)
        scan_start = min(scan_start, cut_offset)
    end, last_timestamp, reason = commit_log.scan_valid_end(scan_start)
    if cut_offset is not None and end > cut_offset:
        end, reason = cut_offset, "replication cut"
    if end == scan_start and reason not in ("end of data", "replication cut") and usable:
        segment = commit_log.segments.find(scan_start)
        if segment is not None and segment.start_offset != scan_start:
            log.warning("checkpoint offset %d is not a record boundary (%s); scanning its segment from %d",
                        scan_start, reason, segment.start_offset)
            scan_start = segment.start_offset
            end, last_timestamp, reason = commit_log.scan_valid_end(scan_start)
            usable = False
    truncated = _bytes_after(commit_log, end)
    if reason not in ("end of data", "end of files", "replication cut"):
        log.warning("commit log cut at %d: %s", end, reason)
    commit_log.set_end(end)
    if usable:
        rollback_to = min(state.dispatched_phy_offset, end)
    else:
        # dispatch runs in log order, so the furthest queue entry marks how far it got;
        # anything past that (or past the scan start) is dispatched again
        reached = max((queue.physical_offset_at(queue.max_offset - 1) for queue in queues.all()
                       if queue.max_offset > queue.min_offset), default=0)
        rollback_to = min(scan_start, reached, end)
    rollback_to = max(rollback_to, commit_log.min_offset) if files else 0
    for queue in queues.all():
        queue.truncate_physical(rollback_to)
    index.rollback(rollback_to, repair=abnormal)
    dispatcher.dispatched_offset = rollback_to
    dispatcher.last_store_timestamp = state.logics_msg_timestamp
    redispatched = dispatcher.catch_up()
    commit_log.queue_offsets = {key: queue.max_offset for key, queue in queues.queues.items()}
    commit_log.last_store_timestamp = max(last_timestamp, state.physic_msg_timestamp, dispatcher.last_store_timestamp)
    commit_log.flushed_offset = min(end, state.flushed_phy_offset) if usable else commit_log.min_offset
    commit_log.flushed_store_timestamp = state.physic_msg_timestamp if usable else 0
    report = RecoveryReport(
        abnormal=abnormal, checkpoint_valid=bool(usable), scan_start_offset=scan_start, end_offset=end,
        truncated_bytes=truncated, stop_reason=reason, rollback_offset=rollback_to,
        redispatched_messages=redispatched, duration_ms=(time.perf_counter() - started) * 1000,
    )
    log.info("recovery: %s", report)
    return report


def _bytes_after(commit_log: CommitLog, end: int) -> int:
    """How many non-zero-looking bytes recovery cuts: data from ``end`` to the last record start seen."""
    segment = commit_log.segments.find(end)
    if segment is None:
        return 0
    position = end - segment.start_offset
    head = segment.mm[position:position + codec.BLANK_HEADER.size]
    cut = 0 if head.count(0) == len(head) else segment.size - position
    later = sum(s.size for s in commit_log.segments.files if s.start_offset > segment.start_offset)
    return cut + later
