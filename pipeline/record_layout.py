"""Where the fields of many records lie, read in as few passes over the log as possible.

Reading one field of every record costs a cache miss per record (records are ~1 KiB apart),
whatever the field's width, so the reader gathers whole regions instead of field after
field: the 88 header bytes of every record in one pass, then, in a second, a row running from
TOPICLEN over the topic to PROPLEN (the topic and both length bytes sit together behind the
body). ``RecordLayout`` keeps what the record walk learnt (the header rows, the topic bytes,
the properties length) so that the decoder builds its columns from them without going back
to the log; ``read_layout`` also says, per record, whether its magic and lengths hold (the
checks ``store.codec.check_record`` makes before any CRC).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from store import codec

from .arrow_decode import HEADER_DTYPE
from .record_walk import field_values, gather_rows

_LENGTH_BYTES = 3       # TOPICLEN before the topic, PROPLEN (two bytes) after it
# the header fields every read needs (the walk's checks, ``size``, where the body ends): a
# read that builds no other header column and checks no CRC gathers only these
LENGTH_FIELDS = ("total_size", "magic", "body_length")
LENGTHS_DTYPE = np.dtype([(name, HEADER_DTYPE.fields[name][0]) for name in LENGTH_FIELDS])


@dataclass(frozen=True, slots=True)
class RecordLayout:
    """Fields of records (in walk order): header rows, topic bytes (concatenated, with int64
    offsets), properties lengths. Meaningful only for records whose lengths hold."""

    header: np.ndarray              # HEADER_DTYPE, one per record
    topic_bytes: np.ndarray         # uint8, every topic in turn
    topic_offsets: np.ndarray       # int64, len n + 1
    props_length: np.ndarray        # int64

    def __len__(self) -> int:
        return len(self.header)

    def take(self, first: int, stop: int) -> "RecordLayout":
        """Records ``[first, stop)``."""
        low, high = int(self.topic_offsets[first]), int(self.topic_offsets[stop])
        return RecordLayout(self.header[first:stop], self.topic_bytes[low:high],
                            self.topic_offsets[first:stop + 1] - low, self.props_length[first:stop])

    def select(self, keep: np.ndarray) -> "RecordLayout":
        """The records where ``keep`` (a bool mask) is true."""
        if keep.all():
            return self
        lengths = np.diff(self.topic_offsets)[keep]
        byte_keep = np.repeat(keep, np.diff(self.topic_offsets))
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return RecordLayout(self.header[keep], self.topic_bytes[byte_keep], offsets, self.props_length[keep])

    @property
    def topic_length(self) -> np.ndarray:
        return np.diff(self.topic_offsets)

    @property
    def body_length(self) -> np.ndarray:
        return self.header["body_length"].astype(np.int64)


def empty_layout(whole_header: bool = True) -> RecordLayout:
    return RecordLayout(np.zeros(0, dtype=HEADER_DTYPE if whole_header else LENGTHS_DTYPE),
                        np.zeros(0, dtype=np.uint8), np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int64))


def concat_layouts(layouts: list[RecordLayout]) -> RecordLayout:
    layouts = [layout for layout in layouts if len(layout)]
    if not layouts:
        return empty_layout()
    if len(layouts) == 1:
        return layouts[0]
    offsets, base = [np.zeros(1, dtype=np.int64)], 0
    for layout in layouts:
        offsets.append(layout.topic_offsets[1:] + base)
        base += int(layout.topic_offsets[-1])
    return RecordLayout(np.concatenate([layout.header for layout in layouts]),
                        np.concatenate([layout.topic_bytes for layout in layouts]), np.concatenate(offsets),
                        np.concatenate([layout.props_length for layout in layouts]))


def read_layout(data: np.ndarray, positions: np.ndarray, sizes: np.ndarray | None = None, *,
                whole_header: bool = True) -> tuple[np.ndarray, RecordLayout]:
    """Per record at ``positions`` (whose ``sizes`` keep it inside ``data``; None: each
    record's TOTALSIZE): whether its magic and lengths hold, as ``codec.check_record`` checks
    them, and its RecordLayout (zeros where they do not hold). ``whole_header=False``: the
    layout's header holds only LENGTH_FIELDS (three 4-byte gathers instead of 88 bytes a
    record; a column that needs another field then fails on it, never reads a wrong one)."""
    count = len(positions)
    if count == 0:
        return np.zeros(0, dtype=bool), empty_layout(whole_header)
    width = HEADER_DTYPE.itemsize
    header = gather_rows(data, positions, width).view(HEADER_DTYPE).reshape(count) if whole_header \
        else _length_fields(data, positions)
    if sizes is None:
        sizes = header["total_size"].astype(np.int64)
    ends = positions + sizes
    body_length = header["body_length"].astype(np.int64)
    topic_at = positions + width + body_length
    ok = (header["magic"] == codec.MESSAGE_MAGIC) & (body_length >= 0) & (topic_at + 1 <= ends)
    topic_at = np.where(ok, topic_at, positions)
    topic_length = np.where(ok, data[topic_at], 0).astype(np.int64)
    ok &= topic_at + 1 + topic_length + 2 <= ends
    topic_length[~ok] = 0
    rows = _rows_from(data, topic_at, int(topic_length.max()) + _LENGTH_BYTES)
    index = np.arange(count)
    props_length = (rows[index, 1 + topic_length].astype(np.int64) << 8) | rows[index, 2 + topic_length]
    ok &= topic_at + 1 + topic_length + 2 + props_length == ends
    topic_length[~ok] = 0
    props_length[~ok] = 0
    inside = np.arange(rows.shape[1] - _LENGTH_BYTES) < topic_length[:, None]
    topic_bytes = np.ascontiguousarray(rows[:, 1:rows.shape[1] - 2][inside])
    offsets = np.zeros(count + 1, dtype=np.int64)
    np.cumsum(topic_length, out=offsets[1:])
    return ok, RecordLayout(header, topic_bytes, offsets, props_length)


def _length_fields(data: np.ndarray, positions: np.ndarray) -> np.ndarray:
    header = np.empty(len(positions), dtype=LENGTHS_DTYPE)
    for name in LENGTH_FIELDS:
        field, at = HEADER_DTYPE.fields[name][:2]
        header[name] = field_values(data, field)[positions + at]
    return header


def _rows_from(data: np.ndarray, starts: np.ndarray, width: int) -> np.ndarray:
    """``data[start:start + width]`` of every start as rows of ``width`` bytes; rows running
    past the end of ``data`` are padded with zeros."""
    limit = len(data)
    if limit < width:
        data = np.concatenate([data, np.zeros(width - limit, dtype=np.uint8)])
    clipped = np.minimum(starts, len(data) - width)
    rows = gather_rows(data, clipped, width)
    for index in np.flatnonzero(clipped != starts).tolist():     # the last few records of a buffer at most
        start = int(starts[index])
        piece = data[start:min(limit, start + width)]
        rows[index] = 0
        rows[index, :len(piece)] = piece
    return rows
