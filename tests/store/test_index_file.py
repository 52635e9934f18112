"""IndexFile: on-disk layout, hash chains under collisions, rolling, time ranges."""

from __future__ import annotations

import datetime
import os
import struct

from store import Message
from store import codec
from store.index_file import index_file_bytes
from store_helpers import SteppedClock

HEADER = struct.Struct(">qqqqii")
ENTRY = struct.Struct(">iqii")


def index_files(store):
    directory = os.path.join(store.config.store_path, "index")
    return sorted(os.path.join(directory, n) for n in os.listdir(directory))


def read(path):
    with open(path, "rb") as handle:
        return handle.read()


def test_layout_on_disk(open_store, tmp_path):
    path = str(tmp_path / "s")
    store = open_store(store_path=path, index_hash_slots=16, index_max_entries=100)
    results = [store.put(Message(topic="T", body=b"%d" % i, keys=[f"k{i}", "shared"])) for i in range(5)]
    store.shutdown()                       # the header's end fields are written on close
    [index_path] = index_files(store)
    name = os.path.basename(index_path)
    assert len(name) == 17 and name.isdigit()
    named_at = datetime.datetime.strptime(name[:14], "%Y%m%d%H%M%S").replace(microsecond=int(name[14:]) * 1000)
    assert abs(named_at.timestamp() * 1000 - results[0].store_timestamp) < 1000
    raw = read(index_path)
    assert len(raw) == 40 + 16 * 4 + 100 * 20 == index_file_bytes(16, 100)
    begin_ts, end_ts, begin_phy, end_phy, slot_count, index_count = HEADER.unpack_from(raw, 0)
    assert index_count == 1 + 10                       # entry 0 unused
    slots_used = {codec.index_key_hash(f"T#{key}") % 16 for i in range(5) for key in (f"k{i}", "shared")}
    assert slot_count == len(slots_used)                # slots in use, as RocketMQ's IndexHeader counts
    assert begin_ts == results[0].store_timestamp and end_ts == results[-1].store_timestamp
    assert begin_phy == results[0].physical_offset and end_phy == results[-1].physical_offset
    entries_at = 40 + 16 * 4
    assert raw[entries_at:entries_at + 20] == bytes(20)
    slots = struct.unpack_from(">16i", raw, 40)
    number = 1
    newest: dict[int, int] = {}
    for i, result in enumerate(results):
        for key in (f"k{i}", "shared"):
            key_hash, phy, diff, prev = ENTRY.unpack_from(raw, entries_at + number * 20)
            assert key_hash == codec.index_key_hash(f"T#{key}")
            assert phy == result.physical_offset
            assert diff == (result.store_timestamp - begin_ts) // 1000
            assert prev == newest.get(key_hash % 16, 0)
            newest[key_hash % 16] = number
            number += 1
    for slot, value in enumerate(slots):
        assert value == newest.get(slot, 0)
    assert raw[entries_at + number * 20:] == bytes(len(raw) - entries_at - number * 20)


def test_chains_under_forced_collisions(open_store):
    for slots in (1, 2):
        store = open_store(index_hash_slots=slots, index_max_entries=1000)
        puts = []
        for i in range(40):
            keys = [f"key{i % 7}", f"only{i}"]
            puts.append((store.put(Message(topic="Coll", body=b"%d" % i, keys=keys)), keys))
        store.put(Message(topic="Other", body=b"x", keys=["key1"]))
        assert store.wait_dispatched()
        for key in [f"key{j}" for j in range(7)] + [f"only{i}" for i in range(40)]:
            found = store.query_by_key("Coll", key, max_count=100)
            expected = [r.physical_offset for r, keys in puts if key in keys]
            assert [m.physical_offset for m in found] == expected, key
            assert all(m.topic == "Coll" and key in m.keys for m in found)
        assert [m.body for m in store.query_by_key("Other", "key1")] == [b"x"]


def test_real_java_hash_collision_is_filtered_by_comparing_keys(open_store):
    # "Aa" and "BB" have the same String.hashCode, and so do "T#Aa" and "T#BB"
    assert codec.index_key_hash("T#Aa") == codec.index_key_hash("T#BB")
    store = open_store()
    a = store.put(Message(topic="T", body=b"a", keys=["Aa"]))
    b = store.put(Message(topic="T", body=b"b", keys=["BB"]))
    assert store.wait_dispatched()
    assert [m.physical_offset for m in store.query_by_key("T", "Aa")] == [a.physical_offset]
    assert [m.physical_offset for m in store.query_by_key("T", "BB")] == [b.physical_offset]


def test_uniq_key_is_indexed_and_max_count_keeps_the_newest(open_store):
    store = open_store()
    results = [store.put(Message(topic="T", body=b"%d" % i, keys=["same"], properties={"UNIQ_KEY": f"U{i}"}))
               for i in range(6)]
    assert store.wait_dispatched()
    assert [m.body for m in store.query_by_key("T", "U4")] == [b"4"]
    newest = store.query_by_key("T", "same", max_count=2)
    assert [m.physical_offset for m in newest] == [r.physical_offset for r in results[-2:]]
    assert store.query_by_key("T", "absent") == []
    assert store.query_by_key("NoSuchTopic", "same") == []


def test_new_index_file_when_full_and_lookups_span_files(open_store, tmp_path):
    path = str(tmp_path / "s")
    store = open_store(store_path=path, index_hash_slots=3, index_max_entries=4)   # 3 entries per file
    results = [store.put(Message(topic="T", body=b"%d" % i, keys=[f"k{i % 4}"])) for i in range(10)]
    assert store.wait_dispatched()
    paths = index_files(store)
    assert len(paths) == 4                              # ceil(10 / 3)
    names = [os.path.basename(p) for p in paths]
    assert names == sorted(set(names)) and all(len(n) == 17 and n.isdigit() for n in names)
    for i in range(4):
        expected = [r.physical_offset for j, r in enumerate(results) if j % 4 == i]
        assert [m.physical_offset for m in store.query_by_key("T", f"k{i}")] == expected
    store.shutdown()
    counts = [HEADER.unpack_from(read(p), 0)[5] for p in paths]
    assert counts == [4, 4, 4, 2]
    store = open_store(store_path=path, index_hash_slots=3, index_max_entries=4)
    assert [m.body for m in store.query_by_key("T", "k1")] == [b"1", b"5", b"9"]


def test_time_range_edges(open_store):
    clock = SteppedClock()
    store = open_store(clock=clock)
    stamps = []
    for i in range(3):
        if i:
            clock.advance(1100)
        stamps.append(store.put(Message(topic="T", body=b"%d" % i, keys=["K"])).store_timestamp)
    assert stamps[0] + 1000 < stamps[1] and stamps[1] + 1000 < stamps[2]
    assert store.wait_dispatched()

    def bodies(begin, end):
        return [m.body for m in store.query_by_key("T", "K", begin, end)]

    assert bodies(0, 2**63 - 1) == [b"0", b"1", b"2"]
    assert bodies(stamps[0], stamps[0]) == [b"0"]                 # begin and end inclusive
    assert bodies(stamps[1], stamps[1]) == [b"1"]
    assert bodies(stamps[0], stamps[1]) == [b"0", b"1"]
    assert bodies(stamps[0] + 1, stamps[2] - 1) == [b"1"]
    assert bodies(stamps[1] + 1, stamps[2] - 1) == []
    assert bodies(stamps[2], stamps[2] + 10) == [b"2"]
    assert bodies(stamps[2] + 1, 2**63 - 1) == []
    assert bodies(0, stamps[0] - 1) == []
