"""MessageStore behaviour: puts, reads, refusals, segment rolling, flush, queries, config
files and retention."""

from __future__ import annotations

import json
import os
import struct
import time

import pytest

from store import GetStatus, Message, MessageNotFound, MessageStore, PutStatus, StoreConfig, StoreCorruptError
from store.errors import StoreConfigError
from store import codec
from store_helpers import SteppedClock, make_config, pull_all, read_cq_entries, same_message, scan_commit_log, segment_files


# --- put / get ----------------------------------------------------------------------------
def test_put_and_get_across_topics_and_queues(open_store):
    store = open_store()
    puts = []
    for i in range(60):
        message = Message(topic=f"T{i % 3}", queue_id=i % 4, body=os.urandom(i * 7), keys=[f"k{i}"],
                          tags=f"tag{i % 5}", properties={"n": str(i), "\u00e9": "\u4e2d"})
        puts.append((message, store.put(message)))
    batch = [Message(topic="B", queue_id=q, body=b"b%d" % i) for i in range(5) for q in (0, 1)]
    batch_results = store.put_batch(batch)
    puts += list(zip(batch, batch_results))
    assert all(r.status is PutStatus.PUT_OK for _, r in puts)
    # queue offsets count per topic/queue from 0
    seen: dict[tuple[str, int], int] = {}
    for message, result in puts:
        key = (message.topic, message.queue_id)
        assert result.queue_offset == seen.get(key, 0)
        seen[key] = result.queue_offset + 1
    # physical offsets are contiguous: each message starts where the previous ended
    for (_, previous), (_, current) in zip(puts, puts[1:]):
        assert current.physical_offset == previous.end_offset
    assert store.commit_log.max_offset == puts[-1][1].end_offset
    assert store.wait_dispatched()
    for (topic, queue_id), count in seen.items():
        assert store.max_offset(topic, queue_id) == count and store.min_offset(topic, queue_id) == 0
        got = pull_all(store, topic, queue_id)
        expected = [(m, r) for m, r in puts if (m.topic, m.queue_id) == (topic, queue_id)]
        assert len(got) == len(expected)
        for stored, (message, result) in zip(got, expected):
            assert same_message(stored, message)
            assert stored.physical_offset == result.physical_offset
            assert stored.queue_offset == result.queue_offset
            assert stored.message_id == result.message_id
            assert stored.store_timestamp == result.store_timestamp
    assert store.topics() == {"B": [0, 1], "T0": [0, 1, 2, 3], "T1": [0, 1, 2, 3], "T2": [0, 1, 2, 3]}
    stats = store.statistics()
    assert stats.put_messages == len(puts) and stats.max_physical_offset == store.commit_log.max_offset
    assert stats.dispatched_offset == stats.max_physical_offset and stats.running


def test_batch_refuses_illegal_messages_alone(open_store):
    store = open_store()
    results = store.put_batch([Message(topic="T", body=b"1"), Message(topic="bad topic", body=b"2"),
                               Message(topic="T", body=b"3")])
    assert [r.status for r in results] == [PutStatus.PUT_OK, PutStatus.MESSAGE_ILLEGAL, PutStatus.PUT_OK]
    assert results[1].physical_offset == -1 and results[1].reason
    assert [r.queue_offset for r in (results[0], results[2])] == [0, 1]
    assert store.wait_dispatched()
    assert [m.body for m in store.get("T", 0, 0, 10)] == [b"1", b"3"]


# --- segments -------------------------------------------------------------------------------
def test_segment_rolling_with_blank_records(open_store, tmp_path):
    segment = 4096
    store = open_store(store_path=str(tmp_path / "s"), commitlog_segment_bytes=segment)
    results = [store.put(Message(topic="Roll", body=bytes([i]) * (300 + 37 * i), keys=[f"k{i}"]))
               for i in range(40)]
    assert all(r.status is PutStatus.PUT_OK for r in results)
    for result in results:                           # no message spans two segments
        assert result.physical_offset // segment == (result.end_offset - 1) // segment
    written = (store.commit_log.max_offset - 1) // segment + 1
    files = segment_files(store.config.store_path)
    assert [int(os.path.basename(f)) for f in files] == [i * segment for i in range(len(files))]
    assert written >= 5 and len(files) in (written, written + 1)   # + the preallocated next one
    for path in files:
        assert os.path.getsize(path) == segment
    starts = {r.physical_offset for r in results}
    for index, path in enumerate(files[:written - 1]):
        base = index * segment
        in_segment = [r for r in results if base <= r.physical_offset < base + segment]
        end = in_segment[-1].end_offset - base
        with open(path, "rb") as handle:
            data = handle.read()
        size, magic = struct.unpack_from(">iI", data, end)
        assert magic == codec.BLANK_MAGIC and size == segment - end
        assert data[end + 4:end + 8] == bytes.fromhex("CBD43194")
        assert base + segment in starts              # the next message opens the next segment
        following = min(r for r in results if r.physical_offset >= base + segment)
        assert following.physical_offset == base + segment
    assert store.wait_dispatched()
    assert [m.body for m in pull_all(store, "Roll", 0)] == [bytes([i]) * (300 + 37 * i) for i in range(40)]
    assert len(scan_commit_log(store.config.store_path)) == 40


def test_message_too_large_for_a_segment_is_refused(open_store):
    segment = 4096
    store = open_store(commitlog_segment_bytes=segment)
    store.put(Message(topic="T", body=b"first"))
    before = store.commit_log.max_offset
    overhead = codec.message_size(b"T", b"", b"")
    too_big = store.put(Message(topic="T", body=b"x" * (segment - 8 - overhead + 1)))
    assert too_big.status is PutStatus.MESSAGE_ILLEGAL
    assert store.commit_log.max_offset == before
    fits = store.put(Message(topic="T", body=b"y" * (segment - 8 - overhead)))   # exactly fills with its blank
    assert fits.status is PutStatus.PUT_OK
    assert fits.physical_offset == segment and fits.wrote_bytes == segment - 8
    assert store.put(Message(topic="T", body=b"after")).physical_offset == 2 * segment
    assert store.wait_dispatched()
    assert [len(m.body) for m in store.get("T", 0, 0, 10)] == [5, segment - 8 - overhead, 5]


# --- refusals -----------------------------------------------------------------------------
BAD = [
    (Message(topic="T", body=b"x" * (4 * 1024 * 1024 + 1)), PutStatus.MESSAGE_ILLEGAL),
    (Message(topic="T" * 128, body=b"x"), PutStatus.MESSAGE_ILLEGAL),
    (Message(topic="", body=b"x"), PutStatus.MESSAGE_ILLEGAL),
    (Message(topic="a b", body=b"x"), PutStatus.MESSAGE_ILLEGAL),
    (Message(topic="a/b", body=b"x"), PutStatus.MESSAGE_ILLEGAL),
    (Message(topic="caf\u00e9", body=b"x"), PutStatus.MESSAGE_ILLEGAL),
    (Message(topic="T", body=b"x", properties={"big": "v" * 32767}), PutStatus.PROPERTIES_SIZE_EXCEEDED),
    (Message(topic="T", body=b"x", properties={"HCRC": "00000000"}), PutStatus.MESSAGE_ILLEGAL),
    (Message(topic="T", body=b"x", keys=["two words"]), PutStatus.MESSAGE_ILLEGAL),
    (Message(topic="T", body=b"x", keys=[""]), PutStatus.MESSAGE_ILLEGAL),
    (Message(topic="T", body=b"x", properties={"a": "b\x01c"}), PutStatus.MESSAGE_ILLEGAL),
    (Message(topic="T", body=b"x", properties={"a\x02": "b"}), PutStatus.MESSAGE_ILLEGAL),
    (Message(topic="T", body=b"x", queue_id=-1), PutStatus.MESSAGE_ILLEGAL),
    (Message(topic="T", body="text"), PutStatus.MESSAGE_ILLEGAL),
]


@pytest.mark.parametrize("message, status", BAD, ids=range(len(BAD)))
def test_bad_input_is_refused_with_nothing_written(open_store, message, status):
    store = open_store(commitlog_segment_bytes=8 * 1024 * 1024)
    store.put(Message(topic="T", body=b"before"))
    before = store.commit_log.max_offset
    result = store.put(message)
    assert result.status is status, result.reason
    assert result.physical_offset == -1 and result.reason
    assert store.commit_log.max_offset == before
    assert store.wait_dispatched()
    assert store.max_offset("T", 0) == 1
    assert store.put(Message(topic="T", body=b"after")).queue_offset == 1


def test_limits_themselves_are_accepted(open_store):
    store = open_store(commitlog_segment_bytes=8 * 1024 * 1024)
    topic = "t" * 127
    assert store.put(Message(topic=topic, body=b"x" * (4 * 1024 * 1024))).status is PutStatus.PUT_OK
    assert store.put(Message(topic="A-b_%9", body=b"")).status is PutStatus.PUT_OK
    room = 32767 - codec.HCRC_PROPERTY_BYTES - len("p\x01\x02")
    assert store.put(Message(topic="T", body=b"x", properties={"p": "v" * room})).status is PutStatus.PUT_OK
    assert store.put(Message(topic="T", body=b"x", properties={"p": "v" * (room + 1)})).status \
        is PutStatus.PROPERTIES_SIZE_EXCEEDED
    assert store.wait_dispatched()
    assert len(store.get(topic, 0, 0)[0].body) == 4 * 1024 * 1024
    assert store.get("T", 0, 0)[0].total_size <= 91 + 1 + 1 + 32767


# --- flush ---------------------------------------------------------------------------------
def test_sync_flush_puts_are_on_disk_when_they_return(open_store):
    store = open_store(flush="sync", flush_interval_ms=10_000, checkpoint_interval_ms=10_000)
    for i in range(20):
        result = store.put(Message(topic="T", body=b"%d" % i))
        assert result.status is PutStatus.PUT_OK
        assert store.commit_log.flushed_offset >= result.end_offset
    results = store.put_batch([Message(topic="T", body=b"b%d" % i) for i in range(10)])
    assert store.statistics().flushed_offset >= results[-1].end_offset


def test_async_flush_catches_up(open_store):
    store = open_store(flush="async", flush_interval_ms=20)
    result = store.put(Message(topic="T", body=b"x"))
    assert store.wait_flushed(result.end_offset, 5000)
    assert store.commit_log.flushed_offset >= result.end_offset


def _wait_flushed_to(store, offset: int, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while store.commit_log.flushed_offset < offset:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def test_async_flush_runs_once_flush_dirty_bytes_max_waits_for_the_disk(open_store):
    # the interval alone would not flush within the test
    store = open_store(flush="async", flush_interval_ms=600_000, flush_dirty_bytes_max=64 * 1024)
    flushed_at_start = store.commit_log.flushed_offset
    first = store.put_batch([Message(topic="T", body=b"x" * 1000) for _ in range(20)])   # ~21 KB: under
    time.sleep(0.1)
    assert store.commit_log.flushed_offset == flushed_at_start < first[-1].end_offset
    results = store.put_batch([Message(topic="T", body=b"y" * 1000) for _ in range(60)])  # past 64 KiB
    assert _wait_flushed_to(store, results[-1].end_offset)


def test_async_flush_with_no_dirty_bound_waits_for_its_interval(open_store):
    store = open_store(flush="async", flush_interval_ms=600_000, flush_dirty_bytes_max=0)
    flushed_at_start = store.commit_log.flushed_offset
    store.put_batch([Message(topic="T", body=b"x" * 1000) for _ in range(300)])
    time.sleep(0.2)
    assert store.commit_log.flushed_offset == flushed_at_start


def test_a_replica_logs_async_flush_runs_once_flush_dirty_bytes_max_waits(open_store):
    master = open_store()
    master.put_batch([Message(topic="T", body=b"z" * 1000) for _ in range(100)])
    replica = open_store(flush="async", flush_interval_ms=600_000, flush_dirty_bytes_max=64 * 1024)
    end = 0
    while end < master.max_physical_offset:
        chunk = master.replica_log.read(end, 32 * 1024)
        end = replica.replica_log.append(end, chunk)
    assert end == master.max_physical_offset > 64 * 1024
    assert _wait_flushed_to(replica, end - 64 * 1024)   # at least what was past the bound once


def test_flush_dirty_bytes_max_may_not_be_negative():
    with pytest.raises(StoreConfigError, match="flush_dirty_bytes_max"):
        StoreConfig(store_path="/tmp/x", flush_dirty_bytes_max=-1)


# --- offset by time -------------------------------------------------------------------------
def test_offset_by_time_edges(open_store):
    clock = SteppedClock()
    store = open_store(clock=clock)
    assert store.offset_by_time("T", 0, 0) == 0                  # no such queue
    stamps = []
    for group in range(3):
        batch = store.put_batch([Message(topic="T", body=b"%d-%d" % (group, i)) for i in range(3)])
        assert len({r.store_timestamp for r in batch}) == 1      # one batch, one store time
        stamps.append(batch[0].store_timestamp)
        clock.advance(10)
    assert stamps[0] < stamps[1] < stamps[2]
    assert store.wait_dispatched()
    assert store.offset_by_time("T", 0, 0) == 0                  # before all
    assert store.offset_by_time("T", 0, stamps[0] - 1) == 0
    assert store.offset_by_time("T", 0, stamps[0]) == 0          # equal: the first of the equal ones
    assert store.offset_by_time("T", 0, stamps[0] + 1) == 3
    assert store.offset_by_time("T", 0, stamps[1]) == 3
    assert store.offset_by_time("T", 0, stamps[2]) == 6
    assert store.offset_by_time("T", 0, stamps[2] + 1) == 9      # after all: max offset
    assert store.offset_by_time("T", 0, 2**62) == store.max_offset("T", 0)
    assert store.offset_by_time("T", 5, stamps[0]) == 0          # a queue never written


# --- by id ------------------------------------------------------------------------------------
def test_get_by_message_id(open_store):
    store = open_store()
    results = [store.put(Message(topic="T", body=b"%d" % i)) for i in range(5)]
    assert store.wait_dispatched()
    for i, result in enumerate(results):
        message = store.get_by_message_id(result.message_id)
        assert message.body == b"%d" % i and message.physical_offset == result.physical_offset
        assert result.message_id == codec.message_id(codec.encode_host("127.0.0.1:10911"), result.physical_offset)
    other_host = codec.message_id(codec.encode_host("10.0.0.1:10911"), results[1].physical_offset)
    past_end = codec.message_id(codec.encode_host("127.0.0.1:10911"), 10**9)
    for bad in (other_host, past_end, "zz", results[0].message_id[:-2]):
        with pytest.raises(MessageNotFound):
            store.get_by_message_id(bad)
    for into in (1, 3, 4, 60, 95):   # an id that points into a message is not found, never corrupt
        inside = codec.message_id(codec.encode_host("127.0.0.1:10911"), results[1].physical_offset + into)
        with pytest.raises(MessageNotFound):
            store.get_by_message_id(inside)


# --- config files ---------------------------------------------------------------------------
def test_config_files_atomic_with_backup(open_store, tmp_path):
    path = str(tmp_path / "s")
    store = open_store(store_path=path)
    topics = store.configs["topics.json"]
    main = os.path.join(path, "config", "topics.json")
    topics.data["Orders"] = {"queues": 4}
    topics.persist()
    with open(main) as handle:
        assert json.load(handle) == {"Orders": {"queues": 4}}
    topics.data["Orders"] = {"queues": 8}
    topics.persist()
    with open(main) as handle:
        assert json.load(handle) == {"Orders": {"queues": 8}}
    with open(main + ".bak") as handle:
        assert json.load(handle) == {"Orders": {"queues": 4}}     # the previous whole version
    assert not os.path.exists(main + ".tmp")
    store.shutdown()
    for name in ("topics.json", "consumerOffset.json", "delayOffset.json", "subscriptionGroup.json",
                 "consumerFilter.json"):
        assert os.path.exists(os.path.join(path, "config", name))
    # a torn or garbage main file: the .bak is used
    with open(main, "wb") as handle:
        handle.write(b'{"Orders": {"que')
    store = open_store(store_path=path)
    # shutdown persisted every file once more, so the .bak holds the last version too
    assert store.configs["topics.json"].data == {"Orders": {"queues": 8}}


def test_config_file_both_copies_bad_is_moved_aside_and_marked_for_rebuild(tmp_path):
    from store.config_files import ConfigFile
    path = tmp_path / "c.json"
    path.write_bytes(b"not json")
    (tmp_path / "c.json.bak").write_bytes(b"[1, 2]")
    config_file = ConfigFile(str(path))
    assert config_file.damaged and config_file.data == {}
    assert (tmp_path / "c.json.damaged").read_bytes() == b"not json"   # kept for a person, out of the way


# --- retention ------------------------------------------------------------------------------
def test_retention_by_age(open_store):
    segment = 4096
    # the disk rule is kept out of the way: this machine's disk may already be over 0.75 used
    store = open_store(commitlog_segment_bytes=segment, consume_queue_entries_per_file=4,
                       index_hash_slots=4, index_max_entries=6, disk_max_used_ratio=0.99)
    results = [store.put(Message(topic="Old", queue_id=i % 2, body=b"r" * 400, keys=[f"k{i}"]))
               for i in range(60)]
    assert store.wait_dispatched() and store.wait_flushed(store.commit_log.max_offset, 5000)
    segments_before = (store.commit_log.max_offset - 1) // segment + 1   # written ones, not the preallocated
    index_before = len(os.listdir(os.path.join(store.config.store_path, "index")))
    assert segments_before >= 6
    assert store.run_retention(now_ms=int(time.time() * 1000)) == 0          # nothing old yet
    deleted = store.run_retention(now_ms=int(time.time() * 1000) + 10 * 365 * 24 * 3600 * 1000)
    assert deleted == segments_before - 1                                       # never the last
    files = segment_files(store.config.store_path)
    assert len(files) <= 2                                                     # the last, maybe one preallocated
    floor = int(os.path.basename(files[0]))
    assert floor == (segments_before - 1) * segment
    assert store.commit_log.min_offset == floor == store.statistics().min_physical_offset
    survivors = [r for r in results if r.physical_offset >= floor]
    assert survivors
    for queue_id in (0, 1):
        queue_survivors = [r for i, r in enumerate(results) if i % 2 == queue_id and r.physical_offset >= floor]
        assert store.min_offset("Old", queue_id) == queue_survivors[0].queue_offset
        too_small = store.pull("Old", queue_id, 0)
        assert too_small.status is GetStatus.OFFSET_TOO_SMALL
        assert too_small.next_offset == queue_survivors[0].queue_offset
        got = pull_all(store, "Old", queue_id)
        assert [m.physical_offset for m in got] == [r.physical_offset for r in queue_survivors]
        # ConsumeQueue files wholly below the new floor are gone; every kept file but the
        # last still has an entry at or above it
        directory = os.path.join(store.config.store_path, "consumequeue", "Old", str(queue_id))
        names = sorted(os.listdir(directory))
        assert int(names[0]) > 0
        entries = read_cq_entries(store.config.store_path, "Old", queue_id)
        for name in names[:-1]:
            first = int(name) // 20
            assert max(entries[q][0] for q in range(first, first + 4)) >= floor
    assert len(os.listdir(os.path.join(store.config.store_path, "index"))) < index_before
    for i, result in enumerate(results):
        found = store.query_by_key("Old", f"k{i}")
        assert [m.physical_offset for m in found] == ([result.physical_offset] if result in survivors else [])
    # and the store keeps working
    after = store.put(Message(topic="Old", queue_id=0, body=b"new"))
    assert after.queue_offset == 30
    assert store.wait_dispatched()
    assert store.get("Old", 0, 30)[0].body == b"new"


def test_retention_survives_restart(open_store, tmp_path):
    path = str(tmp_path / "s")
    settings = dict(store_path=path, commitlog_segment_bytes=4096, consume_queue_entries_per_file=4)
    store = open_store(**settings)
    for i in range(40):
        store.put(Message(topic="T", body=b"z" * 500))
    assert store.wait_dispatched() and store.wait_flushed(store.commit_log.max_offset, 5000)
    store.run_retention(now_ms=2**62)
    low, high = store.min_offset("T", 0), store.max_offset("T", 0)
    assert low > 0
    store.shutdown()
    store = open_store(**settings)
    assert (store.min_offset("T", 0), store.max_offset("T", 0)) == (low, high)
    assert len(pull_all(store, "T", 0)) == high - low
    assert store.put(Message(topic="T", body=b"n")).queue_offset == high


def test_store_directory_lock_and_closed_store(tmp_path):
    from store import StoreClosedError, StoreError
    config = make_config(tmp_path / "s")
    first = MessageStore(config)
    first.start()
    try:
        with pytest.raises(StoreError):
            MessageStore(config).start()
    finally:
        first.shutdown()
    with pytest.raises(StoreClosedError):
        first.put(Message(topic="T", body=b"x"))
    assert not os.path.exists(tmp_path / "s" / "abort")


def test_the_run_listener_is_told_each_run_of_records_as_it_lands(open_store):
    store = open_store()
    told = []
    store.commit_log.run_listener = lambda offset, data: told.append((offset, bytes(data), store.commit_log.max_offset))
    (one,) = store.put_batch([Message("t", b"single")])
    batch = store.put_batch([Message("t", b"m%d" % i) for i in range(5)])
    log = store.commit_log
    assert [(offset, end) for offset, _, end in told] == [(one.physical_offset, one.end_offset),
                                                          (batch[0].physical_offset, batch[-1].end_offset)]
    for offset, data, end in told:   # the log's own bytes, and the log's end already past them
        assert data == bytes(log.segments.find(offset).mm[offset:end])
