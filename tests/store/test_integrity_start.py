"""A crash while a file is being created leaves a file the store must start past by
itself: a 0-byte or short, never-written last CommitLog segment, ConsumeQueue file or
IndexFile, or a truncated last segment that still holds data."""

from __future__ import annotations

import os

import pytest

from store import Message, MessageStore, StoreError
from store_helpers import CQ_ENTRY, check_indexes_agree_with_log, make_config, pull_all, segment_files

SEGMENT = 4096


def _fill(path, count=20, **settings):
    store = MessageStore(make_config(path, commitlog_segment_bytes=SEGMENT, flush="sync", **settings))
    store.start()
    results = store.put_batch([Message(topic="T", body=b"m%03d" % i + b"." * 300, keys=[f"k{i}"])
                               for i in range(count)])
    assert store.wait_dispatched()
    store.halt()
    return results


def _reopen(path, **settings) -> MessageStore:
    store = MessageStore(make_config(path, commitlog_segment_bytes=SEGMENT, flush="sync", **settings))
    store.start()
    return store


def _next_segment_name(path) -> str:
    last = segment_files(path)[-1]
    return os.path.join(os.path.dirname(last), f"{int(os.path.basename(last)) + SEGMENT:020d}")


def _drop_the_preallocated_next_segment(path) -> None:
    for name in segment_files(path):
        if os.path.getsize(name) and open(name, "rb").read(4) == b"\0\0\0\0":
            os.unlink(name)            # the preallocated next segment: keep only written ones


@pytest.mark.parametrize("stale_after", [False, True], ids=["last", "followed by an unwritten preallocation"])
def test_zero_byte_last_segment_is_deleted_and_the_store_starts(tmp_path, stale_after):
    # stale_after: a replica cut left a preallocated segment two past the new end, and the
    # next segment's creation, cut off by a crash (0 bytes), made the two contiguous
    path = str(tmp_path / "s")
    _fill(path)
    _drop_the_preallocated_next_segment(path)
    leftover = _next_segment_name(path)
    open(leftover, "wb").close()
    expected_repairs = [f"deleted empty last file {leftover} (0 bytes)"]
    if stale_after:
        stale = _next_segment_name(path)
        with open(stale, "wb") as handle:
            handle.write(bytes(SEGMENT))
        expected_repairs.insert(0, f"deleted unwritten file {stale} past a short file")
    store = _reopen(path)
    try:
        assert [m.body[:4] for m in pull_all(store, "T", 0)] == [b"m%03d" % i for i in range(20)]
        assert store.put(Message(topic="T", body=b"after")).queue_offset == 20
        assert store.commit_log.segments.repairs == expected_repairs
    finally:
        store.shutdown()


def test_a_segment_with_data_past_a_cut_off_one_is_refused(tmp_path):
    path = str(tmp_path / "s")
    _fill(path)
    _drop_the_preallocated_next_segment(path)
    open(_next_segment_name(path), "wb").close()
    with open(_next_segment_name(path), "wb") as handle:
        handle.write(b"\1" + bytes(SEGMENT - 1))
    with pytest.raises(StoreError, match="holds data; restore the file"):
        _reopen(path)


def test_short_never_written_last_segment_is_deleted(tmp_path):
    path = str(tmp_path / "s")
    _fill(path)
    leftover = _next_segment_name(path)
    if os.path.exists(leftover):
        os.unlink(leftover)
    with open(leftover, "wb") as handle:
        handle.write(bytes(1000))     # a reservation cut off half-way: zeros only
    store = _reopen(path)
    try:
        assert store.max_offset("T", 0) == 20
        assert len(check_indexes_agree_with_log(store)) == 20
    finally:
        store.shutdown()


def _cut_through_last_message(path, results) -> str:
    """Truncate the last written segment through the middle of its last message (and delete
    the segments after it); return the segment's path."""
    last_written = max(r.physical_offset for r in results)
    holder = [p for p in segment_files(path) if int(os.path.basename(p)) <= last_written][-1]
    for name in segment_files(path):
        if int(os.path.basename(name)) > last_written:
            os.unlink(name)
    start = int(os.path.basename(holder))
    in_segment = sorted(r for r in results if r.physical_offset >= start)
    os.truncate(holder, in_segment[-1].physical_offset - start + 10)
    return holder


def test_truncated_last_segment_with_data_keeps_its_whole_messages(tmp_path):
    path = str(tmp_path / "s")
    results = _fill(path, count=30)
    holder = _cut_through_last_message(path, results)
    store = _reopen(path)
    try:
        assert os.path.getsize(holder) == SEGMENT
        survivors = len(results) - 1
        assert store.max_offset("T", 0) == survivors
        assert [m.body[:4] for m in pull_all(store, "T", 0)] == [b"m%03d" % i for i in range(survivors)]
        assert store.put(Message(topic="T", body=b"after")).queue_offset == survivors
        assert len(check_indexes_agree_with_log(store)) == survivors + 1
    finally:
        store.shutdown()


def test_truncated_last_segment_below_the_checkpoint_is_scanned_from_its_start(tmp_path):
    """The checkpoint was written after the last put (as the flush thread does when the puts
    take longer than checkpoint_interval_ms), so its flushed and dispatched offsets count the
    bytes the truncation then took: recovery must not start its scan on the zeros past them
    and keep the torn message, its queue entry and its queue offset."""
    path = str(tmp_path / "s")
    store = MessageStore(make_config(path, commitlog_segment_bytes=SEGMENT, flush="sync"))
    store.start()
    results = store.put_batch([Message(topic="T", body=b"m%03d" % i + b"." * 300, keys=[f"k{i}"])
                               for i in range(30)])
    assert store.wait_dispatched()
    store.flusher.flush_now()
    written = store.flusher.write_checkpoint()
    store.halt()
    last = max(results, key=lambda r: r.physical_offset)
    assert written.flushed_phy_offset == written.dispatched_phy_offset == last.end_offset
    holder = _cut_through_last_message(path, results)
    store = _reopen(path)
    try:
        assert store.recovery.end_offset == last.physical_offset
        assert store.checkpoint.state.flushed_phy_offset <= last.physical_offset
        assert not [r for r in store.integrity.repairs if "consume queue" in r]
        assert os.path.getsize(holder) == SEGMENT
        assert store.max_offset("T", 0) == 29
        assert [m.body[:4] for m in pull_all(store, "T", 0)] == [b"m%03d" % i for i in range(29)]
        after = store.put(Message(topic="T", body=b"after"))
        assert (after.queue_offset, after.physical_offset) == (29, last.physical_offset)
        assert store.wait_dispatched() and store.dispatcher.error is None
        assert len(check_indexes_agree_with_log(store)) == 30
    finally:
        store.shutdown()


def test_queue_rebuilt_at_start_gives_the_next_queue_offset(tmp_path):
    """A ConsumeQueue that recovery keeps but the start-time check rebuilds shorter (here an
    extra entry naming another queue's record, below the checkpoint): the next put takes
    its queue offset from the rebuilt queue, not from the one recovery found."""
    path = str(tmp_path / "s")
    store = MessageStore(make_config(path, commitlog_segment_bytes=SEGMENT, flush="sync"))
    store.start()
    store.put_batch([Message(topic="T", body=b"q0-%d" % i) for i in range(10)])
    other = store.put(Message(topic="T", queue_id=1, body=b"q1"))
    assert store.wait_dispatched()
    store.flusher.flush_now()
    store.flusher.write_checkpoint()
    store.halt()
    queue_file = os.path.join(path, "consumequeue", "T", "0", f"{0:020d}")
    with open(queue_file, "r+b") as handle:
        handle.seek(10 * CQ_ENTRY.size)
        handle.write(CQ_ENTRY.pack(other.physical_offset, other.wrote_bytes, 0))
    store = _reopen(path)
    try:
        assert any("consume queue T/0 disagrees with the log" in r for r in store.integrity.repairs)
        assert store.max_offset("T", 0) == 10
        assert store.put(Message(topic="T", body=b"after")).queue_offset == 10
        assert store.wait_dispatched() and store.dispatcher.error is None
        assert [m.body for m in pull_all(store, "T", 0)][-1] == b"after"
        assert len(check_indexes_agree_with_log(store)) == 12
    finally:
        store.shutdown()


def test_zero_byte_consume_queue_and_index_files_do_not_stop_start(tmp_path):
    path = str(tmp_path / "s")
    _fill(path, count=20, consume_queue_entries_per_file=8)
    queue_dir = os.path.join(path, "consumequeue", "T", "0")
    last_cq = sorted(os.listdir(queue_dir))[-1]
    open(os.path.join(queue_dir, f"{int(last_cq) + 8 * 20:020d}"), "wb").close()
    index_dir = os.path.join(path, "index")
    open(os.path.join(index_dir, "99991231235959999"), "wb").close()
    store = _reopen(path, consume_queue_entries_per_file=8)
    try:
        assert store.max_offset("T", 0) == 20
        assert len(check_indexes_agree_with_log(store)) == 20
        assert not os.path.exists(os.path.join(index_dir, "99991231235959999"))
        store.put_batch([Message(topic="T", body=b"more", keys=["after"]) for _ in range(10)])
        assert store.wait_dispatched()
        assert store.max_offset("T", 0) == 30
    finally:
        store.shutdown()


def test_a_store_killed_before_its_next_checkpoint_starts_with_what_it_kept_flushed(tmp_path):
    """Killed (halt) before a checkpoint counts its writes, a store used to start with the
    checkpoint's flushed offset (0 early in its life) while holding the bytes recovery kept,
    and said so in its status until the next flush. Start now makes them durable first."""
    config = make_config(tmp_path / "s", flush="async", flush_interval_ms=600_000, checkpoint_interval_ms=600_000)
    store = MessageStore(config)
    store.start()
    store.put_batch([Message(topic="F", queue_id=0, body=b"f%d" % i) for i in range(10)])
    written = store.statistics()
    assert written.flushed_offset == 0 < written.max_physical_offset   # nothing flushed within the interval
    store.halt()
    store = MessageStore(config)
    store.start()
    try:
        started = store.statistics()
        assert started.max_physical_offset == written.max_physical_offset
        assert started.flushed_offset == started.max_physical_offset
        assert store.checkpoint.state.flushed_phy_offset == started.max_physical_offset
        assert [m.body for m in pull_all(store, "F", 0)] == [b"f%d" % i for i in range(10)]
    finally:
        store.shutdown()
