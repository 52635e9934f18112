"""A crash while a file is being created leaves a file the store must start past by
itself: a 0-byte or short, never-written last CommitLog segment, ConsumeQueue file or
IndexFile, or a truncated last segment that still holds data."""

from __future__ import annotations

import os

from store import Message, MessageStore
from store_helpers import check_indexes_agree_with_log, make_config, pull_all, segment_files

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


def test_zero_byte_last_segment_is_deleted_and_the_store_starts(tmp_path):
    path = str(tmp_path / "s")
    _fill(path)
    for name in segment_files(path):
        if os.path.getsize(name) and open(name, "rb").read(4) == b"\0\0\0\0":
            os.unlink(name)            # the preallocated next segment: keep only written ones
    leftover = _next_segment_name(path)
    open(leftover, "wb").close()
    store = _reopen(path)
    try:
        assert [m.body[:4] for m in pull_all(store, "T", 0)] == [b"m%03d" % i for i in range(20)]
        assert store.put(Message(topic="T", body=b"after")).queue_offset == 20
        assert any("deleted empty last file" in r for r in store.commit_log.segments.repairs)
    finally:
        store.shutdown()


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


def test_truncated_last_segment_with_data_keeps_its_whole_messages(tmp_path):
    path = str(tmp_path / "s")
    results = _fill(path, count=30)
    last_written = max(r.physical_offset for r in results)
    holder = [p for p in segment_files(path) if int(os.path.basename(p)) <= last_written][-1]
    for name in segment_files(path):
        if int(os.path.basename(name)) > last_written:
            os.unlink(name)
    start = int(os.path.basename(holder))
    in_segment = sorted(r for r in results if r.physical_offset >= start)
    # cut through the middle of the last message of the segment
    cut = in_segment[-1].physical_offset - start + 10
    os.truncate(holder, cut)
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
