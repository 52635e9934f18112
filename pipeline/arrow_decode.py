"""CommitLog bytes to Arrow record batches: the hot loop of the ``commitlog`` data source.

Two steps. ``scan_records`` walks a slice record by record with the codec's own check
(``store.codec.check_record``: magic, lengths, BODYCRC and the whole-message CRC, whatever
the codec verifies today), so it yields each record's position and whether its CRCs hold,
and stops at the end of data. ``decode_batch`` then decodes many records at once with numpy
from their ``record_layout.RecordLayout`` (kept by the fast walk, else read here): the 88
header bytes of every record as a big-endian structured dtype, the topics already gathered;
properties and bodies gathered into Arrow buffers; properties split
on their separators without a Python loop. ``decode_batch_reference`` does the same record
by record through ``store.codec.decode_message``; the unit tests hold the two equal.

A record whose lengths hold but whose CRC fails is decoded with ``crc_ok = false``. Bytes that
are not a whole record (a truncated or corrupt tail) give one row with the offset, the size
up to the slice's end and ``crc_ok = false``, and the scan of that slice stops there.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from store import codec

BATCH_ROWS_MAX = 16_384
BATCH_BYTES_MAX = 32 * 1024 * 1024      # keeps every Arrow binary buffer far below 2 GiB

HEADER_DTYPE = np.dtype([
    ("total_size", ">i4"), ("magic", ">u4"), ("body_crc", ">i4"), ("queue_id", ">i4"), ("flag", ">i4"),
    ("queue_offset", ">i8"), ("physical_offset", ">i8"), ("sys_flag", ">i4"), ("born_timestamp", ">i8"),
    ("born_ip", ">u4"), ("born_port", ">i4"), ("store_timestamp", ">i8"), ("store_ip", ">u4"),
    ("store_port", ">i4"), ("reconsume_times", ">i4"), ("prepared_offset", ">i8"), ("body_length", ">i4"),
])
assert HEADER_DTYPE.itemsize == codec.HEADER.size == 88

TIMESTAMP = pa.timestamp("us", tz="UTC")
COLUMNS = (
    ("node", pa.string()), ("group", pa.string()), ("segment", pa.string()), ("physical_offset", pa.int64()),
    ("size", pa.int32()), ("topic", pa.string()), ("queue_id", pa.int32()), ("queue_offset", pa.int64()),
    ("sys_flag", pa.int32()), ("flag", pa.int32()), ("born_timestamp", TIMESTAMP), ("store_timestamp", TIMESTAMP),
    ("born_host", pa.string()), ("store_host", pa.string()), ("keys", pa.list_(pa.string())),
    ("tags", pa.string()), ("uniq_key", pa.string()), ("properties", pa.map_(pa.string(), pa.string())),
    ("body", pa.binary()), ("crc_ok", pa.bool_()),
)
COLUMN_NAMES = tuple(name for name, _ in COLUMNS)
# The Spark DDL of the same columns (Spark's TIMESTAMP is microseconds, shown in the session zone).
SPARK_TYPES = {"node": "STRING", "group": "STRING", "segment": "STRING", "physical_offset": "BIGINT",
               "size": "INT", "topic": "STRING", "queue_id": "INT", "queue_offset": "BIGINT", "sys_flag": "INT",
               "flag": "INT", "born_timestamp": "TIMESTAMP", "store_timestamp": "TIMESTAMP", "born_host": "STRING",
               "store_host": "STRING", "keys": "ARRAY<STRING>", "tags": "STRING", "uniq_key": "STRING",
               "properties": "MAP<STRING, STRING>", "body": "BINARY", "crc_ok": "BOOLEAN"}


def arrow_schema(columns: tuple[str, ...] = COLUMN_NAMES) -> pa.Schema:
    """The Arrow schema of ``columns`` (a subset of COLUMN_NAMES, in any order)."""
    types = dict(COLUMNS)
    return pa.schema([(name, types[name]) for name in columns])


def spark_ddl(columns: tuple[str, ...] = COLUMN_NAMES) -> str:
    """The Spark DDL schema string of ``columns``."""
    return ", ".join(f"`{name}` {SPARK_TYPES[name]}" for name in columns)


@dataclass(frozen=True, slots=True)
class BadTail:
    """Bytes at ``position`` (in the segment file) that are not a whole record."""

    position: int
    size: int
    problem: str


@dataclass(frozen=True, slots=True)
class ScanResult:
    """What a walk over a slice found: records (file positions, sizes, CRC verdicts), and the
    bad tail it stopped at, if any."""

    positions: np.ndarray       # int64
    sizes: np.ndarray           # int64
    crc_ok: np.ndarray          # bool
    bad_tail: BadTail | None
    layout: object = None       # record_layout.RecordLayout of the records, when the walk kept it


def scan_records(buffer, begin: int, end: int, limit: int, *, verify: bool = True) -> ScanResult:
    """Walk the records that start in ``[begin, end)`` (``limit``: the segment's size, where a
    record may end). Stops at a blank record, at unwritten space (TOTALSIZE 0) or at bytes that
    are not a whole record (returned as ``bad_tail``)."""
    positions: list[int] = []
    sizes: list[int] = []
    verdicts: list[bool] = []
    check, corrupt = codec.check_record, codec.CorruptMessage
    position, bad_tail = begin, None
    while position < end:
        try:
            header = check(buffer, position, limit, check_crc=verify)
            crc_ok = True
        except corrupt as error:
            if bytes(buffer[position:position + 4]) in (b"\0\0\0\0", b"\0\0\0", b"\0\0", b"\0", b""):
                break           # unwritten: the end of the data
            try:
                header = check(buffer, position, limit, check_crc=False)
            except corrupt:
                bad_tail = BadTail(position, max(end, position) - position, str(error))
                break
            crc_ok = False  # the lengths hold, so the walk can step over it
        if header.is_blank:
            break
        positions.append(position)
        sizes.append(header.total_size)
        verdicts.append(crc_ok)
        position += header.total_size
    return ScanResult(np.array(positions, dtype=np.int64), np.array(sizes, dtype=np.int64),
                      np.array(verdicts, dtype=bool), bad_tail)


def batch_ranges(sizes: np.ndarray, rows_max: int = BATCH_ROWS_MAX,
                 bytes_max: int = BATCH_BYTES_MAX) -> list[tuple[int, int]]:
    """Split records (by their sizes) into ``[first, stop)`` index ranges of at most
    ``rows_max`` records and, unless one record alone is larger, ``bytes_max`` bytes."""
    ranges = []
    first, count = 0, len(sizes)
    ends = np.cumsum(sizes, dtype=np.int64)
    while first < count:
        base = ends[first - 1] if first else 0
        by_bytes = int(np.searchsorted(ends, base + bytes_max, side="right"))
        stop = min(count, first + rows_max, max(by_bytes, first + 1))
        ranges.append((first, stop))
        first = stop
    return ranges


# --- gathering variable-length fields --------------------------------------------------------
def _gather(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The bytes ``data[starts[i]:starts[i]+lengths[i]]`` of every i, concatenated, with int32
    offsets (len n + 1)."""
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    total = int(offsets[-1])
    assert total < 2**31, total
    if total == 0:
        return np.zeros(0, dtype=np.uint8), offsets.astype(np.int32)
    if total <= 64 * len(lengths):    # short fields: one vectorised gather
        index = np.repeat(starts - offsets[:-1], lengths) + np.arange(total, dtype=np.int64)
        return data[index], offsets.astype(np.int32)
    # long fields (bodies): a copy per field is cheaper than an index per byte
    joined = b"".join([data[start:start + length].tobytes() for start, length in zip(starts.tolist(), lengths.tolist())])
    return np.frombuffer(joined, dtype=np.uint8), offsets.astype(np.int32)


def _gather_disjoint(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``_gather`` for spans in increasing order that do not overlap (the names, or the values,
    of properties): a mask over ``data`` built from +1/-1 marks instead of an index per byte."""
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    present = lengths > 0
    marks = np.zeros(len(data) + 1, dtype=np.int8)
    marks[starts[present]] += 1
    marks[(starts + lengths)[present]] -= 1
    mask = np.cumsum(marks[:-1], dtype=np.int8).view(bool)
    return data[mask], offsets.astype(np.int32)


def _strings(data: np.ndarray, offsets: np.ndarray, kind=pa.string()) -> pa.Array:
    array = pa.Array.from_buffers(kind, len(offsets) - 1, [None, pa.py_buffer(offsets), pa.py_buffer(data)])
    if kind == pa.string():
        array.validate(full=True)     # raises ArrowInvalid on bytes that are not UTF-8
    return array


def _hosts(ips: np.ndarray, ports: np.ndarray) -> pa.Array:
    """'ip:port' strings, each distinct address formatted once."""
    keys = (ips.astype(np.uint64) << np.uint64(32)) | ports.astype(np.uint32).astype(np.uint64)
    distinct, inverse = np.unique(keys, return_inverse=True)
    texts = [f"{socket.inet_ntoa(int(key >> 32).to_bytes(4, 'big'))}:{int(key & 0xFFFFFFFF) - ((int(key) & 0x80000000) << 1)}"
             for key in distinct.tolist()]
    return pa.array(texts, pa.string()).take(pa.array(inverse.reshape(-1), pa.int64()))


def _timestamps(milliseconds: np.ndarray) -> pa.Array:
    return pa.array(milliseconds.astype(np.int64) * 1000, TIMESTAMP)


@dataclass(frozen=True, slots=True)
class _Properties:
    map: pa.Array
    keys: pa.Array
    tags: pa.Array
    uniq_key: pa.Array


_HIDDEN = [name.encode() for name in codec.STORE_PROPERTY_NAMES]


def _split_properties(data: np.ndarray, offsets: np.ndarray) -> _Properties | None:
    """Properties of every record at once; None when some record's properties are not plain
    ``key\\x01value\\x02`` pairs (the caller then decodes them one by one)."""
    count = len(offsets) - 1
    names_at = np.flatnonzero(data == 1)
    pair_ends = np.flatnonzero(data == 2)
    lengths = np.diff(offsets)
    non_empty = lengths > 0
    if len(names_at) != len(pair_ends) or (non_empty.any() and (data[offsets[1:][non_empty] - 1] != 2).any()):
        return None
    pair_starts = np.concatenate(([0], pair_ends[:-1] + 1)).astype(np.int64)
    if not (np.all(pair_starts <= names_at) and np.all(names_at < pair_ends)):
        return None
    key_lengths = names_at - pair_starts
    keep = np.ones(len(pair_starts), dtype=bool)
    for hidden in _HIDDEN:     # the store's own CRC property is not a user property
        candidates = np.flatnonzero(key_lengths == len(hidden))
        if len(candidates):
            window = data[pair_starts[candidates, None] + np.arange(len(hidden))]
            keep[candidates[(window == np.frombuffer(hidden, np.uint8)).all(axis=1)]] = False
    pair_starts, names_at, pair_ends, key_lengths = pair_starts[keep], names_at[keep], pair_ends[keep], key_lengths[keep]
    records = np.searchsorted(offsets, pair_starts, side="right") - 1
    try:
        names = _strings(*_gather_disjoint(data, pair_starts, key_lengths))
        values = _strings(*_gather_disjoint(data, names_at + 1, pair_ends - names_at - 1))
    except pa.ArrowInvalid:
        return None
    map_offsets = np.zeros(count + 1, dtype=np.int32)
    np.cumsum(np.bincount(records, minlength=count), out=map_offsets[1:])
    properties = pa.MapArray.from_arrays(pa.array(map_offsets, pa.int32()), names, values)

    def pick(name: str) -> pa.Array:
        wanted = np.frombuffer(name.encode(), np.uint8)
        candidates = np.flatnonzero(key_lengths == len(wanted))
        chosen = np.full(count, -1, dtype=np.int64)
        if len(candidates):
            window = data[pair_starts[candidates, None] + np.arange(len(wanted))]
            hits = candidates[(window == wanted).all(axis=1)]
            chosen[records[hits]] = hits     # a repeated key: the last one wins, as in a dict
        return values.take(pa.array(chosen, pa.int64(), mask=chosen < 0))
    keys_text = pc.fill_null(pick(codec.PROPERTY_KEYS), "")
    return _Properties(properties, _split_keys(keys_text), pick(codec.PROPERTY_TAGS), pick(codec.PROPERTY_UNIQ_KEY))


def _split_keys(text: pa.Array) -> pa.Array:
    """KEYS values split on spaces, empty pieces dropped (as StoredMessage.keys)."""
    pieces = pc.split_pattern(text, codec.KEY_SEPARATOR)
    flat = pc.list_flatten(pieces)
    non_empty = pc.not_equal(pc.utf8_length(flat), 0)
    parents = pc.list_parent_indices(pieces).to_numpy()
    kept = np.asarray(non_empty.to_numpy(zero_copy_only=False), dtype=bool)
    offsets = np.zeros(len(text) + 1, dtype=np.int32)
    np.cumsum(np.bincount(parents[kept], minlength=len(text)), out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), flat.filter(pa.array(kept)))


def _properties_one_by_one(data: np.ndarray, offsets: np.ndarray) -> _Properties:
    decoded = [codec.decode_properties(data[a:b].tobytes().decode("utf-8", "replace"))
               for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist())]
    user = [[(k, v) for k, v in d.items() if k not in codec.STORE_PROPERTY_NAMES] for d in decoded]
    return _Properties(
        pa.array(user, pa.map_(pa.string(), pa.string())),
        pa.array([[k for k in d.get(codec.PROPERTY_KEYS, "").split(codec.KEY_SEPARATOR) if k] for d in decoded],
                 pa.list_(pa.string())),
        pa.array([d.get(codec.PROPERTY_TAGS) for d in decoded], pa.string()),
        pa.array([d.get(codec.PROPERTY_UNIQ_KEY) for d in decoded], pa.string()))


@dataclass(frozen=True, slots=True)
class SliceInfo:
    """Constant columns of a slice and its segment's start offset."""

    node: str
    group: str
    segment: str
    segment_start: int


# the columns built from header fields other than the lengths (record_layout.LENGTH_FIELDS)
HEADER_COLUMNS = frozenset({"queue_id", "queue_offset", "sys_flag", "flag", "born_timestamp", "store_timestamp",
                            "born_host", "store_host"})


def decode_batch(buffer, positions: np.ndarray, crc_ok: np.ndarray, info: SliceInfo,
                 columns: tuple[str, ...] = COLUMN_NAMES, layout=None) -> pa.RecordBatch:
    """Records at ``positions`` (whole, as ``scan_records`` found them) as one RecordBatch of
    ``columns``. Only the columns asked for are built. ``layout``: the records' RecordLayout
    when the walk kept it (else it is read here)."""
    data = np.frombuffer(buffer, dtype=np.uint8)
    count = len(positions)
    if layout is None:
        from .record_layout import read_layout
        layout = read_layout(data, positions)[1]
    header = layout.header
    wanted = set(columns)
    built: dict[str, pa.Array] = {}
    if wanted & {"properties", "keys", "tags", "uniq_key", "body"}:
        body_length = layout.body_length
        body_at = positions + HEADER_DTYPE.itemsize
        if "body" in wanted:
            built["body"] = _strings(*_gather(data, body_at, body_length), kind=pa.binary())
        if wanted & {"properties", "keys", "tags", "uniq_key"}:
            props_at = body_at + body_length + 1 + layout.topic_length + 2
            props = _gather(data, props_at, layout.props_length)
            parsed = _split_properties(*props) or _properties_one_by_one(*props)
            built.update(properties=parsed.map, keys=parsed.keys, tags=parsed.tags, uniq_key=parsed.uniq_key)
    if "topic" in wanted:
        built["topic"] = _strings(layout.topic_bytes, layout.topic_offsets.astype(np.int32))
    simple = {
        "node": lambda: pa.array([info.node] * count, pa.string()),
        "group": lambda: pa.array([info.group] * count, pa.string()),
        "segment": lambda: pa.array([info.segment] * count, pa.string()),
        "physical_offset": lambda: pa.array(positions + info.segment_start, pa.int64()),
        "size": lambda: pa.array(header["total_size"].astype(np.int32), pa.int32()),
        "queue_id": lambda: pa.array(header["queue_id"].astype(np.int32), pa.int32()),
        "queue_offset": lambda: pa.array(header["queue_offset"].astype(np.int64), pa.int64()),
        "sys_flag": lambda: pa.array(header["sys_flag"].astype(np.int32), pa.int32()),
        "flag": lambda: pa.array(header["flag"].astype(np.int32), pa.int32()),
        "born_timestamp": lambda: _timestamps(header["born_timestamp"]),
        "store_timestamp": lambda: _timestamps(header["store_timestamp"]),
        "born_host": lambda: _hosts(header["born_ip"], header["born_port"]),
        "store_host": lambda: _hosts(header["store_ip"], header["store_port"]),
        "crc_ok": lambda: pa.array(crc_ok, pa.bool_()),
    }
    arrays = [built[name] if name in built else simple[name]() for name in columns]
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema(columns))


def decode_batch_reference(buffer, positions: np.ndarray, crc_ok: np.ndarray, info: SliceInfo,
                           columns: tuple[str, ...] = COLUMN_NAMES) -> pa.RecordBatch:
    """The same batch as ``decode_batch``, one ``codec.decode_message`` per record: slow and plain,
    the reference the vectorised decoder is tested against."""
    rows = []
    for position, ok in zip(positions.tolist(), crc_ok.tolist()):
        message = codec.decode_message(buffer, position, check_crc=False)
        rows.append({
            "node": info.node, "group": info.group, "segment": info.segment,
            "physical_offset": info.segment_start + position, "size": message.total_size, "topic": message.topic,
            "queue_id": message.queue_id, "queue_offset": message.queue_offset, "sys_flag": message.sys_flag,
            "flag": message.flag, "born_timestamp": message.born_timestamp * 1000,
            "store_timestamp": message.store_timestamp * 1000, "born_host": message.born_host,
            "store_host": message.store_host, "keys": message.keys, "tags": message.tags,
            "uniq_key": message.uniq_key, "properties": list(message.user_properties.items()),
            "body": message.body, "crc_ok": ok})
    return pa.RecordBatch.from_pylist([{name: row[name] for name in columns} for row in rows],
                                      schema=arrow_schema(columns))


def bad_tail_batch(tail: BadTail, info: SliceInfo, columns: tuple[str, ...] = COLUMN_NAMES) -> pa.RecordBatch:
    """One row for bytes that are not a whole record: where, how many, ``crc_ok = false``."""
    row = {"node": info.node, "group": info.group, "segment": info.segment,
           "physical_offset": info.segment_start + tail.position, "size": min(tail.size, 2**31 - 1),
           "crc_ok": False}
    return pa.RecordBatch.from_pylist([{name: row.get(name) for name in columns}], schema=arrow_schema(columns))
