"""Unit tests of the pure half of the commitlog source: stores, record walks, slices, pruning,
and the vectorised Arrow decoder against the per-record reference. No Spark session."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pytest

from pipeline import arrow_decode as ad
from pipeline.errors import NotAStoreError
from pipeline.errors import CorruptLogError
from pipeline.record_walk import find_record_start
from pipeline.segments import Bounds, map_segment, plan_slices, wanted_segments
from pipeline.slice_reader import slice_records
from pipeline.stores import Segment, list_segments, resolve_store, resolve_stores
from store import Message
from store import codec

from pipeline_helpers import SteppedClock, sample_messages, write_store


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("node-a")
    write_store(str(root), sample_messages(3000), node="g1-n1", group="g1")
    return str(root)


def _info(store, segment):
    return ad.SliceInfo(store.node, store.group, segment.name, segment.start_offset)


def test_node_directory_and_store_directory_name_the_same_node(store_dir):
    by_node_dir = resolve_store(store_dir)
    by_store_dir = resolve_store(os.path.join(store_dir, "store"))
    assert by_node_dir == by_store_dir
    assert (by_node_dir.node, by_node_dir.group) == ("g1-n1", "g1")


def test_without_node_yaml_the_directory_names_the_node(tmp_path):
    write_store(str(tmp_path / "n7"), [Message("t", b"x")])
    store = resolve_store(str(tmp_path / "n7" / "store"))
    assert (store.node, store.group) == ("n7", "")


def test_bad_paths_are_refused_with_the_path_named(tmp_path):
    with pytest.raises(NotAStoreError, match="no such directory"):
        resolve_store(str(tmp_path / "missing"))
    with pytest.raises(NotAStoreError, match="not a store directory"):
        resolve_store(str(tmp_path))
    with pytest.raises(NotAStoreError, match="no store directory given"):
        resolve_stores([])


def test_vectorised_decode_equals_the_reference_decoder(store_dir):
    store = resolve_store(store_dir)
    segments = list_segments(store)
    assert len(segments) >= 3
    for segment in segments:
        buffer = map_segment(segment.path)
        result = ad.scan_records(buffer, 0, len(buffer), len(buffer))
        assert result.bad_tail is None and result.crc_ok.all()
        for first, stop in ad.batch_ranges(result.sizes, rows_max=500):
            args = (buffer, result.positions[first:stop], result.crc_ok[first:stop], _info(store, segment))
            fast, reference = ad.decode_batch(*args), ad.decode_batch_reference(*args)
            assert fast.equals(reference), [n for n in fast.schema.names if not fast.column(n).equals(reference.column(n))]
            assert ad.decode_batch(*args, columns=("topic", "crc_ok")).equals(
                ad.decode_batch_reference(*args, columns=("topic", "crc_ok")))


@pytest.mark.parametrize("columns", [("topic",), ("size", "topic", "physical_offset"), ("keys", "body", "topic"),
                                     ("topic", "crc_ok"), ("store_timestamp", "topic"), ad.COLUMN_NAMES])
@pytest.mark.parametrize("verify", ["true", "false"])
def test_a_read_of_any_columns_gives_what_the_reference_decoder_gives(store_dir, columns, verify):
    # reads without header columns or CRC checks gather only the header's length fields
    from pipeline.commitlog_source import read_settings
    from pipeline.slice_reader import read_slice
    store = resolve_store(store_dir)
    settings = read_settings({"paths": store_dir, "verifyCrc": verify})
    for piece in plan_slices([store], Bounds(), max_bytes=64 * 1024):
        got = pa.Table.from_batches(list(read_slice(piece, settings, columns)), schema=ad.arrow_schema(columns))
        buffer = map_segment(piece.segment.path)
        result = slice_records(buffer, piece.begin, piece.end, piece.segment.start_offset)
        want = ad.decode_batch_reference(buffer, result.positions, result.crc_ok, _info(store, piece.segment),
                                         columns=columns)
        assert got.equals(pa.Table.from_batches([want])), piece


def test_decoded_rows_hold_what_was_put(store_dir):
    store = resolve_store(store_dir)
    messages = sample_messages(3000)
    rows = []
    for segment in list_segments(store):
        buffer = map_segment(segment.path)
        result = ad.scan_records(buffer, 0, len(buffer), len(buffer))
        rows += ad.decode_batch(buffer, result.positions, result.crc_ok, _info(store, segment)).to_pylist()
    assert len(rows) == len(messages)
    for row, message in zip(rows, messages):
        assert (row["topic"], row["body"], row["queue_id"], row["keys"], row["tags"]) == \
            (message.topic, message.body, message.queue_id, list(message.keys), message.tags)
        user = dict(row["properties"])
        assert codec.PROPERTY_CRC32 not in user
        assert user.get("trace") == message.properties.get("trace")
        assert row["uniq_key"] == message.properties.get("UNIQ_KEY")
    offsets = [row["physical_offset"] for row in rows]
    assert offsets == sorted(offsets) and offsets[0] == 0


def test_slices_start_on_record_boundaries_and_cover_every_record(tmp_path):
    write_store(str(tmp_path), sample_messages(2000), segment_bytes=1 << 20)
    store = resolve_store(str(tmp_path / "store"))
    whole = plan_slices([store], Bounds(), max_bytes=1 << 20)
    split = plan_slices([store], Bounds(), max_bytes=64 * 1024)
    assert len(split) > len(whole)
    seen = []
    for piece in split:
        buffer = map_segment(piece.segment.path)
        start = find_record_start(buffer, piece.begin, len(buffer), piece.segment.start_offset)
        if piece.begin == 0 or start < len(buffer):
            codec.check_record(buffer, start if piece.begin else 0, len(buffer))    # a record starts there
        result = slice_records(buffer, piece.begin, piece.end, piece.segment.start_offset)
        seen.extend(piece.segment.start_offset + int(p) for p in result.positions)
    whole_positions = []
    for piece in whole:
        buffer = map_segment(piece.segment.path)
        found = ad.scan_records(buffer, 0, len(buffer), len(buffer)).positions
        whole_positions.extend(piece.segment.start_offset + int(p) for p in found)
    assert len(whole_positions) == 2000 and seen == whole_positions     # each record once, in log order


def _records(count: int, body: bytes = b"x" * 100, start: int = 0) -> bytes:
    """``count`` records as the store writes them from log position ``start``."""
    out = bytearray()
    for index in range(count):
        out += b"".join(codec.encode_message(
            topic_bytes=b"t", queue_id=0, body=body, body_crc=codec.crc32_body(body), properties_bytes=b"",
            flag=0, queue_offset=index, physical_offset=start + len(out), sys_flag=0, born_timestamp=1,
            born_host=bytes(8), store_timestamp=1, store_host=bytes(8)))
    return bytes(out)


def test_a_reader_finds_the_first_record_at_or_after_its_cut():
    one = len(_records(1))
    buffer = _records(10) + bytes(1000)
    assert find_record_start(buffer, 0, len(buffer), 0) == 0
    assert find_record_start(buffer, 1, len(buffer), 0) == one
    assert find_record_start(buffer, 3 * one, len(buffer), 0) == 3 * one
    assert find_record_start(buffer, 9 * one + 5, len(buffer), 0) == len(buffer)     # past the data: none
    # the same records at another place in the log: their PHYSICALOFFSET does not name it
    assert find_record_start(bytes(40) + _records(10), 0, 40 + 10 * one, 0) == 40 + 10 * one


def test_a_record_inside_a_body_is_no_cut():
    inner = _records(3)                       # a body holding records, as a copy of another log would
    buffer = _records(4, body=inner + b"y" * 50)
    size = len(buffer) // 4
    assert find_record_start(buffer, 1, len(buffer), 0) == size
    for at in range(0, len(buffer), 64):     # every cut gives each record to exactly one reader
        positions = [int(p) for p in slice_records(buffer, 0, at, 0).positions] + \
            [int(p) for p in slice_records(buffer, at, len(buffer), 0).positions]
        assert positions == [0, size, 2 * size, 3 * size]


def test_bytes_made_to_look_like_a_record_at_the_cut_fail_the_read():
    body_at = codec.HEADER.size
    # a body that holds a record claiming the log position it lands at, then zeros (as unwritten space)
    forged = _records(1, start=body_at)
    buffer = _records(1, body=forged + bytes(10)) + bytes(200)
    cut = body_at - 1
    assert find_record_start(buffer, cut, len(buffer), 0) == body_at
    with pytest.raises(CorruptLogError, match="maxBytesPerPartition"):
        slice_records(buffer, 0, cut, 0)


def test_corrupt_record_and_truncated_tail(tmp_path):
    write_store(str(tmp_path), sample_messages(50), segment_bytes=1 << 20)
    store = resolve_store(str(tmp_path / "store"))
    [segment] = list_segments(store)
    buffer = bytearray(open(segment.path, "rb").read())
    clean = ad.scan_records(bytes(buffer), 0, len(buffer), len(buffer))
    fifth, last = int(clean.positions[5]), int(clean.positions[-1])
    buffer[fifth + 90] ^= 0xFF                            # a body byte: the CRC fails, the lengths hold
    cut = bytes(buffer[:last + 30])                        # the last record cut short
    with open(segment.path, "wb") as handle:
        handle.write(cut)
    result = ad.scan_records(cut, 0, len(cut), len(cut))
    assert len(result.positions) == 49 and not result.crc_ok[5] and result.crc_ok.sum() == 48
    assert result.bad_tail is not None and result.bad_tail.position == last and result.bad_tail.size == 30
    row = ad.bad_tail_batch(result.bad_tail, _info(store, segment)).to_pylist()[0]
    assert row["crc_ok"] is False and row["physical_offset"] == last and row["topic"] is None


def test_offset_and_time_bounds_drop_whole_segments_unopened(tmp_path):
    clock = SteppedClock(1_700_000_000_000, 10)
    write_store(str(tmp_path), sample_messages(3000), clock=clock)
    store = resolve_store(str(tmp_path / "store"))
    segments = list_segments(store)
    assert len(segments) >= 4
    opened = []

    def first(segment: Segment):
        opened.append(segment.start_offset)
        return _first_time(segment)
    second = segments[1]
    by_offset = wanted_segments(segments, Bounds(offset_min=second.start_offset, offset_end=second.start_offset + 1),
                                first_timestamp=first)
    assert by_offset == [second] and opened == []
    t1, t2 = _first_time(segments[1]), _first_time(segments[2])
    by_time = wanted_segments(segments, Bounds(time_min_ms=t1 + 1, time_max_ms=t2 - 1), first_timestamp=first)
    assert by_time == [segments[1]]
    assert wanted_segments(segments, Bounds(time_min_ms=clock.now_ms + 1)) == [segments[-1]]
    assert plan_slices([store], Bounds(topics=frozenset())) == []


def _first_time(segment: Segment) -> int:
    buffer = map_segment(segment.path)
    return codec.decode_message(buffer, 0).store_timestamp


def test_batches_are_bounded_by_rows_and_bytes():
    sizes = np.array([100] * 10 + [5000] + [100] * 5, dtype=np.int64)
    ranges = ad.batch_ranges(sizes, rows_max=4, bytes_max=1000)
    assert ranges[0] == (0, 4) and (10, 11) in ranges
    assert sum(stop - first for first, stop in ranges) == len(sizes)


def test_spark_ddl_and_arrow_schema_agree():
    assert ad.arrow_schema().names == list(ad.COLUMN_NAMES)
    assert "`body` BINARY" in ad.spark_ddl() and pa.types.is_map(ad.arrow_schema().field("properties").type)


def test_slices_are_packed_in_log_order_into_runs_of_about_equal_bytes(tmp_path):
    from pipeline.segments import pack_slices
    write_store(str(tmp_path), sample_messages(2000), segment_bytes=1 << 20)
    slices = plan_slices([resolve_store(str(tmp_path / "store"))], Bounds(), max_bytes=64 * 1024)
    assert pack_slices([], 4) == []
    for count in (1, 2, 3, len(slices), len(slices) + 5):
        packed = pack_slices(slices, count)
        assert [piece for group in packed for piece in group] == slices
        assert len(packed) == min(count, len(slices))
        sizes = [sum(p.end - p.begin for p in group) for group in packed]
        assert max(sizes) - min(sizes) <= max(p.end - p.begin for p in slices)


def test_partitions_are_weighed_by_the_data_before_the_unwritten_tail(tmp_path):
    from pipeline.segments import data_end_estimate, pack_slices, slice_weight
    write_store(str(tmp_path), sample_messages(2000), segment_bytes=1 << 20)
    segments = list_segments(resolve_store(str(tmp_path / "store")))
    newest = segments[-1]
    walked = ad.scan_records(map_segment(newest.path), 0, newest.file_bytes, newest.file_bytes)
    data_end = int(walked.positions[-1] + walked.sizes[-1])
    estimate = data_end_estimate(newest.path)
    assert data_end <= estimate < data_end + 4096 and estimate < newest.file_bytes
    slices = plan_slices([resolve_store(str(tmp_path / "store"))], Bounds(), max_bytes=64 * 1024)
    ends = {newest.path: estimate}
    packed = pack_slices(slices, 2, lambda piece: slice_weight(piece, ends))
    assert [piece for group in packed for piece in group] == slices
    weights = [sum(slice_weight(piece, ends) for piece in group) for group in packed]
    assert abs(weights[0] - weights[1]) <= 2 * 64 * 1024      # the unwritten tail weighs nothing
    assert all(slice_weight(piece, ends) == 1 for piece in slices if piece.begin >= estimate)
