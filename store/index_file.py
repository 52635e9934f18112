"""IndexFile: a hash index from message keys to CommitLog offsets, in one mapped file.

    index/{yyyyMMddHHmmssSSS}                      named by creation time
    header (40 bytes, big-endian):
        0  8  beginTimestamp     store time of the first entry
        8  8  endTimestamp       store time of the last entry
       16  8  beginPhyOffset
       24  8  endPhyOffset
       32  4  hashSlotCount      entries added (as RocketMQ counts it)
       36  4  indexCount         next entry number; starts at 1, entry 0 is unused
    slots:   hashSlots x 4 bytes, each the newest entry number for keys hashing there
    entries: maxEntries x 20 bytes
        0  4  keyHash    abs(Java String.hashCode(key)), 0 for Integer.MIN_VALUE
        4  8  phyOffset
       12  4  timeDiff   seconds since beginTimestamp
       16  4  prevIndex  previous entry in the same slot (0 ends the chain)

Keys are ``topic#key`` for every KEYS word and ``topic#UNIQ_KEY``. A lookup walks the
slot's chain newest first and returns candidate offsets; the caller reads each message
and compares the key, because only hashes are stored.

Write order per key (so a process killed between any two steps leaves a repairable
file): entry, then slot, then header. ``rollback`` undoes entries newest first.
"""

from __future__ import annotations

import datetime
import logging
import mmap
import os
import struct
import time
from dataclasses import dataclass

from .errors import StoreError, invariant

log = logging.getLogger(__name__)

HEADER = struct.Struct(">qqqqii")
HEADER_BYTES = HEADER.size
assert HEADER_BYTES == 40
SLOT = struct.Struct(">i")
SLOT_BYTES = SLOT.size
ENTRY = struct.Struct(">iqii")
ENTRY_BYTES = ENTRY.size
assert ENTRY_BYTES == 20
_COUNT_AT = 36
_COUNT = struct.Struct(">i")
_INT_MAX = 2**31 - 1


def index_file_name(timestamp_ms: int) -> str:
    moment = datetime.datetime.fromtimestamp(timestamp_ms / 1000)
    return moment.strftime("%Y%m%d%H%M%S") + f"{timestamp_ms % 1000:03d}"


def parse_index_file_name(name: str) -> bool:
    return len(name) == 17 and name.isdigit()


def index_file_bytes(hash_slots: int, max_entries: int) -> int:
    return HEADER_BYTES + hash_slots * SLOT_BYTES + max_entries * ENTRY_BYTES


@dataclass(slots=True)
class IndexHeader:
    begin_timestamp: int = 0
    end_timestamp: int = 0
    begin_physical_offset: int = 0
    end_physical_offset: int = 0
    hash_slot_count: int = 0
    index_count: int = 1


class IndexFile:
    """One index file: header, slot table, entry array."""

    def __init__(self, path: str, hash_slots: int, max_entries: int, *, create: bool) -> None:
        self.path = path
        self.hash_slots = hash_slots
        self.max_entries = max_entries
        self.size = index_file_bytes(hash_slots, max_entries)
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        self.fd = os.open(path, flags, 0o644)
        try:
            if create:
                os.ftruncate(self.fd, self.size)  # sparse: a fresh index is mostly holes
            actual = os.fstat(self.fd).st_size
            if actual != self.size:
                raise StoreError(f"{path}: {actual} bytes, expected {self.size} for {hash_slots} slots and "
                                 f"{max_entries} entries; index settings changed?")
            self.mm = mmap.mmap(self.fd, self.size)
        except BaseException:
            os.close(self.fd)
            if create:
                os.unlink(path)
            raise
        if create:
            self.header = IndexHeader()
            self.write_header()
        else:
            self.header = IndexHeader(*HEADER.unpack_from(self.mm, 0))
            if not 1 <= self.header.index_count <= max_entries:
                self.header.index_count = 1
        self._entries_at = HEADER_BYTES + hash_slots * SLOT_BYTES
        self._closed = False
        if not create:
            self._refresh_end_from_entries()

    def _refresh_end_from_entries(self) -> None:
        """The header's end fields are written lazily; after a kill the entries are the truth."""
        header = self.header
        if header.index_count > 1:
            _, last_offset, last_diff, _ = self.entry(header.index_count - 1)
            header.end_physical_offset = last_offset
            header.end_timestamp = max(header.end_timestamp, header.begin_timestamp + last_diff * 1000 + 999)

    # --- writing -------------------------------------------------------------------------
    @property
    def is_full(self) -> bool:
        return self.header.index_count >= self.max_entries

    def put(self, key_hash: int, physical_offset: int, store_timestamp: int) -> bool:
        """Add one key; False if the file is full."""
        header = self.header
        count = header.index_count
        if count >= self.max_entries:
            return False
        slot_at = HEADER_BYTES + (key_hash % self.hash_slots) * SLOT_BYTES
        mm = self.mm
        previous = SLOT.unpack_from(mm, slot_at)[0]
        if previous <= 0 or previous > count:
            previous = 0
        if header.begin_timestamp <= 0:
            time_diff = 0
        else:
            time_diff = min(_INT_MAX, max(0, (store_timestamp - header.begin_timestamp) // 1000))
        ENTRY.pack_into(mm, self._entries_at + count * ENTRY_BYTES, key_hash, physical_offset, time_diff, previous)
        SLOT.pack_into(mm, slot_at, count)
        header.hash_slot_count += 1
        header.index_count = count + 1
        header.end_physical_offset = physical_offset
        header.end_timestamp = store_timestamp
        if count <= 1:
            # the base of every timeDiff must be on disk before any entry counts
            header.begin_physical_offset = physical_offset
            header.begin_timestamp = store_timestamp
            self.write_header()
        else:
            struct.pack_into(">i", mm, _COUNT_AT, count + 1)
        return True

    def put_many(self, entries: list[tuple[int, int, int]], start: int) -> int:
        """Add entries[start:] (key hash, offset, store time) until full; return the next index.

        The loop of ``put`` with everything in locals and the header written once per call:
        the dispatcher's hot path. Per entry the write order is still entry, then slot,
        then count, so ``rollback`` can undo a call cut off anywhere.
        """
        header = self.header
        count = header.index_count
        if count <= 1 and start < len(entries):
            if not self.put(*entries[start]):
                return start
            start += 1
            count = header.index_count
        mm = self.mm
        slots = self.hash_slots
        limit = self.max_entries
        entries_at = self._entries_at
        begin = header.begin_timestamp
        unpack_slot, pack_slot, pack_entry = SLOT.unpack_from, SLOT.pack_into, ENTRY.pack_into
        pack_count = _COUNT.pack_into
        index = start
        total = len(entries)
        while index < total and count < limit:
            key_hash, physical_offset, store_timestamp = entries[index]
            slot_at = HEADER_BYTES + (key_hash % slots) * SLOT_BYTES
            previous = unpack_slot(mm, slot_at)[0]
            if previous <= 0 or previous > count:
                previous = 0
            time_diff = (store_timestamp - begin) // 1000
            if time_diff < 0:
                time_diff = 0
            elif time_diff > _INT_MAX:
                time_diff = _INT_MAX
            pack_entry(mm, entries_at + count * ENTRY_BYTES, key_hash, physical_offset, time_diff, previous)
            pack_slot(mm, slot_at, count)
            count += 1
            pack_count(mm, _COUNT_AT, count)
            index += 1
        added = index - start
        if added:
            last_hash, last_offset, last_time = entries[index - 1]
            header.hash_slot_count += added
            header.index_count = count
            header.end_physical_offset = last_offset
            header.end_timestamp = last_time
        return index

    def write_header(self, *, lowering_count: bool = False) -> None:
        """Write the header fields. The count on disk only grows unless ``lowering_count``:
        the flush thread may write a header while a dispatch pass is adding entries whose
        count the pass has already stored."""
        h = self.header
        count = h.index_count if lowering_count else max(h.index_count, _COUNT.unpack_from(self.mm, _COUNT_AT)[0])
        HEADER.pack_into(self.mm, 0, h.begin_timestamp, h.end_timestamp, h.begin_physical_offset,
                         h.end_physical_offset, h.hash_slot_count, count)

    # --- reading -------------------------------------------------------------------------
    def entry(self, number: int) -> tuple[int, int, int, int]:
        """(keyHash, phyOffset, timeDiff, prevIndex) of entry ``number``."""
        return ENTRY.unpack_from(self.mm, self._entries_at + number * ENTRY_BYTES)

    def candidates(self, key_hash: int, begin_ms: int, end_ms: int):
        """Yield CommitLog offsets of entries with ``key_hash`` stored in [begin_ms, end_ms], newest first.

        timeDiff keeps whole seconds, so an entry's real store time lies in
        [base + diff*1000, base + diff*1000 + 999]; the filter keeps every entry whose
        window meets the range (the caller checks the exact time on the message). The
        walk is bounded by the entry count, so a looped chain cannot spin forever.
        """
        header = self.header
        count = header.index_count
        if count <= 1:
            return
        slot_at = HEADER_BYTES + (key_hash % self.hash_slots) * SLOT_BYTES
        number = SLOT.unpack_from(self.mm, slot_at)[0]
        steps = 0
        while 0 < number < count and steps < count:
            read_hash, physical_offset, time_diff, previous = self.entry(number)
            if time_diff < 0:
                return
            time_read = header.begin_timestamp + time_diff * 1000
            if read_hash == key_hash and time_read <= end_ms and time_read + 999 >= begin_ms:
                yield physical_offset
            if time_read + 999 < begin_ms or previous >= number:
                return
            number = previous
            steps += 1

    # --- repair --------------------------------------------------------------------------
    def rollback(self, physical_offset: int) -> int:
        """Remove every entry pointing at or past ``physical_offset``; return how many.

        Entries are in CommitLog order, so they are the newest ones. First a put that was
        cut off after its slot write but before its header write is undone, then entries
        are unlinked newest first: each one's slot goes back to its prevIndex.
        """
        header = self.header
        count = header.index_count
        if count < self.max_entries:
            key_hash, _, _, previous = self.entry(count)
            slot_at = HEADER_BYTES + (key_hash % self.hash_slots) * SLOT_BYTES
            if key_hash or previous:
                if SLOT.unpack_from(self.mm, slot_at)[0] == count:
                    SLOT.pack_into(self.mm, slot_at, previous if 0 < previous < count else 0)
                ENTRY.pack_into(self.mm, self._entries_at + count * ENTRY_BYTES, 0, 0, 0, 0)
        removed = 0
        number = count - 1
        while number >= 1:
            key_hash, entry_offset, _, previous = self.entry(number)
            if entry_offset < physical_offset:
                break
            slot_at = HEADER_BYTES + (key_hash % self.hash_slots) * SLOT_BYTES
            SLOT.pack_into(self.mm, slot_at, previous if 0 < previous < number else 0)
            ENTRY.pack_into(self.mm, self._entries_at + number * ENTRY_BYTES, 0, 0, 0, 0)
            removed += 1
            number -= 1
        if removed:
            header.index_count = number + 1
            header.hash_slot_count = max(0, header.hash_slot_count - removed)
            if number >= 1:
                _, last_offset, last_diff, _ = self.entry(number)
                header.end_physical_offset = last_offset
                header.end_timestamp = min(header.end_timestamp, header.begin_timestamp + last_diff * 1000 + 999)
            else:
                header.begin_timestamp = header.end_timestamp = 0
                header.begin_physical_offset = header.end_physical_offset = 0
            self.write_header(lowering_count=True)
        return removed

    def slots_consistent(self) -> bool:
        """No slot points past the last entry (cheap check after an unclean stop)."""
        count = self.header.index_count
        raw = memoryview(self.mm)[HEADER_BYTES:self._entries_at]
        try:
            values = struct.unpack(f">{self.hash_slots}i", raw) if self.hash_slots <= 1 << 16 else None
            if values is not None:
                return max(values) < count and min(values) >= 0
            import array
            table = array.array("i", raw)
            if struct.pack("=i", 1) != struct.pack(">i", 1):
                table.byteswap()
            return max(table) < count and min(table) >= 0
        finally:
            raw.release()

    def rebuild_chains(self) -> None:
        """Recompute every slot and prevIndex from the entries' key hashes."""
        mm = self.mm
        mm[HEADER_BYTES:self._entries_at] = bytes(self._entries_at - HEADER_BYTES)
        heads: dict[int, int] = {}
        for number in range(1, self.header.index_count):
            key_hash, physical_offset, time_diff, _ = self.entry(number)
            slot = key_hash % self.hash_slots
            ENTRY.pack_into(mm, self._entries_at + number * ENTRY_BYTES, key_hash, physical_offset,
                            time_diff, heads.get(slot, 0))
            heads[slot] = number
        for slot, number in heads.items():
            SLOT.pack_into(mm, HEADER_BYTES + slot * SLOT_BYTES, number)

    # --- lifecycle -----------------------------------------------------------------------
    def flush(self) -> None:
        if not self._closed:
            self.write_header()
            os.fdatasync(self.fd)

    def close(self) -> None:
        if not self._closed:
            self.write_header()
            self._closed = True
            os.close(self.fd)

    def destroy(self) -> None:
        self.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def __repr__(self) -> str:
        return f"IndexFile({self.path!r}, entries={self.header.index_count - 1})"


class IndexService:
    """The index files of a store: the newest takes new keys, lookups span all of them."""

    def __init__(self, directory: str, hash_slots: int, max_entries: int) -> None:
        self.directory = directory
        self.hash_slots = hash_slots
        self.max_entries = max_entries
        self.files: list[IndexFile] = []
        self.dirty = False

    def load(self) -> None:
        os.makedirs(self.directory, exist_ok=True)
        names = sorted(n for n in os.listdir(self.directory) if parse_index_file_name(n))
        self.files = [IndexFile(os.path.join(self.directory, n), self.hash_slots, self.max_entries, create=False)
                      for n in names]

    def _writable(self, timestamp_ms: int) -> IndexFile:
        if self.files and not self.files[-1].is_full:
            return self.files[-1]
        if self.files:
            self.files[-1].flush()
        name_ms = timestamp_ms
        existing = {f.path for f in self.files}
        while True:
            path = os.path.join(self.directory, index_file_name(name_ms))
            if path not in existing and not os.path.exists(path) and \
                    (not self.files or os.path.basename(path) > os.path.basename(self.files[-1].path)):
                break
            name_ms += 1
        index_file = IndexFile(path, self.hash_slots, self.max_entries, create=True)
        self.files = self.files + [index_file]
        return index_file

    def put(self, key_hash: int, physical_offset: int, store_timestamp: int) -> None:
        index_file = self.files[-1] if self.files else None
        if index_file is None or not index_file.put(key_hash, physical_offset, store_timestamp):
            index_file = self._writable(time.time_ns() // 1_000_000)
            invariant(index_file.put(key_hash, physical_offset, store_timestamp), "fresh index file takes a key")
        self.dirty = True

    def put_many(self, entries: list[tuple[int, int, int]]) -> None:
        """Add (key hash, offset, store time) entries in order, opening new files as they fill."""
        index = 0
        while index < len(entries):
            index_file = self.files[-1] if self.files else None
            if index_file is None or index_file.is_full:
                index_file = self._writable(time.time_ns() // 1_000_000)
            index = index_file.put_many(entries, index)
        self.dirty = True

    def candidates(self, key_hash: int, begin_ms: int, end_ms: int):
        """Yield candidate CommitLog offsets for ``key_hash``, newest files first."""
        for index_file in reversed(self.files):
            header = index_file.header
            if header.index_count <= 1:
                continue
            if header.begin_timestamp > end_ms or header.end_timestamp + 999 < begin_ms:
                continue
            yield from index_file.candidates(key_hash, begin_ms, end_ms)

    @property
    def end_physical_offset(self) -> int:
        for index_file in reversed(self.files):
            if index_file.header.index_count > 1:
                return index_file.header.end_physical_offset
        return -1

    def destroy_all(self) -> None:
        """Delete every index file (a replica whose whole log is being replaced)."""
        for index_file in reversed(self.files):
            index_file.destroy()
        self.files = []

    def rollback(self, physical_offset: int, *, repair: bool) -> int:
        """Remove entries at or past ``physical_offset``; drop files left empty."""
        removed = 0
        for index_file in reversed(list(self.files)):
            if repair and not index_file.slots_consistent():
                log.warning("%s: slot table inconsistent after an unclean stop; rebuilding chains", index_file.path)
                index_file.rebuild_chains()
            removed += index_file.rollback(physical_offset)
            if index_file.header.index_count <= 1 and index_file is not self.files[0]:
                index_file.destroy()
                self.files = [f for f in self.files if f is not index_file]
            elif index_file.header.begin_physical_offset < physical_offset:
                break
        return removed

    def delete_below_physical(self, physical_offset: int) -> int:
        """Drop files whose every entry points below ``physical_offset`` (never the newest)."""
        doomed = [f for f in self.files[:-1] if f.header.end_physical_offset < physical_offset]
        for index_file in doomed:
            index_file.destroy()
        self.files = [f for f in self.files if f not in doomed]
        return len(doomed)

    def flush(self) -> None:
        self.dirty = False
        for index_file in self.files[-2:]:
            index_file.flush()

    def close(self) -> None:
        for index_file in self.files:
            index_file.close()
