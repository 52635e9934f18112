"""The dispatcher's numpy paths give exactly what the one-record-at-a-time paths give:
DispatchParser.parse vs parse_each, IndexFile.put_many vs put, and whole dispatchers."""

from __future__ import annotations

import os
import random
import struct
import zlib
from typing import NamedTuple

import numpy as np
import pytest

from store import Message, codec, commit_log as commit_log_module, dispatch_batch
from store.dispatch_batch import DispatchParser
from store.dispatcher import ConsumeQueueTable, Dispatcher
from store.index_file import IndexFile, IndexService

HOST = codec.encode_host("127.0.0.1:10911")

# Values chosen for the edges of the byte-level parser: window widths (8..256), non-ASCII
# (two-byte, three-byte and astral characters, which Java hashes as surrogate pairs),
# separators inside values, names that merely contain a wanted name.
VALUES = ["a", "k" * 8, "k" * 9, "x" * 16, "y" * 17, "z" * 255, "w" * 256, "v" * 257, "q" * 600,
          "é", "ключ", "鍵-7", "emoji-\U0001F600", "tab\there", "mid\x01dle", "KEYS\x01x", ""]
KEYS_VALUES = ["one", "a b c", " lead", "trail ", "two  spaces", " ", "", "ünï côdé", "x" * 300 + " y",
               "k" * 256 + " " + "m" * 8]


def random_properties(rng: random.Random) -> bytes:
    """Properties as a writer might leave them, and some only another tool would."""
    pairs = []
    for _ in range(rng.randrange(0, 6)):
        name = rng.choice(["KEYS", "TAGS", "UNIQ_KEY", "OTHER", "XKEYS", "KEYSX", "TAG", "UNIQ_KEY2", ""])
        value = rng.choice(KEYS_VALUES if name == "KEYS" else VALUES)
        if rng.random() < 0.1:
            pairs.append(name.encode("utf-8"))               # a pair without a value separator
        else:
            pairs.append(f"{name}\x01{value}".encode("utf-8"))
    text = b"\x02".join(pairs)
    return text + b"\x02" if pairs and rng.random() < 0.8 else text


def encode(rng: random.Random, topic: str, queue_id: int, queue_offset: int, physical_offset: int,
           properties: bytes) -> bytes:
    body = rng.randbytes(rng.randrange(0, 300))
    return b"".join(codec.encode_message(
        topic_bytes=topic.encode("utf-8"), queue_id=queue_id, body=body, body_crc=zlib.crc32(body) & 0x7FFFFFFF,
        properties_bytes=properties, flag=0, queue_offset=queue_offset, physical_offset=physical_offset,
        sys_flag=0, born_timestamp=1, born_host=HOST, store_timestamp=1_700_000_000_000 + rng.randrange(10**7),
        store_host=HOST))


def random_records(seed: int, count: int) -> tuple[bytes, list[int]]:
    rng = random.Random(seed)
    topics = ["T", "Topic-A", "Topic-AB", "tópico", "%RETRY%group", "t" * 127]
    next_offsets: dict[tuple[str, int], int] = {}
    buffer = bytearray(rng.randbytes(rng.randrange(0, 50)))       # records need not start at 0
    positions = []
    topic = rng.choice(topics)
    for _ in range(count):
        if rng.random() < 0.3:
            topic = rng.choice(topics)                             # runs of one topic, and switches
        queue_id = rng.randrange(3)
        queue_offset = next_offsets.get((topic, queue_id), rng.randrange(5))
        if rng.random() < 0.05:
            queue_offset += rng.randrange(1, 4)                    # not contiguous
        next_offsets[(topic, queue_id)] = queue_offset + 1
        positions.append(len(buffer))
        buffer += encode(rng, topic, queue_id, queue_offset, len(buffer), random_properties(rng))
    return bytes(buffer), positions


def as_tuple(batch: dispatch_batch.DispatchBatch):
    """The batch with each queue's runs together (the order across queues is free)."""
    runs: dict[tuple[str, int], list] = {}
    for queue_key, first_queue_offset, entries in batch.queue_runs:
        runs.setdefault(queue_key, []).append((first_queue_offset, entries))
    keys = [list(map(int, column)) for column in (batch.key_hashes, batch.key_offsets, batch.key_timestamps)]
    return batch.count, batch.last_store_timestamp, runs, keys


@pytest.mark.parametrize("seed", range(12))
def test_columns_match_one_record_at_a_time(seed):
    buffer, positions = random_records(seed, 300)
    columns = DispatchParser().parse(buffer, positions)
    each = DispatchParser().parse_each(buffer, positions)
    assert as_tuple(columns) == as_tuple(each)
    assert columns.count == len(positions) and len(columns.key_hashes) > len(positions) // 4


def test_parse_each_is_the_documented_semantics():
    rng = random.Random(5)
    properties = "KEYS\x01first\x02TAGS\x01TagA\x02KEYS\x01 k1  ключ \x02UNIQ_KEY\x01\x02UNIQ_KEY\x01U1\x02"
    raw = encode(rng, "tópico", 2, 7, 0, properties.encode("utf-8"))
    parser = DispatchParser()
    for parse in (parser.parse, parser.parse_each):
        batch = parse(raw + bytes(8), [0])
        [(queue_key, first_queue_offset, entries)] = batch.queue_runs
        assert (queue_key, first_queue_offset) == (("tópico", 2), 7)
        assert entries == struct.pack(">qiq", 0, len(raw), codec.java_hash("TagA"))
        assert list(map(int, batch.key_hashes)) == [codec.index_key_hash(f"tópico#{key}")
                                                    for key in ("k1", "ключ", "U1")]
        assert list(map(int, batch.key_offsets)) == [0, 0, 0]


def test_java_hashes_of_every_width():
    rng = random.Random(9)
    texts = ["a" * n for n in range(300)] + ["".join(rng.choice("ab\u00e9\u4e2d\U0001F600") for _ in range(n))
                                             for n in range(0, 80, 3)]
    encoded = [text.encode("utf-8") for text in texts]
    buffer = np.frombuffer(bytes(256) + b"".join(encoded) + bytes(8), np.uint8)
    ends = 256 + np.cumsum([len(e) for e in encoded])
    starts = ends - [len(e) for e in encoded]
    prefixes = np.array([rng.randrange(1 << 32) for _ in texts], np.uint64)
    hashes = dispatch_batch.java_hashes(buffer, starts, ends, prefixes)
    assert hashes.tolist() == [codec.combine_hash(int(p), t) for p, t in zip(prefixes, texts)]


# --- IndexFile ------------------------------------------------------------------------------

def index_columns(rng: random.Random, count: int):
    hashes = [rng.choice([0, 2**31 - 1, rng.randrange(2**31)]) for _ in range(count)]
    offsets = sorted(rng.randrange(10**9) for _ in range(count))
    times = [1_700_000_000_000 + rng.randrange(-5_000, 10**7) for _ in range(count)]
    return (np.array(hashes, np.int64), np.array(offsets, np.int64), np.array(times, np.int64))


@pytest.mark.parametrize("slots", [1, 2, 7, 1000])
def test_index_blocks_match_puts(tmp_path, slots):
    rng = random.Random(slots)
    block = IndexFile(str(tmp_path / "block"), slots, 400, create=True)
    single = IndexFile(str(tmp_path / "single"), slots, 400, create=True)
    garbage = {slot: rng.randrange(0, 500) for slot in range(0, slots, 3)}   # as an unclean stop leaves
    for index_file in (block, single):
        for slot, value in garbage.items():
            index_file.mm[40 + slot * 4:44 + slot * 4] = value.to_bytes(4, "big")
    columns = index_columns(rng, 450)
    start = 0
    for end in (1, 4, 44, 144, 161, 450):            # from an empty file, small and large blocks, until full
        start = block.put_many(*(column[:end] for column in columns), start)
    assert start == 399 and block.is_full               # entry 0 is unused
    for number in range(start):
        assert single.put(*(int(column[number]) for column in columns))
    block.close()
    single.close()
    with open(block.path, "rb") as a, open(single.path, "rb") as b:
        assert a.read() == b.read()


def test_index_service_rolls_files_like_single_puts(tmp_path):
    rng = random.Random(3)
    columns = index_columns(rng, 1000)
    blocks = IndexService(str(tmp_path / "blocks"), 5, 150)
    singles = IndexService(str(tmp_path / "singles"), 5, 150)
    for service in (blocks, singles):
        service.load()
    for start, end in ((0, 1), (1, 90), (90, 95), (95, 700), (700, 1000)):
        blocks.put_many(*(column[start:end] for column in columns))
    for number in range(1000):
        singles.put(*(int(column[number]) for column in columns))
    assert len(blocks.files) == len(singles.files) == 7        # 149 entries a file
    blocks.close()
    singles.close()
    for a, b in zip(blocks.files, singles.files):
        with open(a.path, "rb") as x, open(b.path, "rb") as y:
            assert x.read() == y.read()


def test_index_block_after_rollback(tmp_path):
    rng = random.Random(4)
    columns = index_columns(rng, 200)
    files = [IndexFile(str(tmp_path / name), 3, 500, create=True) for name in ("block", "single")]
    files[0].put_many(*columns, 0)
    for number in range(200):
        files[1].put(*(int(column[number]) for column in columns))
    cut = int(columns[1][120])
    for index_file in files:
        assert index_file.rollback(cut) == 80
    files[0].put_many(*columns, 120)
    for number in range(120, 200):
        files[1].put(*(int(column[number]) for column in columns))
    for index_file in files:
        index_file.close()
    assert open(files[0].path, "rb").read() == open(files[1].path, "rb").read()


def test_index_block_cut_before_its_count_is_repaired(tmp_path):
    """A kill after a block's entries and slots but before its count: recovery's repair
    (rebuild_chains) leaves exactly the entries the count covers."""
    rng = random.Random(6)
    columns = index_columns(rng, 300)
    cut = IndexService(str(tmp_path / "cut"), 7, 1000)
    whole = IndexService(str(tmp_path / "whole"), 7, 1000)
    for service in (cut, whole):
        service.load()
        service.put_many(*(column[:100] for column in columns))
        service.flush()
    header_before = cut.files[0].mm[:40]
    cut.files[0]._put_block(*(column[100:] for column in columns))
    cut.files[0].mm[:40] = header_before      # the count (and the end fields after it) as before the block
    reopened = IndexService(str(tmp_path / "cut"), 7, 1000)
    reopened.load()
    assert reopened.files[0].header.index_count == 101 and not reopened.files[0].slots_consistent()
    reopened.rollback(10**12, repair=True)
    whole.flush()
    entries_end = 40 + 7 * 4 + 101 * 20
    assert reopened.files[0].mm[:entries_end] == whole.files[0].mm[:entries_end]


# --- whole dispatchers ----------------------------------------------------------------------

def tree_bytes(root: str) -> list[bytes]:
    """Every file's bytes under root, by relative path (index files: in name order)."""
    found = []
    for directory, _, names in sorted(os.walk(root)):
        for name in sorted(names):
            with open(os.path.join(directory, name), "rb") as handle:
                label = os.path.relpath(os.path.join(directory, name), root)
                found.append((label if "index" not in label else "index", handle.read()))
    return found


class Rebuilt(NamedTuple):
    count: int                 # messages dispatched
    dispatched_offset: int
    index_files: int
    tree: list                 # tree_bytes of what was built


def dispatch_afresh(commit_log, root: str, batch_bytes_max: int, **records_min) -> Rebuilt:
    """Build a fresh ConsumeQueue and IndexFile tree under ``root`` from the whole of
    ``commit_log``, with a Dispatcher of its own (passes of ``batch_bytes_max``; its
    ``alike_records_min`` and ``columns_records_min`` if given)."""
    queues = ConsumeQueueTable(os.path.join(root, "consumequeue"), 64)
    index = IndexService(os.path.join(root, "index"), 64, 900)
    queues.load()
    index.load()
    dispatcher = Dispatcher(commit_log, queues, index, batch_bytes_max, **records_min)
    count = dispatcher.catch_up()
    index_files = len(index.files)
    queues.close()
    index.close()
    return Rebuilt(count, dispatcher.dispatched_offset, index_files, tree_bytes(root))


def test_dispatchers_build_identical_files(open_store, tmp_path):
    store = open_store(commitlog_segment_bytes=64 * 1024)       # many segments, blank records
    store.dispatcher.stop()
    rng = random.Random(11)
    topics = ["T", "Topic-B", "%RETRY%group"]
    for start in range(0, 1200, 100):
        messages = []
        for number in range(start, start + 100):
            keys = rng.choice([[f"key-{number}"], [f"k{number}", "shared"], [], ["ключ", "x" * 300]])
            properties = {"UNIQ_KEY": f"{number:032X}"} if rng.random() < 0.8 else {}
            messages.append(Message(topic=rng.choice(topics), queue_id=number % 3, body=rng.randbytes(600),
                                    keys=keys, tags=rng.choice([None, "TagA", "TägB"]), properties=properties))
        assert [result.reason for result in store.append(messages) if not result.status.ok] == []
    built = {}
    for name, records_min in (("columns", 1), ("each", 10**9)):
        rebuilt = dispatch_afresh(store.commit_log, str(tmp_path / name), 50_000,
                                  alike_records_min=records_min, columns_records_min=records_min)
        assert rebuilt.count == 1200
        assert rebuilt.dispatched_offset == store.commit_log.max_offset
        assert rebuilt.index_files > 1                           # files rolled over
        built[name] = rebuilt.tree
    assert built["columns"] == built["each"]
    store.dispatcher.start()


# --- record offsets from the writer -----------------------------------------------------------

def test_written_runs_give_offsets_only_where_they_cover_the_log():
    runs = commit_log_module.WrittenRuns()
    runs.add([100, 150, 230], 300)
    runs.add([300, 340], 400)
    runs.add([500, 520], 600)                                  # a gap before it: 400..500 was replicated
    assert runs.take(0, 1000) is None                           # the runs do not start at 0
    assert runs.take(100, 240) == ([100, 150, 230], 300)        # a record starting below the limit is whole
    assert runs.take(300, 320) == ([300], 340)                  # stopped inside a run ...
    assert runs.take(340, 1000) == ([340], 400)                 # ... and went on from there; then the gap
    assert runs.take(400, 1000) is None                         # walked
    assert runs.take(500, 1000) == ([500, 520], 600)
    assert runs.take(600, 1000) is None
    runs.add([700], 800)
    runs.clear()                                                # a cut
    assert runs.take(700, 1000) is None


def test_written_runs_are_bounded():
    assert commit_log_module.WrittenRuns()._runs.maxlen == commit_log_module.WRITTEN_RUNS_MAX
    runs = commit_log_module.WrittenRuns(runs_max=3)
    for start in range(0, 50, 10):
        runs.add([start], start + 10)
    assert runs.take(0, 100) is None                            # the oldest were dropped: walk them
    assert runs.take(20, 100) == ([20, 30, 40], 50)


def test_dispatch_from_the_writers_offsets_matches_a_walk(open_store, tmp_path, monkeypatch):
    store = open_store(commitlog_segment_bytes=64 * 1024)       # rolls inside batches
    store.dispatcher.stop()
    rng = random.Random(5)
    for start in range(0, 600, 40):
        messages = [Message(topic="T", queue_id=number % 3, body=rng.randbytes(rng.choice([10, 900, 3000])),
                            keys=[f"key-{number}"], tags="TagA", properties={"UNIQ_KEY": f"{number:032X}"})
                    for number in range(start, start + 40)]
        if start % 80:
            messages[7].keys = ()                               # irregular: written one message at a time
        assert all(result.status.ok for result in store.append(messages))
    taken = []
    take = store.commit_log.written_runs.take
    monkeypatch.setattr(store.commit_log.written_runs, "take",
                        lambda start, limit: taken.append(take(start, limit)) or taken[-1])
    built = {}
    for name in ("from the writer", "walked"):
        rebuilt = dispatch_afresh(store.commit_log, str(tmp_path / name), 7_000)   # passes end inside runs
        assert rebuilt.count == 600
        built[name] = rebuilt.tree
        if name == "from the writer":
            assert sum(len(found[0]) for found in taken if found) == 600
            store.commit_log.written_runs.clear()
    assert [found for found in taken[-5:]] == [None] * 5
    assert built["from the writer"] == built["walked"]
    store.dispatcher.start()


def test_index_hashes_match_the_codec_at_the_edges():
    """abs of the signed Java hash, 0 for Integer.MIN_VALUE, for the values around the sign bit."""
    edges = [0, 1, 2**31 - 2, 2**31 - 1, 2**31, 2**31 + 1, 2**32 - 2, 2**32 - 1, 0x9E3779B9]
    hashes = dispatch_batch._index_hashes(np.array(edges, np.uint64))
    assert hashes.tolist() == [codec._abs_hash(value) for value in edges]
    assert hashes.tolist()[4] == 0
