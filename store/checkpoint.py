"""Checkpoint: where the store can trust its files after a stop, in one 4 KiB file.

    checkpoint (4096 bytes, big-endian)
        0  8  physicMsgTimestamp    store time of the last flushed CommitLog message
        8  8  logicsMsgTimestamp    store time of the last flushed ConsumeQueue entry
       16  8  indexMsgTimestamp     store time of the last flushed IndexFile entry
       24  8  confirmPhyOffset      replication confirm offset
       32  8  flushedPhyOffset      hastore: CommitLog bytes below are on disk
       40  8  dispatchedPhyOffset   hastore: ConsumeQueue/Index entries below are on disk
       48  4  crc32 of bytes 0..48  hastore
     2048 .. 2100                   a second copy of bytes 0..52

Offsets 0..31 are RocketMQ's layout. hastore adds the two offsets so recovery can start
at an exact byte instead of whole segments, and a CRC plus a copy in another disk sector,
so a torn checkpoint write is detected and the other copy used.
"""

from __future__ import annotations

import mmap
import os
import struct
import zlib
from dataclasses import dataclass

FILE_BYTES = 4096
BODY = struct.Struct(">qqqqqq")
RECORD = struct.Struct(">qqqqqqI")
assert BODY.size == 48 and RECORD.size == 52
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
    """The checkpoint file, mapped. ``valid`` is False when neither copy checks out."""

    def __init__(self, path: str) -> None:
        self.path = path
        existed = os.path.exists(path)
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        if os.fstat(self.fd).st_size != FILE_BYTES:
            os.ftruncate(self.fd, FILE_BYTES)
        self.mm = mmap.mmap(self.fd, FILE_BYTES)
        self.state, self.valid = self._read()
        self.existed = existed

    def _read(self) -> tuple[CheckpointState, bool]:
        best: CheckpointState | None = None
        for at in COPY_AT:
            *values, crc = RECORD.unpack_from(self.mm, at)
            if zlib.crc32(self.mm[at:at + BODY.size]) == crc:
                state = CheckpointState(*values)
                if best is None or state.flushed_phy_offset > best.flushed_phy_offset:
                    best = state
        if best is not None:
            return best, True
        # unwritten, torn in both copies, or not ours: trust none of it
        return CheckpointState(), False

    def write(self, state: CheckpointState) -> None:
        """Write both copies and sync."""
        body = BODY.pack(state.physic_msg_timestamp, state.logics_msg_timestamp, state.index_msg_timestamp,
                         state.confirm_phy_offset, state.flushed_phy_offset, state.dispatched_phy_offset)
        record = body + struct.pack(">I", zlib.crc32(body))
        for at in COPY_AT:
            self.mm[at:at + RECORD.size] = record
        os.fdatasync(self.fd)
        self.state = CheckpointState(*BODY.unpack(body))
        self.valid = True

    def close(self) -> None:
        os.close(self.fd)
        self.mm.close()
