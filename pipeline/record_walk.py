"""The fast record walk of a CommitLog slice: where records start, whether their lengths hold,
whether their CRCs hold, with as little Python per record as possible.

Three steps, each the same verdicts ``store.codec.check_record`` gives record by record:

1. ``walk``: the chain of TOTALSIZE fields, one precompiled ``struct`` read and a few
   integer comparisons per record (magic, smallest size, inside the segment). It stops at
   the first position that is not plainly a message header.
2. ``lengths_hold``: every record's BODYLEN, TOPICLEN and PROPLEN gathered with numpy and
   checked to add up to its TOTALSIZE, all records at once.
3. ``crc_verdicts``: the body CRC and the whole-message CRC (__CRC32#) of every record, two
   ISA-L CRC32 calls over memoryview slices per record (no bytes copied), compared with the
   stored values in numpy: the BODYCRC fields, and the ten decimal digits of the seal read
   as numbers. A record with another seal (the older HCRC, or none) is judged by the codec.

``scan_records_fast`` puts them together and hands whatever the walk cannot judge (a blank
record, unwritten space, a record whose lengths do not hold, a torn tail) to the reference
walk, ``arrow_decode.scan_records``, which goes on from there with the codec itself. The
unit tests hold the two walks equal on damaged logs.
"""

from __future__ import annotations

import struct

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from store import codec

_SIZE_MAGIC = struct.Struct(">iI").unpack_from
_SEAL_PREFIX = np.frombuffer(codec.SEAL_PREFIX, dtype=np.uint8)
_DIGIT_WEIGHTS = 10 ** np.arange(10, dtype=np.int64)      # least significant digit first


def walk(buffer, begin: int, end: int, limit: int) -> tuple[list[int], list[int], int]:
    """Positions and TOTALSIZEs of the records that plainly start a message, from ``begin``
    while the position is before ``end``; and the position the walk stopped at."""
    positions: list[int] = []
    sizes: list[int] = []
    add_position, add_size = positions.append, sizes.append
    magic_wanted, smallest = codec.MESSAGE_MAGIC, codec.FIXED_SIZE
    header_room = limit - 8
    position = begin
    read = _SIZE_MAGIC
    while position < end and position <= header_room:
        size, magic = read(buffer, position)
        if magic != magic_wanted or size < smallest or position + size > limit:
            break
        add_position(position)
        add_size(size)
        position += size
    return positions, sizes, position


def _rows(data: np.ndarray, at: np.ndarray, width: int) -> np.ndarray:
    """``data[at[i]:at[i] + width]`` for every i, as an (n, width) array: rows of a sliding
    window, one small copy per row instead of an index per byte."""
    return sliding_window_view(data, width)[at]


def _big_endian_i32(rows: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(rows).view(">i4").reshape(len(rows)).astype(np.int64)


def lengths_hold(data: np.ndarray, positions: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray,
                                                                                        np.ndarray]:
    """Per record: whether its length fields add up to TOTALSIZE (as ``check_record``), and
    its body and properties lengths (meaningless where the first is false)."""
    count = len(positions)
    ends = positions + sizes
    if count == 0:
        empty = np.zeros(0, dtype=np.int64)
        return np.zeros(0, dtype=bool), empty, empty
    body_length = _big_endian_i32(_rows(data, positions + codec.BODY_LENGTH_AT, 4))
    topic_at = positions + codec.HEADER.size + body_length
    ok = (body_length >= 0) & (topic_at + 1 <= ends)
    safe_topic_at = np.where(ok, topic_at, positions)
    topic_length = data[safe_topic_at].astype(np.int64)
    props_at = safe_topic_at + 1 + topic_length
    ok &= props_at + 2 <= ends
    safe_props_at = np.where(ok, props_at, positions)
    props_length = (data[safe_props_at].astype(np.int64) << 8) | data[safe_props_at + 1]
    ok &= safe_props_at + 2 + props_length == ends
    return ok, body_length, props_length


def crc_verdicts(buffer, data: np.ndarray, positions: np.ndarray, sizes: np.ndarray, body_length: np.ndarray,
                 props_length: np.ndarray) -> np.ndarray:
    """Per record (whose lengths hold): whether its CRCs hold, as ``check_record`` says."""
    count = len(positions)
    if count == 0:
        return np.zeros(0, dtype=bool)
    crc = codec.crc32
    view = memoryview(buffer)
    body_at = (positions + codec.HEADER.size).tolist()
    body_end = (positions + codec.HEADER.size + body_length).tolist()
    sealed_end = positions + sizes - codec.SEAL_PROPERTY_BYTES
    body_crcs = np.array([crc(view[a:b]) for a, b in zip(body_at, body_end)], dtype=np.int64) & 0x7FFFFFFF
    stored_body = _big_endian_i32(_rows(data, positions + 8, 4))
    ok = body_crcs == stored_body       # a stored negative value never matches a masked CRC, as in the codec
    # the seal: "__CRC32#\x01", ten digits least significant first, "\x02"
    has_seal = props_length >= codec.SEAL_PROPERTY_BYTES
    prefix_at = np.where(has_seal, sealed_end, positions)
    seal_rows = _rows(data, prefix_at, codec.SEAL_PROPERTY_BYTES)      # prefix, ten digits, closing byte
    has_seal &= (seal_rows[:, :len(_SEAL_PREFIX)] == _SEAL_PREFIX).all(axis=1)
    sealed = np.flatnonzero(has_seal)
    seal_rows = seal_rows[sealed]
    digits = seal_rows[:, len(_SEAL_PREFIX):len(_SEAL_PREFIX) + 10].astype(np.int64) - 48
    closing = seal_rows[:, -1]
    starts, stops = positions[sealed].tolist(), sealed_end[sealed].tolist()
    whole = np.array([crc(view[a:b]) for a, b in zip(starts, stops)], dtype=np.int64) & 0x7FFFFFFF
    seal_ok = ((digits >= 0) & (digits <= 9)).all(axis=1) & (closing == 2) & \
        ((digits * _DIGIT_WEIGHTS).sum(axis=1) == whole)
    verdict = np.zeros(count, dtype=bool)
    verdict[sealed] = ok[sealed] & seal_ok
    for index in np.flatnonzero(~has_seal).tolist():    # another seal, or none: the codec decides
        try:
            codec.check_record(buffer, int(positions[index]), len(buffer), check_crc=True)
            verdict[index] = True
        except codec.CorruptMessage:
            verdict[index] = False
    del view
    return verdict


def scan_records_fast(buffer, begin: int, end: int, limit: int, *, verify: bool = True):
    """The same ScanResult as ``arrow_decode.scan_records`` (the reference), faster."""
    from .arrow_decode import ScanResult, scan_records
    positions_list, sizes_list, stopped = walk(buffer, begin, end, limit)
    positions = np.array(positions_list, dtype=np.int64)
    sizes = np.array(sizes_list, dtype=np.int64)
    data = np.frombuffer(buffer, dtype=np.uint8) if len(positions) else None
    if len(positions):
        holds, body_length, props_length = lengths_hold(data, positions, sizes)
        if not holds.all():        # the reference walk judges from the first record that does not hold
            first_bad = int(np.argmin(holds))
            stopped = int(positions[first_bad])
            positions, sizes = positions[:first_bad], sizes[:first_bad]
            body_length, props_length = body_length[:first_bad], props_length[:first_bad]
        crc_ok = crc_verdicts(buffer, data, positions, sizes, body_length, props_length) if verify \
            else np.ones(len(positions), dtype=bool)
    else:
        crc_ok = np.zeros(0, dtype=bool)
    del data
    if stopped >= end:
        return ScanResult(positions, sizes, crc_ok, None)
    rest = scan_records(buffer, stopped, end, limit, verify=verify)
    return ScanResult(np.concatenate([positions, rest.positions]), np.concatenate([sizes, rest.sizes]),
                      np.concatenate([crc_ok, rest.crc_ok]), rest.bad_tail)


def record_cuts_fast(buffer, limit: int, max_bytes: int) -> list[int]:
    """``segments.record_cuts`` over the fast walk: 0, then the first record boundary at or
    past each ``max_bytes`` step, among records whose lengths hold (the reference stops the
    walk at the first that does not, and so does this)."""
    positions_list, sizes_list, _ = walk(buffer, 0, limit, limit)
    positions = np.array(positions_list, dtype=np.int64)
    sizes = np.array(sizes_list, dtype=np.int64)
    if len(positions):
        holds, _, _ = lengths_hold(np.frombuffer(buffer, dtype=np.uint8), positions, sizes)
        if not holds.all():
            first_bad = int(np.argmin(holds))
            positions, sizes = positions[:first_bad], sizes[:first_bad]
    ends = (positions + sizes).tolist()
    cuts = [0]
    next_cut = max_bytes
    for position in ends:
        if position >= next_cut and position < limit:
            cuts.append(position)
            next_cut = position + max_bytes
    return cuts
