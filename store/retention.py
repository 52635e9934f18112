"""Retention: delete old CommitLog segments, then the ConsumeQueue and IndexFile files below them.

A segment goes when it is older than ``file_reserved_hours`` or when the disk holding the
store is fuller than ``disk_max_used_ratio`` (oldest first, until it is not). A segment's
age is the store time of the first message in the *next* segment: store timestamps never
go backwards, so every message in a segment is at least that old. Never deleted: the last
segment, and any segment not yet wholly flushed and dispatched.
"""

from __future__ import annotations

import logging
import os
import threading

from . import codec
from .commit_log import CommitLog, now_ms
from .dispatcher import ConsumeQueueTable, Dispatcher
from .index_file import IndexService

log = logging.getLogger(__name__)


class Retention:
    def __init__(self, commit_log: CommitLog, queues: ConsumeQueueTable, index: IndexService,
                 dispatcher: Dispatcher, root: str, *, file_reserved_hours: float, disk_max_used_ratio: float,
                 interval_ms: int) -> None:
        self.commit_log = commit_log
        self.queues = queues
        self.index = index
        self.dispatcher = dispatcher
        self.root = root
        self.reserved_ms = int(file_reserved_hours * 3600 * 1000)
        self.disk_max_used_ratio = disk_max_used_ratio
        self.interval_s = interval_ms / 1000
        self.deleted_segments = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def disk_used_ratio(self) -> float:
        stats = os.statvfs(self.root)
        if stats.f_blocks == 0:
            return 0.0
        return 1.0 - stats.f_bavail / stats.f_blocks

    def _first_timestamp(self, segment) -> int | None:
        size, magic = codec.BLANK_HEADER.unpack_from(segment.mm, 0)
        if magic != codec.MESSAGE_MAGIC:
            return None
        return codec.struct.unpack_from(">q", segment.mm, codec.STORE_TIMESTAMP_AT)[0]

    def run_once(self, now: int | None = None) -> int:
        """One pass; returns how many segments were deleted."""
        now = now_ms() if now is None else now
        files = self.commit_log.segments.files
        safe_end = min(self.commit_log.flushed_offset, self.dispatcher.dispatched_offset)
        bytes_to_free = max(0.0, self.disk_used_ratio() - self.disk_max_used_ratio) * self._disk_bytes()
        doomed = 0
        for segment, following in zip(files, files[1:]):
            if segment.end_offset > safe_end:
                break
            newest = self._first_timestamp(following)
            expired = newest is not None and now - newest > self.reserved_ms
            if not expired and bytes_to_free <= 0:
                break
            doomed += 1
            bytes_to_free -= segment.size
        if not doomed:
            return 0
        removed = self.commit_log.segments.delete_front(doomed)
        floor = self.commit_log.min_offset
        for queue in self.queues.all():
            queue.delete_below_physical(floor)
        self.index.delete_below_physical(floor)
        self.deleted_segments += len(removed)
        log.info("retention deleted %d segment(s); commit log now starts at %d", len(removed), floor)
        return len(removed)

    def _disk_bytes(self) -> int:
        stats = os.statvfs(self.root)
        return stats.f_blocks * stats.f_frsize

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="retention", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.run_once()
            except Exception:  # a failed pass is retried next interval; logged loudly
                log.exception("retention pass failed")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
