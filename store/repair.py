"""Repair: write an intact copy of a range of the CommitLog over a damaged one.

The store-level hook for replica repair: a slave that finds a corrupt record fetches the
range again from its master, a master fetches it from a member of its sync-state set,
and either hands the bytes to ``overwrite_range``. Nothing is written unless every record
of the copy is whole and valid (CRCs, lengths) and sits exactly where the local log has
its record boundaries at both ends: the copy replaces bytes, never moves them. The range
must be below the flushed offset (bytes above it are the writer's and replication's). The
corrupt records of the range are cleared from the integrity statistics once written.
"""

from __future__ import annotations

import logging

from . import codec
from .codec import CorruptMessage
from .commit_log import CommitLog
from .errors import StoreError
from .integrity import Integrity

log = logging.getLogger(__name__)


class RepairError(StoreError):
    """A replacement range that cannot be written (not whole valid records, not in place)."""


def check_replacement(commit_log: CommitLog, offset: int, data) -> list[int]:
    """The record offsets of ``data`` as it would sit at ``offset``; RepairError if it
    cannot replace the local bytes there."""
    view = memoryview(data).cast("B")
    end = offset + len(view)
    if not view or end > commit_log.flushed_offset or offset < commit_log.min_offset:
        raise RepairError(f"range [{offset}, {end}) is not inside the flushed commit log "
                          f"[{commit_log.min_offset}, {commit_log.flushed_offset})")
    segment = commit_log.segments.find(offset)
    if segment is None or end > segment.end_offset:
        raise RepairError(f"range [{offset}, {end}) does not lie within one segment")
    starts = []
    position = 0
    while position < len(view):
        try:
            header = codec.check_record(view, position, len(view))
        except CorruptMessage as error:
            raise RepairError(f"replacement for {offset} is not whole valid records: {error}") from None
        if not header.is_blank:
            physical = codec.struct.unpack_from(">q", view, position + codec.PHYSICAL_OFFSET_AT)[0]
            if physical != offset + position:
                raise RepairError(f"record at {offset + position} of the replacement names offset {physical}")
        starts.append(offset + position)
        position += header.total_size
    first_end = offset + codec.struct.unpack_from(">i", view, 0)[0]
    if not commit_log.record_starts_at(offset) and offset != segment.start_offset \
            and not commit_log.boundary_at(first_end):
        # a local record whose magic or offset field is damaged is known by where the next starts
        raise RepairError(f"no local record starts at {offset}: the copy would not replace records in place")
    if end < commit_log.max_offset and end != segment.end_offset and not commit_log.record_starts_at(end):
        raise RepairError(f"no local record starts at {end}, where the copy ends")
    return starts


def overwrite_range(commit_log: CommitLog, integrity: Integrity, offset: int, data) -> int:
    """Write ``data`` (whole valid records, checked first) over the log at ``offset`` and
    sync it; return the number of records written."""
    starts = check_replacement(commit_log, offset, data)
    segment = commit_log.segments.find(offset)
    segment.write(offset - segment.start_offset, data)
    segment.flush()
    integrity.forget_corrupt(offset, offset + len(memoryview(data).cast("B")))
    log.warning("commit log range [%d, %d) repaired from an intact copy (%d records)",
                offset, offset + len(memoryview(data).cast("B")), len(starts))
    return len(starts)
