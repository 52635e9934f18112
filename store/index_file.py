"""IndexFile: a hash index from message keys to CommitLog offsets, in one mapped file.

    index/{yyyyMMddHHmmssSSS}                      named by creation time
    header (40 bytes, big-endian):
        0  8  beginTimestamp     store time of the first entry
        8  8  endTimestamp       store time of the last entry
       16  8  beginPhyOffset
       24  8  endPhyOffset
       32  4  hashSlotCount      slots in use: +1 when a key lands in an empty slot (RocketMQ's IndexHeader)
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

Write order (so a process killed between any two steps leaves a repairable file): entry,
then slot, then the count, then the end fields (endTimestamp, endPhyOffset, hashSlotCount),
per key in ``put`` and per block of keys in ``put_many``: the header on disk is never more
than one pass behind its entries, and ``load`` brings a stale one up to them.
``rollback`` undoes entries newest first; after an unclean stop, slots pointing past the
count make recovery rebuild the chains first.
"""

from __future__ import annotations

import datetime
import logging
import mmap
import os
import struct
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .errors import StoreError, invariant
from .mapped_file import reserve

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
_SLOT_COUNT_AT = 32
_END_AT = 8
_END_OFFSET_AT = 24
_END_FIELDS = struct.Struct(">q")
_COUNT = struct.Struct(">i")
_INT_MAX = 2**31 - 1
_SLOT_DTYPE = np.dtype(">i4")
_ENTRY_DTYPE = np.dtype([("key_hash", ">i4"), ("physical_offset", ">i8"), ("time_diff", ">i4"), ("previous", ">i4")])
assert _ENTRY_DTYPE.itemsize == ENTRY_BYTES
_BLOCK_ENTRIES_MIN = 64


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
                # reserved, not sparse: a page of a sparse file first touched through the
                # mapping on a full disk is a SIGBUS; a reservation fails with DiskFullError
                reserve(self.fd, self.size, path)
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
            self.refresh_header()

    def refresh_header(self, *, recount_slots: bool = False) -> None:
        """After a kill the header may be a pass behind; the entries and slots are the truth:
        endPhyOffset and endTimestamp from the last entry, hashSlotCount from the slot table
        (``recount_slots``: it reads the whole table). The header is written back when stale."""
        header = self.header
        before = (header.end_physical_offset, header.end_timestamp, header.hash_slot_count)
        if header.index_count > 1:
            _, last_offset, last_diff, _ = self.entry(header.index_count - 1)
            if header.end_physical_offset != last_offset:   # a pass the header did not see
                header.end_physical_offset = last_offset
                header.end_timestamp = max(header.end_timestamp, header.begin_timestamp + last_diff * 1000)
        if recount_slots:
            header.hash_slot_count = self.slots_in_use()
        if (header.end_physical_offset, header.end_timestamp, header.hash_slot_count) != before:
            self.write_header()

    def slots_in_use(self) -> int:
        """Slots holding a valid entry number (what hashSlotCount counts)."""
        table = np.frombuffer(self.mm, _SLOT_DTYPE, self.hash_slots, HEADER_BYTES)
        try:
            return int(np.count_nonzero((table > 0) & (table < self.header.index_count)))
        finally:
            del table

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
        if previous == 0:
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
            self._write_end_fields()
        return True

    def put_many(self, key_hashes: Sequence[int], physical_offsets: Sequence[int], store_timestamps: Sequence[int],
                 start: int) -> int:
        """Add entries ``start:`` of the columns (key hash, offset, store time: lists or
        int64 arrays) until full; return the index of the first entry not added.

        The same bytes as ``put`` once per entry. Many entries are written as blocks
        (``_put_block``, numpy); below ``_BLOCK_ENTRIES_MIN`` the loop is cheaper.
        """
        header = self.header
        total = len(key_hashes)
        if header.index_count <= 1 and start < total:
            # the first entry sets the file's base time and offset (``put`` writes the header)
            if not self.put(int(key_hashes[start]), int(physical_offsets[start]), int(store_timestamps[start])):
                return start
            start += 1
        end = start + max(0, min(total - start, self.max_entries - header.index_count))
        if end - start >= _BLOCK_ENTRIES_MIN:
            self._put_block(*(np.asarray(column[start:end], np.int64)
                              for column in (key_hashes, physical_offsets, store_timestamps)))
        elif end > start:
            self._put_each(key_hashes[start:end], physical_offsets[start:end], store_timestamps[start:end])
        return end

    def _put_each(self, key_hashes: Sequence[int], physical_offsets: Sequence[int],
                  store_timestamps: Sequence[int]) -> None:
        """Append entries that fit: the loop of ``put`` with everything in locals and the
        header fields set once. Per entry the write order is entry, slot, count."""
        header = self.header
        count = header.index_count
        mm = self.mm
        slots = self.hash_slots
        entries_at = self._entries_at
        begin = header.begin_timestamp
        unpack_slot, pack_slot, pack_entry = SLOT.unpack_from, SLOT.pack_into, ENTRY.pack_into
        pack_count = _COUNT.pack_into
        newly_used = 0
        for key_hash, physical_offset, store_timestamp in zip(key_hashes, physical_offsets, store_timestamps):
            slot_at = HEADER_BYTES + (key_hash % slots) * SLOT_BYTES
            previous = unpack_slot(mm, slot_at)[0]
            if previous <= 0 or previous > count:
                previous = 0
                newly_used += 1
            time_diff = (store_timestamp - begin) // 1000
            if time_diff < 0:
                time_diff = 0
            elif time_diff > _INT_MAX:
                time_diff = _INT_MAX
            pack_entry(mm, entries_at + count * ENTRY_BYTES, key_hash, physical_offset, time_diff, previous)
            pack_slot(mm, slot_at, count)
            count += 1
            pack_count(mm, _COUNT_AT, count)
        header.hash_slot_count += newly_used
        header.index_count = count
        header.end_physical_offset = int(physical_offsets[-1])
        header.end_timestamp = int(store_timestamps[-1])
        self._write_end_fields()

    def _put_block(self, key_hashes: np.ndarray, physical_offsets: np.ndarray, store_timestamps: np.ndarray) -> None:
        """Append entries that fit (int64 arrays), as ``put`` would one by one.

        An entry's prevIndex is the newest earlier entry of the block in its slot, else what
        the slot held (0 if that is not a valid older entry, as in ``put``); each touched
        slot ends at its block's newest entry. Entries, slots, count: a kill in between
        leaves slots past the count, which recovery's ``rebuild_chains`` repairs. (A block's
        keys rarely share a slot: the slots are then written in one go, unsorted.)
        """
        header = self.header
        count = header.index_count
        added = len(key_hashes)
        invariant(count > 1 and count + added <= self.max_entries, "block fits an index file with a base")
        numbers = np.arange(count, count + added)
        slots = key_hashes % self.hash_slots
        order = np.argsort(slots, kind="stable")          # by slot, oldest first within a slot
        sorted_slots = slots[order]
        shared = sorted_slots[1:] == sorted_slots[:-1]    # in a slot an entry before it took
        table = np.frombuffer(self.mm, _SLOT_DTYPE, self.hash_slots, HEADER_BYTES)
        at = self._entries_at + count * ENTRY_BYTES
        entries = np.frombuffer(self.mm, _ENTRY_DTYPE, added, at)
        try:
            heads = table[slots].astype(np.int64)
            previous = np.where((heads > 0) & (heads <= numbers), heads, 0)
            any_shared = np.count_nonzero(shared) > 0
            if any_shared:
                previous[order[1:][shared]] = numbers[order[:-1][shared]]
            newly_used = int(np.count_nonzero(previous == 0))
            entries["key_hash"] = key_hashes
            entries["physical_offset"] = physical_offsets
            # np.clip's own checks cost more than these two calls on a pass's few entries
            entries["time_diff"] = np.minimum(np.maximum((store_timestamps - header.begin_timestamp) // 1000, 0),
                                              _INT_MAX)
            entries["previous"] = previous
            if any_shared:
                newest = np.append(~shared, True)             # the last of each slot's entries
                table[sorted_slots[newest]] = numbers[order[newest]]
            else:
                table[slots] = numbers
        finally:
            del table, entries     # release the mapping's buffer: it cannot close while exported
        _COUNT.pack_into(self.mm, _COUNT_AT, count + added)
        header.hash_slot_count += newly_used
        header.index_count = count + added
        header.end_physical_offset = int(physical_offsets[-1])
        header.end_timestamp = int(store_timestamps[-1])
        self._write_end_fields()

    def _write_end_fields(self) -> None:
        """endTimestamp, endPhyOffset and hashSlotCount into the mapping, after the count:
        what a kill leaves on disk is at most one pass behind the entries."""
        h = self.header
        _END_FIELDS.pack_into(self.mm, _END_AT, h.end_timestamp)
        _END_FIELDS.pack_into(self.mm, _END_OFFSET_AT, h.end_physical_offset)
        _COUNT.pack_into(self.mm, _SLOT_COUNT_AT, h.hash_slot_count)

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

    def chain(self, key_hash: int, begin_ms: int, end_ms: int):
        """Yield (entry's key hash, CommitLog offset, wanted) for each entry of ``key_hash``'s
        slot chain the walk visits, newest first; wanted: the entry has ``key_hash`` and was
        stored in [begin_ms, end_ms]. A reader checks the entries it visits against their
        records (a damaged entry is found by the first query that meets it).

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
            yield read_hash, physical_offset, read_hash == key_hash and time_read <= end_ms and time_read + 999 >= begin_ms
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
            header.hash_slot_count = self.slots_in_use()
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
        table = np.frombuffer(self.mm, _SLOT_DTYPE, self.hash_slots, HEADER_BYTES)
        try:
            return bool(table.max(initial=0) < count) and bool(table.min(initial=0) >= 0)
        finally:
            del table   # no export of the map outlives the call (it could not be closed)

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
        self.header.hash_slot_count = len(heads)
        self.write_header()

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
        self.repairs: list[str] = []   # what ``load`` repaired
        self.directory_missing = False # ``load`` found no index directory

    def load(self) -> None:
        """Map every index file. One of the wrong size (a crash while it was created, or
        damage) is deleted: the index is derived from the log, and ``repairs`` tells the
        owner that entries may be missing (recovery then rebuilds the index)."""
        self.directory_missing = not os.path.isdir(self.directory)
        os.makedirs(self.directory, exist_ok=True)
        self.repairs = []
        names = sorted(n for n in os.listdir(self.directory) if parse_index_file_name(n))
        expected = index_file_bytes(self.hash_slots, self.max_entries)
        files = []
        for name in names:
            path = os.path.join(self.directory, name)
            actual = os.path.getsize(path)
            if actual != expected:
                log.warning("%s: %d bytes, expected %d; deleted (a crash while it was created, or damage): "
                            "the index is rebuilt from the commit log", path, actual, expected)
                os.unlink(path)
                self.repairs.append(f"deleted index file {path} of {actual} bytes (expected {expected})")
                continue
            files.append(IndexFile(path, self.hash_slots, self.max_entries, create=False))
        if files:
            newest = files[-1]
            # the file written next: reserved, as stores made before index files were may be sparse
            reserve(newest.fd, newest.size, newest.path)
            newest.refresh_header(recount_slots=True)   # only the newest can be stale: a roll flushes the one before
        self.files = files

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

    def put_many(self, key_hashes: Sequence[int], physical_offsets: Sequence[int],
                 store_timestamps: Sequence[int]) -> None:
        """Add entries (columns: key hash, offset, store time; lists or int64 arrays) in
        order, opening new files as they fill."""
        index = 0
        while index < len(key_hashes):
            index_file = self.files[-1] if self.files else None
            if index_file is None or index_file.is_full:
                index_file = self._writable(time.time_ns() // 1_000_000)
            index = index_file.put_many(key_hashes, physical_offsets, store_timestamps, index)
        self.dirty = True

    def chain(self, key_hash: int, begin_ms: int, end_ms: int):
        """``IndexFile.chain`` over the files whose time range meets [begin_ms, end_ms], newest first."""
        for index_file in reversed(self.files):
            header = index_file.header
            if header.index_count <= 1:
                continue
            if header.begin_timestamp > end_ms or header.end_timestamp + 999 < begin_ms:
                continue
            yield from index_file.chain(key_hash, begin_ms, end_ms)

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
