"""Segments to partitions: record boundaries, ranges and pruning. Pure: reads bytes, no Spark.

A partition is a slice of one CommitLog segment, ``[begin, end)`` in file positions, cut
every ``max_bytes`` without reading the segment. Its reader finds where records really start
at both ends (``record_walk.find_record_start``: a record whose lengths hold and whose
PHYSICALOFFSET field names its own place, leading into more such records), and reads the
records that start between them; the reader of the slice before checks that its walk lands
exactly on that start. A segment no larger than ``max_bytes`` is one slice.

A segment wholly outside the wanted physical offset range is dropped by its name alone; one
wholly outside the store time range is dropped after reading only the first record's store
timestamp of it and of the next segment (records are stamped in log order, so a segment's
times lie between its first record's and the next segment's first record's).
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass


from .stores import Segment, StoreDir, first_store_timestamp_ms, list_segments

MAX_BYTES_PER_PARTITION_DEFAULT = 128 * 1024 * 1024   # 32 and 64 MiB measured slower on 2 cores (per-task cost)
MAX_BYTES_PER_PARTITION_MIN = 64 * 1024


@dataclass(frozen=True, slots=True)
class Bounds:
    """What a read wants: physical offsets in ``[offset_min, offset_end)``, store times in
    ``[time_min_ms, time_max_ms]`` (inclusive), topics (None: all). None means unbounded."""

    offset_min: int | None = None
    offset_end: int | None = None
    time_min_ms: int | None = None
    time_max_ms: int | None = None
    topics: frozenset[str] | None = None

    def excludes_offsets(self, first: int, end: int) -> bool:
        """True when no offset of ``[first, end)`` is wanted."""
        return (self.offset_min is not None and end <= self.offset_min) or \
            (self.offset_end is not None and first >= self.offset_end)

    def excludes_times(self, first_ms: int | None, last_ms: int | None) -> bool:
        """True when no time of ``[first_ms, last_ms]`` is wanted (None: unknown, never excluded)."""
        return (self.time_min_ms is not None and last_ms is not None and last_ms < self.time_min_ms) or \
            (self.time_max_ms is not None and first_ms is not None and first_ms > self.time_max_ms)

    def wants_nothing(self) -> bool:
        """True when the bounds contradict each other (an empty range or an empty topic set)."""
        return (self.topics is not None and not self.topics) or \
            (self.offset_min is not None and self.offset_end is not None and self.offset_min >= self.offset_end) or \
            (self.time_min_ms is not None and self.time_max_ms is not None and self.time_min_ms > self.time_max_ms)


@dataclass(frozen=True, slots=True)
class SegmentSlice:
    """One partition: positions ``[begin, end)`` of ``segment`` of ``store``."""

    store: StoreDir
    segment: Segment
    begin: int
    end: int


def map_segment(path: str):
    """The segment's bytes, read-only mapped (``b""`` for an empty file)."""
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size == 0:
            return b""
        return mmap.mmap(handle.fileno(), size, access=mmap.ACCESS_READ)


def segment_slices(store: StoreDir, segment: Segment, max_bytes: int) -> list[SegmentSlice]:
    """A segment as slices of ``max_bytes`` each. Their bounds are nominal: each reader
    starts at the first record at or after its ``begin`` and stops before the first record
    at or after its ``end`` (``record_walk.find_record_start``), so the planner opens no
    segment and walks nothing (``data_end_estimate`` reads a few pages of the newest
    segment, only to weigh the slices)."""
    size = segment.file_bytes
    bounds = list(range(0, size, max_bytes)) + [size]
    return [SegmentSlice(store, segment, begin, end) for begin, end in zip(bounds, bounds[1:])] \
        or [SegmentSlice(store, segment, 0, 0)]


def wanted_segments(segments: list[Segment], bounds: Bounds,
                    first_timestamp=first_store_timestamp_ms) -> list[Segment]:
    """The segments that may hold a wanted record (offsets by name, times by first records)."""
    spans = []
    for index, segment in enumerate(segments):
        end = segments[index + 1].start_offset if index + 1 < len(segments) \
            else segment.start_offset + segment.file_bytes
        if not bounds.excludes_offsets(segment.start_offset, end):
            spans.append(index)
    if bounds.time_min_ms is None and bounds.time_max_ms is None:
        return [segments[index] for index in spans]
    firsts: dict[int, int | None] = {}

    def first_of(index: int) -> int | None:
        if index not in firsts:
            firsts[index] = first_timestamp(segments[index]) if index < len(segments) else None
        return firsts[index]
    return [segments[index] for index in spans
            if not bounds.excludes_times(first_of(index), first_of(index + 1))]


def plan_slices(stores: list[StoreDir], bounds: Bounds,
                max_bytes: int = MAX_BYTES_PER_PARTITION_DEFAULT) -> list[SegmentSlice]:
    """Every slice to read, store by store, in log order."""
    if bounds.wants_nothing():
        return []
    slices = []
    for store in stores:
        for segment in wanted_segments(list_segments(store), bounds):
            slices.extend(segment_slices(store, segment, max_bytes))
    return slices


PAGE = 4096


def data_end_estimate(path: str) -> int:
    """Where a segment's data seems to end: the start of the all-zero pages at its end (the
    unwritten, preallocated space of the newest segment), found by bisection over its
    4 KiB pages, a few reads. Only for weighing partitions (a zero page inside the data can
    make it wrong; the readers find their records themselves)."""
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        low, high = 0, -(-size // PAGE)           # pages [high, end) are all zeros
        while low < high:
            middle = (low + high) // 2
            if any(os.pread(handle.fileno(), PAGE, middle * PAGE)):
                low = middle + 1
            else:
                high = middle
    return min(size, high * PAGE)


def slice_weight(piece: SegmentSlice, data_ends: dict[str, int]) -> int:
    """The bytes of data a slice likely holds (``data_ends``: per segment path, its
    ``data_end_estimate``; a segment not in it counts whole)."""
    end = min(piece.end, data_ends.get(piece.segment.path, piece.end))
    return max(1, end - piece.begin)


def pack_slices(slices: list[SegmentSlice], count: int, weight=None) -> list[tuple[SegmentSlice, ...]]:
    """``slices`` in log order as at most ``count`` runs of about equal weight (``weight``: a
    function of a slice, its bytes by default): one task each.
    On 2 cores, 10 tasks of 128 MiB over 1.15 GB took 0.93-1.2 s where 5 of 256 MiB took
    0.72-0.78 s (same session): every task is a fixed cost, so no more tasks than cores."""
    if not slices:
        return []
    weights = [weight(piece) if weight else max(1, piece.end - piece.begin) for piece in slices]
    total = sum(weights)
    groups: list[list[SegmentSlice]] = [[] for _ in range(min(count, len(slices)))]
    done = 0
    for piece, piece_weight in zip(slices, weights):
        index = min(len(groups) - 1, (2 * done + piece_weight) * len(groups) // (2 * total))
        groups[index].append(piece)
        done += piece_weight
    return [tuple(group) for group in groups if group]
