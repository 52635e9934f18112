"""The lockstep walk (pipeline.chain_walk) against the one-record-at-a-time walk and the codec's
reference walk, on records of varied sizes: intact, with the magic planted in bodies (false
anchors), torn tails and damage anywhere. Small strides make many chains in a small log."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline import arrow_decode as ad
from pipeline import record_walk as rw
from pipeline import chain_walk
from pipeline.chain_walk import walk_chains
from store import codec

MAGIC = codec.MESSAGE_MAGIC.to_bytes(4, "big")


def _records(bodies: list[bytes]) -> bytearray:
    out = bytearray()
    for index, body in enumerate(bodies):
        properties = codec.encode_properties({"KEYS": f"k{index}"}) if index % 3 else b""
        out += b"".join(codec.encode_message(
            topic_bytes=b"topic-%d" % (index % 4), queue_id=index % 8, body=body, body_crc=codec.crc32_body(body),
            properties_bytes=properties, flag=0, queue_offset=index, physical_offset=len(out), sys_flag=0,
            born_timestamp=1, born_host=bytes(8), store_timestamp=1, store_host=bytes(8)))
    return out


def _same_walk(buffer, begin: int, end: int, stride: int) -> tuple[np.ndarray, int]:
    limit = len(buffer)
    positions, sizes, stopped = walk_chains(buffer, begin, end, limit, stride=stride)
    one_by_one = rw.walk(buffer, begin, end, limit, check_magic=False)
    assert positions.tolist() == one_by_one[0].tolist()
    assert sizes.tolist() == one_by_one[1].tolist()
    assert stopped == one_by_one[2]
    return positions, stopped


def _varied_bodies(draw_sizes: list[int], planted: set[int]) -> list[bytes]:
    bodies = []
    for index, size in enumerate(draw_sizes):
        body = bytearray(b"b" * size)
        if index in planted and size >= 12:      # a fake record start inside the body
            body[0:4] = (size - 4).to_bytes(4, "big")
            body[4:8] = MAGIC
        bodies.append(bytes(body))
    return bodies


def test_varied_sizes_walk_as_one_record_at_a_time():
    rng = np.random.default_rng(7)
    buffer = _records(_varied_bodies(rng.integers(0, 3000, 2000).tolist(), set()))
    buffer += bytes(5000)                        # unwritten space after the data
    for stride in (512, 4096, 65536):
        positions, stopped = _same_walk(buffer, 0, len(buffer), stride)
        assert len(positions) == 2000
        reference = ad.scan_records(buffer, 0, len(buffer), len(buffer))
        assert positions.tolist() == reference.positions.tolist()
    _same_walk(buffer, 0, len(buffer) // 2, 1024)              # an end inside the data


def test_a_truncated_tail_stops_the_walk_where_the_reference_stops():
    rng = np.random.default_rng(11)
    buffer = _records(_varied_bodies(rng.integers(0, 2000, 800).tolist(), set()))
    cut = bytes(buffer[:len(buffer) - 500])       # the last record torn
    positions, stopped = _same_walk(cut, 0, len(cut), 1024)
    reference = ad.scan_records(cut, 0, len(cut), len(cut))
    assert positions.tolist() == reference.positions.tolist() and len(positions) == 799
    assert reference.bad_tail is not None and stopped == reference.bad_tail.position


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_false_anchors_and_damage_walk_as_one_record_at_a_time(data):
    sizes = data.draw(st.lists(st.integers(0, 1500), min_size=50, max_size=400))
    planted = set(data.draw(st.lists(st.integers(0, len(sizes) - 1), max_size=40)))
    buffer = _records(_varied_bodies(sizes, planted))
    buffer += bytes(data.draw(st.integers(0, 3000)))
    for at in data.draw(st.lists(st.integers(0, len(buffer) - 1), max_size=3)):
        buffer[at] ^= 1 << data.draw(st.integers(0, 7))
    if data.draw(st.booleans()):
        buffer = buffer[:data.draw(st.integers(1, len(buffer)))]
    stride = data.draw(st.sampled_from([128, 700, 2048, 9000]))
    begin = 0
    end = data.draw(st.integers(0, len(buffer)))
    _same_walk(buffer, begin, end, stride)
    _same_walk(buffer, begin, len(buffer), stride)
    # the whole fast scan (chains, layout, CRCs) still gives the codec's verdicts
    fast = rw.scan_records_fast(buffer, 0, len(buffer), len(buffer))
    reference = ad.scan_records(buffer, 0, len(buffer), len(buffer))
    assert fast.positions.tolist() == reference.positions.tolist()
    assert fast.crc_ok.tolist() == reference.crc_ok.tolist() and fast.bad_tail == reference.bad_tail


def test_anchors_inside_bodies_are_found_out():
    rng = np.random.default_rng(3)
    sizes = rng.integers(200, 1500, 400).tolist()
    buffer = _records(_varied_bodies(sizes, set(range(len(sizes)))))      # a fake record start in every body
    true_starts = set(rw.walk(buffer, 0, len(buffer), len(buffer))[0].tolist())
    anchors = chain_walk._anchors(buffer, 0, len(buffer), len(buffer), 2048).tolist()
    assert any(anchor not in true_starts for anchor in anchors)              # the case under test happens
    positions, stopped = _same_walk(buffer, 0, len(buffer), 2048)
    assert len(positions) == len(sizes) and stopped == len(buffer)


def test_runs_of_one_size_take_the_one_by_one_walk_with_the_same_records():
    sizes = [700] * 900 + [10, 2000, 30] + [700] * 300            # runs, then a few others, then runs
    buffer = _records(_varied_bodies(sizes, {5, 950}))
    buffer += bytes(3000)
    positions, stopped = _same_walk(buffer, 0, len(buffer), 4096)
    assert len(positions) == len(sizes)
    _same_walk(buffer[:len(buffer) - 4000], 0, len(buffer) - 4000, 4096)    # and a torn tail
