"""DiskRoom: whether the store may acknowledge a put, given the room left on its disk.

An ack promises that the message's bytes are in the CommitLog, and should also mean that
it can be read by its queue and found by its keys without waiting for room. The dispatcher
writes the ConsumeQueue and IndexFile entries after the ack, and a new ConsumeQueue or index
file needs room on disk that the CommitLog segment's reservation does not cover. So a put
is acknowledged only when

1. its bytes fit a reserved CommitLog segment: a roll that cannot reserve the next segment
   refuses the put (``CommitLog.append``, before this module's checks matter);
2. dispatch is not waiting for room: after a pass failed to create a ConsumeQueue or index
   file (DiskFullError), every put is refused until a pass succeeds. A refused put still
   wakes the dispatcher, so the pass is retried as puts arrive and writes resume once
   space is freed;
3. the file system has room for what the next dispatch may have to create: one
   ConsumeQueue file, plus one index file when the newest index file has fewer than
   ``index_free_entries_min`` entries left (min(65,536, half a file)) or there is none.

Rule 3 reserves ahead, not exactly: it keeps room for one new ConsumeQueue file, so a
batch that opens more new queues than the disk has files for is still acked. Its messages
are in the log and are served once dispatch finds room; rule 2 refuses puts meanwhile.

Refusals are SERVICE_NOT_AVAILABLE with a reason starting "no room on disk". The free
space is read with statvfs (~17 µs here) at most every ``recheck_s`` while it exceeds the
largest headroom (a ConsumeQueue file and an index file) by ``low_water_bytes``; a put
then pays an attribute read and a clock call. Nearer than that, every put reads it.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Callable

from .dispatcher import Dispatcher
from .index_file import IndexService, index_file_bytes

log = logging.getLogger(__name__)

INDEX_FREE_ENTRIES_MIN = 65_536
RECHECK_S = 0.1
LOW_WATER_BYTES = 64 * 1024 * 1024


class DiskRoom:
    def __init__(self, root: str, dispatcher: Dispatcher, index: IndexService, *, consume_queue_file_bytes: int,
                 statvfs: Callable[[str], os.statvfs_result] = os.statvfs,
                 clock: Callable[[], float] = time.monotonic, recheck_s: float = RECHECK_S,
                 low_water_bytes: int = LOW_WATER_BYTES) -> None:
        self.root = root
        self.dispatcher = dispatcher
        self.index = index
        self.consume_queue_file_bytes = consume_queue_file_bytes
        self.index_file_bytes = index_file_bytes(index.hash_slots, index.max_entries)
        self.index_free_entries_min = min(INDEX_FREE_ENTRIES_MIN, index.max_entries // 2)
        self._statvfs = statvfs
        self._clock = clock
        self.recheck_s = recheck_s
        self.low_water_bytes = low_water_bytes
        self._free_bytes = 0
        self._trusted_until = float("-inf")   # no statvfs needed before this clock reading
        self.refused_puts = 0          # puts refused by rules 2 and 3
        self._refusing: str | None = None

    def headroom_bytes(self) -> int:
        """Bytes the next dispatch may need for new files (rule 3)."""
        files = self.index.files
        newest_free = files[-1].max_entries - files[-1].header.index_count if files else 0
        index_bytes = self.index_file_bytes if newest_free < self.index_free_entries_min else 0
        return self.consume_queue_file_bytes + index_bytes

    def free_bytes(self) -> int:
        """Bytes an unprivileged writer may still allocate on the store's file system."""
        stats = self._statvfs(self.root)
        return stats.f_bavail * stats.f_frsize

    def refusal(self, puts: int = 1) -> str | None:
        """Why ``puts`` puts must be refused now, or None when they may be written; refused
        ones are counted and the start and end of a refusing spell are logged."""
        if self.dispatcher.room_wait is None and self._clock() < self._trusted_until:
            return None
        reason = self._reason()
        if reason is None:
            if self._refusing is not None:
                log.warning("puts accepted again: room on disk (%d bytes free)", self._free_bytes)
                self._refusing = None
            return None
        self.refused_puts += puts
        if self._refusing is None:
            log.warning("refusing puts: %s", reason)
        self._refusing = reason
        return reason

    def _reason(self) -> str | None:
        waiting = self.dispatcher.room_wait
        if waiting is not None:
            return f"no room on disk: dispatch waits for room for its files ({waiting})"
        headroom = self.headroom_bytes()
        now = self._clock()
        self._free_bytes = self.free_bytes()
        largest = self.consume_queue_file_bytes + self.index_file_bytes
        # far above even the largest headroom: trusted, unread, for recheck_s
        self._trusted_until = now + self.recheck_s if self._free_bytes - largest >= self.low_water_bytes \
            else float("-inf")
        if self._free_bytes < headroom:
            return (f"no room on disk: {self._free_bytes} bytes free under {self.root}, the next ConsumeQueue "
                    f"and index files may need {headroom}: free space or add disk")
        return None
