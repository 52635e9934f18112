"""The CommitLog codec, byte by byte, against the RocketMQ v1 table (seeds 000, 001)."""

from __future__ import annotations

import socket
import struct
import zlib

import pytest
from hypothesis import given, settings, strategies as st

from store import codec, key_hashes

BODY = b"hello, commit log"
TOPIC = b"TopicTest"
PROPERTIES = {"KEYS": "k1 k2", "TAGS": "TagA", "UNIQ_KEY": "ABCDEF", "user": "v\u00e9"}
FIELDS = dict(
    queue_id=3, flag=0x01020304, queue_offset=0x1122334455667788, physical_offset=0x0102030405060708,
    sys_flag=0x0A0B0C0D, born_timestamp=1_700_000_000_123, store_timestamp=1_700_000_000_456,
    reconsume_times=7, prepared_transaction_offset=0x7EADBEEFCAFEBABE,
)
BORN_HOST = "10.1.2.3:5555"
STORE_HOST = "192.168.7.9:10911"


def encode(body=BODY, topic=TOPIC, properties=PROPERTIES, **changes) -> bytes:
    fields = {**FIELDS, **changes}
    pieces = codec.encode_message(
        topic_bytes=topic, body=body, body_crc=codec.crc32_body(body),
        properties_bytes=codec.encode_properties(properties),
        born_host=codec.encode_host(BORN_HOST), store_host=codec.encode_host(STORE_HOST), **fields)
    return b"".join(pieces)


def be(raw: bytes, at: int, size: int) -> int:
    return int.from_bytes(raw[at:at + size], "big", signed=True)


def java_hash_reference(text: str) -> int:
    """String.hashCode written the way the JDK does it: a loop over UTF-16 code units."""
    units = text.encode("utf-16-be")
    h = 0
    for i in range(0, len(units), 2):
        h = (31 * h + int.from_bytes(units[i:i + 2], "big")) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


# --- the 17 fields ----------------------------------------------------------------------
def test_every_field_at_its_v1_position_and_size():
    raw = encode()
    props_bytes = codec.encode_properties(PROPERTIES)
    expected_size = 4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + 8 + 8 + 8 + 4 + 8 + (4 + len(BODY)) + (1 + len(TOPIC)) \
        + (2 + len(props_bytes) + codec.HCRC_PROPERTY_BYTES)
    assert len(raw) == expected_size
    assert be(raw, 0, 4) == len(raw)                                    # 1 TOTALSIZE
    assert raw[4:8] == bytes.fromhex("DAA320A7")                        # 2 MAGICCODE
    assert be(raw, 4, 4) == -626843481
    assert be(raw, 8, 4) == zlib.crc32(BODY) & 0x7FFFFFFF               # 3 BODYCRC
    assert be(raw, 12, 4) == 3                                          # 4 QUEUEID
    assert raw[16:20] == bytes([1, 2, 3, 4])                            # 5 FLAG
    assert raw[20:28] == bytes.fromhex("1122334455667788")              # 6 QUEUEOFFSET
    assert raw[28:36] == bytes.fromhex("0102030405060708")              # 7 PHYSICALOFFSET
    assert raw[36:40] == bytes.fromhex("0A0B0C0D")                      # 8 SYSFLAG
    assert be(raw, 40, 8) == 1_700_000_000_123                          # 9 BORNTIMESTAMP
    assert raw[48:52] == socket.inet_aton("10.1.2.3")                   # 10 BORNHOST ip
    assert be(raw, 52, 4) == 5555                                       #    BORNHOST port
    assert be(raw, 56, 8) == 1_700_000_000_456                          # 11 STORETIMESTAMP
    assert raw[64:68] == bytes([192, 168, 7, 9])                        # 12 STOREHOSTADDRESS
    assert be(raw, 68, 4) == 10911
    assert be(raw, 72, 4) == 7                                          # 13 RECONSUMETIMES
    assert raw[76:84] == bytes.fromhex("7EADBEEFCAFEBABE")              # 14 PREPARED TX OFFSET
    assert be(raw, 84, 4) == len(BODY)                                  # 15 BODY LENGTH
    assert raw[88:88 + len(BODY)] == BODY                               #    BODY
    topic_at = 88 + len(BODY)
    assert raw[topic_at] == len(TOPIC)                                  # 16 TOPIC LENGTH (1 byte)
    assert raw[topic_at + 1:topic_at + 1 + len(TOPIC)] == TOPIC
    props_at = topic_at + 1 + len(TOPIC)
    props_length = be(raw, props_at, 2)                                 # 17 PROPERTIES LENGTH (2 bytes)
    assert props_at + 2 + props_length == len(raw)
    props = raw[props_at + 2:]
    assert props.startswith(props_bytes)
    assert props[len(props_bytes):len(props_bytes) + 9] == b"__CRC32#\x01"
    digits = props[len(props_bytes) + 9:-1]
    assert len(digits) == 10 and digits.isdigit()
    assert props[-1:] == b"\x02"


def test_crc32_property_is_rocketmq_5s_append_prop_crc():
    # CommitLog under enabledAppendPropCRC: UtilAll.crc32 (sign bit cleared) of the record's
    # first TOTALSIZE - 20 bytes, written by MessageDecoder.createCrc32 as ten decimal
    # digits, least significant first; checkMessageAndReturnSize reads them back that way
    raw = encode()
    expected = zlib.crc32(raw[:-20]) & 0x7FFFFFFF
    assert raw[-20:-11] == b"__CRC32#\x01" and raw[-1:] == b"\x02"
    digits = raw[-11:-1].decode()
    assert sum(int(digit) * 10 ** place for place, digit in enumerate(digits)) == expected
    assert digits == str(expected).zfill(10)[::-1]


def legacy_hcrc_record(**changes) -> bytes:
    """A record as hastore wrote it before __CRC32#: HCRC, hex CRC32 of header and tail."""
    fields = dict(FIELDS, **changes)
    props = codec.encode_properties(PROPERTIES)
    tail = bytes([len(TOPIC)]) + TOPIC + struct.pack(">H", len(props) + 14) + props + b"HCRC\x01"
    header = codec.HEADER.pack(88 + len(BODY) + len(tail) + 9, codec.MESSAGE_MAGIC, codec.crc32_body(BODY),
                               fields["queue_id"], fields["flag"], fields["queue_offset"], fields["physical_offset"],
                               fields["sys_flag"], fields["born_timestamp"], codec.encode_host(BORN_HOST),
                               fields["store_timestamp"], codec.encode_host(STORE_HOST), fields["reconsume_times"],
                               fields["prepared_transaction_offset"], len(BODY))
    return header + BODY + tail + b"%08x\x02" % zlib.crc32(tail, zlib.crc32(header))


def test_records_with_the_older_hcrc_still_read_and_verify():
    raw = legacy_hcrc_record()
    message = codec.decode_message(raw)
    assert message.body == BODY and message.user_properties == PROPERTIES
    for position in (30, 72, 90, len(raw) - 5):
        damaged = bytearray(raw)
        damaged[position] ^= 0x01
        with pytest.raises(codec.CorruptMessage):
            codec.check_record(damaged, 0, len(damaged))


def test_message_size_matches_encoding():
    props = codec.encode_properties(PROPERTIES)
    assert codec.message_size(TOPIC, BODY, props) == len(encode())
    assert codec.message_size(b"T", b"", b"") == 91 + 1 + codec.HCRC_PROPERTY_BYTES == len(
        encode(body=b"", topic=b"T", properties={}))


def test_blank_record():
    blank = codec.encode_blank(1234)
    assert len(blank) == 8
    assert blank[:4] == (1234).to_bytes(4, "big")
    assert blank[4:8] == bytes.fromhex("CBD43194")
    assert struct.unpack(">i", blank[4:8])[0] == -875286124
    segment = bytearray(1234)
    segment[:8] = blank
    header = codec.check_record(segment, 0, len(segment))
    assert header.is_blank and header.total_size == 1234
    with pytest.raises(codec.CorruptMessage):       # a blank record must end the segment
        codec.check_record(segment + b"\0", 0, len(segment) + 1)
    with pytest.raises(codec.CorruptMessage):       # and is not a message
        codec.decode_message(segment)


@pytest.mark.parametrize("body", [b"", b"x", bytes(range(256)) * 40])
def test_body_crc_is_rocketmq_crc32(body):
    assert codec.crc32_body(body) == zlib.crc32(body) & 0x7FFFFFFF
    raw = encode(body=body)
    assert be(raw, 8, 4) == zlib.crc32(body) & 0x7FFFFFFF


# --- Java String.hashCode and the index key hash ----------------------------------------
@pytest.mark.parametrize("text, expected", [
    ("", 0),
    ("a", 97),
    ("hello", 99162322),
    ("polygenelubricants", -2147483648),
    ("Aa", 2112), ("BB", 2112),
    ("TopicTest#key-1", None),
    ("h\u00e9llo", None),                 # non-ASCII, one code unit
    ("k\U0001F600y", None),              # a surrogate pair: two code units
    ("\u4e2d\u6587\u6d88\u606f", None),
    ("x" * 5000, None),                   # longer than any cached power table
])
def test_java_string_hash(text, expected):
    reference = java_hash_reference(text)
    if expected is not None:
        assert reference == expected
    assert codec.java_hash(text) == reference
    assert codec.java_hash_unsigned(text) == reference & 0xFFFFFFFF


def test_surrogate_pair_hashes_as_two_units():
    # U+1F600 is D83D DE00 in UTF-16: the hash must see both units, not the code point
    assert codec.java_hash("\U0001F600") == 0xD83D * 31 + 0xDE00
    assert codec.utf16_length("a\U0001F600") == 3


@given(st.text(max_size=40))
@settings(max_examples=200, deadline=None)
def test_java_hash_matches_reference(text):
    assert codec.java_hash(text) == java_hash_reference(text)


@given(st.text(max_size=20), st.text(max_size=20))
@settings(max_examples=100, deadline=None)
def test_prefix_hash_combines(prefix, suffix):
    unsigned = codec.java_hash_unsigned(prefix)
    assert codec.combine_hash(unsigned, suffix) == codec.java_hash_unsigned(prefix + suffix)
    assert codec.index_key_hash_with_prefix(unsigned, suffix) == codec.index_key_hash(prefix + suffix)


def test_index_key_hash_is_abs_and_zero_for_min_value():
    assert codec.index_key_hash("polygenelubricants") == 0
    assert codec.index_key_hash("hello") == 99162322
    negative = next(t for t in ("a#b", "TopicTest#key", "zzzzzz", "key-12345", "\u00ff" * 7)
                    if java_hash_reference(t) < 0)
    assert codec.index_key_hash(negative) == -java_hash_reference(negative)
    for text in ("", "x", "TopicTest#order-42", "h\u00e9llo"):
        assert codec.index_key_hash(text) == abs(java_hash_reference(text))


def test_tags_hash_code():
    assert codec.tags_hash_code(None) == 0
    assert codec.tags_hash_code("") == 0
    assert codec.tags_hash_code("TagA") == java_hash_reference("TagA")


# --- properties, hosts, message ids -----------------------------------------------------
def test_properties_round_trip():
    props = {"KEYS": "a b", "TAGS": "t", "x": "", "\u00e9": "\u4e2d"}
    raw = codec.encode_properties(props)
    assert raw == "KEYS\x01a b\x02TAGS\x01t\x02x\x01\x02\u00e9\x01\u4e2d\x02".encode("utf-8")
    assert codec.decode_properties(raw) == props
    assert codec.decode_properties(b"a\x011\x02b\x012") == {"a": "1", "b": "2"}  # no final separator
    assert codec.encode_properties({}) == b"" and codec.decode_properties(b"") == {}


def test_message_id_is_host_and_offset_upper_hex():
    host = codec.encode_host("127.0.0.1:10911")
    assert host == bytes([127, 0, 0, 1, 0, 0, 0x2A, 0x9F])
    mid = codec.message_id(host, 0x1234ABCD)
    assert mid == "7F00000100002A9F000000001234ABCD"
    assert len(mid) == 32 and mid == mid.upper()
    assert codec.parse_message_id(mid) == ("127.0.0.1:10911", 0x1234ABCD)
    assert codec.decode_host(host) == "127.0.0.1:10911"
    for bad in ("xyz", "7F000001", "7F00000100002A9F000000001234ABCD00"):
        with pytest.raises(ValueError):
            codec.parse_message_id(bad)


# --- decoding -----------------------------------------------------------------------------
def test_decode_round_trip():
    raw = encode()
    message = codec.decode_message(raw)
    assert message.total_size == len(raw)
    assert message.magic_code == codec.MESSAGE_MAGIC
    assert message.body_crc == codec.crc32_body(BODY)
    for name, value in FIELDS.items():
        assert getattr(message, name) == value, name
    assert message.born_host == BORN_HOST and message.store_host == STORE_HOST
    assert message.body == BODY and message.topic == TOPIC.decode()
    assert message.user_properties == PROPERTIES
    assert set(message.properties) == set(PROPERTIES) | {"__CRC32#"}
    assert message.keys == ["k1", "k2"] and message.tags == "TagA" and message.uniq_key == "ABCDEF"
    assert message.message_id == codec.message_id(codec.encode_host(STORE_HOST), FIELDS["physical_offset"])


def test_decode_at_position_inside_a_larger_buffer():
    first, second = encode(body=b"one"), encode(body=b"two", physical_offset=99)
    buffer = first + second
    assert codec.check_record(buffer, 0, len(buffer)).total_size == len(first)
    assert codec.decode_message(buffer, len(first)).body == b"two"


def test_unwritten_space_is_not_a_record():
    with pytest.raises(codec.CorruptMessage):
        codec.check_record(bytes(200), 0, 200)
    with pytest.raises(codec.CorruptMessage):
        codec.check_record(encode(), 0, 50)         # truncated: the record runs past the limit


def test_message_without_hcrc_is_refused_unless_legacy_reading_is_asked_for():
    raw = bytearray(encode())
    # rewrite the message as another RocketMQ tool would: no HCRC property
    props_at = 88 + len(BODY) + 1 + len(TOPIC)
    props = codec.encode_properties(PROPERTIES)
    legacy = bytes(raw[:props_at]) + struct.pack(">H", len(props)) + props
    legacy = struct.pack(">i", len(legacy)) + legacy[4:]
    with pytest.raises(codec.CorruptMessage):
        codec.decode_message(legacy)
    assert codec.decode_message(legacy, require_hcrc=False).body == BODY


# --- single-byte damage is always detected -----------------------------------------------
ENCODED = encode()
SMALL = encode(body=b"", topic=b"T", properties={})


@given(st.data())
@settings(max_examples=400, deadline=None)
def test_any_single_byte_change_is_detected(data):
    raw = data.draw(st.sampled_from([ENCODED, SMALL]))
    position = data.draw(st.integers(0, len(raw) - 1))
    mask = data.draw(st.integers(1, 255))
    damaged = bytearray(raw)
    damaged[position] ^= mask
    with pytest.raises(codec.CorruptMessage):
        codec.check_record(damaged, 0, len(damaged))
    with pytest.raises(codec.CorruptMessage):
        codec.decode_message(bytes(damaged))


@pytest.mark.parametrize("position", range(len(SMALL)))
def test_every_position_every_single_bit_flip_is_detected(position):
    # exhaustive over the small message: 8 bit flips and the case flip of hex digits
    for mask in (1, 2, 4, 8, 16, 32, 64, 128, 0xFF):
        damaged = bytearray(SMALL)
        damaged[position] ^= mask
        with pytest.raises(codec.CorruptMessage):
            codec.check_record(damaged, 0, len(damaged))


def test_crc_check_can_be_skipped_but_lengths_still_checked():
    damaged = bytearray(encode())
    damaged[90] ^= 0xFF                      # a body byte
    assert codec.decode_message(bytes(damaged), check_crc=False).body != BODY
    with pytest.raises(codec.CorruptMessage):
        codec.decode_message(bytes(damaged))
    damaged[0] ^= 0x01                       # TOTALSIZE off by one
    with pytest.raises(codec.CorruptMessage):
        codec.decode_message(bytes(damaged), check_crc=False)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["t#", "orders#", "%SYS%x#", "é#"]),
                          st.one_of(st.text(min_size=1, max_size=40),
                                    st.text(alphabet="0123456789ABCDEF", min_size=32, max_size=32))),
                min_size=0, max_size=60))
def test_batched_index_key_hashes_match_the_scalar_hash(pairs):
    # many keys share a length, so the vector path runs; odd ones take the scalar path
    prefixes = [codec.java_hash_unsigned(prefix) for prefix, _ in pairs]
    keys = [key for _, key in pairs]
    assert key_hashes.index_key_hashes(prefixes, keys) == [codec.index_key_hash(p + k) for p, k in pairs]


def test_batched_index_key_hashes_keep_the_min_value_rule():
    # "polygenelubricants" hashes to Integer.MIN_VALUE; abs() of it is 0 in the index
    prefix, key = "polygene", "lubricants"
    for count in (1, 7, 10):                                  # the loop for a few keys, and numpy
        hashes = key_hashes.index_key_hashes([codec.java_hash_unsigned(prefix)] * count, [key] * count)
        assert hashes == [0] * count


def test_index_key_hashes_of_keys_of_one_length():
    """Keys of one length (a batch's UNIQ_KEYs) are hashed as one group without a loop over
    them; a non-ASCII key among them, or a length past the groups' bound, sends them back
    to the loop. Same values as the scalar hash either way."""
    prefix = codec.java_hash_unsigned("orders#")
    hex_keys = [f"{number:032X}" for number in range(0, 10**6, 9973)]
    for keys in (hex_keys, hex_keys[:8], hex_keys[:-1] + ["é" * 32], ["k" * 300] * 9, [""] * 9):
        assert key_hashes.index_key_hashes([prefix] * len(keys), keys) == \
            [codec.index_key_hash_with_prefix(prefix, key) for key in keys]


def test_a_few_index_key_hashes_match_the_scalar_hash():
    import random
    rng = random.Random(12)
    for _ in range(500):
        keys = ["".join(rng.choice("az09#\u00e9\u4e2d\U0001F600") for _ in range(rng.choice([0, 1, 5, 32, 300, 1100])))
                for _ in range(rng.randrange(1, 8))]
        prefixes = [rng.randrange(1 << 32) for _ in keys]
        assert key_hashes.index_key_hashes(prefixes, keys) == [codec.index_key_hash_with_prefix(p, k)
                                                          for p, k in zip(prefixes, keys)]


def test_the_store_crc32_is_zlibs():
    """codec.crc32 (ISA-L when installed) must be bit for bit zlib's CRC32, chained too."""
    import random
    import zlib
    rng = random.Random(3)
    for size in (0, 1, 7, 88, 1024, 4096 + 3, 1 << 20):
        data = rng.randbytes(size)
        start = rng.randrange(1 << 32)
        assert codec.crc32(data) == zlib.crc32(data)
        assert codec.crc32(data, start) == zlib.crc32(data, start)
        assert codec.crc32(memoryview(data)[size // 3:]) == zlib.crc32(data[size // 3:])


@pytest.mark.parametrize("kind", ["bytes", "bytearray", "memoryview", "mmap"])
def test_check_record_reads_every_kind_of_buffer_alike(kind):
    """The scans hand check_record a mapping (scrub, recovery), a memoryview (repair) or bytes:
    the same verdicts on each, a sound record and a changed CRC digit."""
    import mmap
    sound = encode()
    digit_changed = bytearray(sound)
    digit_changed[-2] = ord("0") + (digit_changed[-2] - ord("0") + 1) % 10   # the most significant digit
    verdicts = []
    for raw in (sound, bytes(digit_changed)):
        data = b"\0" * 16 + raw + b"\0" * 16
        if kind == "mmap":
            buffer = mmap.mmap(-1, len(data))
            buffer[:] = data
        else:
            buffer = {"bytes": bytes, "bytearray": bytearray, "memoryview": memoryview}[kind](data)
        try:
            verdicts.append(codec.check_record(buffer, 16, 16 + len(raw)))
        except codec.CorruptMessage as error:
            verdicts.append(str(error))
    assert verdicts == [codec.RecordHeader(False, len(sound)), "message CRC (__CRC32#) mismatch at 16"]
    assert verdicts[0].total_size == len(sound) and not verdicts[0].is_blank
