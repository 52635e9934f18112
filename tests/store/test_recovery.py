"""Recovery after crashes and damage: what was acknowledged survives, nothing corrupt is
served, ConsumeQueue and IndexFile agree with the CommitLog, and writing goes on."""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import tempfile
import textwrap
import time
import zlib

import pytest
from hypothesis import HealthCheck, event, given, settings, strategies as st

from store import Message, MessageStore, PutStatus, StoreCorruptError
from store_helpers import (check_indexes_agree_with_log, make_config, pull_all, same_message, scan_commit_log,
                           segment_files)

SEGMENT = 4096


# --- helpers ----------------------------------------------------------------------------
class Workload:
    """Puts with unique bodies and keys; remembers every (message, result) in log order."""

    def __init__(self) -> None:
        self.sequence = 0
        self.puts: list[tuple[Message, object]] = []

    def message(self, topic: int, queue_id: int, body_bytes: int, key_count: int) -> Message:
        self.sequence += 1
        n = self.sequence
        keys = [f"k{n}", f"shared{topic}"][:key_count]
        body = (b"%d:" % n + bytes(range(256)) * 3)[:max(body_bytes, len(b"%d:" % n))]
        return Message(topic=f"Topic{topic}", queue_id=queue_id, body=body, keys=keys,
                       tags=f"tag{n % 3}" if n % 2 else None, properties={"seq": str(n)})

    def record(self, messages, results) -> None:
        for message, result in zip(messages, results):
            assert result.status is PutStatus.PUT_OK, result
            self.puts.append((message, result))
        self.puts.sort(key=lambda pair: pair[1].physical_offset)


def zero_from(path: str, offset: int) -> None:
    for segment in segment_files(path):
        start = int(os.path.basename(segment))
        size = os.path.getsize(segment)
        if start + size <= offset:
            continue
        with open(segment, "r+b") as handle:
            position = max(0, offset - start)
            handle.seek(position)
            handle.write(bytes(size - position))


def flip(path: str, offset: int, mask: int) -> None:
    for segment in segment_files(path):
        start = int(os.path.basename(segment))
        if start <= offset < start + os.path.getsize(segment):
            with open(segment, "r+b") as handle:
                handle.seek(offset - start)
                value = handle.read(1)[0]
                handle.seek(offset - start)
                handle.write(bytes([value ^ mask]))
            return


def bytes_after_are_zero(path: str, offset: int) -> bool:
    for segment in segment_files(path):
        start = int(os.path.basename(segment))
        with open(segment, "rb") as handle:
            data = handle.read()
        if start + len(data) <= offset:
            continue
        if data[max(0, offset - start):].count(0) != len(data) - max(0, offset - start):
            return False
    return True


def verify_after_recovery(store: MessageStore, workload: Workload, acked_end: int) -> list:
    """The recovered log is a prefix of what was written, holding everything acked."""
    report = store.recovery
    end = report.end_offset
    assert end == store.commit_log.max_offset
    assert end >= acked_end, (report, acked_end)
    survivors = [(m, r) for m, r in workload.puts if r.end_offset <= end]
    assert all(r.end_offset <= end or r.physical_offset >= end for _, r in workload.puts)
    log = check_indexes_agree_with_log(store)
    assert [m.physical_offset for m in log] == [r.physical_offset for _, r in survivors]
    for stored, (message, result) in zip(log, survivors):
        assert same_message(stored, message)
        assert (stored.queue_offset, stored.store_timestamp) == (result.queue_offset, result.store_timestamp)
    # every acknowledged message reads back identical through the store's own read path
    queues = sorted({(m.topic, m.queue_id) for m, _ in workload.puts})
    for topic, queue_id in queues:
        got = pull_all(store, topic, queue_id)
        expected = [(m, r) for m, r in survivors if (m.topic, m.queue_id) == (topic, queue_id)]
        assert len(got) == len(expected)
        for stored, (message, result) in zip(got, expected):
            assert same_message(stored, message)
            assert (stored.physical_offset, stored.queue_offset) == (result.physical_offset, result.queue_offset)
    assert bytes_after_are_zero(store.config.store_path, end)      # the cut tail can never look valid
    return survivors


def continue_writing(store: MessageStore, workload: Workload) -> None:
    """New puts continue every queue's offsets without a gap or a duplicate."""
    queues = sorted({(m.topic, m.queue_id) for m, _ in workload.puts}) or [("Topic0", 0)]
    for topic, queue_id in queues:
        expected = store.max_offset(topic, queue_id)
        message = Message(topic=topic, queue_id=queue_id, body=b"after-recovery", keys=["after"])
        result = store.put(message)
        assert result.status is PutStatus.PUT_OK and result.queue_offset == expected
        workload.puts.append((message, result))
    check_indexes_agree_with_log(store)


# --- the property -------------------------------------------------------------------------
OPS = st.lists(st.one_of(
    st.tuples(st.just("put"), st.integers(0, 2), st.integers(0, 1), st.integers(0, 1500), st.integers(0, 2)),
    st.tuples(st.just("batch"), st.integers(1, 8), st.integers(0, 700)),
    st.tuples(st.just("flush")),
), min_size=3, max_size=25)

DAMAGE = st.lists(st.one_of(
    st.tuples(st.just("zero"), st.floats(0, 1)),
    st.tuples(st.just("flip"), st.floats(0, 1), st.integers(1, 255)),
), max_size=3)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS, flush=st.sampled_from(["sync", "async", "async"]), flush_interval_ms=st.sampled_from([5, 10_000, 10_000]),
       checkpoint_interval_ms=st.sampled_from([10, 10_000]), crash=st.sampled_from(["halt", "halt", "halt", "shutdown"]),
       damage=DAMAGE, abort=st.booleans(), garbage_checkpoint=st.booleans())
def test_recovery_property(ops, flush, flush_interval_ms, checkpoint_interval_ms, crash, damage, abort,
                           garbage_checkpoint):
    with tempfile.TemporaryDirectory() as directory:
        config = make_config(directory, commitlog_segment_bytes=SEGMENT, flush=flush,
                             flush_interval_ms=flush_interval_ms, checkpoint_interval_ms=checkpoint_interval_ms,
                             consume_queue_entries_per_file=8, index_hash_slots=2, index_max_entries=16)
        store = MessageStore(config)
        store.start()
        workload = Workload()
        try:
            for op in ops:
                if op[0] == "put":
                    message = workload.message(*op[1:])
                    workload.record([message], [store.put(message)])
                elif op[0] == "batch":
                    messages = [workload.message(i % 3, i % 2, op[2], i % 3) for i in range(op[1])]
                    workload.record(messages, store.put_batch(messages))
                else:
                    assert store.wait_flushed(store.commit_log.max_offset)
            written_end = store.commit_log.max_offset
            if garbage_checkpoint:
                # without a checkpoint, recovery cannot know how far the dispatcher got;
                # a lagging dispatcher is test_garbage_checkpoint_with_lagging_dispatcher
                assert store.wait_dispatched()
            if crash == "shutdown":
                store.shutdown()
                flushed = written_end
            else:
                store.halt()
                flushed = store.commit_log.flushed_offset      # final: every byte below was fsynced
        finally:
            store.halt()
        if flush == "sync":
            assert flushed >= max((r.end_offset for _, r in workload.puts), default=0)
        abort_path = os.path.join(directory, "abort")
        if crash == "halt":
            assert os.path.exists(abort_path)
            span = written_end + 16 - flushed
            for kind, fraction, *mask in damage:           # only ever past the flushed offset
                position = flushed + min(span - 1, int(fraction * span))
                if kind == "zero":
                    zero_from(directory, position)
                else:
                    flip(directory, position, mask[0])
            if not abort:
                os.unlink(abort_path)                       # a stale stop that looks clean
        else:
            assert not os.path.exists(abort_path)
            if abort:
                open(abort_path, "wb").close()               # an abort file after a clean stop
        if garbage_checkpoint and crash == "halt":
            # garbage in both copies: recovery scans the last segments instead; keep the
            # log short enough for that scan to reach back to the flushed offset
            if flushed >= max(0, len(segment_files(directory)) - 3) * SEGMENT:
                with open(os.path.join(directory, "checkpoint"), "r+b") as handle:
                    handle.write(os.urandom(4096))

        abnormal = os.path.exists(abort_path)
        store = MessageStore(config)
        report = store.start()
        try:
            assert report.abnormal == abnormal
            event(f"checkpoint valid: {report.checkpoint_valid}")
            event(f"unflushed tail at crash: {flushed < written_end}")
            event(f"recovery cut the log: {report.end_offset < written_end}")
            event(f"segments: {'several' if written_end > SEGMENT else 'one'}")
            if crash == "shutdown":
                assert report.end_offset == written_end and report.truncated_bytes == 0
                assert report.redispatched_messages == 0                  # no rescan of a healthy store
            verify_after_recovery(store, workload, flushed)
            continue_writing(store, workload)
        finally:
            store.shutdown()
        # and once more after a clean stop: still consistent
        store = MessageStore(config)
        store.start()
        try:
            check_indexes_agree_with_log(store)
        finally:
            store.shutdown()


# --- targeted cases -----------------------------------------------------------------------
def test_flipped_flushed_body_is_never_served(open_store, tmp_path):
    path = str(tmp_path / "s")
    store = open_store(store_path=path, flush="sync")
    results = [store.put(Message(topic="T", body=b"body-%d" % i, keys=[f"k{i}"])) for i in range(5)]
    store.shutdown()
    flip(path, results[2].physical_offset + 88 + 2, 0x01)          # a byte of message 2's body
    store = open_store(store_path=path, flush="sync")
    # never served, never blocking: skipped and named by its queue offset
    result = store.pull("T", 0, 2, 1)
    assert result.messages == [] and result.next_offset == 3
    assert [(c.queue_offset, c.physical_offset) for c in result.corrupt] == [(2, results[2].physical_offset)]
    result = store.pull("T", 0, 0, 10)
    assert [m.body for m in result.messages] == [b"body-0", b"body-1", b"body-3", b"body-4"]
    assert [c.queue_offset for c in result.corrupt] == [2] and result.next_offset == 5
    assert store.statistics().integrity.corrupt_records_found == 1
    with pytest.raises(StoreCorruptError):
        store.get_by_message_id(results[2].message_id)
    assert store.query_by_key("T", "k2") == []
    assert [m.body for m in store.query_by_key("T", "k3")] == [b"body-3"]


def test_flipped_header_byte_is_never_served(open_store, tmp_path):
    path = str(tmp_path / "s")
    store = open_store(store_path=path, flush="sync")
    results = [store.put(Message(topic="T", body=b"body-%d" % i, tags="a")) for i in range(3)]
    store.shutdown()
    flip(path, results[1].physical_offset + 72, 0x04)              # RECONSUMETIMES: only HCRC covers it
    store = open_store(store_path=path)
    result = store.pull("T", 0, 1, 1)
    assert result.messages == [] and [c.queue_offset for c in result.corrupt] == [1]


def test_garbage_checkpoint_falls_back_to_scanning(open_store, tmp_path):
    path = str(tmp_path / "s")
    settings_ = dict(store_path=path, commitlog_segment_bytes=SEGMENT, flush="sync",
                     consume_queue_entries_per_file=8, index_hash_slots=2, index_max_entries=16)
    store = open_store(**settings_)
    workload = Workload()
    for i in range(30):
        message = workload.message(i % 3, i % 2, 300, 2)
        workload.record([message], [store.put(message)])
    flushed = store.commit_log.max_offset
    tail = [workload.message(0, 0, 200, 1) for _ in range(3)]
    store.flusher.stop()                                           # the tail is never flushed
    tail_results = store.append(tail)
    store.halt()
    zero_from(path, tail_results[1].physical_offset + 40)          # torn in the middle of a message
    with open(os.path.join(path, "checkpoint"), "wb") as handle:
        handle.write(os.urandom(4096))
    store = open_store(**settings_)
    assert not store.recovery.checkpoint_valid and store.recovery.abnormal
    assert store.recovery.end_offset == tail_results[1].physical_offset
    workload.record(tail[:1], tail_results[:1])
    verify_after_recovery(store, workload, flushed)
    continue_writing(store, workload)


def test_garbage_checkpoint_with_lagging_dispatcher(open_store, tmp_path):
    path = str(tmp_path / "s")
    settings_ = dict(store_path=path, commitlog_segment_bytes=SEGMENT, flush="sync")
    store = open_store(**settings_)
    first = store.put(Message(topic="T", body=b"dispatched"))
    assert store.wait_dispatched()
    store.dispatcher.stop()                                        # the dispatcher falls behind
    results = [store.put(Message(topic="T", body=b"b" * 1000)) for _ in range(20)]   # > 3 segments
    store.halt()
    with open(os.path.join(path, "checkpoint"), "wb") as handle:
        handle.write(os.urandom(4096))
    store = open_store(**settings_)
    assert store.max_offset("T", 0) == 21
    assert [m.physical_offset for m in pull_all(store, "T", 0)] == \
        [first.physical_offset] + [r.physical_offset for r in results]


def test_checkpoint_layout_and_second_copy(open_store, tmp_path):
    path = str(tmp_path / "s")
    store = open_store(store_path=path)
    results = store.put_batch([Message(topic="T", body=b"x" * 100) for _ in range(10)])
    store.shutdown()
    with open(os.path.join(path, "checkpoint"), "rb") as handle:
        raw = handle.read()
    assert len(raw) == 4096
    # RocketMQ 5's fields at 0..40, then hastore's flushed and dispatched offsets, version, CRC
    physic_ts, logics_ts, index_ts, master_flushed, confirm, flushed, dispatched, version = \
        struct.unpack_from(">7qi", raw, 0)
    assert physic_ts == logics_ts == index_ts == results[-1].store_timestamp
    assert master_flushed == flushed == dispatched == results[-1].end_offset
    assert version == 2
    assert struct.unpack_from(">I", raw, 60)[0] == zlib.crc32(raw[:60])
    assert raw[2048:2048 + 64] == raw[:64]
    # a torn first copy: the second one is used, and nothing is rescanned
    with open(os.path.join(path, "checkpoint"), "r+b") as handle:
        handle.seek(41)
        handle.write(b"\xff")
    store = open_store(store_path=path)
    assert store.recovery.checkpoint_valid
    assert store.recovery.scan_start_offset == results[-1].end_offset
    assert len(store.get("T", 0, 0, 100)) == 10


def test_abort_file_after_clean_shutdown(open_store, tmp_path):
    path = str(tmp_path / "s")
    store = open_store(store_path=path, commitlog_segment_bytes=SEGMENT)
    store.put_batch([Message(topic="T", body=b"y" * 700, keys=[f"k{i}"]) for i in range(20)])
    store.shutdown()
    open(os.path.join(path, "abort"), "wb").close()
    store = open_store(store_path=path, commitlog_segment_bytes=SEGMENT)
    assert store.recovery.abnormal and store.recovery.truncated_bytes == 0
    assert store.max_offset("T", 0) == 20
    assert len(check_indexes_agree_with_log(store)) == 20


# --- a real process, killed -----------------------------------------------------------------
WRITER = textwrap.dedent("""
    import sys
    from store import Message, MessageStore, PutStatus, StoreConfig
    store = MessageStore(StoreConfig(store_path=sys.argv[1], commitlog_segment_bytes=8192, flush="sync",
                                     consume_queue_entries_per_file=16, index_hash_slots=8,
                                     index_max_entries=64))
    store.start()
    print("STARTED", flush=True)
    for i in range(100_000):
        result = store.put(Message(topic="Kill", queue_id=i % 3, body=b"m%d" % i + b"." * (i % 200),
                                   keys=["k%d" % i]))
        if result.status is PutStatus.PUT_OK:
            print("ACK", i, result.queue_offset, result.physical_offset, flush=True)
""")


@pytest.mark.integration   # a writer process killed with SIGKILL
def test_sigkill_mid_run_keeps_every_acknowledged_message(tmp_path):
    path = str(tmp_path / "s")
    process = subprocess.Popen([sys.executable, "-c", WRITER, path], stdout=subprocess.PIPE, text=True,
                               cwd=str(tmp_path))
    acked = []
    deadline = time.monotonic() + 60
    try:
        assert process.stdout.readline().strip() == "STARTED"
        while len(acked) < 300 and time.monotonic() < deadline:
            line = process.stdout.readline()
            if not line:
                break
            _, i, queue_offset, physical_offset = line.split()
            acked.append((int(i), int(queue_offset), int(physical_offset)))
    finally:
        process.send_signal(signal.SIGKILL)
        remaining = process.stdout.read()                         # acks printed before the kill landed
        process.wait(timeout=30)
    for line in remaining.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[0] == "ACK":
            acked.append((int(parts[1]), int(parts[2]), int(parts[3])))
    assert len(acked) >= 300, "the writer did not get far enough"
    assert process.returncode == -signal.SIGKILL
    assert os.path.exists(os.path.join(path, "abort"))
    store = MessageStore(make_config(path, commitlog_segment_bytes=8192, flush="sync",
                                     consume_queue_entries_per_file=16, index_hash_slots=8,
                                     index_max_entries=64))
    store.start()
    try:
        assert store.recovery.abnormal
        for i, queue_offset, physical_offset in acked:
            [message] = store.get("Kill", i % 3, queue_offset, 1)
            assert message.physical_offset == physical_offset
            assert message.body == b"m%d" % i + b"." * (i % 200) and message.keys == ["k%d" % i]
        last = acked[-1][0]
        assert [m.body for m in store.query_by_key("Kill", "k%d" % last)] == [b"m%d" % last + b"." * (last % 200)]
        log = check_indexes_agree_with_log(store)
        assert len(log) >= len(acked)
        for queue_id in range(3):
            before = store.max_offset("Kill", queue_id)
            assert store.put(Message(topic="Kill", queue_id=queue_id, body=b"again")).queue_offset == before
    finally:
        store.shutdown()
