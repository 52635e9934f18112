"""Retention: delete old CommitLog segments, then the ConsumeQueue and IndexFile files below them.

A segment goes when it is older than ``file_reserved_hours`` or, under the disk-full
policy ``delete_oldest`` (the default), when the disk holding the store is fuller than
``disk_max_used_ratio`` (oldest first, until it is not). Under ``refuse_writes`` a full
disk deletes nothing: puts are refused (SERVICE_NOT_AVAILABLE, "no room on disk") until
space is freed. A segment's age is the store time of the first message in the *next*
segment: store timestamps never go backwards, so every message in a segment is at least
that old. Never deleted: the last segment, and any segment not yet wholly flushed and
dispatched.

Deleting messages a consumer group has not read yet is a loss: each pass that does it
logs a WARNING naming every group, queue and the queue offsets lost, and counts them
(``unconsumed_messages_deleted``).
"""

from __future__ import annotations

import logging
import os
import threading

from typing import Callable

from . import codec
from .commit_log import CommitLog, now_ms
from .dispatcher import ConsumeQueueTable, Dispatcher
from .index_file import IndexService

log = logging.getLogger(__name__)


class Retention:
    def __init__(self, commit_log: CommitLog, queues: ConsumeQueueTable, index: IndexService,
                 dispatcher: Dispatcher, root: str, *, file_reserved_hours: float, disk_max_used_ratio: float,
                 interval_ms: int, disk_full_policy: str = "delete_oldest",
                 consumer_offsets: Callable[[], dict] | None = None,
                 statvfs: Callable[[str], os.statvfs_result] = os.statvfs) -> None:
        """``consumer_offsets()`` returns consumerOffset.json's table ({"topic@group":
        {"queue id": next offset}}), read to name what a deletion takes from consumers."""
        self.commit_log = commit_log
        self.queues = queues
        self.index = index
        self.dispatcher = dispatcher
        self.root = root
        self.reserved_ms = int(file_reserved_hours * 3600 * 1000)
        self.disk_max_used_ratio = disk_max_used_ratio
        self.interval_s = interval_ms / 1000
        self.deleted_segments = 0
        self.disk_full_policy = disk_full_policy
        self.consumer_offsets = consumer_offsets
        self.unconsumed_messages_deleted = 0
        self._statvfs = statvfs
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def disk_used_ratio(self) -> float:
        """The share of the store's file system in use, as ``df`` counts it: used blocks
        over used plus the blocks an unprivileged writer may still take. Blocks kept back
        for root (or otherwise not available) count as neither: on a file system where
        ``f_bavail`` lies far below ``f_bfree``, ``1 - f_bavail / f_blocks`` read a
        third-used disk as 71% full."""
        used, usable, _ = self._blocks()
        return used / usable if usable else 0.0

    def _blocks(self) -> tuple[int, int, int]:
        """(blocks used, blocks used or available to an unprivileged writer, block size)."""
        stats = self._statvfs(self.root)
        used = max(0, stats.f_blocks - stats.f_bfree)
        return used, used + stats.f_bavail, stats.f_frsize

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
        bytes_to_free = 0.0
        if self.disk_full_policy == "delete_oldest":
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
        lost = self._unconsumed_below(files[doomed].start_offset)
        removed = self.commit_log.segments.delete_front(doomed)
        floor = self.commit_log.min_offset
        if lost:
            count = sum(last - first for _, _, _, first, last in lost)
            self.unconsumed_messages_deleted += count
            log.warning("retention deleted %d message(s) consumer groups had not read: %s", count, "; ".join(
                f"group {group} {topic}/{queue_id} queue offsets [{first}, {last})"
                for group, topic, queue_id, first, last in lost))
        for queue in self.queues.all():
            queue.delete_below_physical(floor)
        self.index.delete_below_physical(floor)
        self.deleted_segments += len(removed)
        log.info("retention deleted %d segment(s); commit log now starts at %d", len(removed), floor)
        return len(removed)

    def _unconsumed_below(self, floor: int) -> list[tuple[str, str, int, int, int]]:
        """(group, topic, queue id, first, end) of the queue offsets a group has not read
        whose messages lie below ``floor``."""
        if self.consumer_offsets is None:
            return []
        lost = []
        for key, table in sorted(self.consumer_offsets().items()):
            topic, _, group = key.rpartition("@")
            for queue_text, committed in sorted(table.items()):
                queue = self.queues.get(topic, int(queue_text)) if str(queue_text).isdigit() else None
                if queue is None or not isinstance(committed, int):
                    continue
                end = _first_at_or_above(queue, floor)
                if committed < end:
                    lost.append((group, topic, int(queue_text), max(committed, queue.min_offset), end))
        return [item for item in lost if item[4] > item[3]]

    def _disk_bytes(self) -> int:
        """The bytes ``disk_used_ratio`` is a share of."""
        _, usable, block_bytes = self._blocks()
        return usable * block_bytes

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


def _first_at_or_above(queue, floor: int) -> int:
    """The first queue offset whose message lies at or above ``floor`` (binary search)."""
    low, high = queue.min_offset, queue.max_offset
    while low < high:
        middle = (low + high) // 2
        if queue.physical_offset_at(middle) < floor:
            low = middle + 1
        else:
            high = middle
    return low
