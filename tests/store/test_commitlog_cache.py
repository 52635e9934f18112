"""The CommitLog keeps only ``commitlog_cache_bytes`` of its flushed end in the page cache:
a flush lets the pages further back go (MappedFile.release), every message stays readable
from the disk, a scrub walk lets go of what it read behind the window, and a cut never
leaves the released mark above the log's end."""

from __future__ import annotations

import ctypes
import mmap
import os
from contextlib import contextmanager

import pytest

from store import MessageStore, StoreConfigError
from store.commit_log import RELEASE_STEP_BYTES
from store.mapped_file import MappedFile
from store.put_batch import PlainBatch
from store.scrub import Scrub

from store_helpers import make_config, pull_all

MIB = 1024 * 1024
BODY = bytes(range(256)) * 4   # 1 KiB, not all zeros: a page read back as zeros would show

_mincore = ctypes.CDLL(None, use_errno=True).mincore
_mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p)


def resident_pages(mapped: MappedFile, start: int, end: int) -> int:
    """Whole pages of [start, end) of ``mapped``'s file in the page cache (mincore over its
    mapping)."""
    start += -start % mmap.PAGESIZE
    end -= end % mmap.PAGESIZE
    pages = (end - start) // mmap.PAGESIZE
    vector = ctypes.create_string_buffer(pages)
    exported = ctypes.c_char.from_buffer(mapped.mm)
    try:
        assert _mincore(ctypes.addressof(exported) + start, end - start, vector) == 0, ctypes.get_errno()
    finally:
        del exported
    return sum(byte & 1 for byte in vector.raw)


def drops_page_cache(path: str) -> bool:
    """Whether the file system under ``path`` lets POSIX_FADV_DONTNEED drop pages (tmpfs
    and ramfs keep them: there the pages are the file)."""
    path = os.path.realpath(path)
    best, kind = "", ""
    with open("/proc/self/mounts", encoding="utf-8") as mounts:
        for line in mounts:
            _, mount_point, fs_type = line.split()[:3]
            if (path == mount_point or path.startswith(mount_point.rstrip("/") + "/")) and len(mount_point) > len(best):
                best, kind = mount_point, fs_type
    return kind not in ("tmpfs", "ramfs")


@contextmanager
def filled_store(tmp_path, *, cache_bytes: int, total_bytes: int):
    """A started store (8 MiB segments, no timed flush) holding ``total_bytes`` of queue t/0."""
    store = MessageStore(make_config(tmp_path / "s", commitlog_segment_bytes=8 * MIB, commitlog_cache_bytes=cache_bytes,
                                     flush_interval_ms=60_000, consume_queue_entries_per_file=100_000,
                                     index_hash_slots=10_000, index_max_entries=100_000))
    store.start()
    try:
        while store.commit_log.max_offset < total_bytes:
            store.append(PlainBatch("t", [0] * 64, [BODY] * 64, [{} for _ in range(64)]))
        yield store
    finally:
        store.shutdown()


def test_a_flush_lets_the_pages_behind_the_window_go_and_every_message_stays_readable(tmp_path):
    with filled_store(tmp_path, cache_bytes=1 * MIB, total_bytes=12 * MIB) as store:
        log = store.commit_log
        first = log.segments.files[0]
        before = resident_pages(first, 0, 4 * MIB)
        flushed = log.flush()
        assert log.segments.released_offset == flushed - 1 * MIB
        if drops_page_cache(str(tmp_path)):
            assert before > 0
            assert resident_pages(first, 0, 4 * MIB) < before // 10
            # the window's pages stay
            last = log.segments.find(flushed - 1)
            assert resident_pages(last, flushed - 1 * MIB - last.start_offset, flushed - last.start_offset) > 0
        messages = pull_all(store, "t", 0)   # the released ones read back from the disk
        assert messages and all(message.body == BODY for message in messages)
        assert [m.queue_offset for m in messages] == list(range(len(messages)))


def test_a_flush_releases_only_once_a_step_more_is_behind_the_window(tmp_path):
    with filled_store(tmp_path, cache_bytes=4 * MIB, total_bytes=4 * MIB + RELEASE_STEP_BYTES // 2) as store:
        store.commit_log.flush()
        assert store.commit_log.segments.released_offset == 0


def test_no_window_keeps_every_page(tmp_path):
    with filled_store(tmp_path, cache_bytes=0, total_bytes=10 * MIB) as store:
        log = store.commit_log
        log.flush()
        assert log.segments.released_offset == 0
        if drops_page_cache(str(tmp_path)):
            first = log.segments.files[0]
            assert resident_pages(first, 0, 4 * MIB) == 4 * MIB // mmap.PAGESIZE


def test_a_cut_below_the_released_mark_lowers_it(tmp_path):
    with filled_store(tmp_path, cache_bytes=1 * MIB, total_bytes=10 * MIB) as store:
        log = store.commit_log
        log.flush()
        released = log.segments.released_offset
        assert released > 0
        cut_at = _record_offset_below(store, released // 2)
        log.set_end(cut_at)
        assert log.segments.released_offset == cut_at


def _record_offset_below(store: MessageStore, offset: int) -> int:
    """The physical offset of the last message of queue t/0 starting below ``offset``."""
    starts = [message.physical_offset for message in pull_all(store, "t", 0)]
    return max(start for start in starts if start < offset)


def test_release_rounds_inwards_to_whole_pages(tmp_path):
    path = str(tmp_path / "f")
    page = mmap.PAGESIZE
    mapped = MappedFile(path, 0, 4 * page, create=True)
    try:
        mapped.mm[:] = b"\x07" * (4 * page)
        mapped.flush()
        mapped.release(100, 3 * page - 1)     # holds page 1 whole, pages 0 and 2 in part
        if drops_page_cache(path):
            assert [resident_pages(mapped, n * page, (n + 1) * page) for n in range(4)] == [1, 0, 1, 1]
        assert bytes(mapped.mm[:]) == b"\x07" * (4 * page)
        assert resident_pages(mapped, page, 2 * page) == 1   # read back in from the disk
    finally:
        mapped.close()


def test_a_scrub_walk_lets_go_of_what_it_read_behind_the_window(tmp_path):
    with filled_store(tmp_path, cache_bytes=1 * MIB, total_bytes=12 * MIB) as store:
        log = store.commit_log
        flushed = log.flush()
        pull_all(store, "t", 0)   # reads the whole log back into the page cache
        first = log.segments.files[0]
        cached = resident_pages(first, 0, 4 * MIB)
        scrub = Scrub(log, store.integrity, bytes_per_s=1)
        while scrub.passes_completed == 0:
            scrub.check(256 * 1024)   # steps that end inside pages: the next one takes them
        assert scrub.corrupt_records_found == 0
        if drops_page_cache(str(tmp_path)):
            assert cached == 4 * MIB // mmap.PAGESIZE
            assert resident_pages(first, 0, 4 * MIB) == 0
            last = log.segments.find(flushed - 1)
            assert resident_pages(last, flushed - 1 * MIB - last.start_offset, flushed - last.start_offset) > 0


def test_a_negative_window_is_refused(tmp_path):
    with pytest.raises(StoreConfigError, match="commitlog_cache_bytes must be 0"):
        make_config(tmp_path / "s", commitlog_cache_bytes=-1)
