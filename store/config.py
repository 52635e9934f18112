"""StoreConfig: every setting of the storage engine, each with a default."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from .errors import StoreConfigError

GIB = 1024 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class StoreConfig:
    """Settings of one MessageStore. Frozen: build a new one with ``dataclasses.replace``."""

    store_path: str = os.path.expanduser("~/hastore/store")
    # CommitLog
    commitlog_segment_bytes: int = GIB
    store_host: str = "127.0.0.1:10911"
    preallocate_next_segment: bool = True
    # How much of the CommitLog, back from its flushed end, stays in the page cache: after
    # each flush the pages further back are let go (they are on disk; a read of them, by a
    # consumer that far behind or the scrub, goes to the disk). New pages then reuse memory
    # the kernel has just freed instead of memory never touched, which costs several times
    # more on a VM whose balloon hands free memory back to its host (docs/sync-performance.md,
    # stop 26). 0: every page stays until the kernel needs the memory.
    commitlog_cache_bytes: int = 256 * 1024 * 1024
    # Flush: "sync" (group commit, put returns once on disk) or "async" (interval).
    flush: str = "async"
    flush_interval_ms: int = 500
    # async: also flush as soon as this much is written and not on disk (0: only the
    # interval), so a burst never leaves hundreds of MB for one fdatasync (store/flush.py)
    flush_dirty_bytes_max: int = 16 * 1024 * 1024
    sync_flush_timeout_ms: int = 5000
    checkpoint_interval_ms: int = 1000
    # ConsumeQueue and IndexFile
    consume_queue_entries_per_file: int = 300_000
    index_hash_slots: int = 5_000_000
    index_max_entries: int = 20_000_000
    # Reads verify BODYCRC and HCRC, so a flipped bit is never served.
    check_crc_on_read: bool = True
    # Retention
    file_reserved_hours: float = 72.0
    disk_max_used_ratio: float = 0.75
    retention_check_interval_ms: int = 10_000
    # The disk's fullness is read as df reads it: used / (used + available to non-root).
    # What a disk fuller than disk_max_used_ratio does: "delete_oldest" segments (logging
    # and counting any message a consumer group had not read), or "refuse_writes": keep
    # every message and refuse puts once the disk is full.
    disk_full_policy: str = "delete_oldest"
    # Background scrub (store/scrub.py): flushed CommitLog bytes re-read and CRC-checked per second.
    scrub_bytes_per_s: int = 4 * 1024 * 1024
    # The scrub's rate while the log grows (puts, or a slave's replicated appends): the scrub
    # yields to the writes. Its checks run in a worker thread that takes the GIL from the
    # node's loop, and under a one-at-a-time sync load 4 MiB/s of them cost every node far more
    # than their own CRC work (node/server/integrity.py).
    scrub_busy_bytes_per_s: int = 512 * 1024
    # After a whole walk the scrub goes on with newly flushed bytes only, and starts over
    # from the log's first offset no sooner than this after the walk began: a small log is
    # not re-read many times a minute (each walk holds the GIL for its CRC work). 0: at once.
    scrub_pass_interval_ms: int = 60_000
    # Dispatcher batch bound: bytes of CommitLog read per pass.
    dispatch_batch_bytes_max: int = 4 * 1024 * 1024
    # Woken by a write, the dispatcher waits this long before its pass, so the writes of
    # that time share one pass (as RocketMQ's reput service, which polls every 1 ms). Each
    # pass takes the GIL from the writers; 0 dispatches at once, a pass per write.
    dispatch_interval_ms: float = 1.0
    # False: no dispatcher thread. The store's owner runs the passes in its own loop
    # (``Dispatcher.dispatch_pass``) when the wake's callback tells it to; the node does,
    # in its trio loop, so a put never hands the GIL to another thread. A bare store keeps
    # the thread.
    dispatcher_thread: bool = True

    def __post_init__(self) -> None:
        problems = []
        if self.flush not in ("sync", "async"):
            problems.append(f"flush must be 'sync' or 'async', not {self.flush!r}")
        if not 4096 <= self.commitlog_segment_bytes <= 2 * GIB - 1:
            problems.append("commitlog_segment_bytes must be between 4096 and 2 GiB - 1")
        if not 1 <= self.consume_queue_entries_per_file <= 100_000_000:
            problems.append("consume_queue_entries_per_file must be between 1 and 100,000,000")
        if self.index_hash_slots < 1 or self.index_max_entries < 2:
            problems.append("index_hash_slots must be >= 1 and index_max_entries >= 2")
        if 40 + 4 * self.index_hash_slots + 20 * self.index_max_entries > 2 * GIB:
            problems.append("an index file (40 + 4*slots + 20*entries bytes) must stay under 2 GiB")
        for name in ("flush_interval_ms", "sync_flush_timeout_ms", "checkpoint_interval_ms",
                     "retention_check_interval_ms", "dispatch_batch_bytes_max"):
            if getattr(self, name) <= 0:
                problems.append(f"{name} must be positive")
        if self.flush_dirty_bytes_max < 0:
            problems.append("flush_dirty_bytes_max must be 0 (only the interval) or more")
        if not 0 <= self.dispatch_interval_ms <= 1000:
            problems.append("dispatch_interval_ms must be between 0 and 1000")
        if self.disk_full_policy not in ("delete_oldest", "refuse_writes"):
            problems.append(f"disk_full_policy must be 'delete_oldest' or 'refuse_writes', not {self.disk_full_policy!r}")
        if self.commitlog_cache_bytes < 0:
            problems.append("commitlog_cache_bytes must be 0 (keep every page) or more")
        if self.scrub_bytes_per_s <= 0:
            problems.append("scrub_bytes_per_s must be positive")
        if self.scrub_busy_bytes_per_s <= 0:
            problems.append("scrub_busy_bytes_per_s must be positive")
        if self.scrub_pass_interval_ms < 0:
            problems.append("scrub_pass_interval_ms must be 0 or more")
        if self.file_reserved_hours <= 0:
            problems.append("file_reserved_hours must be positive")
        if not 0.1 <= self.disk_max_used_ratio <= 0.99:
            problems.append("disk_max_used_ratio must be between 0.1 and 0.99")
        host, _, port = self.store_host.rpartition(":")
        if not host or not port.isdigit():
            problems.append(f"store_host must be 'ipv4:port', not {self.store_host!r}")
        if problems:
            raise StoreConfigError("; ".join(problems))

    def replace(self, **changes) -> "StoreConfig":
        """A copy with some settings changed."""
        return dataclasses.replace(self, **changes)

    @property
    def consume_queue_file_bytes(self) -> int:
        return self.consume_queue_entries_per_file * 20
