"""Damage on a real store (cases 8 and 9 of the integrity issue): random bytes in
ConsumeQueue and IndexFile files, deleted directories, both copies of a config file
corrupt or removed. After each the store starts by itself, serves every acknowledged
message, says what it repaired (WARNING log, statistics) and ``store verify`` agrees."""

from __future__ import annotations

import os
import random
import shutil

import msgpack
import pytest

from store import Message, MessageStore, offline
from store_helpers import check_indexes_agree_with_log, make_config, pull_all

SETTINGS = dict(commitlog_segment_bytes=16 * 1024, flush="sync", consume_queue_entries_per_file=64,
                index_hash_slots=16, index_max_entries=400)
QUEUES = 3


def _write(path, count=300) -> dict[int, list[bytes]]:
    store = MessageStore(make_config(path, **SETTINGS))
    store.start()
    bodies = {q: [] for q in range(QUEUES)}
    messages = [Message(topic="D", queue_id=i % QUEUES, body=b"d%04d" % i, keys=[f"k{i}"]) for i in range(count)]
    for start in range(0, count, 50):
        store.put_batch(messages[start:start + 50])
    for message in messages:
        bodies[message.queue_id].append(message.body)
    store.shutdown()
    return bodies


def _start(path) -> MessageStore:
    store = MessageStore(make_config(path, **SETTINGS))
    store.start()
    return store


def _serves_everything(store, bodies) -> None:
    for queue_id, expected in bodies.items():
        assert [m.body for m in pull_all(store, "D", queue_id, 0)] == expected
    assert [m.body for m in store.query_by_key("D", "k0")] == [b"d0000"]
    assert [m.body for m in store.query_by_key("D", "k299")] == [b"d0299"]


def _scribble(path: str, count: int, seed: int) -> None:
    rng = random.Random(seed)
    size = os.path.getsize(path)
    with open(path, "r+b") as handle:
        for _ in range(count):
            handle.seek(rng.randrange(size))
            handle.write(bytes([rng.randrange(256)]))


def _cq_file(path, queue_id=1) -> str:
    directory = os.path.join(path, "consumequeue", "D", str(queue_id))
    return os.path.join(directory, sorted(os.listdir(directory))[0])


@pytest.mark.parametrize("seed", range(4))
def test_random_bytes_in_a_consume_queue_are_repaired_at_start(tmp_path, seed, caplog):
    path = str(tmp_path / "s")
    bodies = _write(path)
    _scribble(_cq_file(path), 1000, seed)
    problems, _ = offline.verify(path)
    assert problems, "verify called a damaged consume queue sound"
    open(os.path.join(path, "abort"), "wb").close()
    store = _start(path)
    try:
        assert store.statistics().integrity.consume_queues_rebuilt >= 1
        assert any("consume queue D/1" in r for r in store.statistics().integrity.repairs)
        assert "rebuilding it from the log" in caplog.text
        _serves_everything(store, bodies)
        check_indexes_agree_with_log(store)
    finally:
        store.shutdown()
    assert offline.verify(path)[0] == []


def test_consume_queue_damaged_while_running_is_rebuilt_when_a_read_finds_it(tmp_path):
    path = str(tmp_path / "s")
    bodies = _write(path)
    store = _start(path)
    try:
        queue = store.queues.get("D", 1)
        queue.files.files[0].mm[5 * 20:5 * 20 + 8] = (7).to_bytes(8, "big")   # entry 5 -> offset 7
        _serves_everything(store, bodies)
        assert store.statistics().integrity.consume_queues_rebuilt == 1
    finally:
        store.shutdown()


@pytest.mark.parametrize("directory", ["consumequeue", "index", "both"])
def test_deleted_directories_are_rebuilt_from_the_log(tmp_path, directory):
    path = str(tmp_path / "s")
    bodies = _write(path)
    for name in (["consumequeue", "index"] if directory == "both" else [directory]):
        shutil.rmtree(os.path.join(path, name))
    problems, _ = offline.verify(path)
    assert problems, f"verify called a store without {directory}/ sound"
    store = _start(path)
    try:
        stats = store.statistics().integrity
        assert stats.repairs
        _serves_everything(store, bodies)
        check_indexes_agree_with_log(store)
    finally:
        store.shutdown()
    assert offline.verify(path)[0] == []


@pytest.mark.parametrize("seed", range(3))
def test_random_bytes_in_an_index_file_are_repaired_at_start(tmp_path, seed):
    path = str(tmp_path / "s")
    bodies = _write(path)
    index_dir = os.path.join(path, "index")
    target = os.path.join(index_dir, sorted(os.listdir(index_dir))[0])
    _scribble(target, 300, seed)
    with open(target, "r+b") as handle:          # the slot table and header always get some
        handle.seek(30)
        handle.write(os.urandom(40))
    store = _start(path)
    try:
        assert store.statistics().integrity.index_rebuilds == 1
        _serves_everything(store, bodies)
        check_indexes_agree_with_log(store)
    finally:
        store.shutdown()


def _config_records(store, count):
    for i in range(count):
        store.put(Message("%SYS%CONFIG", msgpack.packb({"type": "topic", "topic": f"T{i}", "queue_count": 4,
                                                         "perm": 6})))
    store.put(Message("%SYS%CONFIG", msgpack.packb({"type": "offsets", "group": "g", "topic": "T1",
                                                     "offsets": {0: 2000, 3: 17}}, use_bin_type=True)))


@pytest.mark.parametrize("damage", ["corrupt", "removed"])
def test_config_files_are_rebuilt_from_sys_config_records(tmp_path, damage):
    path = str(tmp_path / "s")
    store = MessageStore(make_config(path, **SETTINGS))
    store.start()
    _config_records(store, 3)
    store.configs["topics.json"].data = {"topicConfigTable": {"T0": {}, "T1": {}, "T2": {}}}
    store.shutdown()
    config_dir = os.path.join(path, "config")
    for name in ("topics.json", "consumerOffset.json"):
        for suffix in ("", ".bak"):
            target = os.path.join(config_dir, name + suffix)
            if damage == "corrupt":
                with open(target, "wb") as handle:
                    handle.write(b"{not json")
            elif os.path.exists(target):
                os.unlink(target)
    store = _start(path)
    try:
        topics = store.configs["topics.json"].data["topicConfigTable"]
        assert sorted(topics) == ["T0", "T1", "T2"] and topics["T1"]["readQueueNums"] == 4
        assert store.configs["consumerOffset.json"].data == {"T1@g": {"0": 2000, "3": 17}}
        assert store.statistics().integrity.config_files_rebuilt == 2
    finally:
        store.shutdown()
    if damage == "corrupt":
        assert os.path.exists(os.path.join(config_dir, "topics.json.damaged"))   # kept, out of the way


@pytest.mark.parametrize("directory", ["consumequeue", "index"])
def test_a_rebuild_a_crash_interrupted_is_done_again(tmp_path, directory):
    path = str(tmp_path / "s")
    bodies = _write(path)
    # what a kill half way through a rebuild leaves: the marker, and files that look whole
    if directory == "consumequeue":
        queue_dir = os.path.join(path, "consumequeue", "D", "2")
        os.unlink(os.path.join(queue_dir, sorted(os.listdir(queue_dir))[-1]))
        marker = '[["D", 2]]'
    else:
        index_dir = os.path.join(path, "index")
        os.unlink(os.path.join(index_dir, sorted(os.listdir(index_dir))[-1]))
        marker = '"all"'
    with open(os.path.join(path, directory, ".rebuilding"), "w") as handle:
        handle.write(marker)
    assert any("interrupted" in p.what for p in offline.verify(path)[0])
    store = _start(path)
    try:
        stats = store.statistics().integrity
        assert any("interrupted" in r for r in stats.repairs)
        _serves_everything(store, bodies)
        check_indexes_agree_with_log(store)
    finally:
        store.shutdown()
    assert not os.path.exists(os.path.join(path, directory, ".rebuilding"))
