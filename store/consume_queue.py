"""ConsumeQueue: per topic/queue index of CommitLog positions, one fixed entry per message.

    consumequeue/{topic}/{queueId}/{start byte offset, 20 digits}
    entry (20 bytes, big-endian):
        0  8  commit log offset
        8  4  message size
       12  8  tags hash code (Java String.hashCode of TAGS, 0 without tags)

Queue offset = entry index; entry i lives at byte i * 20. 300,000 entries per file by
default (6,000,000 bytes). An all-zero entry (size 0) is not yet written. When a queue's
first entry lands past the start of its file (replicas and retention start queues past 0),
the entries before it in that file are RocketMQ's filler (``fillPreBlank``): commit log
offset 0, size Integer.MAX_VALUE, tags 0, which RocketMQ's ``ConsumeQueue.recover`` steps
over (it stops at zeros). Readers treat filler as absent, as they do an all-zero hole
(stores written before filler existed). Entries are built by the dispatcher from the
CommitLog.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from .errors import invariant
from .mapped_file_queue import MappedFileQueue

ENTRY = struct.Struct(">qiq")
ENTRY_BYTES = ENTRY.size
assert ENTRY_BYTES == 20
_SIZE_AT = 8
FILLER_SIZE = 2**31 - 1                 # Integer.MAX_VALUE
FILLER = ENTRY.pack(0, FILLER_SIZE, 0)


def is_entry(physical_offset: int, size: int) -> bool:
    """Whether a stored entry names a message: not a hole (size 0) and not filler."""
    return 0 < size < FILLER_SIZE


@dataclass(frozen=True, slots=True)
class QueueEntry:
    queue_offset: int
    physical_offset: int
    size: int
    tags_code: int


class ConsumeQueue:
    """The entries of one topic/queue, over a MappedFileQueue of entry files."""

    def __init__(self, root: str, topic: str, queue_id: int, entries_per_file: int) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.directory = os.path.join(root, topic, str(queue_id))
        # written an entry at a time from empty: no read-around on a new file's first fault
        self.files = MappedFileQueue(self.directory, entries_per_file * ENTRY_BYTES, fault_around_created=False)
        self.min_offset = 0           # first valid queue offset
        self.max_offset = 0           # one past the last entry
        self.dirty: set = set()       # files written since the last flush
        self.suspect = ""             # why ``load`` found the entries inconsistent ('' if not)

    # --- loading -------------------------------------------------------------------------
    def load(self) -> None:
        """Map the files and find the first and last entries."""
        self.files.load()
        if not self.files.files:
            return
        first = self.files.files[0]
        first_position = self._first_entry_position(first)
        self.min_offset = (first.start_offset + first_position) // ENTRY_BYTES
        last = self.files.files[-1]
        start = first_position if last is first else 0
        self.max_offset = (last.start_offset + self._end_position(last, start)) // ENTRY_BYTES
        if self.max_offset < self.min_offset:
            self.max_offset = self.min_offset
        self.suspect = self._self_check(first, first_position)

    def _self_check(self, first, first_position: int) -> str:
        """Why the entries cannot be what a dispatcher wrote ('' if they can), without the
        log: zeros before the first entry where filler belongs, a hole or filler between the
        first and last entries, sizes out of range, commit log offsets not increasing.
        Integrity rebuilds a suspect queue from the log."""
        if first_position and first_position < first.size and first.mm[:ENTRY_BYTES] != FILLER:
            return f"no filler before the first entry (queue offset {self.min_offset})"
        if self.max_offset <= self.min_offset:
            return ""
        import numpy as np
        dtype = np.dtype([("offset", ">i8"), ("size", ">i4"), ("tags", ">i8")])
        parts = []
        for mapped in self.files.files:
            low = max(self.min_offset * ENTRY_BYTES, mapped.start_offset)
            high = min(self.max_offset * ENTRY_BYTES, mapped.end_offset)
            if low < high:
                parts.append(np.frombuffer(mapped.mm[low - mapped.start_offset:high - mapped.start_offset], dtype))
        entries = np.concatenate(parts)
        offsets, sizes = entries["offset"].astype(np.int64), entries["size"].astype(np.int64)
        if bool(((sizes <= 0) | (sizes >= FILLER_SIZE)).any()):
            return "a hole or filler between the first and last entries"
        if bool((offsets < 0).any()) or (len(offsets) > 1 and bool((offsets[1:] < offsets[:-1] + sizes[:-1]).any())):
            return "commit log offsets out of order"
        last = self.files.files[-1]
        end = self.max_offset * ENTRY_BYTES - last.start_offset
        if 0 <= end < last.size and last.mm[end:min(last.size, end + 20 * ENTRY_BYTES)] != bytes(
                min(last.size, end + 20 * ENTRY_BYTES) - end):
            return "bytes after the last entry"
        return ""

    @staticmethod
    def _size_at(mm, position: int) -> int:
        return struct.unpack_from(">i", mm, position + _SIZE_AT)[0]

    def _first_entry_position(self, mapped) -> int:
        # leading holes come only before a queue's first entry; entries are contiguous after
        mm = mapped.mm
        for position in range(0, mapped.size, ENTRY_BYTES):
            if 0 < self._size_at(mm, position) < FILLER_SIZE:
                return position
        return mapped.size

    def _end_position(self, mapped, low: int) -> int:
        """Binary search: entries [low, end) are written, [end, size) are zero."""
        count = (mapped.size - low) // ENTRY_BYTES
        lo, hi = 0, count
        while lo < hi:
            mid = (lo + hi) // 2
            if self._size_at(mapped.mm, low + mid * ENTRY_BYTES) > 0:
                lo = mid + 1
            else:
                hi = mid
        return low + lo * ENTRY_BYTES

    # --- writing -------------------------------------------------------------------------
    def append_entries(self, first_queue_offset: int, data: bytes) -> None:
        """Write entries (already packed) starting at ``first_queue_offset``.

        Entries below ``max_offset`` are already there (a re-dispatch): skipped. A gap
        above ``max_offset`` is allowed only for an empty queue (its first entry may be
        anywhere: replicas and retention start queues past 0).
        """
        if first_queue_offset == self.max_offset:
            # the usual call, right after the last entry and inside the last file: one copy
            files = self.files.files
            if files:
                mapped = files[-1]
                position = first_queue_offset * ENTRY_BYTES - mapped.start_offset
                if 0 <= position <= mapped.size - len(data):
                    mapped.mm[position:position + len(data)] = data
                    self.dirty.add(mapped)
                    self.max_offset = first_queue_offset + len(data) // ENTRY_BYTES
                    return
        count = len(data) // ENTRY_BYTES
        skip = self.max_offset - first_queue_offset
        fill_before = None
        if skip > 0:
            if skip >= count:
                return
            data = data[skip * ENTRY_BYTES:]
            first_queue_offset = self.max_offset
        elif skip < 0:
            invariant(self.max_offset == self.min_offset,
                      f"consume queue {self.topic}/{self.queue_id}: gap from {self.max_offset} to {first_queue_offset}")
            self.min_offset = first_queue_offset
            fill_before = first_queue_offset
        offset = first_queue_offset * ENTRY_BYTES
        written = 0
        while written < len(data):
            mapped = self.files.find(offset)
            if mapped is None:
                last = self.files.last
                start = offset - offset % self.files.file_size
                if last is not None and last.end_offset < start:
                    invariant(self.max_offset == self.min_offset, "files of a queue are contiguous")
                    self.files.reset_to(start)
                    mapped = self.files.last
                elif last is None:
                    mapped = self.files.reset_to(start)
                else:
                    mapped = self.files.roll(last.end_offset)
            position = offset - mapped.start_offset
            if fill_before is not None:
                _fill_pre_blank(mapped, position)
                fill_before = None
            step = min(len(data) - written, mapped.size - position)
            mapped.mm[position:position + step] = data[written:written + step]
            self.dirty.add(mapped)
            written += step
            offset += step
        self.max_offset = first_queue_offset + len(data) // ENTRY_BYTES

    # --- reading -------------------------------------------------------------------------
    def entries(self, queue_offset: int, max_count: int) -> list[QueueEntry]:
        """Up to ``max_count`` entries from ``queue_offset`` (fewer at a file's end); an
        entry of size FILLER_SIZE names no record (see ``integrity``)."""
        queue_offset = max(queue_offset, self.min_offset)
        count = min(max_count, self.max_offset - queue_offset)
        if count <= 0:
            return []
        offset = queue_offset * ENTRY_BYTES
        mapped = self.files.find(offset)
        if mapped is None:
            return []
        position = offset - mapped.start_offset
        count = min(count, (mapped.size - position) // ENTRY_BYTES)
        raw = mapped.mm[position:position + count * ENTRY_BYTES]
        result = []
        for index, (physical_offset, size, tags_code) in enumerate(ENTRY.iter_unpack(raw)):
            # filler past min_offset stands for a record a rebuild found unreadable: returned,
            # so that readers report its offset as lost instead of stopping there
            if size <= 0:
                break
            result.append(QueueEntry(queue_offset + index, physical_offset, size, tags_code))
        return result

    def entry(self, queue_offset: int) -> QueueEntry | None:
        found = self.entries(queue_offset, 1)
        return found[0] if found else None

    def physical_offset_at(self, queue_offset: int) -> int:
        mapped = self.files.find(queue_offset * ENTRY_BYTES)
        invariant(mapped is not None, "queue offset inside the queue")
        return struct.unpack_from(">q", mapped.mm, queue_offset * ENTRY_BYTES - mapped.start_offset)[0]

    # --- cutting -------------------------------------------------------------------------
    def truncate_physical(self, physical_offset: int) -> None:
        """Drop entries that point at or past ``physical_offset`` (the log was cut there).

        Filler and holes name no offset: each goes with the first entry after it, kept when
        that entry is kept and dropped with it (trailing ones, with nothing after them, are
        dropped). Entries of a range no file holds (a queue a rebuild emptied) count as
        holes. Never raises for what the entries hold."""
        lo, hi = self.min_offset, self.max_offset
        # the first queue offset whose next real entry points at or past the cut, or has none
        # (the predicate only turns true going up: commit log offsets grow with queue offsets)
        while lo < hi:
            mid = (lo + hi) // 2
            found = self._next_real_entry(mid, hi)
            if found is not None and found[1] < physical_offset:
                lo = found[0] + 1
            else:
                hi = mid
        if lo == self.max_offset:
            return
        self.files.truncate(lo * ENTRY_BYTES)
        self.max_offset = lo
        if lo <= self.min_offset:
            self.min_offset = self.max_offset = lo
        self.dirty = {m for m in self.dirty if m in self.files.files}

    def _next_real_entry(self, queue_offset: int, end: int) -> tuple[int, int] | None:
        """(queue offset, commit log offset) of the first entry in [queue_offset, end) that
        names a record; None when there is none (only filler, holes or no file)."""
        while queue_offset < end:
            mapped = self.files.find(queue_offset * ENTRY_BYTES)
            if mapped is None:  # below the first file or in a gap: on to the next file, if any
                later = [m.start_offset for m in self.files.files if m.start_offset > queue_offset * ENTRY_BYTES]
                if not later:
                    return None
                queue_offset = later[0] // ENTRY_BYTES
                continue
            position = queue_offset * ENTRY_BYTES - mapped.start_offset
            stop = min(mapped.size, (end * ENTRY_BYTES) - mapped.start_offset)
            mm = mapped.mm
            while position < stop:
                physical, size = struct.unpack_from(">qi", mm, position)
                if is_entry(physical, size):
                    return (mapped.start_offset + position) // ENTRY_BYTES, physical
                position += ENTRY_BYTES
            queue_offset = (mapped.start_offset + position) // ENTRY_BYTES
        return None

    def delete_below_physical(self, physical_offset: int) -> int:
        """Drop whole files whose every entry points below ``physical_offset``; keep the last."""
        count = 0
        for mapped in self.files.files[:-1]:
            last_position = mapped.size - ENTRY_BYTES
            if struct.unpack_from(">q", mapped.mm, last_position)[0] + self._size_at(mapped.mm, last_position) > physical_offset:
                break
            count += 1
        removed = self.files.delete_front(count)
        if removed:
            self.dirty.difference_update(removed)
            self.min_offset = max(self.min_offset, self.files.files[0].start_offset // ENTRY_BYTES)
        return len(removed)

    def flush(self) -> None:
        dirty, self.dirty = self.dirty, set()
        for mapped in dirty:
            mapped.flush()

    def close(self) -> None:
        self.files.close()


def _fill_pre_blank(mapped, position: int) -> None:
    """Fill the unwritten entries before ``position`` of ``mapped`` with RocketMQ's filler."""
    mm = mapped.mm
    if mm[:position] == bytes(position):   # a fresh file: one copy
        mm[:position] = FILLER * (position // ENTRY_BYTES)
        return
    zero = bytes(ENTRY_BYTES)
    for at in range(0, position, ENTRY_BYTES):
        if mm[at:at + ENTRY_BYTES] == zero:
            mm[at:at + ENTRY_BYTES] = FILLER
