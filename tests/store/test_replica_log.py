"""The store's replica log (store.replica_log): whole-record chunks, replica appends, cuts,
resets and the confirm offset."""

from __future__ import annotations

import os
from contextlib import contextmanager

import pytest

from store import Message, MessageStore, PutStatus, StoreClosedError, StoreError
from store.commit_log import REPLICA_WRITE_WINDOW_BYTES
from store.mapped_file import MappedFile
from store.replica_log import CUT, RESET, ChunkError, CutIntent, CutMarker, check_chunk
from store_helpers import make_config, pull_all, segment_files

SEGMENT = 64 * 1024


def fill(store: MessageStore, count: int, *, topic: str = "t", start: int = 0, body_bytes: int = 700) -> list:
    results = []
    for number in range(start, start + count):
        body = (b"%06d" % number) * (body_bytes // 6)
        results.append(store.put(Message(topic, body, queue_id=number % 3, keys=[f"k{number}"], tags=f"tag{number % 2}")))
    assert all(r.status is PutStatus.PUT_OK for r in results)
    return results


def replicate(master: MessageStore, replica: MessageStore, max_bytes: int) -> int:
    """Copy the master's log to the replica chunk by chunk; return the number of chunks."""
    chunks = 0
    for _ in range(100_000):
        offset = replica.max_physical_offset
        chunk = master.replica_log.read(offset, max_bytes)
        if not chunk:
            return chunks
        assert replica.replica_log.append(offset, chunk) == offset + len(chunk)
        chunks += 1
    raise AssertionError("replication did not finish")


def log_bytes(path) -> bytes:
    return b"".join(open(name, "rb").read() for name in segment_files(path))


@pytest.mark.parametrize("max_bytes", [1, 5000, 1 << 20])
def test_replica_log_is_byte_identical_and_answers_the_same_queries(open_store, max_bytes):
    master = open_store()
    fill(master, 300)                       # about 3.3 segments, blank records included
    replica = open_store()
    chunks = replicate(master, replica, max_bytes)
    assert replica.max_physical_offset == master.max_physical_offset
    # a chunk never spans segments and never exceeds max_bytes unless one record does
    assert chunks >= (300 if max_bytes == 1 else master.max_physical_offset // min(max_bytes, SEGMENT))
    assert replica.wait_dispatched()
    assert master.wait_dispatched()
    for queue_id in range(3):
        assert [m.physical_offset for m in pull_all(replica, "t", queue_id)] == \
               [m.physical_offset for m in pull_all(master, "t", queue_id)]
    found = replica.query_by_key("t", "k123")
    assert [m.body for m in found] == [m.body for m in master.query_by_key("t", "k123")] and found
    master.shutdown()
    replica.shutdown()
    assert log_bytes(replica.config.store_path) == log_bytes(master.config.store_path)


def test_a_promoted_replica_continues_every_queue_where_the_master_stopped(open_store):
    master = open_store()
    fill(master, 50)
    replica = open_store()
    replicate(master, replica, 1 << 20)
    result = replica.put(Message("t", b"after promotion", queue_id=1))
    assert result.status is PutStatus.PUT_OK
    assert result.queue_offset == master.max_offset("t", 1)
    assert replica.wait_dispatched()
    assert pull_all(replica, "t", 1)[-1].body == b"after promotion"


def test_replica_append_refuses_the_wrong_offset_and_broken_framing(open_store):
    master = open_store()
    fill(master, 10)
    replica = open_store()
    chunk = master.replica_log.read(0, 1 << 20)
    with pytest.raises(StoreError):
        replica.replica_log.append(100, chunk)             # not the replica's end
    with pytest.raises(ChunkError):
        replica.replica_log.append(0, chunk[:-3])          # ends inside a record
    with pytest.raises(ChunkError):
        replica.replica_log.append(0, b"\0" * 8 + chunk)   # no record at the start
    assert replica.max_physical_offset == 0
    replica.replica_log.append(0, chunk)
    assert replica.max_physical_offset == master.max_physical_offset


def test_a_read_from_inside_a_record_is_refused_whether_or_not_it_reaches_the_end(open_store):
    """A read that takes all up to the log's end looks at its first record only; one cut
    short by max_bytes walks every record: both refuse an offset inside a record, and
    both give whole records ending where the log or the segment does."""
    store = open_store()
    results = fill(store, 120)                 # ~1.9 segments: the first closed by a blank
    for record in (results[1], results[-2]):  # in the closed segment, in the last one
        for max_bytes in (1 << 20, 1):        # up to the end at once, or one record
            with pytest.raises(ChunkError, match="no record"):
                store.replica_log.read(record.physical_offset + 7, max_bytes)
    tail = results[-3].physical_offset
    end = store.max_physical_offset
    assert bytes(store.replica_log.read(tail, 1 << 20)) == log_bytes(store.config.store_path)[tail:end]
    closing = [r for r in results if r.physical_offset < SEGMENT][-1]
    chunk = store.replica_log.read(closing.physical_offset, 1 << 20)   # the segment's last record
    assert closing.physical_offset + len(chunk) == SEGMENT               # and its blank record
    assert check_chunk(chunk, closing.physical_offset, SEGMENT) == [0]


def test_check_chunk_rules():
    with pytest.raises(ChunkError, match="crosses a segment"):
        check_chunk(b"\0" * 16, SEGMENT - 8, SEGMENT)
    with pytest.raises(ChunkError, match="header"):
        check_chunk(b"\0" * 4, 0, SEGMENT)
    blank = (16).to_bytes(4, "big") + (0xCBD43194).to_bytes(4, "big") + b"\0" * 8
    check_chunk(blank, SEGMENT - 16, SEGMENT)
    with pytest.raises(ChunkError, match="does not close"):
        check_chunk(blank, SEGMENT - 32, SEGMENT)


def test_check_chunk_returns_where_each_message_starts():
    record = lambda size: size.to_bytes(4, "big") + (0xDAA320A7).to_bytes(4, "big") + b"\0" * (size - 8)
    blank = (16).to_bytes(4, "big") + (0xCBD43194).to_bytes(4, "big") + b"\0" * 8
    assert check_chunk(record(100) + record(120) + record(90), 0, SEGMENT) == [0, 100, 220]
    assert check_chunk(record(100) + blank, SEGMENT - 116, SEGMENT) == [0]
    assert check_chunk(blank, SEGMENT - 16, SEGMENT) == []


@pytest.mark.parametrize("count", [15, 16, 40])   # below and from the count checked at once
def test_a_chunk_of_alike_records_is_checked_as_a_walk_would(count):
    """Records of one size are checked together (numpy), others one by one: the same
    positions and the same refusals either way."""
    magic = (0xDAA320A7).to_bytes(4, "big")
    record = lambda size, magic=magic: size.to_bytes(4, "big") + magic + b"\x07" * (size - 8)
    size = 180
    assert check_chunk(record(size) * count, SEGMENT, SEGMENT) == list(range(0, count * size, size))
    # a record of twice the size among them: no longer alike, walked, and still whole records
    mixed = record(size) * (count - 3) + record(2 * size) + record(size)
    assert check_chunk(mixed, 0, SEGMENT) == [*range(0, (count - 3) * size, size), (count - 3) * size,
                                              (count - 1) * size]
    # a broken magic, or a size that does not fit, in the middle: refused
    bad_magic = record(size) * (count - 2) + record(size, b"\0\0\0\0") + record(size)
    with pytest.raises(ChunkError, match=f"no whole record at {(count - 2) * size}"):
        check_chunk(bad_magic, 0, SEGMENT)
    too_long = record(size) * (count - 1) + (size + 1).to_bytes(4, "big") + record(size)[4:]
    with pytest.raises(ChunkError, match=f"no whole record at {(count - 1) * size}"):
        check_chunk(too_long, 0, SEGMENT)


def test_a_replica_dispatches_its_appended_records_from_their_checked_positions(open_store):
    """What a replica appends is recorded (CommitLog.written_runs) as its chunk check found
    it, across segment ends, so its dispatcher takes those positions instead of walking."""
    master = open_store()
    results = fill(master, 300)
    replica = open_store(dispatcher_thread=False)
    replicate(master, replica, 5000)
    end = replica.max_physical_offset
    kept, cursor = [], 0
    while cursor < end:
        taken = replica.commit_log.written_runs.take(cursor, end)
        assert taken is not None, f"no positions kept from {cursor}"
        kept.extend(taken[0])
        cursor = taken[1]
        if cursor < end and cursor % SEGMENT:   # a blank record closes the segment: the next starts a run
            cursor += SEGMENT - cursor % SEGMENT
    assert kept == [r.physical_offset for r in results]
    other = open_store()
    replicate(master, other, 5000)
    assert other.wait_dispatched()
    assert [m.body for m in pull_all(other, "t", 1)] == [m.body for m in pull_all(master, "t", 1)]
    assert [m.physical_offset for m in other.query_by_key("t", "k77")] == [results[77].physical_offset]


def test_a_reset_forgets_the_positions_of_the_dropped_log(open_store):
    master = open_store()
    fill(master, 200)
    replica = open_store(dispatcher_thread=False)
    replicate(master, replica, 1 << 20)
    replica.replica_log.reset(2 * SEGMENT)
    assert replica.commit_log.written_runs.take(2 * SEGMENT, master.max_physical_offset) is None
    replicate(master, replica, 1 << 20)
    assert replica.wait_dispatched()
    later = [m for m in pull_all(master, "t", 0) if m.physical_offset >= 2 * SEGMENT]
    assert [m.body for m in pull_all(replica, "t", 0)] == [m.body for m in later]


def test_truncate_cuts_log_queues_and_index_and_replication_resumes(open_store):
    master = open_store()
    results = fill(master, 200)
    replica = open_store()
    replicate(master, replica, 1 << 20)
    assert replica.wait_dispatched()
    cut = results[120].physical_offset
    replica.replica_log.cut(cut)
    assert replica.max_physical_offset == cut
    assert replica.query_by_key("t", "k150") == []
    assert replica.query_by_key("t", "k100")
    for queue_id in range(3):
        assert all(m.physical_offset < cut for m in pull_all(replica, "t", queue_id))
    replicate(master, replica, 3000)
    assert replica.wait_dispatched()
    assert [m.body for m in replica.query_by_key("t", "k150")] == [m.body for m in master.query_by_key("t", "k150")]
    master.shutdown()
    replica.shutdown()
    assert log_bytes(replica.config.store_path) == log_bytes(master.config.store_path)


def test_truncate_refuses_offsets_that_are_no_record_start(open_store):
    store = open_store()
    results = fill(store, 5)
    with pytest.raises(StoreError, match="no whole record"):
        store.replica_log.cut(results[2].physical_offset + 3)
    with pytest.raises(StoreError, match="holds"):
        store.replica_log.cut(store.max_physical_offset + 100)
    assert store.max_physical_offset == results[-1].end_offset


def test_a_cut_interrupted_by_a_crash_is_finished_at_the_next_start(tmp_path):
    path = tmp_path / "s"
    store = MessageStore(make_config(path))
    store.start()
    results = fill(store, 150)
    assert store.wait_dispatched()
    store.flusher.flush_now()
    store.flusher.write_checkpoint()
    store.halt()
    cut = results[90].physical_offset
    CutMarker(str(path)).write(CutIntent(CUT, cut))   # the crash came right after the intent
    store = MessageStore(make_config(path))
    store.start()
    try:
        assert store.max_physical_offset == cut
        assert not os.path.exists(path / "truncate")
        assert store.query_by_key("t", "k100") == []
        assert store.query_by_key("t", "k50")
        assert max(m.physical_offset for q in range(3) for m in pull_all(store, "t", q)) < cut
    finally:
        store.shutdown()
    store = MessageStore(make_config(path))           # and the cut stays cut
    store.start()
    assert store.max_physical_offset == cut
    store.shutdown()


def test_reset_replaces_the_log_with_an_empty_one_at_a_segment_boundary(open_store, tmp_path):
    master = open_store()
    fill(master, 200)
    replica = open_store()
    replicate(master, replica, 1 << 20)
    with pytest.raises(StoreError, match="segment boundary"):
        replica.replica_log.reset(100)
    replica.replica_log.reset(2 * SEGMENT)
    assert replica.min_physical_offset == replica.max_physical_offset == 2 * SEGMENT
    assert replica.topics() == {}
    replicate(master, replica, 1 << 20)
    assert replica.wait_dispatched()
    assert replica.max_physical_offset == master.max_physical_offset
    later = [m for m in pull_all(master, "t", 0) if m.physical_offset >= 2 * SEGMENT]
    assert [m.body for m in pull_all(replica, "t", 0)] == [m.body for m in later]


def test_an_interrupted_reset_is_finished_at_the_next_start(tmp_path):
    path = tmp_path / "s"
    store = MessageStore(make_config(path))
    store.start()
    fill(store, 150)
    store.halt()
    CutMarker(str(path)).write(CutIntent(RESET, SEGMENT))
    store = MessageStore(make_config(path))
    store.start()
    try:
        assert store.min_physical_offset == store.max_physical_offset == SEGMENT
        assert store.topics() == {}
    finally:
        store.shutdown()


def test_store_timestamp_at(open_store):
    store = open_store()
    results = fill(store, 3)
    assert store.replica_log.store_timestamp_at(results[1].physical_offset) == results[1].store_timestamp
    assert store.replica_log.store_timestamp_at(store.max_physical_offset) == -1


def test_store_timestamp_at_a_segments_closing_blank_is_none(open_store):
    store = open_store(commitlog_segment_bytes=SEGMENT)
    results = fill(store, 120)                 # about 56 KiB a segment's worth: one roll
    last_in_first = max((r for r in results if r.physical_offset < SEGMENT), key=lambda r: r.physical_offset)
    blank_at = last_in_first.physical_offset + last_in_first.wrote_bytes
    assert blank_at < SEGMENT <= store.max_physical_offset
    assert store.replica_log.store_timestamp_at(blank_at) == -1          # no store time there, not 0
    assert store.replica_log.store_timestamp_at(SEGMENT) == next(r for r in results if r.physical_offset == SEGMENT).store_timestamp


def test_reads_stop_before_the_confirm_offset_when_asked(open_store):
    store = open_store()
    results = fill(store, 9)                  # queue 0 holds messages 0, 3, 6
    assert store.wait_dispatched()
    store.limit_reads_to_confirm_offset(True)
    store.replica_log.publish_confirm_offset(results[3].end_offset)
    assert [m.physical_offset for m in store.pull("t", 0, 0).messages] == [results[0].physical_offset,
                                                                             results[3].physical_offset]
    blocked = store.pull("t", 0, 2)
    assert blocked.messages == [] and blocked.next_offset == 2 and blocked.max_offset == 3
    store.replica_log.publish_confirm_offset(results[6].end_offset - 1)   # a message counts only when wholly below
    assert store.pull("t", 0, 2).messages == []
    store.replica_log.publish_confirm_offset(results[6].end_offset)
    assert [m.physical_offset for m in store.pull("t", 0, 2).messages] == [results[6].physical_offset]
    store.limit_reads_to_confirm_offset(False)
    assert len(pull_all(store, "t", 0)) == 3


def test_the_confirm_offset_only_rises_when_published_and_falls_with_a_cut(open_store):
    store = open_store()
    results = fill(store, 6)
    replica = store.replica_log
    replica.publish_confirm_offset(results[4].end_offset)
    replica.publish_confirm_offset(results[1].end_offset)      # an older figure changes nothing
    assert store.confirm_offset == replica.confirm_offset == results[4].end_offset
    replica.cut(results[2].physical_offset)
    assert replica.confirm_offset == results[2].physical_offset
    replica.reset(2 * SEGMENT)
    assert replica.confirm_offset == 2 * SEGMENT


def test_the_confirm_offset_survives_a_restart_within_the_recovered_log(tmp_path):
    path = tmp_path / "s"
    store = MessageStore(make_config(path))
    store.start()
    results = fill(store, 5)
    store.replica_log.publish_confirm_offset(results[3].end_offset)
    store.shutdown()
    store.start()
    try:
        assert store.replica_log.confirm_offset == results[3].end_offset
    finally:
        store.shutdown()


def test_replica_operations_need_a_running_store(tmp_path):
    store = MessageStore(make_config(tmp_path / "s"))
    store.start()
    fill(store, 2)
    replica = store.replica_log
    store.shutdown()
    for operation in (lambda: replica.read(0, 100), lambda: replica.append(0, b""), lambda: replica.cut(0),
                      lambda: replica.reset(0), replica.catch_up_for_writes):
        with pytest.raises(StoreClosedError):
            operation()


def test_a_failed_append_leaves_no_record_positions_for_other_bytes_written_there(open_store, monkeypatch):
    """A replicated chunk's record positions are kept for the dispatcher only once its bytes
    are written: a write that failed (here, no room for a segment) must not leave them to be
    taken for different bytes appended at the same offset later (a promotion, a new master)."""
    first_master, second_master, slave = open_store(), open_store(), open_store()
    fill(first_master, 5, body_bytes=700)
    fill(second_master, 9, body_bytes=300, topic="u")
    lost = first_master.replica_log.read(0, 1 << 20)
    kept = second_master.replica_log.read(0, 1 << 20)
    assert second_master.wait_dispatched()

    def no_room():
        raise StoreError("no room for the next segment")
    with monkeypatch.context() as patch:
        patch.setattr(slave.commit_log, "_writable_segment", no_room)
        with pytest.raises(StoreError, match="no room"):
            slave.replica_log.append(0, lost)
    assert slave.max_physical_offset == 0
    slave.replica_log.append(0, kept)
    assert slave.wait_dispatched()
    got = pull_all(slave, "u", 0, 0) + pull_all(slave, "u", 1, 0) + pull_all(slave, "u", 2, 0)
    assert sorted(m.physical_offset for m in got) == \
        sorted(m.physical_offset for q in range(3) for m in pull_all(second_master, "u", q, 0))
    assert slave.topics().keys() == {"u"}


@contextmanager
def master_and_replica(tmp_path):
    """Two running stores of 4 MiB segments with no preallocator threads (they populate each
    file they create, whenever they get to it)."""
    stores = [MessageStore(make_config(tmp_path / name, commitlog_segment_bytes=4 * 1024 * 1024,
                                       preallocate_next_segment=False)) for name in ("m", "r")]
    for store in stores:
        store.start()
    try:
        yield stores
    finally:
        for store in stores:
            store.shutdown()


def test_an_append_without_read_ahead_leaves_the_pages_ahead_alone(tmp_path, monkeypatch):
    with master_and_replica(tmp_path) as (master, replica):
        fill(master, 400)
        chunk = master.replica_log.read(0, 128 * 1024)
        populated, asked = [], []
        monkeypatch.setattr(MappedFile, "populate", lambda self, start=0, end=None: populated.append((start, end)))
        segments = replica.commit_log.segments
        monkeypatch.setattr(segments, "populate_ahead",
                            lambda offset, for_write=False, window=None: asked.append(offset))
        end = replica.replica_log.append(0, chunk, read_ahead=False)
        assert (populated, asked) == ([], [])
        assert bytes(replica.commit_log.read(0, end)) == bytes(chunk)
        more = master.replica_log.read(end, 1 << 20)
        assert len(more) > 64 * 1024
        replica.replica_log.append(end, more)   # the default reads ahead: a write this large populates first
        assert asked == [end + len(more)] and populated


def test_a_small_append_without_read_ahead_has_the_pages_ahead_faulted_in_writable(tmp_path, monkeypatch):
    # a caught-up slave's frames of a few records: copied into the mapping, which would fault
    # each new page; the preallocator faults the window ahead in writable, as for puts
    with master_and_replica(tmp_path) as (master, replica):
        fill(master, 40)
        asked = []
        segments = replica.commit_log.segments
        monkeypatch.setattr(segments, "populate_ahead", lambda offset, for_write=False, window=None:
                            asked.append((offset, for_write, window)))
        small = master.replica_log.read(0, 8 * 1024)
        end = replica.replica_log.append(0, small, read_ahead=False)
        assert asked == [(end, True, REPLICA_WRITE_WINDOW_BYTES)]
        replica.replica_log.append(end, master.replica_log.read(end, 8 * 1024), read_ahead=False)
        assert len(asked) == 1   # asked again only after REPLICA_WRITE_CHECK_BYTES more
