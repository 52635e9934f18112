"""How full retention reads the disk: as ``df`` does, used blocks over used plus available
ones. Blocks an unprivileged writer cannot take (root's reserve, or a file system whose
``f_bavail`` lies far below ``f_bfree``) are neither used nor room."""

from __future__ import annotations

import os

from store import Message
from store.retention import Retention

SEGMENT = 4096


def _statvfs(*, blocks: int, free: int, available: int, block_bytes: int = 4096):
    fields = (block_bytes, block_bytes, blocks, free, available, 1000, 500, 500, 0, 255)
    return lambda path: os.statvfs_result(fields)


def _retention(store, statvfs, *, ratio: float) -> Retention:
    return Retention(store.commit_log, store.queues, store.index, store.dispatcher, store.root,
                     file_reserved_hours=1000, disk_max_used_ratio=ratio, interval_ms=60_000,
                     statvfs=statvfs)


def test_ratio_counts_used_over_used_and_available(open_store):
    store = open_store()
    # 252 GB disk, 31 GB used, 221 GB free of which only 72 GB available: df says 30%.
    wide_gap = _retention(store, _statvfs(blocks=252_000, free=221_000, available=72_000), ratio=0.75)
    assert abs(wide_gap.disk_used_ratio() - 31 / 103) < 1e-9
    # The usual 5% root reserve: 60 used, 40 free, 35 available -> 60 / 95.
    reserve = _retention(store, _statvfs(blocks=100, free=40, available=35), ratio=0.75)
    assert abs(reserve.disk_used_ratio() - 60 / 95) < 1e-9
    assert _retention(store, _statvfs(blocks=0, free=0, available=0), ratio=0.75).disk_used_ratio() == 0.0


def _filled_store(open_store):
    store = open_store(commitlog_segment_bytes=SEGMENT, consume_queue_entries_per_file=4,
                       file_reserved_hours=1000, disk_max_used_ratio=0.99)
    store.put_batch([Message(topic="R", body=b"z" * 500) for _ in range(30)])
    assert store.wait_dispatched()
    store.flusher.flush_now()
    return store


def test_a_disk_with_little_available_but_little_used_keeps_every_segment(open_store):
    store = _filled_store(open_store)
    segments = len(store.commit_log.segments.files)
    retention = _retention(store, _statvfs(blocks=252_000, free=221_000, available=72_000), ratio=0.75)
    assert retention.run_once() == 0
    assert len(store.commit_log.segments.files) == segments


def test_a_disk_over_the_ratio_deletes_the_oldest_segments(open_store):
    store = _filled_store(open_store)
    segments = len(store.commit_log.segments.files)
    # 90% used as df counts it; the store's segments are a sliver of the excess, so every
    # segment that may go goes (all but the last).
    retention = _retention(store, _statvfs(blocks=1_000_000, free=100_000, available=100_000), ratio=0.75)
    assert retention.run_once() == segments - 1
    assert store.min_physical_offset == store.commit_log.segments.files[0].start_offset > 0
