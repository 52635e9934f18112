"""One partition of the ``commitlog`` source: a segment slice to Arrow record batches, with the
read's bounds applied and its mode (PERMISSIVE or FAILFAST) obeyed. No Spark here: the
executor-side half of the data source, testable on its own."""

from __future__ import annotations

import mmap
from dataclasses import replace
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .arrow_decode import HEADER_COLUMNS, ScanResult, SliceInfo, bad_tail_batch, batch_ranges, decode_batch
from .errors import CorruptLogError
from .record_layout import concat_layouts, empty_layout
from .record_walk import find_record_start, scan_records_fast
from .segments import Bounds, SegmentSlice, map_segment

# a slice is walked and decoded this much at a time: Spark takes in one step's batches while
# the reader walks the next, and the reader holds one step's arrays, not a 128 MiB slice's
SCAN_STEP_BYTES = 16 * 1024 * 1024


def read_slice(piece: SegmentSlice, settings, columns: tuple[str, ...]) -> Iterator[pa.RecordBatch]:
    """The records of ``piece`` as batches of ``columns``. ``settings``: a ReadSettings
    (bounds, mode, verify_crc). The slice is walked a step at a time (``slice_scans``), each
    step's batches yielded before the next is walked, so Spark takes them in while the
    reader works on."""
    bounds: Bounds = settings.bounds
    buffer = map_segment(piece.segment.path)
    try:
        info = SliceInfo(piece.store.node, piece.store.group, piece.segment.name, piece.segment.start_offset)
        needed = columns + tuple(name for name, wanted in (("topic", bounds.topics is not None),
                                                           ("store_timestamp", bounds.time_min_ms is not None
                                                            or bounds.time_max_ms is not None))
                                 if wanted and name not in columns)
        for result in slice_scans(buffer, piece.begin, piece.end, piece.segment.start_offset,
                                  verify=checks_crc(settings, columns), where=piece.segment.path,
                                  whole_header=bool(HEADER_COLUMNS.intersection(needed))):
            if settings.mode == "FAILFAST":
                _fail_fast(result, piece)
            yield from _batches(buffer, result, info, bounds, columns, needed)
            tail = result.bad_tail
            if tail is not None and not bounds.excludes_offsets(info.segment_start + tail.position,
                                                                info.segment_start + tail.position + 1):
                yield bad_tail_batch(tail, info, columns)
    finally:
        if isinstance(buffer, mmap.mmap):
            buffer.close()


def _batches(buffer, result, info: SliceInfo, bounds: Bounds, columns: tuple[str, ...],
             needed: tuple[str, ...]) -> Iterator[pa.RecordBatch]:
    """The whole records of one ScanResult as batches, within the read's bounds."""
    positions, crc_ok, sizes, layout = result.positions, result.crc_ok, result.sizes, result.layout
    offsets = positions + info.segment_start
    keep = np.ones(len(positions), dtype=bool)
    if bounds.offset_min is not None:
        keep &= offsets >= bounds.offset_min
    if bounds.offset_end is not None:
        keep &= offsets < bounds.offset_end
    if not keep.all():
        positions, crc_ok, sizes, layout = positions[keep], crc_ok[keep], sizes[keep], layout.select(keep)
    for first, stop in batch_ranges(sizes):
        batch = decode_batch(buffer, positions[first:stop], crc_ok[first:stop], info, needed,
                             layout.take(first, stop))
        batch = _within(batch, bounds)
        if batch.num_rows:
            yield batch.select(list(columns)) if needed != columns else batch


def checks_crc(settings, columns: tuple[str, ...]) -> bool:
    """Whether the read must compute CRCs: only ``crc_ok`` shows them, and FAILFAST acts on
    them. Without either the rows are the same with or without the check (a record whose
    lengths hold is a row whatever its CRC says), so a projection without ``crc_ok`` skips it."""
    return settings.verify_crc and (settings.mode == "FAILFAST" or "crc_ok" in columns)


def slice_records(buffer, begin: int, end: int, segment_start: int, *, verify: bool = True, where: str = "segment"):
    """The ScanResult of the records a slice with nominal bounds ``[begin, end)`` owns: from
    the first record at or after ``begin`` (0 stays 0) to the first at or after ``end``
    (``slice_scans``'s steps in one)."""
    return concat_scans(list(slice_scans(buffer, begin, end, segment_start, verify=verify, where=where)))


def slice_scans(buffer, begin: int, end: int, segment_start: int, *, verify: bool = True, where: str = "segment",
                step: int = SCAN_STEP_BYTES, whole_header: bool = True) -> Iterator[ScanResult]:
    """``slice_records`` a step at a time: the ScanResults of the records starting in
    successive ``step``-byte stretches of the slice, in log order (each step's walk goes on
    from where the last record of the step before ended). The last one holds the bad tail
    if there is one (its size reaching to the slice's end, as a walk of the whole slice
    gives it); the data ending (a blank record, unwritten space) ends the steps.
    ``whole_header=False``: the layouts hold only the header's length fields (see
    ``record_layout.read_layout``), for reads that build no other header column.

    The walk must end exactly where the next slice's reader starts, or stop early (end of
    data, a bad tail): a record running past that start means the next reader took bytes
    inside it for a record. Never seen short of bytes written to look like a record at that
    very offset; the read fails (CorruptLogError) rather than give rows twice or wrongly."""
    limit = len(buffer)
    first = find_record_start(buffer, begin, limit, segment_start) if begin > 0 else 0
    # where the next slice's reader starts: searched for only once the walk reaches ``end``
    # (or meets a bad tail), so a slice whose data ends before ``end`` never searches the
    # unwritten rest of the segment for a record (the newest segment's tail: 128 MiB of zeros)
    stop = limit if end >= limit else None
    position, last = first, None     # last: (position, end) of the last record walked
    while True:
        if stop is None and position >= end:
            stop = find_record_start(buffer, end, limit, segment_start)
        if last is not None and stop is not None and stop < limit and last[1] > stop:
            raise CorruptLogError(
                f"{where}: the record at file position {last[0]} runs to {last[1]}, past position {stop} "
                f"where the next partition's reader found a record start; read this segment whole "
                f"(maxBytesPerPartition of at least {limit})")
        bound = end if stop is None else stop
        if position >= bound:
            return
        step_end = min(bound, position + step)
        result = scan_records_fast(buffer, position, step_end, limit, verify=verify, whole_header=whole_header)
        tail = result.bad_tail
        if tail is not None:
            if stop is None:
                stop = find_record_start(buffer, end, limit, segment_start)
            result = replace(result, bad_tail=replace(tail, size=max(stop, tail.position) - tail.position))
        if len(result.positions):
            last = (int(result.positions[-1]), int(result.positions[-1] + result.sizes[-1]))
        reached = last[1] if len(result.positions) else position
        yield result
        if tail is not None or reached < step_end:      # a bad tail, or the data ended within the step
            return
        position = reached


def concat_scans(results: list[ScanResult]) -> ScanResult:
    """One ScanResult of consecutive ones (the bad tail is the last one's)."""
    if len(results) == 1:
        return results[0]
    if not results:
        empty = np.zeros(0, dtype=np.int64)
        return ScanResult(empty, empty.copy(), np.zeros(0, dtype=bool), None, empty_layout())
    return ScanResult(np.concatenate([r.positions for r in results]), np.concatenate([r.sizes for r in results]),
                      np.concatenate([r.crc_ok for r in results]), results[-1].bad_tail,
                      concat_layouts([r.layout for r in results]))


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
