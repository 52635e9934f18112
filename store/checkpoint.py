"""Checkpoint: where the store can trust its files after a stop, in one 4 KiB file.

    checkpoint (4096 bytes, big-endian), layout version 2: RocketMQ 5's fields first
        0  8  physicMsgTimestamp    store time of the last flushed CommitLog message
        8  8  logicsMsgTimestamp    store time of the last flushed ConsumeQueue entry
       16  8  indexMsgTimestamp     store time of the last flushed IndexFile entry
       24  8  masterFlushedOffset   CommitLog bytes below are on disk (hastore writes its own)
       32  8  confirmPhyOffset      replication confirm offset
       40  8  flushedPhyOffset      hastore: CommitLog bytes below are on disk
       48  8  dispatchedPhyOffset   hastore: ConsumeQueue/Index entries below are on disk
       56  4  layout version (2)    hastore
       60  4  crc32 of bytes 0..60  hastore
     2048 .. 2112                   a second copy of bytes 0..64

Offsets 0..39 are RocketMQ 5's layout, so its ``StoreCheckpoint`` reads this file as its
own. hastore adds the two offsets so recovery can start at an exact byte instead of whole
segments, and a CRC plus a copy in another disk sector, so a torn checkpoint write is
detected and the other copy used.

Layout version 1 (hastore before RocketMQ 5's order; still read, never written): confirm
offset @24, flushed @32, dispatched @40, crc32 of bytes 0..48 @48, copy at 2048.
"""

from __future__ import annotations

import mmap
import os
import struct
import zlib
from dataclasses import dataclass

from .mapped_file import reserve

FILE_BYTES = 4096
LAYOUT_VERSION = 2
BODY = struct.Struct(">qqqqqqqi")
RECORD = struct.Struct(">qqqqqqqiI")
assert BODY.size == 60 and RECORD.size == 64
V1_BODY = struct.Struct(">qqqqqq")
V1_RECORD = struct.Struct(">qqqqqqI")
assert V1_BODY.size == 48 and V1_RECORD.size == 52
COPY_AT = (0, 2048)


@dataclass(slots=True)
class CheckpointState:
    physic_msg_timestamp: int = 0
    logics_msg_timestamp: int = 0
    index_msg_timestamp: int = 0
    confirm_phy_offset: int = 0
    flushed_phy_offset: int = 0
    dispatched_phy_offset: int = 0


class Checkpoint:
    """The checkpoint file, mapped. ``valid`` is False when neither copy checks out;
    ``layout_version`` is the version the file was read in (0: nothing valid)."""

    def __init__(self, path: str) -> None:
        self.path = path
        existed = os.path.exists(path)
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if os.fstat(self.fd).st_size > FILE_BYTES:
                os.ftruncate(self.fd, FILE_BYTES)
            # a new file, or one a crash cut short, grows to 4 KiB with its space reserved (it is mapped)
            reserve(self.fd, FILE_BYTES, path)
        except BaseException:
            os.close(self.fd)
            raise
        self.mm = mmap.mmap(self.fd, FILE_BYTES)
        self.layout_version = 0
        self.state, self.valid = self._read()
        self.existed = existed

    def _read(self) -> tuple[CheckpointState, bool]:
        best: CheckpointState | None = None
        for at in COPY_AT:
            state, version = _read_copy(self.mm, at)
            if state is not None and (best is None or state.flushed_phy_offset > best.flushed_phy_offset):
                best, self.layout_version = state, version
        if best is not None:
            return best, True
        # unwritten, torn in both copies, or not ours: trust none of it
        return CheckpointState(), False

    def write(self, state: CheckpointState) -> None:
        """Write both copies (layout version 2) and sync."""
        body = BODY.pack(state.physic_msg_timestamp, state.logics_msg_timestamp, state.index_msg_timestamp,
                         state.flushed_phy_offset, state.confirm_phy_offset, state.flushed_phy_offset,
                         state.dispatched_phy_offset, LAYOUT_VERSION)
        record = body + struct.pack(">I", zlib.crc32(body))
        for at in COPY_AT:
            self.mm[at:at + RECORD.size] = record
        os.fdatasync(self.fd)
        self.state = CheckpointState(state.physic_msg_timestamp, state.logics_msg_timestamp,
                                     state.index_msg_timestamp, state.confirm_phy_offset,
                                     state.flushed_phy_offset, state.dispatched_phy_offset)
        self.valid = True
        self.layout_version = LAYOUT_VERSION

    def close(self) -> None:
        os.close(self.fd)
        self.mm.close()


def _read_copy(buffer, at: int) -> tuple[CheckpointState | None, int]:
    """The state in the copy at ``at`` and its layout version, (None, 0) if it checks out in none."""
    (physic, logics, index, _master_flushed, confirm, flushed, dispatched, version,
     crc) = RECORD.unpack_from(buffer, at)
    if version == LAYOUT_VERSION and zlib.crc32(buffer[at:at + BODY.size]) == crc:
        return CheckpointState(physic, logics, index, confirm, flushed, dispatched), LAYOUT_VERSION
    *values, crc = V1_RECORD.unpack_from(buffer, at)
    if zlib.crc32(buffer[at:at + V1_BODY.size]) == crc:
        return CheckpointState(*values), 1
    return None, 0


def read_checkpoint(path: str) -> tuple[CheckpointState, int]:
    """Read a checkpoint file without mapping or changing it (``store verify``): the state
    and its layout version (0 when no copy checks out)."""
    with open(path, "rb") as handle:
        raw = handle.read(FILE_BYTES)
    if len(raw) < FILE_BYTES:
        return CheckpointState(), 0
    best, best_version = None, 0
    for at in COPY_AT:
        state, version = _read_copy(raw, at)
        if state is not None and (best is None or state.flushed_phy_offset > best.flushed_phy_offset):
            best, best_version = state, version
    return (best or CheckpointState()), best_version
