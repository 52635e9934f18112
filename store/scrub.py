"""Scrub: re-read the flushed CommitLog and check every record's CRCs, at a bounded rate.

A flipped bit in a record nobody reads stays unseen until a consumer reaches it (or
never, for a queue read long ago). The scrub walks the flushed log from its first offset
to the flushed offset and around again, checking each record as a read would (BODYCRC,
__CRC32# or HCRC, every length). Having reached the flushed offset it follows what is
flushed after, and goes around again only ``pass_interval_s`` after the walk began. A
corrupt record is counted and named by physical offset in the store's integrity
statistics (and so in status, metrics and the log), which is what a replica repair picks
up (``repair.overwrite_range``).

No thread of its own: the owner calls ``step(now_s)`` from whatever loop it runs (the
node's dispatch loop, a timer). Each step checks at most what the rate allows since the
previous one (``bytes_per_s``; at most one second's worth after a long pause) and returns
at once when nothing is due. A step the owner calls ``busy`` (the store is being written)
allows ``busy_bytes_per_s`` instead: the scrub yields to the writes. Progress is in
``statistics()``.
"""

from __future__ import annotations

import mmap
import time
from dataclasses import dataclass

from . import codec
from .codec import CorruptMessage
from .commit_log import CommitLog
from .integrity import Integrity


@dataclass(frozen=True, slots=True)
class ScrubStatistics:
    position: int                 # next offset to check
    passes_completed: int         # whole walks over the flushed log
    bytes_checked: int
    records_checked: int
    corrupt_records_found: int
    bytes_per_s: int
    busy_bytes_per_s: int         # the rate of a busy step
    busy: bool                    # the last step was busy


class Scrub:
    """Bounded-rate CRC walk over the flushed CommitLog."""

    def __init__(self, commit_log: CommitLog, integrity: Integrity, *, bytes_per_s: int,
                 pass_interval_s: float = 0.0, busy_bytes_per_s: int | None = None) -> None:
        busy_bytes_per_s = bytes_per_s if busy_bytes_per_s is None else busy_bytes_per_s
        if bytes_per_s <= 0 or busy_bytes_per_s <= 0:
            raise ValueError("bytes_per_s and busy_bytes_per_s must be positive")
        if pass_interval_s < 0:
            raise ValueError("pass_interval_s must be 0 or more")
        self.commit_log = commit_log
        self.integrity = integrity
        self.bytes_per_s = bytes_per_s
        self.busy_bytes_per_s = busy_bytes_per_s
        self.busy = False
        self.pass_interval_s = pass_interval_s
        self.position = commit_log.min_offset
        self._pass_started_s: float | None = None   # when the current walk began (None: not yet)
        self.passes_completed = 0
        self.bytes_checked = 0
        self.records_checked = 0
        self.corrupt_records_found = 0
        self._last_step_s: float | None = None
        self._walk_complete = False                 # this walk reached the flushed offset

    def step(self, now_s: float | None = None, *, busy: bool = False) -> int:
        """Check the records the rate allows since the last step (``busy_bytes_per_s`` when
        ``busy``); return the bytes checked."""
        now_s = time.monotonic() if now_s is None else now_s
        self.busy = busy
        if self._last_step_s is None:
            self._last_step_s = now_s
            return 0
        rate = self.busy_bytes_per_s if busy else self.bytes_per_s
        budget = int(min(1.0, max(0.0, now_s - self._last_step_s)) * rate)
        if budget <= 0:
            return 0
        self._last_step_s = now_s
        return self.check(budget, now_s)

    def check(self, budget_bytes: int, now_s: float | None = None) -> int:
        """Check records from ``position`` for up to ``budget_bytes`` (at least one record).
        At the flushed offset a walk is complete; the next starts from the log's first offset
        once ``pass_interval_s`` has passed since this one began, else the scrub waits there
        for newly flushed bytes."""
        now_s = time.monotonic() if now_s is None else now_s
        if self._pass_started_s is None:
            self._pass_started_s = now_s
        checked = 0
        log_min, flushed = self.commit_log.min_offset, self.commit_log.flushed_offset
        if self.position < log_min:
            self.position = log_min      # retention removed what was ahead of us
        started_at = self.position
        while checked < budget_bytes:
            if self.position >= flushed:
                if self.position > log_min and not self._walk_complete:
                    self.passes_completed += 1
                    self._walk_complete = True
                if now_s - self._pass_started_s >= self.pass_interval_s:
                    self.position = log_min
                    self._pass_started_s = now_s
                    self._walk_complete = False
                break
            segment = self.commit_log.segments.find(self.position)
            if segment is None:
                self.position = log_min
                break
            step = self._check_record(segment, self.position - segment.start_offset)
            checked += step
            self.position += step
        self.bytes_checked += checked
        self._release_behind_window(started_at)
        return checked

    def _release_behind_window(self, started_at: int) -> None:
        """Let go of the pages this check read that lie behind the log's page-cache window
        (``CommitLog.cache_bytes``): a walk over an old log does not fill the page cache
        with it. From the page holding ``started_at``: the previous check stopped inside
        it and left it."""
        released = self.commit_log.segments.released_offset
        end = min(self.position, released)
        start = started_at - started_at % mmap.PAGESIZE
        if start < end:
            self.commit_log.segments.release_range(start, end)

    def _check_record(self, segment, at: int) -> int:
        """Bytes to step over from ``at``: the record, or the rest of the segment when its
        lengths cannot be trusted (reported as corrupt)."""
        mm = segment.mm
        try:   # one parse for a sound record; a second only to tell a bad CRC from bad lengths
            header = codec.check_record(mm, at, segment.size, check_crc=True)
        except CorruptMessage as crc_error:
            try:
                header = codec.check_record(mm, at, segment.size, check_crc=False)
            except CorruptMessage as error:
                self._found(segment.start_offset + at, f"unreadable record, rest of segment skipped: {error}")
                return max(1, segment.size - at)
            self.records_checked += 1
            self._found(segment.start_offset + at, str(crc_error))
            return header.total_size
        if not header.is_blank:
            self.records_checked += 1
        return header.total_size

    def _found(self, physical_offset: int, reason: str) -> None:
        self.corrupt_records_found += 1
        self.integrity.note_corrupt_physical(physical_offset, f"scrub: {reason}")

    def statistics(self) -> ScrubStatistics:
        return ScrubStatistics(self.position, self.passes_completed, self.bytes_checked, self.records_checked,
                               self.corrupt_records_found, self.bytes_per_s, self.busy_bytes_per_s, self.busy)
