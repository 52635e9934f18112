"""What replication needs from the CommitLog: whole-record chunks, their framing check, and
a crash-safe cut marker.

Chunks. A master streams its log in chunks of whole records that never span two segments.
A segment's closing blank record belongs to the chunk that reaches it, so such a chunk ends
exactly at the segment's end and the slave's segments line up with the master's byte for
byte. ``read_chunk`` walks record headers only (size and magic, no CRC): a chunk of 1 KiB
messages costs one ``struct`` unpack per record, and it returns a read-only view of the
mapping rather than a copy, so the master hands the page cache to the socket directly.
``check_chunk`` is the slave's check of the same framing before a byte is written.

Cut marker. Cutting a slave's log past the consistent point touches three structures
(CommitLog, ConsumeQueue, IndexFile) and the checkpoint. A crash half way must never leave
a stale tail that recovery takes for valid data, so the store first records the intent
durably in ``{store}/truncate``::

    0  1  kind: 1 = cut the log at offset, 2 = reset: drop the whole log, restart at offset
    1  8  offset (big-endian)
    9  4  crc32 of bytes 0..9

and removes it only when the cut is complete and the checkpoint rewritten. A start that
finds the marker finishes the job before recovery trusts anything.
"""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass

from . import codec
from .config_files import fsync_directory, write_atomically
from .errors import StoreError

MARKER = struct.Struct(">BqI")
assert MARKER.size == 13
CUT = 1
RESET = 2


class ChunkError(StoreError):
    """Replicated bytes that are not whole records where the log expects them."""


def read_chunk(segments, offset: int, end: int, max_bytes: int) -> memoryview:
    """Whole records from ``offset`` (a record boundary below ``end``) within one segment.

    At most ``max_bytes``, but always at least one record; empty when ``offset >= end``.
    A read-only view of the segment's mapping, not a copy: it shows the log's bytes for as
    long as nothing cuts the log under it (a master's log is only ever appended to; a
    reader that cannot rule a cut out checksums the view once and checks that later).
    """
    if offset >= end:
        return memoryview(b"")
    segment = segments.find(offset)
    if segment is None:
        raise ChunkError(f"offset {offset} is not in the commit log")
    mm = segment.mm
    start = position = offset - segment.start_offset
    limit = min(segment.size, end - segment.start_offset)
    budget_end = start + max_bytes
    unpack = codec.BLANK_HEADER.unpack_from
    while position < limit:
        size, magic = unpack(mm, position)
        if magic == codec.BLANK_MAGIC:
            position = segment.size
            break
        if magic != codec.MESSAGE_MAGIC or size <= 0 or position + size > segment.size:
            raise ChunkError(f"{segment.path}: no record at offset {segment.start_offset + position}")
        if position + size > budget_end and position > start:
            break
        position += size
    return memoryview(mm)[start:position].toreadonly()


def check_chunk(data, offset: int, segment_bytes: int) -> None:
    """Raise ChunkError unless ``data`` is whole records starting at ``offset`` in one segment.

    A blank record must close the segment exactly; nothing may follow it in the chunk.
    """
    segment_position = offset % segment_bytes
    if segment_position + len(data) > segment_bytes:
        raise ChunkError(f"chunk at {offset} of {len(data)} bytes crosses a segment boundary")
    unpack = codec.BLANK_HEADER.unpack_from
    position = 0
    while position < len(data):
        if len(data) - position < codec.BLANK_HEADER.size:
            raise ChunkError(f"chunk at {offset} ends inside a record header")
        size, magic = unpack(data, position)
        if magic == codec.BLANK_MAGIC:
            if segment_position + position + size != segment_bytes or position + size != len(data):
                raise ChunkError(f"blank record at {offset + position} does not close its segment")
            return
        if magic != codec.MESSAGE_MAGIC or size < codec.HEADER.size or position + size > len(data):
            raise ChunkError(f"no whole record at {offset + position} (size {size}, magic {magic:#x})")
        position += size


@dataclass(frozen=True, slots=True)
class CutIntent:
    kind: int
    offset: int


class CutMarker:
    """The ``truncate`` file: a durable record of a cut in progress."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.path = os.path.join(root, "truncate")

    def read(self) -> CutIntent | None:
        """The pending cut, or None. A torn marker means the cut had not started: None."""
        try:
            with open(self.path, "rb") as handle:
                raw = handle.read(MARKER.size + 1)
        except FileNotFoundError:
            return None
        if len(raw) != MARKER.size:
            return None
        kind, offset, crc = MARKER.unpack(raw)
        if zlib.crc32(raw[:9]) != crc or kind not in (CUT, RESET) or offset < 0:
            return None
        return CutIntent(kind, offset)

    def write(self, intent: CutIntent) -> None:
        head = struct.pack(">Bq", intent.kind, intent.offset)
        write_atomically(self.path, head + struct.pack(">I", zlib.crc32(head)), keep_backup=False)

    def clear(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            return
        fsync_directory(self.root)

