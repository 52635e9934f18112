"""The CommitLog as replicas compare and repair it: raw ranges and CRCs per range.

Two requests on the client port, authenticated like every other:

- READ_LOG_RANGE ``{offset, size, raw}``: bytes of the log from ``offset``, never past the
  confirm offset (what every in-sync replica holds, so the bytes are the same on each of
  them). By default (``raw`` false) whole records only: a record must start at ``offset``,
  each is CRC-checked before it is sent (a copy that fails here is RECORD_CORRUPT, never
  sent), and the reply holds as many whole records as fit in ``size`` (at least the first).
  This is what a replica repairing a damaged record asks for. With ``raw`` the bytes
  [offset, offset + size) are sent as they are (``hastore cluster verify`` compares them).
- LOG_RANGE_CRCS ``{start, end, range_bytes}``: the CRC32 of each ``range_bytes`` range of
  [start, min(end, confirm offset)), the last one shorter, at most ``CRC_RANGES_MAX`` per
  reply (ask again from the reply's ``end``).

The reads run in a worker thread (a CRC over many MiB takes a while). Pure functions of
the CommitLog plus thin handlers; no state of their own.
"""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING

import trio

from store import codec
from store.codec import CorruptMessage

from ..errors import RequestError
from ..wire.protocol import Fields

if TYPE_CHECKING:
    from store import MessageStore
    from store.commit_log import CommitLog

READ_BYTES_MAX = 8 * 1024 * 1024         # a reply stays well inside a 16 MiB frame
RANGE_BYTES_DEFAULT = 1024 * 1024
RANGE_BYTES_MIN = 4096
RANGE_BYTES_MAX = 64 * 1024 * 1024
CRC_RANGES_MAX = 1024


def readable_end(store: MessageStore) -> int:
    """Where replicas' logs are known to agree up to: the confirm offset, never past the
    log's end or what is on disk."""
    commit_log = store.commit_log
    return min(store.confirm_offset, commit_log.max_offset)


def whole_records(commit_log: CommitLog, offset: int, size_max: int, end: int) -> bytes:
    """The whole records from ``offset`` (which must start one) below ``end``, each
    CRC-checked, as many as fit in ``size_max`` bytes (the first always) and all in the
    segment of ``offset``. RequestError when no record starts there or the first fails."""
    if offset < commit_log.min_offset or offset >= end:
        raise RequestError("BAD_REQUEST", f"offset {offset} is outside [{commit_log.min_offset}, {end}), the log "
                                          "below the confirm offset here")
    segment = commit_log.segments.find(offset)
    if segment is None or not commit_log.record_starts_at(offset):
        raise RequestError("BAD_REQUEST", f"no record starts at offset {offset} here")
    limit = min(segment.end_offset, end) - segment.start_offset
    start = position = offset - segment.start_offset
    while position < limit:
        try:
            header = codec.check_record(segment.mm, position, segment.size)
        except CorruptMessage as error:
            if position == start:
                raise RequestError("RECORD_CORRUPT", f"the record at {offset} fails its checks here too: "
                                                     f"{error}") from None
            break   # send what is intact before it
        if header.is_blank or position + header.total_size > limit:
            break
        if position > start and position + header.total_size - start > size_max:
            break
        position += header.total_size
    if position == start:
        raise RequestError("BAD_REQUEST", f"the record at {offset} is not wholly below {end}")
    return bytes(segment.mm[start:position])


def raw_bytes(commit_log: CommitLog, offset: int, size: int, end: int) -> bytes:
    """The bytes [offset, min(offset + size, end)) of the log, across segments, unchecked."""
    if offset < commit_log.min_offset or offset > end:
        raise RequestError("BAD_REQUEST", f"offset {offset} is outside [{commit_log.min_offset}, {end}]")
    parts = []
    stop = min(offset + size, end)
    while offset < stop:
        segment = commit_log.segments.find(offset)
        if segment is None:
            break
        upto = min(stop, segment.end_offset)
        parts.append(bytes(segment.mm[offset - segment.start_offset:upto - segment.start_offset]))
        offset = upto
    return b"".join(parts)


def range_crcs(commit_log: CommitLog, start: int, end: int, range_bytes: int) -> list[int]:
    """CRC32 of each ``range_bytes`` range of [start, end), the last one shorter."""
    crcs = []
    offset = start
    while offset < end:
        stop = min(offset + range_bytes, end)
        crc = 0
        while offset < stop:
            segment = commit_log.segments.find(offset)
            if segment is None:
                raise RequestError("BAD_REQUEST", f"offset {offset} is in no segment here (retention?)")
            upto = min(stop, segment.end_offset)
            with memoryview(segment.mm)[offset - segment.start_offset:upto - segment.start_offset] as view:
                crc = zlib.crc32(view, crc)
            offset = upto
        crcs.append(crc)
    return crcs


class LogRangeHandlers:
    """READ_LOG_RANGE and LOG_RANGE_CRCS over one store (see the module docstring)."""

    def __init__(self, store: MessageStore) -> None:
        self.store = store

    def read_log_range(self, f: Fields):
        offset = f.int("offset", 0, 2**63 - 1)
        size = f.int("size", 1, READ_BYTES_MAX)
        raw = f.bool("raw", False)
        store = self.store

        async def read() -> dict:
            end = readable_end(store)
            if raw:
                data = await trio.to_thread.run_sync(raw_bytes, store.commit_log, offset, size, end)
            else:
                data = await trio.to_thread.run_sync(whole_records, store.commit_log, offset, size, end)
            return {"offset": offset, "data": data, "confirm_offset": end,
                    "min_offset": store.commit_log.min_offset}
        return read

    def log_range_crcs(self, f: Fields):
        range_bytes = f.int("range_bytes", RANGE_BYTES_MIN, RANGE_BYTES_MAX, RANGE_BYTES_DEFAULT)
        start = f.int("start", 0, 2**63 - 1, 0)
        end_asked = f.int("end", 0, 2**63 - 1, 2**63 - 1)
        store = self.store

        async def crcs() -> dict:
            confirm = readable_end(store)
            first = max(start, store.commit_log.min_offset)
            end = min(end_asked, confirm, first + range_bytes * CRC_RANGES_MAX)
            values = await trio.to_thread.run_sync(range_crcs, store.commit_log, first, end, range_bytes) \
                if end > first else []
            return {"start": first, "end": max(first, end), "range_bytes": range_bytes, "crcs": values,
                    "confirm_offset": confirm, "min_offset": store.commit_log.min_offset}
        return crcs
