"""ConsumeQueue files as they lie on disk: 20-byte entries, rolling, names, reload."""

from __future__ import annotations

import os

from store import Message, PutStatus
from store import codec
from store_helpers import CQ_ENTRY, pull_all, read_cq_entries


def cq_dir(store, topic, queue_id):
    return os.path.join(store.config.store_path, "consumequeue", topic, str(queue_id))


def test_entries_on_disk_point_at_the_messages(open_store):
    store = open_store(consume_queue_entries_per_file=1000)
    results = []
    for i in range(10):
        tags = None if i % 3 == 0 else f"tag{i % 2}"
        results.append((store.put(Message(topic="Orders", queue_id=1, body=b"m%d" % i, tags=tags)), tags))
    store.put(Message(topic="Orders", queue_id=2, body=b"other"))
    assert store.wait_dispatched()
    entries = read_cq_entries(store.config.store_path, "Orders", 1)
    assert sorted(entries) == list(range(10))
    for queue_offset, (result, tags) in enumerate(results):
        assert result.status is PutStatus.PUT_OK and result.queue_offset == queue_offset
        physical, size, tags_code = entries[queue_offset]
        assert physical == result.physical_offset
        assert size == result.wrote_bytes
        assert tags_code == (codec.java_hash(tags) if tags else 0)
    # raw layout: entry i at byte i * 20, big-endian (8, 4, 8)
    name = os.listdir(cq_dir(store, "Orders", 1))
    assert name == ["0" * 20]
    with open(os.path.join(cq_dir(store, "Orders", 1), name[0]), "rb") as handle:
        raw = handle.read()
    assert len(raw) == 1000 * 20
    assert raw[3 * 20:3 * 20 + 8] == results[3][0].physical_offset.to_bytes(8, "big")
    assert raw[3 * 20 + 8:3 * 20 + 12] == results[3][0].wrote_bytes.to_bytes(4, "big")
    assert raw[3 * 20 + 12:3 * 20 + 20] == bytes(8)                      # message 3 has no tags
    assert raw[5 * 20 + 12:5 * 20 + 20] == codec.java_hash("tag1").to_bytes(8, "big", signed=True)
    assert raw[10 * 20:] == bytes(len(raw) - 200)       # nothing past the last entry
    assert list(read_cq_entries(store.config.store_path, "Orders", 2)) == [0]


def test_files_roll_at_entries_per_file_and_are_named_by_start_byte(open_store):
    store = open_store(consume_queue_entries_per_file=4)
    results = store.put_batch([Message(topic="T", body=b"x" * i) for i in range(11)])
    assert [r.queue_offset for r in results] == list(range(11))
    assert store.wait_dispatched()
    names = sorted(os.listdir(cq_dir(store, "T", 0)))
    assert names == [f"{0:020d}", f"{80:020d}", f"{160:020d}"]
    for name in names:
        assert os.path.getsize(os.path.join(cq_dir(store, "T", 0), name)) == 4 * CQ_ENTRY.size
    entries = read_cq_entries(store.config.store_path, "T", 0)
    assert [entries[i][0] for i in range(11)] == [r.physical_offset for r in results]
    # pulls cross the file boundaries
    assert [m.body for m in pull_all(store, "T", 0)] == [b"x" * i for i in range(11)]
    assert store.get("T", 0, 3, 2)[0].queue_offset == 3
    assert store.min_offset("T", 0) == 0 and store.max_offset("T", 0) == 11


def test_queues_reload_after_restart(open_store, tmp_path):
    path = str(tmp_path / "s")
    store = open_store(store_path=path, consume_queue_entries_per_file=3)
    for i in range(7):
        store.put(Message(topic="A", queue_id=i % 2, body=b"%d" % i))
    store.shutdown()
    store = open_store(store_path=path, consume_queue_entries_per_file=3)
    assert store.recovery.redispatched_messages == 0           # a clean stop: nothing rebuilt
    assert (store.max_offset("A", 0), store.max_offset("A", 1)) == (4, 3)
    assert [m.body for m in pull_all(store, "A", 0)] == [b"0", b"2", b"4", b"6"]
    result = store.put(Message(topic="A", queue_id=1, body=b"next"))
    assert result.queue_offset == 3


def test_unknown_queue_and_offsets_past_the_end(open_store):
    from store import GetStatus
    store = open_store()
    assert store.pull("Nope", 0, 0).status is GetStatus.NO_MATCHED_LOGIC_QUEUE
    assert store.min_offset("Nope", 0) == 0 and store.max_offset("Nope", 0) == 0
    store.put(Message(topic="T", body=b"a"))
    assert store.wait_dispatched()
    assert store.pull("T", 0, 1).status is GetStatus.NO_NEW_MESSAGE
    assert store.pull("T", 0, 5).status is GetStatus.OFFSET_OVERFLOW
    assert store.pull("T", 0, 0).status is GetStatus.FOUND


def test_appends_in_pieces_write_what_one_append_writes(tmp_path):
    """Pieces that end inside a file, end at its end, cross it, start past 0, repeat entries
    already there: the same files as one append of everything."""
    import random
    from store.consume_queue import ConsumeQueue
    rng = random.Random(6)
    entries = b"".join(CQ_ENTRY.pack(1000 + 7 * number, 7, number % 5) for number in range(400))
    whole = ConsumeQueue(str(tmp_path / "whole"), "T", 0, 32)
    whole.load()
    whole.append_entries(13, entries)
    pieces = ConsumeQueue(str(tmp_path / "pieces"), "T", 0, 32)
    pieces.load()
    at = 0
    while at < 400:
        count = rng.choice([1, 2, 5, 19, 32, 45])
        again = min(at, rng.choice([0, 0, 0, 3]))              # a re-dispatch of the last few
        pieces.append_entries(13 + at - again, entries[(at - again) * 20:(at + count) * 20])
        at += count
    assert (pieces.min_offset, pieces.max_offset) == (whole.min_offset, whole.max_offset) == (13, 413)
    assert [bytes(m.mm) for m in pieces.files.files] == [bytes(m.mm) for m in whole.files.files]
    assert [m.start_offset for m in pieces.files.files] == [m.start_offset for m in whole.files.files]
    assert pieces.entries(200, 3) == whole.entries(200, 3)
    whole.close()
    pieces.close()


def _mapping_flags(path: str) -> set[str]:
    """The VmFlags of this process's mapping of ``path`` (/proc/self/smaps)."""
    with open("/proc/self/smaps", encoding="ascii", errors="replace") as handle:
        lines = handle.read().splitlines()
    for index, line in enumerate(lines):
        if line.endswith(" " + path):
            for after in lines[index + 1:]:
                if after.startswith("VmFlags:"):
                    return set(after.split()[1:])
    raise AssertionError(f"{path} is not mapped")


def test_a_created_queue_file_faults_its_own_page_only_and_a_loaded_one_reads_around(open_store, tmp_path):
    # a new file's first fault read around the whole 6 MB file (read_ahead_kb 8192): 1.4-2 ms
    store = open_store(consume_queue_entries_per_file=300_000)
    store.put(Message(topic="Orders", queue_id=0, body=b"m"))
    assert store.wait_dispatched()
    path = os.path.join(cq_dir(store, "Orders", 0), "0" * 20)
    assert "rr" in _mapping_flags(path)          # MADV_RANDOM
    store.shutdown()
    again = open_store(consume_queue_entries_per_file=300_000, store_path=store.config.store_path)
    assert again.pull("Orders", 0, 0, 10).messages[0].body == b"m"
    assert "rr" not in _mapping_flags(path)      # as loaded: the kernel's read-around for readers
