"""Records alike (dispatch_layout): DispatchParser.parse_alike gives exactly what
parse_each gives, or None when the records do not share one layout."""

from __future__ import annotations

import random

import pytest

from store import Message
from store.dispatch_batch import DispatchParser
from store.dispatch_layout import layout_of

from test_dispatch_batch import as_tuple, dispatch_afresh, encode

# property sets as (name, value) with every value of one length per set; "?" is replaced
# by a random character from ALPHABET in each record
LAYOUTS = [
    [("UNIQ_KEY", "?" * 32)],
    [("UNIQ_KEY", "?" * 32), ("HCRCX", "????????")],
    [("KEYS", "key-???"), ("TAGS", "Tag?"), ("UNIQ_KEY", "?" * 32)],
    [("TAGS", "?"), ("KEYS", ""), ("UNIQ_KEY", "")],
    [("KEYS", "first?"), ("UNIQ_KEY", "?" * 8), ("KEYS", "second??"), ("TAGS", "a"), ("TAGS", "b?")],
    [("OTHER", "é?ü"), ("UNIQ_KEYS", "??"), ("XTAGS", "?"), ("KEYS", "k" * 230 + "??????")],
    [("mid", "a\x01b?"), ("TAGS", "x\x01?"), ("NONAME", None)],
    [],
]
ALPHABET = "0123456789ABCDEF-_x"


def layout_records(rng: random.Random, pairs, count: int, topic: str = "Topic-A", trailing: bool = True):
    buffer = bytearray(rng.randbytes(rng.randrange(0, 50)))
    positions = []
    offsets = {}
    for _ in range(count):
        queue_id = rng.randrange(4)
        queue_offset = offsets.get(queue_id, rng.randrange(9))
        offsets[queue_id] = queue_offset + 1
        properties = b"\x02".join(
            name.encode() if value is None else
            f"{name}\x01{''.join(rng.choice(ALPHABET) if c == '?' else c for c in value)}".encode("utf-8")
            for name, value in pairs)
        if pairs and trailing:
            properties += b"\x02"
        positions.append(len(buffer))
        buffer += encode(rng, topic, queue_id, queue_offset, len(buffer), properties)
    return buffer, positions


@pytest.mark.parametrize("number", range(len(LAYOUTS)))
def test_records_alike_match_one_record_at_a_time(number):
    rng = random.Random(number)
    for count, trailing in ((1, True), (17, False), (300, True)):
        buffer, positions = layout_records(rng, LAYOUTS[number], count, trailing=trailing)
        parser = DispatchParser()
        alike = parser.parse_alike(bytes(buffer), positions)
        assert alike is not None
        assert as_tuple(alike) == as_tuple(parser.parse_each(bytes(buffer), positions))


def test_a_layout_is_kept_and_replaced():
    rng = random.Random(3)
    parser = DispatchParser()
    for pairs in (LAYOUTS[0], LAYOUTS[2], LAYOUTS[2], LAYOUTS[0]):
        buffer, positions = layout_records(rng, pairs, 20, topic=rng.choice(["T", "Topic-B", "tópico"]))
        alike = parser.parse_alike(bytes(buffer), positions)
        assert alike is not None and as_tuple(alike) == as_tuple(parser.parse_each(bytes(buffer), positions))


@pytest.mark.parametrize("seed", range(40))
def test_records_changed_anywhere_are_alike_only_when_they_parse_the_same(seed):
    """Bytes of one record's tail changed to separators, spaces, non-ASCII: the batch is
    refused (None) or equals parse_each's."""
    rng = random.Random(seed)
    pairs = rng.choice(LAYOUTS[:-1])
    buffer, positions = layout_records(rng, pairs, 20)
    size = int.from_bytes(buffer[positions[5]:positions[5] + 4], "big")
    tail_at = positions[5] + 88 + int.from_bytes(buffer[positions[5] + 84:positions[5] + 88], "big")
    for _ in range(rng.randrange(1, 3)):
        buffer[rng.randrange(tail_at, positions[5] + size)] = rng.choice([1, 2, 32, 0x80, 0xC3, 48, 0])
    parser = DispatchParser()
    alike = parser.parse_alike(bytes(buffer), positions)
    if alike is not None:
        # parse_each decodes every property, the columns only what they hash
        each = parser.parse(bytes(buffer), positions) if b"\x80" in buffer or b"\xc3" in buffer \
            else parser.parse_each(bytes(buffer), positions)
        assert as_tuple(alike) == as_tuple(each)


def test_records_of_other_lengths_or_topics_are_not_alike():
    rng = random.Random(8)
    first, first_positions = layout_records(rng, LAYOUTS[2], 10)
    second, second_positions = layout_records(rng, LAYOUTS[2], 10, topic="Topic-B")
    buffer = first + second
    positions = first_positions + [len(first) + position for position in second_positions]
    assert DispatchParser().parse_alike(bytes(buffer), positions) is None
    longer, longer_positions = layout_records(rng, [("UNIQ_KEY", "?" * 33)], 10)
    positions = first_positions + [len(first) + position for position in longer_positions]
    assert DispatchParser().parse_alike(bytes(first + longer), positions) is None


def test_layouts_the_columns_cannot_describe():
    assert layout_of(b"") is None
    assert layout_of(b"\x05abc") is None                                   # topic past the tail
    assert layout_of(b"\x02\xff\xfe\x00\x04TAGS") is None                    # topic not UTF-8
    assert layout_of(b"\x01T\x01\x10KEYS\x01" + b"k" * 257 + b"\x02") is None   # a hashed value too long
    layout = layout_of(b"\x01T\x00\x10KEYS\x01" + b"k" * 256 + b"\x02")
    assert layout is not None and layout.keys == (9, 265)


def test_dispatchers_of_records_alike_build_identical_files(open_store, tmp_path, monkeypatch):
    store = open_store(commitlog_segment_bytes=64 * 1024)       # many segments, blank records
    store.dispatcher.stop()
    rng = random.Random(4)
    for start in range(0, 1200, 100):
        alike = start % 300 != 0
        messages = [Message(topic="T" if alike else rng.choice(["T", "U"]), queue_id=number % 3,
                            body=rng.randbytes(rng.choice([100, 600])),
                            keys=[f"key-{number:05d}"] if alike else [f"k{number}", "two"],
                            tags=rng.choice(["TagA", "TagB"]), properties={"UNIQ_KEY": f"{number:032X}"})
                    for number in range(start, start + 100)]
        assert all(result.status.ok for result in store.append(messages))
    parsed_alike = []
    parse_alike = DispatchParser.parse_alike
    monkeypatch.setattr(DispatchParser, "parse_alike",
                        lambda self, *args: parsed_alike.append(parse_alike(self, *args)) or parsed_alike[-1])
    built = {}
    for name, records_min in (("alike", 1), ("each", 10**9)):
        rebuilt = dispatch_afresh(store.commit_log, str(tmp_path / name), 20_000,
                                  alike_records_min=records_min, columns_records_min=10**9)
        assert rebuilt.count == 1200
        built[name] = rebuilt.tree
    assert built["alike"] == built["each"]
    assert sum(batch.count for batch in parsed_alike if batch is not None) > 600
    assert None in parsed_alike
    store.dispatcher.start()
