"""Epochs: which master term wrote which stretch of the CommitLog, and where two logs agree.

Every term of a master has an epoch number and the CommitLog offset where it began. The
list lives in ``{store_path}/epoch``, big-endian::

    0   4  magic b"HAEP"
    4   2  version (1)
    6   2  reserved (0)
    8   4  entry count n
    12  16*n entries: epoch u64, start offset u64
    ..  4  crc32 of every byte before it

It is replaced atomically (temp file, fsync, rename, directory fsync), so a crash leaves the
old list or the new one, and the CRC catches a disk that returns other bytes. Epochs rise
strictly and start offsets never fall. An epoch ends where the next one starts; the last
one ends at the log's max offset.

The consistent point (``find_resync``) is a pure function of two epoch lists and two
logs' bounds: the newest epoch both lists hold with the same start offset, cut at the
lesser of the two ends of that epoch. A slave truncates its log there (and drops its
epochs after the common one) before any byte is streamed. When the lists share nothing,
or the master no longer holds the bytes from that point on, the slave's log is reset to
start empty at the master's first offset.
"""

from __future__ import annotations

import bisect
import enum
import os
import struct
import zlib
from dataclasses import dataclass

from store.config_files import write_atomically

from .errors import EpochFileError

MAGIC = b"HAEP"
VERSION = 1
HEADER = struct.Struct(">4sHHI")
ENTRY = struct.Struct(">QQ")
TRAILER = struct.Struct(">I")
assert HEADER.size == 12 and ENTRY.size == 16 and TRAILER.size == 4
ENTRIES_MAX = 1_000_000   # a term per election: far more than a cluster will ever see
EPOCH_FILE = "epoch"


@dataclass(frozen=True, slots=True, order=True)
class EpochEntry:
    """A master term: its epoch number and the CommitLog offset where its writes begin."""

    epoch: int
    start_offset: int


# --- pure list operations ------------------------------------------------------------------
def check_order(entries: list[EpochEntry] | tuple[EpochEntry, ...]) -> None:
    """EpochFileError unless epochs rise strictly and start offsets never fall."""
    for entry in entries:
        if entry.epoch < 1 or entry.start_offset < 0:
            raise EpochFileError(f"epoch {entry.epoch} at {entry.start_offset}: epochs start at 1, offsets at 0")
    for earlier, later in zip(entries, entries[1:]):
        if later.epoch <= earlier.epoch or later.start_offset < earlier.start_offset:
            raise EpochFileError(f"epoch {later.epoch} at {later.start_offset} cannot follow epoch "
                                 f"{earlier.epoch} at {earlier.start_offset}")


def encode_epochs(entries: list[EpochEntry] | tuple[EpochEntry, ...]) -> bytes:
    """The epoch file's bytes for ``entries`` (checked first)."""
    check_order(entries)
    if len(entries) > ENTRIES_MAX:
        raise EpochFileError(f"{len(entries)} epochs: over the {ENTRIES_MAX} limit")
    body = HEADER.pack(MAGIC, VERSION, 0, len(entries)) + b"".join(
        ENTRY.pack(entry.epoch, entry.start_offset) for entry in entries)
    return body + TRAILER.pack(zlib.crc32(body))


def decode_epochs(data: bytes) -> list[EpochEntry]:
    """The entries of an epoch file's bytes; EpochFileError when they are not one."""
    if len(data) < HEADER.size + TRAILER.size:
        raise EpochFileError(f"epoch file of {len(data)} bytes is too short")
    magic, version, _, count = HEADER.unpack_from(data, 0)
    if magic != MAGIC or version != VERSION:
        raise EpochFileError(f"not an epoch file (magic {magic!r}, version {version})")
    expected = HEADER.size + count * ENTRY.size + TRAILER.size
    if count > ENTRIES_MAX or len(data) != expected:
        raise EpochFileError(f"epoch file of {len(data)} bytes does not hold the {count} entries it claims")
    (crc,) = TRAILER.unpack_from(data, expected - TRAILER.size)
    if crc != zlib.crc32(data[:expected - TRAILER.size]):
        raise EpochFileError("epoch file CRC mismatch: the file is not what was written")
    entries = [EpochEntry(*ENTRY.unpack_from(data, HEADER.size + i * ENTRY.size)) for i in range(count)]
    check_order(entries)
    return entries


def entry_index_at(entries, offset: int) -> int:
    """Index of the entry whose term wrote ``offset`` (the last one starting at or below
    it); -1 when ``offset`` is before the first epoch."""
    starts = [entry.start_offset for entry in entries]
    return bisect.bisect_right(starts, offset) - 1


def epoch_at(entries, offset: int) -> EpochEntry | None:
    """The entry whose term wrote ``offset``; None before the first epoch.

    Where empty terms share a start offset, the newest of them is the one that wrote it.
    """
    index = entry_index_at(entries, offset)
    return entries[index] if index >= 0 else None


def next_epoch_start(entries, offset: int) -> int | None:
    """Start of the first term beginning past ``offset`` (a frame must stop there), or None."""
    for entry in entries:
        if entry.start_offset > offset:
            return entry.start_offset
    return None


def end_of(entries, index: int, log_max_offset: int) -> int:
    """Where the term ``entries[index]`` ends: the next term's start, or the log's end."""
    return entries[index + 1].start_offset if index + 1 < len(entries) else log_max_offset


def within_log(entries, log_max_offset: int) -> list[EpochEntry]:
    """``entries`` without terms starting past the log's end.

    A crash between a cut of the log and the rewrite of the epoch file leaves such terms
    behind; they hold no byte, and keeping them would misdate the bytes streamed next.
    """
    return [entry for entry in entries if entry.start_offset <= log_max_offset]


class ResyncKind(enum.Enum):
    TRUNCATE = "truncate"   # keep the log up to the offset (a no-op when it ends there)
    RESET = "reset"         # drop the whole log; it restarts empty at the offset


@dataclass(frozen=True, slots=True)
class Resync:
    """Where a slave's log must end before streaming starts, and why."""

    kind: ResyncKind
    offset: int
    common_epoch: int | None   # the newest epoch both lists agree on (None: nothing shared)
    reason: str


def find_resync(master: list[EpochEntry], master_min: int, master_max: int,
                slave: list[EpochEntry], slave_min: int, slave_max: int) -> Resync:
    """The consistent point of a slave's log against its master's.

    The newest epoch present in both lists with the same start offset is the last term
    both logs hold bytes of from the same writer; they agree up to the lesser of that
    term's two ends. Anything the slave holds past that point was written by a term the
    master never saw (an old master's unreplicated tail) and is cut. When the point is
    not in both logs (the lists share nothing, or retention removed the bytes), the slave
    starts over, empty, at the master's first offset.
    """
    master_index = {(entry.epoch, entry.start_offset): index for index, entry in enumerate(master)}
    for slave_index in range(len(slave) - 1, -1, -1):
        entry = slave[slave_index]
        index = master_index.get((entry.epoch, entry.start_offset))
        if index is None:
            continue
        point = min(end_of(master, index, master_max), end_of(slave, slave_index, slave_max))
        if point < master_min or point < slave_min:
            return Resync(ResyncKind.RESET, master_min, None,
                          f"consistent point {point} in epoch {entry.epoch} is no longer in both logs "
                          f"(master from {master_min}, slave from {slave_min})")
        return Resync(ResyncKind.TRUNCATE, point, entry.epoch,
                      f"epoch {entry.epoch} (from {entry.start_offset}) is the newest both hold")
    if slave_max == master_min and slave_max == slave_min:
        return Resync(ResyncKind.TRUNCATE, slave_max, None, "the slave's log is empty where the master's starts")
    return Resync(ResyncKind.RESET, master_min, None,
                  "the slave shares no epoch with the master" if slave_max > slave_min
                  else "the slave's log is empty")


def slave_epochs_after(slave: list[EpochEntry], resync: Resync) -> list[EpochEntry]:
    """The slave's epochs once its log is resynchronised: the common term and those before it."""
    if resync.kind is ResyncKind.RESET or resync.common_epoch is None:
        return []
    return [entry for entry in slave if entry.epoch <= resync.common_epoch]


# --- the file ------------------------------------------------------------------------------
class EpochFile:
    """The store's epoch list, on disk at ``{store_path}/epoch``. Not thread-safe: one owner
    (the node) changes it, from one task at a time."""

    def __init__(self, store_path: str) -> None:
        self.path = os.path.join(store_path, EPOCH_FILE)
        self._entries: tuple[EpochEntry, ...] = ()

    def load(self, log_max_offset: int) -> list[EpochEntry]:
        """Read the file (missing: no epochs yet) and drop terms past the log's end."""
        try:
            with open(self.path, "rb") as handle:
                data = handle.read(HEADER.size + ENTRIES_MAX * ENTRY.size + TRAILER.size + 1)
        except FileNotFoundError:
            data = None
        entries = decode_epochs(data) if data is not None else []
        kept = within_log(entries, log_max_offset)
        self._entries = tuple(entries)
        if len(kept) != len(entries):
            self.replace(kept)
        return kept

    @property
    def entries(self) -> list[EpochEntry]:
        return list(self._entries)

    @property
    def last(self) -> EpochEntry | None:
        return self._entries[-1] if self._entries else None

    @property
    def last_epoch(self) -> int:
        return self._entries[-1].epoch if self._entries else 0

    def append(self, epoch: int, start_offset: int) -> None:
        """Record a new term beginning at ``start_offset`` (durable when this returns)."""
        self.replace([*self._entries, EpochEntry(epoch, start_offset)])

    def replace(self, entries: list[EpochEntry]) -> None:
        """Replace the whole list atomically (durable when this returns)."""
        data = encode_epochs(entries)
        write_atomically(self.path, data, keep_backup=False)
        self._entries = tuple(entries)
