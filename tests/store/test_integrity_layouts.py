"""RocketMQ 5's exact layouts: the checkpoint's field order (and the older hastore layout
still read), the IndexFile header's hashSlotCount and end fields, ConsumeQueue filler."""

from __future__ import annotations

import os
import struct
import time
import zlib

from store import Message, MessageStore
from store.checkpoint import Checkpoint, CheckpointState, read_checkpoint
from store.consume_queue import ENTRY, FILLER_SIZE, ConsumeQueue
from store.index_file import HEADER, IndexFile
from store_helpers import make_config, pull_all


def test_checkpoint_fields_sit_where_rocketmq_5_reads_them(tmp_path):
    checkpoint = Checkpoint(str(tmp_path / "checkpoint"))
    checkpoint.write(CheckpointState(11, 22, 33, confirm_phy_offset=44, flushed_phy_offset=55,
                                     dispatched_phy_offset=66))
    checkpoint.close()
    raw = open(tmp_path / "checkpoint", "rb").read()
    # StoreCheckpoint: physic @0, logics @8, index @16, masterFlushedOffset @24, confirmPhyOffset @32
    assert struct.unpack_from(">5q", raw, 0) == (11, 22, 33, 55, 44)
    state, version = read_checkpoint(str(tmp_path / "checkpoint"))
    assert version == 2 and (state.confirm_phy_offset, state.flushed_phy_offset, state.dispatched_phy_offset) == \
        (44, 55, 66)


def test_a_version_1_checkpoint_is_still_read(tmp_path):
    body = struct.pack(">6q", 1, 2, 3, 400, 500, 600)     # v1: confirm @24, flushed @32, dispatched @40
    record = body + struct.pack(">I", zlib.crc32(body))
    raw = bytearray(4096)
    raw[0:52] = raw[2048:2100] = record
    (tmp_path / "checkpoint").write_bytes(bytes(raw))
    checkpoint = Checkpoint(str(tmp_path / "checkpoint"))
    try:
        assert checkpoint.valid and checkpoint.layout_version == 1
        assert checkpoint.state == CheckpointState(1, 2, 3, 400, 500, 600)
        checkpoint.write(checkpoint.state)                 # rewritten in version 2
    finally:
        checkpoint.close()
    assert read_checkpoint(str(tmp_path / "checkpoint")) == (CheckpointState(1, 2, 3, 400, 500, 600), 2)


def test_a_store_with_a_version_1_checkpoint_recovers_from_it(open_store, tmp_path):
    path = str(tmp_path / "s")
    store = open_store(store_path=path)
    results = store.put_batch([Message(topic="T", body=b"x" * 50) for _ in range(10)])
    store.shutdown()
    end = results[-1].end_offset
    body = struct.pack(">6q", results[-1].store_timestamp, results[-1].store_timestamp,
                       results[-1].store_timestamp, 0, end, end)
    raw = bytearray(4096)
    raw[0:52] = raw[2048:2100] = body + struct.pack(">I", zlib.crc32(body))
    (tmp_path / "s" / "checkpoint").write_bytes(bytes(raw))
    store = open_store(store_path=path)
    assert store.recovery.checkpoint_valid and store.recovery.scan_start_offset == end
    assert len(pull_all(store, "T", 0)) == 10


def test_physic_timestamp_stays_current_while_writing(tmp_path):
    store = MessageStore(make_config(tmp_path / "s", flush="async", flush_interval_ms=5, checkpoint_interval_ms=10))
    store.start()
    try:
        first = None
        deadline = time.monotonic() + 20
        seen = 0
        while time.monotonic() < deadline:
            result = store.put(Message(topic="T", body=b"y" * 100))
            first = first or result.store_timestamp
            seen = struct.unpack_from(">q", open(tmp_path / "s" / "checkpoint", "rb").read(8))[0]
            if seen >= first:
                break
            time.sleep(0.002)
        assert seen >= first, "physicMsgTimestamp never moved while messages were written"
    finally:
        store.shutdown()


def test_index_header_counts_slots_in_use_and_is_current_after_a_kill(tmp_path):
    path = tmp_path / "s"
    store = MessageStore(make_config(path, index_hash_slots=8, index_max_entries=4000))
    store.start()
    # block writes (many keys) and single ones, more keys than slots
    store.put_batch([Message(topic="T", body=b"%d" % i, keys=[f"k{i}"]) for i in range(200)])
    results = [store.put(Message(topic="T", body=b"one", keys=[f"one{i}"])) for i in range(3)]
    assert store.wait_dispatched()
    store.halt()                                             # no header write on close: as a kill
    [name] = os.listdir(path / "index")
    raw = open(path / "index" / name, "rb").read()
    _, _, _, end_phy, slot_count, index_count = HEADER.unpack_from(raw, 0)
    slots = struct.unpack_from(">8i", raw, 40)
    assert slot_count == sum(1 for value in slots if 0 < value < index_count) == 8
    assert end_phy == results[-1].physical_offset           # not behind its last entry
    index_file = IndexFile(str(path / "index" / name), 8, 4000, create=False)
    try:
        assert index_file.slots_in_use() == 8
    finally:
        index_file.close()


def test_consume_queue_hole_is_rocketmq_filler_and_reads_as_absent(tmp_path):
    queue = ConsumeQueue(str(tmp_path), "T", 0, 16)
    queue.load()
    queue.append_entries(5, b"".join(ENTRY.pack(1000 + 10 * i, 10, 7) for i in range(3)))
    raw = bytes(queue.files.files[0].mm[:8 * 20])
    for number in range(5):
        assert ENTRY.unpack_from(raw, number * 20) == (0, FILLER_SIZE, 0)
    assert [e.queue_offset for e in queue.entries(0, 10)] == [5, 6, 7]
    queue.close()
    again = ConsumeQueue(str(tmp_path), "T", 0, 16)
    again.load()
    try:
        assert (again.min_offset, again.max_offset) == (5, 8)
        assert again.entry(5).physical_offset == 1000
    finally:
        again.close()
