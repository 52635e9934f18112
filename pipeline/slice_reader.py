"""One partition of the ``commitlog`` source: a segment slice to Arrow record batches, with the
read's bounds applied and its mode (PERMISSIVE or FAILFAST) obeyed. No Spark here: the
executor-side half of the data source, testable on its own."""

from __future__ import annotations

import mmap
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .arrow_decode import SliceInfo, bad_tail_batch, batch_ranges, decode_batch
from .errors import CorruptLogError
from .record_walk import find_record_start, scan_records_fast
from .segments import Bounds, SegmentSlice, map_segment


def read_slice(piece: SegmentSlice, settings, columns: tuple[str, ...]) -> Iterator[pa.RecordBatch]:
    """The records of ``piece`` as batches of ``columns``. ``settings``: a ReadSettings
    (bounds, mode, verify_crc)."""
    bounds: Bounds = settings.bounds
    buffer = map_segment(piece.segment.path)
    try:
        result = slice_records(buffer, piece.begin, piece.end, piece.segment.start_offset,
                               verify=checks_crc(settings, columns), where=piece.segment.path)
        info = SliceInfo(piece.store.node, piece.store.group, piece.segment.name, piece.segment.start_offset)
        if settings.mode == "FAILFAST":
            _fail_fast(result, piece)
        positions, crc_ok, sizes, layout = result.positions, result.crc_ok, result.sizes, result.layout
        offsets = positions + piece.segment.start_offset
        keep = np.ones(len(positions), dtype=bool)
        if bounds.offset_min is not None:
            keep &= offsets >= bounds.offset_min
        if bounds.offset_end is not None:
            keep &= offsets < bounds.offset_end
        if not keep.all():
            positions, crc_ok, sizes, layout = positions[keep], crc_ok[keep], sizes[keep], layout.select(keep)
        needed = columns + tuple(name for name, wanted in (("topic", bounds.topics is not None),
                                                           ("store_timestamp", bounds.time_min_ms is not None
                                                            or bounds.time_max_ms is not None))
                                 if wanted and name not in columns)
        for first, stop in batch_ranges(sizes):
            batch = decode_batch(buffer, positions[first:stop], crc_ok[first:stop], info, needed,
                                 layout.take(first, stop))
            batch = _within(batch, bounds)
            if batch.num_rows:
                yield batch.select(list(columns)) if needed != columns else batch
        tail = result.bad_tail
        if tail is not None and not bounds.excludes_offsets(info.segment_start + tail.position,
                                                            info.segment_start + tail.position + 1):
            yield bad_tail_batch(tail, info, columns)
    finally:
        if isinstance(buffer, mmap.mmap):
            buffer.close()


def checks_crc(settings, columns: tuple[str, ...]) -> bool:
    """Whether the read must compute CRCs: only ``crc_ok`` shows them, and FAILFAST acts on
    them. Without either the rows are the same with or without the check (a record whose
    lengths hold is a row whatever its CRC says), so a projection without ``crc_ok`` skips it."""
    return settings.verify_crc and (settings.mode == "FAILFAST" or "crc_ok" in columns)


def slice_records(buffer, begin: int, end: int, segment_start: int, *, verify: bool = True, where: str = "segment"):
    """The ScanResult of the records a slice with nominal bounds ``[begin, end)`` owns: from
    the first record at or after ``begin`` (0 stays 0) to the first at or after ``end``.

    The walk must end exactly where the next slice's reader starts, or stop early (end of
    data, a bad tail): a record running past that start means the next reader took bytes
    inside it for a record. Never seen short of bytes written to look like a record at that
    very offset; the read fails (CorruptLogError) rather than give rows twice or wrongly."""
    limit = len(buffer)
    first = find_record_start(buffer, begin, limit, segment_start) if begin > 0 else 0
    stop = find_record_start(buffer, end, limit, segment_start) if end < limit else limit
    result = scan_records_fast(buffer, first, stop, limit, verify=verify)
    if stop < limit and result.bad_tail is None and len(result.positions):
        last_end = int(result.positions[-1] + result.sizes[-1])
        if last_end > stop:
            raise CorruptLogError(
                f"{where}: the record at file position {int(result.positions[-1])} runs to {last_end}, past "
                f"position {stop} where the next partition's reader found a record start; read this segment "
                f"whole (maxBytesPerPartition of at least {limit})")
    return result


def _fail_fast(result, piece: SegmentSlice) -> None:
    start = piece.segment.start_offset
    bad = np.flatnonzero(~result.crc_ok)
    if len(bad):
        raise CorruptLogError(f"{piece.segment.path}: record at physical offset {start + int(result.positions[bad[0]])} "
                              f"fails its CRC (mode=FAILFAST; PERMISSIVE gives it as a row with crc_ok=false)")
    if result.bad_tail is not None:
        raise CorruptLogError(f"{piece.segment.path}: no whole record at physical offset "
                              f"{start + result.bad_tail.position}: {result.bad_tail.problem} (mode=FAILFAST)")


def _within(batch: pa.RecordBatch, bounds: Bounds) -> pa.RecordBatch:
    """Rows inside the topic and time bounds (offsets were applied before decoding)."""
    mask = None
    if bounds.topics is not None:
        mask = pc.is_in(batch.column("topic"), value_set=pa.array(sorted(bounds.topics), pa.string()))
    if bounds.time_min_ms is not None or bounds.time_max_ms is not None:
        times = batch.column("store_timestamp").cast(pa.int64())
        if bounds.time_min_ms is not None:
            low = pc.greater_equal(times, bounds.time_min_ms * 1000)
            mask = low if mask is None else pc.and_(mask, low)
        if bounds.time_max_ms is not None:
            high = pc.less_equal(times, bounds.time_max_ms * 1000)
            mask = high if mask is None else pc.and_(mask, high)
    return batch if mask is None else batch.filter(mask)
