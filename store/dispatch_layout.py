"""Records of one layout: a run whose tails (topic and properties) differ only inside
property values, checked and parsed with a few dozen numpy calls.

A live store's passes are mostly such runs: one producer's messages to one topic, the same
property names in the same order with values of the same lengths (UNIQ_KEY is 32 hex
digits, HCRC 8). A ``Layout`` is what the first such record's tail says about every byte
column of the tail::

    [topic length][topic][properties length, 2][name \\x01 value \\x02]...

- fixed columns: the topic length and topic, every name, every ``\\x01`` ending a name,
  every ``\\x02``; a record of the layout has the first record's bytes there;
- the properties length: any byte (the parsers take a record's size instead);
- values: any byte but ``\\x02``, so every record splits into the same pairs with the same
  names, and the last TAGS, KEYS and UNIQ_KEY pair is the same pair in every record;
- the TAGS, KEYS and UNIQ_KEY values that count: ASCII only (hashed as bytes, which is
  exact for ASCII), and no space in KEYS (one word; the general parser splits words).

A run matches when every record's tail has the layout's length and every byte lies in its
column's range (fixed: the first record's byte; hashed values: ASCII; the rest: any),
and the properties of every record hold as many ``\\x02`` as the fixed columns do (so none
inside a value). The tails then give the tags codes and index keys as matrix products
over fixed columns, with the same values ``DispatchParser.parse_each`` computes one
record at a time.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from . import codec

# A value is hashed as one matrix product over its columns, in float64: at most this many
# bytes, so every partial sum (ASCII bytes below 2**7 times powers below 2**32) stays an
# integer below 2**53, exact in any order of summing.
HASHED_VALUE_BYTES_MAX = 256
# Longer tails (huge property sets) are left to the general parser.
TAIL_BYTES_MAX = 4096

_SEPARATOR = 2
_SPACE = 32
_ASCII_END = 0x80
# the properties whose values the indexes take, in the order of DispatchBatch's Layout fields
_NAMES = (codec.PROPERTY_TAGS.encode(), codec.PROPERTY_KEYS.encode(), codec.PROPERTY_UNIQ_KEY.encode())


class Span(NamedTuple):
    """Columns [start, end) of a value in the tail; empty when the value is."""
    start: int
    end: int


class Layout(NamedTuple):
    """The byte columns of the tails of records alike (see the module docstring)."""

    tail_bytes: int
    topic: str
    properties_at: int               # the column of the first property byte
    low: np.ndarray                  # per column, uint8: the lowest byte allowed ...
    spread: np.ndarray               # ... and how far above it the highest is
    separators: int                  # \x02 bytes in a record's properties
    tags: Span | None                # the TAGS value that counts, if not empty
    keys: Span | None                # the KEYS value (one word), if not empty
    uniq_key: Span | None            # the UNIQ_KEY value, if not empty

    def matches(self, tails: np.ndarray) -> bool:
        """Whether every row of ``tails`` (records x tail_bytes, uint8) has this layout."""
        if not ((tails - self.low) <= self.spread).all():      # uint8 arithmetic wraps below low
            return False
        if np.count_nonzero(tails[:, self.properties_at:] == _SEPARATOR) != len(tails) * self.separators:
            return False
        keys = self.keys
        return keys is None or not (tails[:, keys.start:keys.end] == _SPACE).any()


def layout_of(tail: bytes) -> Layout | None:
    """The layout of records whose tail is like ``tail``; None for a tail the layout
    cannot describe (the general parser takes those: a value longer than
    ``HASHED_VALUE_BYTES_MAX``, a topic that is not UTF-8, a malformed tail)."""
    tail_bytes = len(tail)
    topic_bytes = tail[0] if tail_bytes else 0
    properties_at = 1 + topic_bytes + codec.PROPS_LEN.size
    if not properties_at <= tail_bytes <= TAIL_BYTES_MAX:
        return None
    try:
        topic = tail[1:1 + topic_bytes].decode("utf-8")
    except UnicodeDecodeError:
        return None
    low = np.frombuffer(tail, np.uint8).copy()                  # fixed columns: the byte itself
    spread = np.zeros(tail_bytes, np.uint8)
    low[1 + topic_bytes:properties_at] = 0                      # the properties length: any
    spread[1 + topic_bytes:properties_at] = 255
    found: dict[bytes, tuple[int, int]] = {}
    pair_at = properties_at
    while pair_at < tail_bytes:                                 # "if props:" in parse_each
        separator_at = tail.find(b"\x02", pair_at)
        pair_end = tail_bytes if separator_at < 0 else separator_at
        name_end = tail.find(b"\x01", pair_at, pair_end)
        if name_end < 0:                                        # a pair that is all name
            name, value = tail[pair_at:pair_end], (pair_end, pair_end)
        else:
            name, value = tail[pair_at:name_end], (name_end + 1, pair_end)
            low[value[0]:value[1]] = 0
            spread[value[0]:value[1]] = 255
        if name in _NAMES:
            found[name] = value                                 # the last pair of a name wins
        if separator_at < 0:
            break
        pair_at = separator_at + 1
    spans = []
    for name in _NAMES:
        start, end = found.get(name, (0, 0))
        if end - start > HASHED_VALUE_BYTES_MAX:
            return None
        spread[start:end] = _ASCII_END - 1
        spans.append(Span(start, end) if end > start else None)
    separators = tail.count(b"\x02", properties_at)
    return Layout(tail_bytes, topic, properties_at, low, spread, separators, *spans)
