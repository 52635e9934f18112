"""The fast record walk (pipeline.record_walk) against the reference walk through the codec
(arrow_decode.scan_records), on real segments damaged at random:
flipped bytes anywhere, torn tails, zeroed spans. The codec stays the judge."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline import arrow_decode as ad
from pipeline import record_walk as rw
from pipeline.errors import CorruptLogError
from pipeline.segments import map_segment
from pipeline.slice_reader import concat_scans, slice_records, slice_scans
from pipeline.stores import list_segments, resolve_store
from store import Message

from pipeline_helpers import sample_messages, write_store


@pytest.fixture(scope="module")
def segment_bytes(tmp_path_factory) -> bytes:
    root = tmp_path_factory.mktemp("walk")
    messages = sample_messages(600) + [Message("legacy-free", b"", queue_id=0)]
    store_path = write_store(str(root), messages, segment_bytes=512 * 1024)
    segments = list_segments(resolve_store(store_path))
    with open(segments[0].path, "rb") as handle:
        return handle.read()


def _same(buffer, begin: int, end: int, verify: bool) -> None:
    limit = len(buffer)
    fast = rw.scan_records_fast(buffer, begin, end, limit, verify=verify)
    reference = ad.scan_records(buffer, begin, end, limit, verify=verify)
    assert fast.positions.tolist() == reference.positions.tolist()
    assert fast.sizes.tolist() == reference.sizes.tolist()
    assert fast.crc_ok.tolist() == reference.crc_ok.tolist()
    assert fast.bad_tail == reference.bad_tail


def test_an_intact_segment_walks_the_same(segment_bytes):
    buffer = bytearray(segment_bytes)
    reference = ad.scan_records(buffer, 0, len(buffer), len(buffer))
    assert len(reference.positions) > 500 and reference.crc_ok.all()
    for verify in (True, False):
        _same(buffer, 0, len(buffer), verify)
    middle = int(reference.positions[len(reference.positions) // 2])
    _same(buffer, middle, len(buffer) // 2 + 777, True)
    assert _split(buffer, 64 * 1024) == reference.positions.tolist()


def _split(buffer, max_bytes: int) -> list[int]:
    """Record positions read by slices of ``max_bytes`` that find their own starts."""
    cuts = list(range(0, len(buffer), max_bytes)) + [len(buffer)]
    return [int(p) for begin, end in zip(cuts, cuts[1:]) for p in slice_records(buffer, begin, end, 0).positions]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_damaged_segments_walk_the_same_as_the_codec_says(segment_bytes, data):
    buffer = bytearray(segment_bytes)
    used = int(ad.scan_records(buffer, 0, len(buffer), len(buffer)).positions[-1]) + 2000
    damage = data.draw(st.lists(st.tuples(st.sampled_from(["flip", "zero", "tear"]),
                                          st.integers(0, used), st.integers(1, 300)), min_size=1, max_size=4))
    for kind, at, span in damage:
        if kind == "flip":
            buffer[at] ^= 1 << (span % 8)
        elif kind == "zero":
            buffer[at:at + span] = bytes(len(buffer[at:at + span]))
        else:
            buffer[at:] = bytes(len(buffer) - at)
    verify = data.draw(st.booleans())
    _same(buffer, 0, len(buffer), verify)
    positions = ad.scan_records(buffer, 0, len(buffer), len(buffer), verify=False).positions
    if len(positions) > 2:
        begin = int(positions[data.draw(st.integers(0, len(positions) - 1))])
        _same(buffer, begin, data.draw(st.integers(begin, len(buffer))), verify)
    # split reads give every record the reference walk reaches, once; past a record whose
    # lengths do not hold (where the reference stops) later slices read on from their own start
    walked = ad.scan_records(buffer, 0, len(buffer), len(buffer), verify=False).positions.tolist()
    split = _split(buffer, 64 * 1024)
    assert split[:len(walked)] == walked and split == sorted(set(split))
    # a slice walked in steps gives what one walk of it gives, bad tail included
    begin = data.draw(st.integers(0, len(buffer) - 1))
    end = data.draw(st.integers(begin + 1, len(buffer)))
    step = data.draw(st.sampled_from([1, 1000, 4096, 50_000, len(buffer)]))
    _same_scans(buffer, begin, end, step, verify)


def _same_scans(buffer, begin: int, end: int, step: int, verify: bool) -> None:
    """slice_scans in steps of ``step`` give what one walk of the slice's records gives (from
    the first record start at or after ``begin`` to the first at or after ``end``), or fail
    where that walk's last record runs past the next slice's start."""
    limit = len(buffer)
    first = rw.find_record_start(buffer, begin, limit, 0) if begin > 0 else 0
    stop = rw.find_record_start(buffer, end, limit, 0) if end < limit else limit
    whole = rw.scan_records_fast(buffer, first, max(first, stop), limit, verify=verify)
    last_end = int(whole.positions[-1] + whole.sizes[-1]) if len(whole.positions) else 0
    if stop < limit and whole.bad_tail is None and last_end > stop:
        with pytest.raises(CorruptLogError):
            list(slice_scans(buffer, begin, end, 0, verify=verify, step=step))
        return
    stepped = list(slice_scans(buffer, begin, end, 0, verify=verify, step=step))
    assert all(result.bad_tail is None for result in stepped[:-1])
    joined = concat_scans(stepped)
    for name in ("positions", "sizes", "crc_ok"):
        assert getattr(joined, name).tolist() == getattr(whole, name).tolist(), name
    assert joined.bad_tail == whole.bad_tail
    if len(whole.positions):
        assert joined.layout.header.tolist() == whole.layout.header.tolist()
        assert joined.layout.topic_bytes.tolist() == whole.layout.topic_bytes.tolist()


def test_the_reader_uses_the_fast_walk_on_a_mapped_segment(tmp_path):
    store_path = write_store(str(tmp_path), sample_messages(50))
    segment = list_segments(resolve_store(store_path))[0]
    buffer = map_segment(segment.path)
    try:
        result = rw.scan_records_fast(buffer, 0, len(buffer), len(buffer))
        assert len(result.positions) == 50 and result.crc_ok.all() and result.bad_tail is None
        assert np.all(np.diff(result.positions) == result.sizes[:-1])
        del result
    finally:
        buffer.close()


def _equal_records(count: int, body: bytes) -> bytearray:
    from store import codec
    out = bytearray()
    for index in range(count):
        out += b"".join(codec.encode_message(
            topic_bytes=b"t", queue_id=0, body=body, body_crc=codec.crc32_body(body), properties_bytes=b"",
            flag=0, queue_offset=index, physical_offset=len(out), sys_flag=0, born_timestamp=1,
            born_host=bytes(8), store_timestamp=1, store_host=bytes(8)))
    return out


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_runs_of_equal_sizes_walk_the_same_as_the_codec_says(data):
    # long runs (read in numpy), broken by other sizes and by damage anywhere
    buffer = bytearray()
    for count, length in data.draw(st.lists(st.tuples(st.integers(1, 400), st.sampled_from([10, 11, 200])),
                                            min_size=1, max_size=5)):
        buffer += _equal_records(count, b"b" * length)
    buffer += bytes(data.draw(st.integers(0, 500)))
    for at in data.draw(st.lists(st.integers(0, len(buffer) - 1), max_size=3)):
        buffer[at] ^= 0x40
    end = data.draw(st.integers(0, len(buffer)))
    _same(buffer, 0, end, data.draw(st.booleans()))
    _same(buffer, 0, len(buffer), False)
