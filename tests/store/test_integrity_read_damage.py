"""Index damage that start's sampled checks miss is found by the first read that meets it.

Start follows only the newest 4,096 and an even sample of 4,096 older ConsumeQueue and
index entries into the log. On a real store with more entries than that, one entry the
sample skips is damaged after a clean stop; the store starts without a word, then a pull
(ConsumeQueue) or a key query (IndexFile) meets the entry, finds it disagrees with its
record, rebuilds the structure from the log (WARNING, counted) and answers correctly."""

from __future__ import annotations

import logging
import os
import shutil
import struct

import pytest

from store import Message, MessageStore, codec
from store.integrity import _start_check_sample
from store_helpers import make_config, pull_all

MESSAGES = 20_000      # 10,000 entries per queue, 20,000 index entries: well past what start follows
SETTINGS = dict(commitlog_segment_bytes=1 << 20, flush="async", consume_queue_entries_per_file=4096,
                index_hash_slots=8192, index_max_entries=32768)
INDEX_HEADER_BYTES, SLOT_BYTES = 40, 4
INDEX_ENTRY = struct.Struct(">iqii")
CQ_ENTRY = struct.Struct(">qiq")


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A store of MESSAGES messages alternating over queues 0 and 1 of topic R, key k{i}
    each, cleanly stopped; the files are copied per test."""
    path = tmp_path_factory.mktemp("read-damage") / "store"
    store = MessageStore(make_config(path, **SETTINGS))
    store.start()
    messages = [Message(topic="R", queue_id=i % 2, body=b"r%05d" % i, keys=[f"k{i}"]) for i in range(MESSAGES)]
    offsets = []
    for start in range(0, MESSAGES, 500):
        offsets.extend(r.physical_offset for r in store.put_batch(messages[start:start + 500]))
    store.shutdown()
    return path, offsets


@pytest.fixture
def store_path(written, tmp_path):
    source, _ = written
    target = tmp_path / "store"
    shutil.copytree(source, target)
    return target


def _unsampled(count: int, near: int) -> int:
    """An entry number (0-based, in ``count``) at or after ``near`` that start does not follow."""
    sampled = _start_check_sample(count)
    return next(n for n in range(near, count) if not sampled[n])


def _start(path) -> MessageStore:
    store = MessageStore(make_config(path, **SETTINGS))
    store.start()
    statistics = store.integrity.statistics()
    assert statistics.consume_queues_rebuilt == 0 and statistics.index_rebuilds == 0, statistics.repairs
    return store


@pytest.mark.parametrize("damage", ["size", "other queue's record"])
def test_a_damaged_consume_queue_entry_start_misses_is_rebuilt_by_the_pull_that_meets_it(
        store_path, written, damage, caplog):
    _, offsets = written
    entry = _unsampled(MESSAGES // 2, 2000)            # queue 0's entry ``entry`` is message 2 * entry
    path = os.path.join(store_path, "consumequeue", "R", "0", "%020d" % (entry // 4096 * 4096 * CQ_ENTRY.size))
    at = entry % 4096 * CQ_ENTRY.size
    with open(path, "r+b") as handle:
        handle.seek(at)
        offset, size, tags = CQ_ENTRY.unpack(handle.read(CQ_ENTRY.size))
        assert offset == offsets[2 * entry]
        # a wrong size, or the record of queue 1 between this entry and the next (log order holds)
        changed = (offset, size + 1, tags) if damage == "size" else (offsets[2 * entry + 1], size, tags)
        handle.seek(at)
        handle.write(CQ_ENTRY.pack(*changed))
    store = _start(store_path)
    try:
        with caplog.at_level(logging.WARNING, logger="store"):
            read = store.pull("R", 0, entry - 2, 5)
        assert [m.body for m in read.messages] == [b"r%05d" % (2 * n) for n in range(entry - 2, entry + 3)]
        assert not read.corrupt
        assert store.integrity.statistics().consume_queues_rebuilt == 1
        assert any("consume queue R/0" in r.message and "rebuilding it from the log" in r.message
                   and r.levelno == logging.WARNING for r in caplog.records)
        assert [m.body for m in pull_all(store, "R", 0)] == [b"r%05d" % i for i in range(0, MESSAGES, 2)]
    finally:
        store.shutdown()


@pytest.mark.parametrize("damage", ["key hash", "offset of the next record"])
def test_a_damaged_index_entry_start_misses_is_rebuilt_by_the_key_query_that_meets_it(
        store_path, written, damage, caplog):
    _, offsets = written
    message = _unsampled(MESSAGES, 5000)               # message i's key is entry i + 1 of the one index file
    (index_file,) = os.listdir(os.path.join(store_path, "index"))
    at = INDEX_HEADER_BYTES + SETTINGS["index_hash_slots"] * SLOT_BYTES + (message + 1) * INDEX_ENTRY.size
    with open(os.path.join(store_path, "index", index_file), "r+b") as handle:
        handle.seek(at)
        key_hash, offset, time_diff, previous = INDEX_ENTRY.unpack(handle.read(INDEX_ENTRY.size))
        assert (key_hash, offset) == (codec.index_key_hash(f"R#k{message}"), offsets[message])
        # a flipped hash bit (start never reads hashes), or the next message's record (log order holds)
        changed = (key_hash ^ 1, offset) if damage == "key hash" else (key_hash, offsets[message + 1])
        handle.seek(at)
        handle.write(INDEX_ENTRY.pack(*changed, time_diff, previous))
    store = _start(store_path)
    try:
        with caplog.at_level(logging.WARNING, logger="store"):
            found = store.query_by_key("R", f"k{message}")
        assert [m.body for m in found] == [b"r%05d" % message]
        assert store.integrity.statistics().index_rebuilds == 1
        assert any("rebuilding the index from the log" in r.message and r.levelno == logging.WARNING
                   for r in caplog.records)
        for i in (0, message - 1, message + 1, MESSAGES - 1):
            assert [m.body for m in store.query_by_key("R", f"k{i}")] == [b"r%05d" % i]
        assert store.integrity.statistics().index_rebuilds == 1
    finally:
        store.shutdown()


def test_a_damaged_record_is_not_taken_for_a_damaged_index(store_path, written):
    """A key query that meets a record with a flipped body bit skips it (the record is
    reported by reads and repaired by replicas); the index is not rebuilt for it."""
    _, offsets = written
    segment = os.path.join(store_path, "commitlog", "%020d" % 0)
    with open(segment, "r+b") as handle:
        handle.seek(offsets[10] + codec.HEADER.size + 2)   # inside the body
        byte = handle.read(1)
        handle.seek(offsets[10] + codec.HEADER.size + 2)
        handle.write(bytes([byte[0] ^ 0x10]))
    store = _start(store_path)
    try:
        assert store.query_by_key("R", "k10") == []
        assert [m.body for m in store.query_by_key("R", "k11")] == [b"r00011"]
        assert store.integrity.statistics().index_rebuilds == 0
    finally:
        store.shutdown()


@pytest.mark.parametrize("points_at", ["past the log's end", "before the log's start"])
def test_a_consume_queue_entry_damaged_while_running_does_not_stall_its_queue(tmp_path, points_at, caplog):
    """An entry that names no offset of the log: before, a pull stopped at it (taken for a
    cut under way) or stepped over it (taken for retention), so the queue stalled there or
    lost the message. Out of log order with its neighbours, it is damage: rebuilt, served."""
    store = MessageStore(make_config(tmp_path / "s", **SETTINGS))
    store.start()
    try:
        sent = store.put_batch([Message(topic="L", queue_id=0, body=b"l%03d" % i) for i in range(100)])
        assert store.wait_dispatched()
        queue = store.queues.get("L", 0)
        mapped = queue.files.find(50 * CQ_ENTRY.size)
        at = 50 * CQ_ENTRY.size - mapped.start_offset
        offset, size, tags = CQ_ENTRY.unpack_from(mapped.mm, at)
        assert offset == sent[50].physical_offset
        wrong = store.commit_log.max_offset + (1 << 30) if points_at == "past the log's end" else -(1 << 20)
        with open(mapped.path, "r+b") as handle:          # as a disk would: the mapping sees it
            handle.seek(at)
            handle.write(CQ_ENTRY.pack(wrong, size, tags))
        with caplog.at_level(logging.WARNING, logger="store"):
            read = store.pull("L", 0, 48, 4)
        assert [m.body for m in read.messages] == [b"l048", b"l049", b"l050", b"l051"]
        assert store.integrity.statistics().consume_queues_rebuilt == 1
        assert any("rebuilding it from the log" in r.message for r in caplog.records)
    finally:
        store.shutdown()


def test_a_flipped_key_in_another_record_of_the_chain_is_not_taken_for_a_damaged_index(tmp_path):
    """With one hash slot every key shares a chain: a query for key-a walks past key-b's
    record, read without its CRCs since it is not wanted. A flipped byte in key-b's KEYS makes
    the record's hashes miss the entry's: that is the record's damage (its CRCs fail), not
    the index's, and the index is not rebuilt for it."""
    settings = dict(SETTINGS, index_hash_slots=1)
    store = MessageStore(make_config(tmp_path / "s", **settings))
    store.start()
    results = store.put_batch([Message(topic="R", body=b"body-%d" % i, keys=[f"key-{name}"])
                               for i, name in enumerate("abc")])
    store.shutdown()
    victim = results[1]
    segment = os.path.join(tmp_path / "s", "commitlog", "%020d" % 0)
    with open(segment, "r+b") as handle:
        handle.seek(victim.physical_offset)
        record = handle.read(victim.wrote_bytes)
        at = victim.physical_offset + record.index(b"key-b") + 4
        handle.seek(at)
        handle.write(b"x")                                   # key-b -> key-x in the record only
    store = MessageStore(make_config(tmp_path / "s", **settings))
    store.start()
    try:
        assert [m.body for m in store.query_by_key("R", "key-a")] == [b"body-0"]
        assert [m.body for m in store.query_by_key("R", "key-c")] == [b"body-2"]
        assert store.integrity.statistics().index_rebuilds == 0
    finally:
        store.shutdown()
