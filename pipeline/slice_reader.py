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
from .record_walk import scan_records_fast
from .segments import Bounds, SegmentSlice, map_segment


def read_slice(piece: SegmentSlice, settings, columns: tuple[str, ...]) -> Iterator[pa.RecordBatch]:
    """The records of ``piece`` as batches of ``columns``. ``settings``: a ReadSettings
    (bounds, mode, verify_crc)."""
    bounds: Bounds = settings.bounds
    buffer = map_segment(piece.segment.path)
    try:
        limit = len(buffer)
        result = scan_records_fast(buffer, piece.begin, min(piece.end, limit), limit, verify=settings.verify_crc)
        info = SliceInfo(piece.store.node, piece.store.group, piece.segment.name, piece.segment.start_offset)
        if settings.mode == "FAILFAST":
            _fail_fast(result, piece)
        positions, crc_ok, sizes = result.positions, result.crc_ok, result.sizes
        offsets = positions + piece.segment.start_offset
        keep = np.ones(len(positions), dtype=bool)
        if bounds.offset_min is not None:
            keep &= offsets >= bounds.offset_min
        if bounds.offset_end is not None:
            keep &= offsets < bounds.offset_end
        positions, crc_ok, sizes = positions[keep], crc_ok[keep], sizes[keep]
        needed = columns + tuple(name for name, wanted in (("topic", bounds.topics is not None),
                                                           ("store_timestamp", bounds.time_min_ms is not None
                                                            or bounds.time_max_ms is not None))
                                 if wanted and name not in columns)
        for first, stop in batch_ranges(sizes):
            batch = decode_batch(buffer, positions[first:stop], crc_ok[first:stop], info, needed)
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
