"""The fast record walk of a CommitLog slice: where records start, whether their lengths hold,
whether their CRCs hold, with as little Python per record as possible.

Three steps, each the same verdicts ``store.codec.check_record`` gives record by record:

1. ``chain_walk.walk_chains`` (long slices) or ``walk``: the chain of TOTALSIZE fields.
   ``walk`` reads one precompiled ``struct`` field and makes two integer comparisons per
   record (smallest size, inside the segment), and reads runs of records of one size in
   numpy; ``walk_chains`` follows many chains at once in numpy, whatever the sizes. Both
   stop at the first position that is not plainly a message header.
2. ``record_layout.read_layout``: every record's magic, BODYLEN, TOPICLEN and PROPLEN
   gathered with numpy (two passes over the log) and checked to add up to its TOTALSIZE,
   all records at once; what it gathered is kept for the decoder.
3. ``crc_verdicts``: the body CRC and the whole-message CRC (__CRC32#) of every record, two
   ISA-L CRC32 calls over memoryview slices per record (no bytes copied, the loop in
   ``map``), compared with the stored values in numpy: the BODYCRC fields, and the ten
   decimal digits of the seal read as numbers. A record with another seal (the older HCRC,
   or none) is judged by the codec.

``scan_records_fast`` puts them together and hands whatever the walk cannot judge (a blank
record, unwritten space, a record whose lengths do not hold, a torn tail) to the reference
walk, ``arrow_decode.scan_records``, which goes on from there with the codec itself. The
unit tests hold the walks equal on damaged logs.
"""

from __future__ import annotations

import struct

import numpy as np

from store import codec

_SIZE_MAGIC = struct.Struct(">iI").unpack_from
_SIZE = struct.Struct(">i")
_SEAL_PREFIX = np.frombuffer(codec.SEAL_PREFIX, dtype=np.uint8)
_DIGIT_WEIGHTS = 10 ** np.arange(10, dtype=np.int64)      # least significant digit first


RUN_PROBE_FIRST = 16          # records of one size looked at in numpy at once, doubling up to
RUN_PROBE_MAX = 65_536        # this while every one matches
RUN_SHORT = 8                 # a run shorter than this makes the walk wait before probing again
RUN_PAUSE_MAX = 1024


def walk(buffer, begin: int, end: int, limit: int, *, check_magic: bool = True) -> tuple[np.ndarray, np.ndarray,
                                                                                         int]:
    """Positions and TOTALSIZEs of the records that plainly start a message, from ``begin``
    while the position is before ``end``; and the position the walk stopped at.

    The loop only follows TOTALSIZE (the least Python per record). When two records in a
    row have the same size, the walk guesses a run of that size and reads the TOTALSIZE
    fields of the next records at once in numpy (rows of a sliding window), taking every
    record up to the first that differs: the same records the loop would take one by one.
    Runs that stay short make it wait longer before guessing again. The magic of every
    record is checked afterwards in numpy, and the walk is cut back to the first record
    whose magic is wrong."""
    singles: list[int] = []
    add_position = singles.append
    pieces: list[np.ndarray] = []
    smallest = codec.FIXED_SIZE
    header_room = limit - 8
    position = begin
    read = _SIZE.unpack_from
    data = None
    previous, wait, pause = -1, 0, 4
    while position < end and position <= header_room:
        size = read(buffer, position)[0]
        if size < smallest or position + size > limit:
            break
        if size != previous or wait > 0:
            add_position(position)
            position += size
            previous = size
            wait -= 1
            continue
        if data is None:
            data = np.frombuffer(buffer, dtype=np.uint8)
        last_allowed = min(end - 1, header_room, limit - size)
        first, probe = position, RUN_PROBE_FIRST
        while position <= last_allowed:
            count = min(probe, (last_allowed - position) // size + 1)
            # the TOTALSIZE fields a run would have, read in place: a strided view, no copy
            matched = np.ndarray((count,), dtype=">i4", buffer=data, offset=position, strides=(size,)) == size
            taken = count if matched.all() else int(np.argmin(matched))
            position += taken * size
            if taken < count:
                break
            probe = min(probe * 2, RUN_PROBE_MAX)
        if singles:
            pieces.append(np.array(singles, dtype=np.int64))
            singles.clear()
        pieces.append(np.arange(first, position, size, dtype=np.int64))
        if (position - first) // size < RUN_SHORT:
            wait, pause = pause, min(pause * 2, RUN_PAUSE_MAX)
        else:
            pause = 4
        previous = -1       # the record at the new position is read by the loop
    del data
    if singles:
        pieces.append(np.array(singles, dtype=np.int64))
    at = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)
    if not len(at):
        return at, at.copy(), position
    sizes = np.empty(len(at), dtype=np.int64)
    sizes[:-1] = np.diff(at)
    sizes[-1] = position - at[-1]
    if not check_magic:
        return at, sizes, position
    magic = field_values(np.frombuffer(buffer, dtype=np.uint8), ">u4")[at + 4]
    wrong = np.flatnonzero(magic != codec.MESSAGE_MAGIC)
    if len(wrong):
        first = int(wrong[0])
        return at[:first], sizes[:first], int(at[first])
    return at, sizes, position


def gather_rows(data: np.ndarray, at: np.ndarray, width: int) -> np.ndarray:
    """``data[at[i]:at[i] + width]`` for every i (each inside ``data``), as a C-contiguous
    (n, width) uint8 array. Each row is one item of a ``width``-byte void type laid over
    ``data`` at every byte, so numpy copies it whole; rows of a uint8 sliding window are
    copied byte by byte, 1.3 to 4x slower (4 to 88 bytes)."""
    rows = field_values(data, np.dtype(f"V{width}"))[at]
    return rows.view(np.uint8).reshape(len(at), width)


def field_values(data: np.ndarray, dtype) -> np.ndarray:
    """A ``dtype`` item starting at every byte of ``data`` (that has room for one): index it
    with positions to read that field of many records."""
    dtype = np.dtype(dtype)
    return np.ndarray((max(0, len(data) - dtype.itemsize + 1),), dtype=dtype, buffer=data, strides=(1,))


def crc_verdicts(buffer, data: np.ndarray, positions: np.ndarray, sizes: np.ndarray, layout) -> np.ndarray:
    """Per record (whose lengths hold; ``layout``: their RecordLayout): whether its CRCs hold,
    as ``check_record`` says."""
    count = len(positions)
    if count == 0:
        return np.zeros(0, dtype=bool)
    crc = codec.crc32
    view = memoryview(buffer)
    body_length, props_length = layout.body_length, layout.props_length
    body_at = positions + codec.HEADER.size
    sealed_end = positions + sizes - codec.SEAL_PROPERTY_BYTES
    body_crcs = _crcs(view, body_at, body_at + body_length) & 0x7FFFFFFF
    ok = body_crcs == layout.header["body_crc"].astype(np.int64)   # a stored negative never matches, as in the codec
    # the seal: "__CRC32#\x01", ten digits least significant first, "\x02"
    has_seal = props_length >= codec.SEAL_PROPERTY_BYTES
    prefix_at = np.where(has_seal, sealed_end, positions)
    seal_rows = gather_rows(data, prefix_at, codec.SEAL_PROPERTY_BYTES)      # prefix, ten digits, closing byte
    has_seal &= (seal_rows[:, :len(_SEAL_PREFIX)] == _SEAL_PREFIX).all(axis=1)
    sealed = np.flatnonzero(has_seal)
    seal_rows = seal_rows[sealed]
    digits = seal_rows[:, len(_SEAL_PREFIX):len(_SEAL_PREFIX) + 10].astype(np.int64) - 48
    closing = seal_rows[:, -1]
    whole = _crcs(view, positions[sealed], sealed_end[sealed]) & 0x7FFFFFFF
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


def _crcs(view: memoryview, starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
    """CRC32 of ``view[start:stop]`` for every pair (no bytes copied): the loop runs in ``map``,
    not in Python bytecode."""
    spans = map(view.__getitem__, map(slice, starts.tolist(), stops.tolist()))
    return np.fromiter(map(codec.crc32, spans), dtype=np.int64, count=len(starts))


def scan_records_fast(buffer, begin: int, end: int, limit: int, *, verify: bool = True, whole_header: bool = True):
    """The same ScanResult as ``arrow_decode.scan_records`` (the reference), faster, with the
    RecordLayout of its records (which the decoder reuses; ``whole_header=False``: its header
    holds only the length fields, unless ``verify`` needs the body CRC field)."""
    from .arrow_decode import ScanResult, scan_records
    from .chain_walk import walk_chains
    from .record_layout import concat_layouts, empty_layout, read_layout
    whole_header = whole_header or verify
    positions, sizes, stopped = walk_chains(buffer, begin, end, limit)
    data = np.frombuffer(buffer, dtype=np.uint8) if len(positions) else None
    layout = empty_layout(whole_header)
    if len(positions):
        holds, layout = read_layout(data, positions, sizes, whole_header=whole_header)
        if not holds.all():        # the reference walk judges from the first record that does not hold
            first_bad = int(np.argmin(holds))
            stopped = int(positions[first_bad])
            positions, sizes, layout = positions[:first_bad], sizes[:first_bad], layout.take(0, first_bad)
        crc_ok = crc_verdicts(buffer, data, positions, sizes, layout) if verify \
            else np.ones(len(positions), dtype=bool)
    else:
        crc_ok = np.zeros(0, dtype=bool)
    if stopped >= end:
        return ScanResult(positions, sizes, crc_ok, None, layout)
    rest = scan_records(buffer, stopped, end, limit, verify=verify)
    if len(rest.positions):
        data = np.frombuffer(buffer, dtype=np.uint8)
        layout = concat_layouts([layout, read_layout(data, rest.positions, rest.sizes, whole_header=whole_header)[1]])
    del data
    return ScanResult(np.concatenate([positions, rest.positions]), np.concatenate([sizes, rest.sizes]),
                      np.concatenate([crc_ok, rest.crc_ok]), rest.bad_tail, layout)


_MAGIC_BYTES = codec.MESSAGE_MAGIC.to_bytes(4, "big")
_PHYSICAL_OFFSET = struct.Struct(">q").unpack_from
CHAIN_CHECKED = 8       # records a partition start must lead into (or the end of data)


def _plain_record(buffer, position: int, limit: int, segment_start: int) -> int:
    """TOTALSIZE of the record at ``position`` if it is plainly one written there: magic,
    lengths that hold (``codec.check_record`` without CRCs) and the PHYSICALOFFSET the store
    wrote into it equal to its own place in the log; else 0."""
    if position + codec.FIXED_SIZE > limit:
        return 0
    size, magic = _SIZE_MAGIC(buffer, position)
    if magic != codec.MESSAGE_MAGIC or size < codec.FIXED_SIZE or position + size > limit \
            or _PHYSICAL_OFFSET(buffer, position + codec.PHYSICAL_OFFSET_AT)[0] != segment_start + position:
        return 0
    try:
        codec.check_record(buffer, position, limit, check_crc=False)
    except codec.CorruptMessage:
        return 0
    return size


def _ends_data(buffer, position: int, limit: int) -> bool:
    """Whether the log's data plainly ends at ``position``: the segment's end, unwritten
    space (TOTALSIZE 0) or the blank record that closes a segment."""
    if position >= limit:
        return True
    if position + 8 > limit:
        return not any(bytes(buffer[position:limit]))
    size, magic = _SIZE_MAGIC(buffer, position)
    return size == 0 or (magic == codec.BLANK_MAGIC and position + size == limit)


ZERO_CHUNK = 1 << 20


def _past_zeros(buffer, at: int, limit: int) -> int:
    """The first position at or after ``at`` whose byte is not zero (``limit`` if none): the
    unwritten end of a segment is skipped in numpy, ~8x faster than a byte search over it
    (the magic has no zero byte, so no candidate is passed over)."""
    data = np.frombuffer(buffer, dtype=np.uint8) if len(buffer) else np.zeros(0, dtype=np.uint8)
    while at < limit:
        chunk = data[at:min(limit, at + ZERO_CHUNK)]
        if chunk.any():
            return at + int(np.argmax(chunk != 0))
        at += len(chunk)
    return limit


def find_record_start(buffer, at: int, limit: int, segment_start: int) -> int:
    """The first position at or after ``at`` where a record verifiably starts, or ``limit``.

    A partition of a large segment starts here, found by its own reader instead of a walk
    from the segment's start. A candidate is a place where the message magic sits; it must
    hold a plain record (``_plain_record``: lengths that add up, and the PHYSICALOFFSET
    field naming that very place, which bytes inside a body do not do unless written to
    fool exactly this position) leading through ``CHAIN_CHECKED`` more such records, or
    into the end of data. Deterministic: the reader before it asks the same question about
    its own end, so two neighbours agree on the cut; ``scan_records_fast``'s caller checks
    that the walk from the start really lands there."""
    found = buffer.find(_MAGIC_BYTES, max(at, _past_zeros(buffer, at, limit) - 4) + 4)
    while 0 <= found < limit:
        candidate = found - 4
        position, chained = candidate, 0
        while chained <= CHAIN_CHECKED:
            size = _plain_record(buffer, position, limit, segment_start)
            if not size:
                break
            position += size
            chained += 1
            if _ends_data(buffer, position, limit):
                chained = CHAIN_CHECKED + 1
        if chained > CHAIN_CHECKED:
            return candidate
        found = buffer.find(_MAGIC_BYTES, found + 1)
    return limit
