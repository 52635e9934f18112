"""DispatchBatch: what a run of CommitLog records adds to the ConsumeQueues and the IndexFile.

The dispatcher walks a pass's records and hands their positions to a ``DispatchParser``,
which returns a DispatchBatch: the packed ConsumeQueue entries per run of one queue, and
the IndexFile entries (key hash, offset, store time) in dispatch order. Two ways to parse:

- ``parse_each``, one record at a time in Python: cheapest for the few records of a live
  store's typical pass, and the reference the tests compare ``parse`` with;
- ``parse``, numpy over the whole run: header fields gathered at once, all properties
  gathered into one array and split into pairs there, every TAGS value and index key
  hashed as a few matrix products. Its cost is about a hundred numpy calls per pass,
  which pays from about a hundred records on (catching up, recovery, a replica's chunks).

Both give the same entries, bit for bit:

- properties are ``name\\x01value\\x02`` pairs; a name ends at its pair's first ``\\x01``;
  when a name repeats, the last pair wins;
- KEYS is split on spaces and empty words are skipped; an empty UNIQ_KEY is no key;
- tags code = Java ``String.hashCode(TAGS)``, 0 without tags;
- index key hash = abs(``String.hashCode(topic + "#" + key)``), 0 for Integer.MIN_VALUE.

``parse`` works on the UTF-8 bytes. That is exact: ``\\x01``, ``\\x02`` and space never
occur inside a multi-byte UTF-8 sequence, and an ASCII string's UTF-16 units are its
bytes. Values with other bytes are decoded and hashed one by one (``codec.combine_hash``).
"""

from __future__ import annotations

import struct
from typing import NamedTuple, Sequence

import numpy as np

from . import codec
from .key_hashes import index_key_hashes
from .consume_queue import ENTRY as QUEUE_ENTRY
from .dispatch_layout import HASHED_VALUE_BYTES_MAX, Layout, layout_of
from .errors import invariant

# The header fields the dispatcher reads, at their offsets in a record.
_HEADER = np.dtype({
    "names": ["size", "queue_id", "queue_offset", "physical_offset", "store_timestamp", "body_length"],
    "formats": [">i4", ">i4", ">i8", ">i8", ">i8", ">i4"],
    "offsets": [0, codec.QUEUE_ID_AT, codec.QUEUE_OFFSET_AT, codec.PHYSICAL_OFFSET_AT,
                codec.STORE_TIMESTAMP_AT, codec.BODY_LENGTH_AT],
    "itemsize": codec.HEADER.size,
})
# The same fields as native int64, converted from a run's headers in one call
_HEADER_NATIVE = np.dtype([(name, np.int64) for name in _HEADER.names])
# One ConsumeQueue entry (consume_queue.ENTRY): commit log offset, size, tags code.
_QUEUE_ENTRY = np.dtype([("physical_offset", ">i8"), ("size", ">i4"), ("tags_code", ">i8")])
assert _QUEUE_ENTRY.itemsize == QUEUE_ENTRY.size
# The same fields for ``parse_each``: TOTALSIZE, QUEUEID, QUEUEOFFSET, PHYSICALOFFSET,
# STORETIMESTAMP, BODY LENGTH
_DISPATCH_FIELDS = struct.Struct(">i8xi4xqq20xq20xi")
assert _DISPATCH_FIELDS.size == codec.HEADER.size and (codec.QUEUE_ID_AT, codec.QUEUE_OFFSET_AT,
                                                       codec.PHYSICAL_OFFSET_AT, codec.STORE_TIMESTAMP_AT,
                                                       codec.BODY_LENGTH_AT) == (12, 20, 28, 56, 84)
# Distinct TAGS values whose codes ``parse_each`` remembers.
_TAGS_CODES_MAX = 65536

# Byte strings are hashed right-aligned in windows of these widths; longer ones one by one.
_WIDTHS = (8, 16, 32, 64, 128, 256)
_WIDTH_MAX = _WIDTHS[-1]
# Zero bytes around the gathered properties, so every window stays inside the array.
_PAD_BYTES = _WIDTH_MAX
_MASK32 = np.uint64(0xFFFFFFFF)
# 31**n mod 2**32 (uint64 arithmetic wraps mod 2**64, which keeps every value mod 2**32 exact)
_POW31 = np.array([pow(31, n, 1 << 32) for n in range(_WIDTH_MAX + 1)], np.uint64)
_POW31_FLOAT = _POW31.astype(np.float64)
assert HASHED_VALUE_BYTES_MAX <= _WIDTH_MAX
_WINDOW_POWERS = {width: _POW31[width - 1::-1].copy() for width in _WIDTHS}
_WINDOW_COLUMNS = {width: np.arange(width) for width in _WIDTHS}

_SEPARATOR = 2          # \x02 ends a property pair
_SPACE = 32             # separates KEYS words
_NAME_END = 1           # \x01 ends a pair's name
assert codec.PROPERTY_SEPARATOR == "\x02" and codec.NAME_VALUE_SEPARATOR == "\x01" and codec.KEY_SEPARATOR == " "
assert (codec.PROPERTY_KEYS, codec.PROPERTY_TAGS, codec.PROPERTY_UNIQ_KEY) == ("KEYS", "TAGS", "UNIQ_KEY")

_EMPTY = np.zeros(0, np.int64)
# np.dtype((np.void, width)) per width, built once (``_windows`` runs a few times a pass)
_VOID_DTYPES: dict[int, np.dtype] = {}
# Working arrays up to this size are kept from pass to pass (see DispatchParser).
_SCRATCH_BYTES_MAX = 32 * 1024 * 1024


QueueRun = tuple[tuple[str, int], int, bytes]


class DispatchBatch(NamedTuple):
    """What one run of records adds to the indexes. (A NamedTuple: the dispatcher builds
    one per pass, and a live store's passes are small and many.)"""

    count: int                         # messages
    last_store_timestamp: int
    # ((topic, queue id), first queue offset, packed entries) per run of consecutive queue
    # offsets of one queue; a queue's runs in log order
    queue_runs: list[QueueRun]
    # IndexFile entries in dispatch order: lists, or int64 arrays from ``parse``
    key_hashes: Sequence[int]
    key_offsets: Sequence[int]
    key_timestamps: Sequence[int]


class DispatchParser:
    """Parses runs of records into DispatchBatches, keeping what outlives one pass: the
    topics' key-prefix hashes and the working memory of ``parse``.

    The large arrays of a pass (the records' copy, the gather index of their properties)
    are reused from pass to pass, up to ``_SCRATCH_BYTES_MAX`` each: fresh multi-MiB
    arrays every pass cost more in page faults than the parsing itself (the allocator
    hands such blocks back to the kernel on free).
    """

    def __init__(self) -> None:
        self._topic_prefixes: dict[str, int] = {}
        self._tags_codes: dict[str, int] = {}
        self._scratch: dict[str, np.ndarray] = {}
        self._layout: Layout | None = None        # of the last run of records alike

    def parse_each(self, buffer, positions: list[int]) -> DispatchBatch:
        """The batch of the messages at ``positions`` in ``buffer``, one record at a time."""
        runs: list[QueueRun] = []
        pending: dict[tuple[str, int], list] = {}          # queue -> [first queue offset, entries]
        # key hashes are computed in one call after the walk (key_hashes.index_key_hashes)
        key_prefixes: list[int] = []
        index_keys: list[str] = []
        key_offsets: list[int] = []
        key_timestamps: list[int] = []
        tags_codes = self._tags_codes
        unpack = _DISPATCH_FIELDS.unpack_from
        pack_entry = QUEUE_ENTRY.pack
        store_timestamp = 0
        for position in positions:
            size, queue_id, queue_offset, physical_offset, store_timestamp, body_length = unpack(buffer, position)
            topic_at = position + codec.HEADER.size + body_length
            topic_end = topic_at + 1 + buffer[topic_at]
            topic = buffer[topic_at + 1:topic_end].decode("utf-8")
            props = buffer[topic_end + 2:position + size].decode("utf-8")
            tags = keys = uniq = None
            if props:
                for pair in props.split("\x02"):
                    name, _, value = pair.partition("\x01")
                    if name == "KEYS":
                        keys = value
                    elif name == "TAGS":
                        tags = value
                    elif name == "UNIQ_KEY":
                        uniq = value
            if tags:
                tags_code = tags_codes.get(tags)
                if tags_code is None:
                    tags_code = codec.java_hash(tags)
                    if len(tags_codes) < _TAGS_CODES_MAX:
                        tags_codes[tags] = tags_code
            else:
                tags_code = 0
            entry = pack_entry(physical_offset, size, tags_code)
            queue_key = (topic, queue_id)
            run = pending.get(queue_key)
            if run is None:
                pending[queue_key] = [queue_offset, [entry]]
            elif run[0] + len(run[1]) == queue_offset:
                run[1].append(entry)
            else:  # not contiguous (never in a log this store wrote): the queue's next run
                runs.append((queue_key, run[0], b"".join(run[1])))
                pending[queue_key] = [queue_offset, [entry]]
            if keys or uniq:
                prefix = self._topic_prefix(topic)
                for key in (keys.split(" ") if keys else ()):
                    if key:
                        key_prefixes.append(prefix)
                        index_keys.append(key)
                        key_offsets.append(physical_offset)
                        key_timestamps.append(store_timestamp)
                if uniq:
                    key_prefixes.append(prefix)
                    index_keys.append(uniq)
                    key_offsets.append(physical_offset)
                    key_timestamps.append(store_timestamp)
        runs.extend((queue_key, run[0], b"".join(run[1])) for queue_key, run in pending.items())
        key_hashes = index_key_hashes(key_prefixes, index_keys) if index_keys else []
        return DispatchBatch(len(positions), store_timestamp, runs, key_hashes, key_offsets, key_timestamps)

    def parse(self, buffer, positions: list[int]) -> DispatchBatch:
        """The batch of the messages at ``positions`` in ``buffer`` (a mapping or bytes), with numpy.

        The records are copied out in one piece first (a mapping must not stay exported,
        and windows read up to 256 bytes past a record's end). Records must be whole
        messages, walked by the caller (size and magic checked); fields pointing outside
        their record are an error.
        """
        first, last = positions[0], positions[-1]
        end = last + codec.BLANK_HEADER.unpack_from(buffer, last)[0]
        raw = self._array("records", end - first + _PAD_BYTES, np.uint8)
        raw[:end - first] = np.frombuffer(buffer, np.uint8, end - first, first)
        raw[end - first:] = 0
        positions = np.array(positions, np.int64) - first
        headers = _windows(raw, codec.HEADER.size)[positions].view(_HEADER)
        sizes = headers["size"].astype(np.int64)
        body_lengths = headers["body_length"].astype(np.int64)
        ends = positions + sizes
        topic_at = positions + codec.HEADER.size + body_lengths
        invariant(bool(np.all((body_lengths >= 0) & (topic_at + 3 <= ends))), "message body inside its record")
        topic_lengths = raw[topic_at].astype(np.int64)
        properties_at = topic_at + 3 + topic_lengths
        invariant(bool(np.all(properties_at <= ends)), "message topic inside its record")
        topics, topic_numbers = _topics(raw, topic_at + 1, topic_lengths)
        properties, record_at = self._gather_properties(raw, properties_at, ends - properties_at)
        (tag_records, tag_starts, tag_ends), (key_records, key_starts, key_ends) = \
            _property_values(properties, record_at)
        # one hashing call for both: tags hash alone, index keys behind their topic's "topic#"
        topic_hashes = np.array([self._topic_prefix(topic) for topic in topics], np.uint64)
        prefixes = np.concatenate((np.zeros(len(tag_records), np.uint64), topic_hashes[topic_numbers[key_records]]))
        hashes = java_hashes(properties, np.concatenate((tag_starts, key_starts)),
                             np.concatenate((tag_ends, key_ends)), prefixes)
        tags_codes = np.zeros(len(positions), np.int64)
        tags_codes[tag_records] = _signed(hashes[:len(tag_records)])
        physical_offsets = headers["physical_offset"].astype(np.int64)
        store_timestamps = headers["store_timestamp"].astype(np.int64)
        entries = np.empty(len(positions), _QUEUE_ENTRY)
        entries["physical_offset"] = physical_offsets
        entries["size"] = sizes
        entries["tags_code"] = tags_codes
        runs = _queue_runs(topics, topic_numbers, headers["queue_id"].astype(np.int64),
                           headers["queue_offset"].astype(np.int64), entries)
        return DispatchBatch(len(positions), int(store_timestamps[-1]), runs,
                             _index_hashes(hashes[len(tag_records):]), physical_offsets[key_records],
                             store_timestamps[key_records])

    def parse_alike(self, buffer, positions: list[int]) -> DispatchBatch | None:
        """The batch of the messages at ``positions`` in ``buffer`` if their tails share one
        layout (dispatch_layout), in a few dozen numpy calls; None if they do not (then
        ``parse`` or ``parse_each`` it is). The last layout is kept from pass to pass."""
        view = np.frombuffer(buffer, np.uint8)
        try:
            at = np.array(positions, np.int64)
            headers = _windows(view, codec.HEADER.size)[at].view(_HEADER).astype(_HEADER_NATIVE)
            sizes = headers["size"]
            body_lengths = headers["body_length"]
            tail_ends = sizes - body_lengths
            tail_bytes = int(tail_ends[0]) - codec.HEADER.size
            if tail_bytes <= 0 or not bool((tail_ends == tail_ends[0]).all()):
                return None
            invariant(bool(np.all(body_lengths >= 0)), "message body inside its record")
            tails = _rows(view, at + (codec.HEADER.size + body_lengths), tail_bytes)
        finally:
            del view                 # a mapping cannot close while exported
        layout = self._layout
        if layout is None or layout.tail_bytes != tail_bytes or not layout.matches(tails):
            layout = layout_of(tails[0].tobytes())
            if layout is None or not layout.matches(tails):
                return None
            self._layout = layout
        count = len(positions)
        prefix = np.uint64(self._topic_prefix(layout.topic))
        keys = [_index_hashes(_span_hashes(tails, span, prefix)) for span in (layout.keys, layout.uniq_key) if span]
        tags_codes = _signed(_span_hashes(tails, layout.tags, np.uint64(0))) if layout.tags else 0
        physical_offsets = headers["physical_offset"]
        store_timestamps = headers["store_timestamp"]
        entries = np.empty(count, _QUEUE_ENTRY)
        entries["physical_offset"] = physical_offsets
        entries["size"] = sizes
        entries["tags_code"] = tags_codes
        runs = _one_topic_runs(layout.topic, headers["queue_id"], headers["queue_offset"], entries)
        if len(keys) == 2:             # a record's KEYS word, then its UNIQ_KEY
            key_hashes = np.stack(keys, axis=1).ravel()
            key_offsets, key_timestamps = np.repeat(physical_offsets, 2), np.repeat(store_timestamps, 2)
        elif keys:
            key_hashes, key_offsets, key_timestamps = keys[0], physical_offsets, store_timestamps
        else:
            key_hashes = key_offsets = key_timestamps = _EMPTY
        return DispatchBatch(count, int(store_timestamps[-1]), runs, key_hashes, key_offsets, key_timestamps)

    def _gather_properties(self, raw: np.ndarray, starts: np.ndarray,
                           lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every record's properties in one array, each behind a separator byte::

            [pad][\\x02 props of record 0][\\x02 props of record 1]...[\\x02][pad]

        so a pair starts after every separator, a record's first pair included. Returns
        the array and where each record's separator is.
        """
        spans = lengths + 1
        record_at = _PAD_BYTES + np.cumsum(spans) - spans
        total = int(spans.sum())
        properties = np.zeros(_PAD_BYTES + total + 1 + _PAD_BYTES, np.uint8)
        # where in raw each gathered byte comes from: consecutive within a record, and a
        # record's separator slot takes the byte before its properties (then overwritten)
        sources = self._array("sources", total, np.int64)
        sources.fill(1)
        sources[0] = starts[0] - 1
        sources[record_at[1:] - _PAD_BYTES] = starts[1:] - (starts[:-1] + spans[:-1] - 1)
        np.cumsum(sources, out=sources)
        np.take(raw, sources, out=properties[_PAD_BYTES:_PAD_BYTES + total])
        properties[record_at] = _SEPARATOR
        properties[_PAD_BYTES + total] = _SEPARATOR
        return properties, record_at

    def _array(self, name: str, length: int, dtype) -> np.ndarray:
        """A working array of ``length`` items, reused when it is small enough to keep."""
        kept = self._scratch.get(name)
        if kept is not None and len(kept) >= length:
            return kept[:length]
        array = np.empty(length, dtype)
        if array.nbytes <= _SCRATCH_BYTES_MAX:
            self._scratch[name] = array
        return array

    def _topic_prefix(self, topic: str) -> int:
        """Unsigned Java hash of ``topic + "#"``, the start of each of its index keys."""
        prefix = self._topic_prefixes.get(topic)
        if prefix is None:
            prefix = self._topic_prefixes[topic] = codec.java_hash_unsigned(topic + "#")
        return prefix


def _queue_runs(topics: list[str], topic_numbers: np.ndarray, queue_ids: np.ndarray, queue_offsets: np.ndarray,
                entries: np.ndarray) -> list[QueueRun]:
    """Split the records' ConsumeQueue entries into runs of consecutive offsets per queue."""
    order = np.lexsort((queue_ids, topic_numbers))          # stable: log order within a queue
    topic_numbers, queue_ids, queue_offsets = topic_numbers[order], queue_ids[order], queue_offsets[order]
    breaks = ((topic_numbers[1:] != topic_numbers[:-1]) | (queue_ids[1:] != queue_ids[:-1])
              | (queue_offsets[1:] != queue_offsets[:-1] + 1))
    bounds = [0, *(np.flatnonzero(breaks) + 1).tolist(), len(order)]
    entries = entries[order]
    return [((topics[int(topic_numbers[start])], int(queue_ids[start])), int(queue_offsets[start]),
             entries[start:end].tobytes()) for start, end in zip(bounds, bounds[1:])]


def java_hashes(buffer: np.ndarray, starts: np.ndarray, ends: np.ndarray, prefixes: np.ndarray) -> np.ndarray:
    """``codec.combine_hash(prefix, buffer[start:end].decode())`` of each range, as uint64.

    ASCII ranges up to 256 bytes are grouped by window width and hashed as one matrix
    product per group; others are decoded and hashed one by one. ``buffer`` must hold at
    least 256 bytes before every range.
    """
    lengths = ends - starts
    result = np.zeros(len(starts), np.uint64)
    widths = np.searchsorted(_WIDTHS, lengths)             # narrowest window holding each range
    order = np.argsort(widths, kind="stable")
    bounds = np.concatenate(([0], np.cumsum(np.bincount(widths, minlength=len(_WIDTHS) + 1)))).tolist()
    all_ascii = len(buffer) == 0 or int(buffer.max()) < 0x80
    one_by_one = [order[bounds[len(_WIDTHS)]:]]            # longer than the widest window
    for number, width in enumerate(_WIDTHS):
        group = order[bounds[number]:bounds[number + 1]]
        if not len(group):
            continue
        group_lengths = lengths[group]
        rows = _rows(buffer, ends[group] - width, width)     # right-aligned at the range's end
        rows *= _WINDOW_COLUMNS[width] >= (width - group_lengths)[:, None]   # zero the bytes before it
        sums = rows.astype(np.uint64) @ _WINDOW_POWERS[width]
        result[group] = (prefixes[group] * _POW31[group_lengths] + sums) & _MASK32
        if not all_ascii:
            one_by_one.append(group[(rows >= 0x80).any(axis=1)])
    for number in np.concatenate(one_by_one).tolist():
        text = buffer[starts[number]:ends[number]].tobytes().decode("utf-8")
        result[number] = codec.combine_hash(int(prefixes[number]), text)
    return result


def _span_hashes(tails: np.ndarray, span, prefix: np.uint64) -> np.ndarray:
    """Unsigned Java hash of prefix + each row's ASCII bytes in columns [span.start, span.end)
    (float64 is exact here: see dispatch_layout.HASHED_VALUE_BYTES_MAX)."""
    width = span.end - span.start
    sums = (tails[:, span.start:span.end] @ _POW31_FLOAT[width - 1::-1]).astype(np.uint64)
    return (prefix * _POW31[width] + sums) & _MASK32


def _one_topic_runs(topic: str, queue_ids: np.ndarray, queue_offsets: np.ndarray,
                    entries: np.ndarray) -> list[QueueRun]:
    """``_queue_runs`` of records of one topic."""
    ids, offsets = queue_ids.tolist(), queue_offsets.tolist()
    first_offset = offsets[0]
    if ids.count(ids[0]) == len(ids) and offsets == list(range(first_offset, first_offset + len(offsets))):
        # one queue's consecutive offsets (a put batch goes to one queue): one run, in log order
        return [((topic, ids[0]), first_offset, entries.tobytes())]
    order = queue_ids.argsort(kind="stable")              # stable: log order within a queue
    queue_ids, queue_offsets = queue_ids[order], queue_offsets[order]
    breaks = (queue_ids[1:] != queue_ids[:-1]) | (queue_offsets[1:] != queue_offsets[:-1] + 1)
    bounds = [0, *(np.flatnonzero(breaks) + 1).tolist(), len(order)]
    packed = entries[order].tobytes()
    queue_ids, queue_offsets = queue_ids.tolist(), queue_offsets.tolist()
    return [((topic, queue_ids[start]), queue_offsets[start], packed[start * QUEUE_ENTRY.size:end * QUEUE_ENTRY.size])
            for start, end in zip(bounds, bounds[1:])]


def _windows(buffer: np.ndarray, width: int) -> np.ndarray:
    """``buffer`` seen as one ``width``-byte item per starting byte: item i is
    ``buffer[i:i + width]``. Indexing it with an array copies whole windows at a time,
    several times faster than the same through ``sliding_window_view``."""
    dtype = _VOID_DTYPES.get(width)
    if dtype is None:
        dtype = _VOID_DTYPES[width] = np.dtype((np.void, width))
    return np.ndarray((len(buffer) - width + 1,), dtype, buffer=buffer, strides=(1,))


def _rows(buffer: np.ndarray, starts: np.ndarray, width: int) -> np.ndarray:
    """``buffer[start:start + width]`` for each start, as a (len(starts), width) uint8 matrix."""
    return _windows(buffer, width)[starts].view(np.uint8).reshape(len(starts), width)


def _signed(unsigned: np.ndarray) -> np.ndarray:
    """Unsigned 32-bit values as Java ints."""
    return unsigned.astype(np.int64) - (unsigned >= np.uint64(0x80000000)) * (1 << 32)


def _index_hashes(unsigned: np.ndarray) -> np.ndarray:
    """IndexFile key hash of unsigned 32-bit Java hashes: abs of the signed value, 0 for
    MIN_VALUE. From 2**31 on the signed value is negative and its abs is 2**32 minus the
    unsigned one; MIN_VALUE's (2**31) masks to 0."""
    values = unsigned.astype(np.int64)
    return np.where(values >= 1 << 31, ((1 << 32) - values) & 0x7FFFFFFF, values)


def _topics(raw: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> tuple[list[str], np.ndarray]:
    """Distinct topics and each record's topic number. Consecutive records mostly share a
    topic, so only the first record of each run of equal topic bytes is decoded."""
    width = next(w for w in _WIDTHS if w >= lengths.max())
    rows = _rows(raw, starts, width)
    rows *= _WINDOW_COLUMNS[width] < lengths[:, None]      # zero the bytes past the topic
    words = rows.view(np.uint64)                            # compared 8 bytes at a time
    same = (lengths[1:] == lengths[:-1]) & (words[1:] == words[:-1]).all(axis=1)
    heads = np.flatnonzero(np.concatenate(([True], ~same)))
    topic_index: dict[str, int] = {}
    head_numbers = []
    for head in heads.tolist():
        topic = raw[starts[head]:starts[head] + lengths[head]].tobytes().decode("utf-8")
        head_numbers.append(topic_index.setdefault(topic, len(topic_index)))
    run_lengths = np.diff(np.append(heads, len(starts)))
    return list(topic_index), np.repeat(np.array(head_numbers, np.int64), run_lengths)


def _property_values(properties: np.ndarray, record_at: np.ndarray):
    """(record, start, end) in ``properties`` of each record's TAGS value, and of its index
    keys in dispatch order (its KEYS words in order, then its UNIQ_KEY; no empty ones)."""
    separators = np.flatnonzero(properties == _SEPARATOR)
    pair_at, pair_ends = separators[:-1], separators[1:]
    # a pair's first 8 bytes as one number; the name is followed by \x01, or ends the pair
    heads = _windows(properties, 8)[pair_at + 1].view(">u8")

    def last_value(found: np.ndarray, name_bytes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(record, value start, value end) of each record's last pair among ``found``."""
        records = np.searchsorted(record_at, pair_at[found], side="right") - 1
        last = np.ones(len(records), bool)
        last[:-1] = records[1:] != records[:-1]
        found = found[last]
        ends = pair_ends[found]
        return records[last], np.minimum(pair_at[found] + 1 + name_bytes + 1, ends), ends

    def short_name(name: bytes) -> np.ndarray:
        """Pairs named ``name`` (up to 7 bytes): the name, then \\x01 or \\x02."""
        shift = np.uint64(8 * (7 - len(name)))
        follower = (heads >> shift) - np.uint64(int.from_bytes(name + b"\x01", "big"))
        return np.flatnonzero(follower <= np.uint64(_SEPARATOR - _NAME_END))

    uniq = np.flatnonzero(heads == np.uint64(int.from_bytes(b"UNIQ_KEY", "big")))
    follower = properties[pair_at[uniq] + 9]
    uniq = uniq[(follower == _NAME_END) | (follower == _SEPARATOR)]
    tags = last_value(short_name(b"TAGS"), 4)
    key_records, key_starts, key_ends = _words(properties, *last_value(short_name(b"KEYS"), 4))
    uniq_records, uniq_starts, uniq_ends = last_value(uniq, 8)
    records = np.concatenate((key_records, uniq_records))
    starts = np.concatenate((key_starts, uniq_starts))
    ends = np.concatenate((key_ends, uniq_ends))
    kinds = np.repeat([0, 1], [len(key_records), len(uniq_records)])
    keep = np.flatnonzero(ends > starts)
    keep = keep[np.lexsort((starts[keep], kinds[keep], records[keep]))]
    return tags, (records[keep], starts[keep], ends[keep])


def _words(properties: np.ndarray, records: np.ndarray, starts: np.ndarray, ends: np.ndarray):
    """Split KEYS values on spaces: (record, start, end) per word, in order (empty words kept)."""
    if not len(records):
        return _EMPTY, _EMPTY, _EMPTY
    spaces = np.flatnonzero(properties == _SPACE)
    owners = np.searchsorted(starts, spaces, side="right") - 1
    inside = (owners >= 0) & (spaces < ends[np.maximum(owners, 0)])
    if not inside.any():
        return records, starts, ends
    # a value's words lie between its cuts: the byte before it, its spaces, its end
    cuts = np.concatenate((starts - 1, spaces[inside], ends))
    cut_owners = np.concatenate((np.arange(len(starts)), owners[inside], np.arange(len(starts))))
    order = np.argsort(cuts, kind="stable")
    cuts, cut_owners = cuts[order], cut_owners[order]
    same = cut_owners[1:] == cut_owners[:-1]
    return records[cut_owners[:-1][same]], cuts[:-1][same] + 1, cuts[1:][same]
