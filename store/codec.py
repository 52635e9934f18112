"""The CommitLog message codec: RocketMQ v1 byte layout, big-endian. Pure: no I/O.

This module is what the pipeline imports to read store directories, so it depends on
little: the standard library and, when installed, ``isal`` for CRC32 (the same checksum as ``zlib.crc32``, several times faster; ``zlib`` is
the fallback).

One message (all integers big-endian, as Java's ByteBuffer)::

    offset size field
       0    4  TOTALSIZE
       4    4  MAGICCODE          0xDAA320A7 (message) | 0xCBD43194 (blank end of segment)
       8    4  BODYCRC            CRC32(body) & 0x7FFFFFFF (RocketMQ UtilAll.crc32)
      12    4  QUEUEID
      16    4  FLAG
      20    8  QUEUEOFFSET
      28    8  PHYSICALOFFSET
      36    4  SYSFLAG
      40    8  BORNTIMESTAMP      ms
      48    8  BORNHOST           IPv4 (4) + port (4)
      56    8  STORETIMESTAMP     ms
      64    8  STOREHOSTADDRESS   IPv4 (4) + port (4)
      72    4  RECONSUMETIMES
      76    8  PREPARED TRANSACTION OFFSET
      84    4  BODY LENGTH        then BODY
       .    1  TOPIC LENGTH       then TOPIC (<= 127 bytes)
       .    2  PROPERTIES LENGTH  then PROPERTIES (key \\x01 value \\x02 ...)

Every message hastore writes ends with RocketMQ 5's whole-message CRC property, the last
20 bytes of the record, as RocketMQ writes it under ``enabledAppendPropCRC``
(``MessageDecoder.createCrc32``) and checks it under ``forceVerifyPropCRC``::

    "__CRC32#" \x01 d0 d1 ... d9 \x02      d0..d9: decimal digits, least significant first

The value is ``UtilAll.crc32`` (CRC32 with the sign bit cleared) of the record's first
TOTALSIZE - 20 bytes: every header field, the body, the topic and the properties before
it. v1's BODYCRC leaves every header field unprotected; with this CRC a flipped bit
anywhere in a message is caught by recovery and by reads.

Stores written before carry hastore's older property ``HCRC`` instead (eight hex digits,
the last 14 bytes: CRC32 of the record except the body and the digits); such records
still read and verify. Messages with neither (written by other RocketMQ-format tools) are
accepted with the body check alone only when the reader passes ``require_hcrc=False``;
the store itself always requires one of the two.
"""

from __future__ import annotations

import re
import socket
import struct
import sys
import zlib
from dataclasses import dataclass, field
from operator import mul
from typing import NamedTuple


try:  # ISA-L's CRC32: bit for bit zlib's, about 6x faster on 1 KiB here (0.07 against 0.40 us)
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - isal is a dependency; zlib keeps a bare install working
    from zlib import crc32

MESSAGE_MAGIC = 0xDAA320A7
BLANK_MAGIC = 0xCBD43194

# TOTALSIZE .. BODY LENGTH, everything before the body bytes.
HEADER = struct.Struct(">iIiiiqqiq8sq8siqi")
assert HEADER.size == 88
BLANK_HEADER = struct.Struct(">iI")
assert BLANK_HEADER.size == 8
# A segment keeps this much room for the blank record that closes it.
END_OF_SEGMENT_MIN_BLANK = BLANK_HEADER.size

TOPIC_LEN = struct.Struct(">B")
PROPS_LEN = struct.Struct(">H")
FIXED_SIZE = HEADER.size + TOPIC_LEN.size + PROPS_LEN.size
assert FIXED_SIZE == 91

MAX_BODY_BYTES = 4 * 1024 * 1024
MAX_TOPIC_BYTES = 127
MAX_PROPERTIES_BYTES = 32767

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"
PROPERTY_KEYS = "KEYS"
PROPERTY_TAGS = "TAGS"
PROPERTY_UNIQ_KEY = "UNIQ_KEY"
PROPERTY_CRC32 = "__CRC32#"             # RocketMQ's MessageConst.PROPERTY_CRC32
PROPERTY_HCRC = "HCRC"                  # hastore's older whole-message CRC (read, never written)
KEY_SEPARATOR = " "
# property names only the store writes: a put that sets one is refused
STORE_PROPERTY_NAMES = frozenset((PROPERTY_CRC32, PROPERTY_HCRC))

# "__CRC32#\x01" + 10 digits + "\x02" (RocketMQ's CRC32_RESERVED_LEN, 20 bytes): the last
# SEAL_VALUE_BYTES of a record are the digits and the closing separator.
SEAL_PREFIX = b"__CRC32#\x01"
SEAL_VALUE_BYTES = 11
SEAL_PROPERTY_BYTES = len(SEAL_PREFIX) + SEAL_VALUE_BYTES
assert SEAL_PROPERTY_BYTES == 20
# The writers (commit_log, put_batch, message_store) know the seal by these older names:
# they now describe the __CRC32# property.
HCRC_PREFIX = SEAL_PREFIX
HCRC_VALUE_BYTES = SEAL_VALUE_BYTES
HCRC_PROPERTY_BYTES = SEAL_PROPERTY_BYTES
# hastore's older property, still read: "HCRC\x01" + 8 hex digits + "\x02"
LEGACY_HCRC_PREFIX = b"HCRC\x01"
LEGACY_HCRC_VALUE_BYTES = 9
LEGACY_HCRC_PROPERTY_BYTES = len(LEGACY_HCRC_PREFIX) + LEGACY_HCRC_VALUE_BYTES

TOPIC_PATTERN = re.compile(r"^[A-Za-z0-9_%-]+$")

# Field offsets inside a message, for readers that pick single fields.
QUEUE_ID_AT = 12
QUEUE_OFFSET_AT = 20
PHYSICAL_OFFSET_AT = 28
STORE_TIMESTAMP_AT = 56
BODY_LENGTH_AT = 84


def crc32_body(body: bytes) -> int:
    """RocketMQ's ``UtilAll.crc32``: CRC32 of the body with the sign bit cleared."""
    return crc32(body) & 0x7FFFFFFF


# --- Java String.hashCode -------------------------------------------------------------
# h = sum(c[i] * 31^(n-1-i)) mod 2^32 over UTF-16 code units. Because it is a polynomial,
# hash(a + b) = hash(a) * 31^len(b) + hash(b), which lets callers cache a prefix.
_UTF16_NATIVE = "utf-16-le" if sys.byteorder == "little" else "utf-16-be"
_POW31 = [pow(31, i, 1 << 32) for i in range(1024)]
_REVERSED_POWERS: dict[int, list[int]] = {}


def _reversed_powers(length: int) -> list[int]:
    powers = _REVERSED_POWERS.get(length)
    if powers is None:
        powers = [pow(31, i, 1 << 32) for i in range(length - 1, -1, -1)]
        if length <= 4096:
            _REVERSED_POWERS[length] = powers
    return powers


def java_hash_unsigned(text: str) -> int:
    """Java ``String.hashCode`` as an unsigned 32-bit value."""
    if text.isascii():
        units: bytes | memoryview = text.encode("ascii")
    else:
        units = memoryview(text.encode(_UTF16_NATIVE)).cast("H")
    return sum(map(mul, units, _reversed_powers(len(units)))) & 0xFFFFFFFF


def java_hash(text: str) -> int:
    """Java ``String.hashCode``: a signed 32-bit int."""
    value = java_hash_unsigned(text)
    return value - (1 << 32) if value & 0x80000000 else value


def utf16_length(text: str) -> int:
    """Length in UTF-16 code units, the length Java's hash works over."""
    if text.isascii():
        return len(text)
    return len(text.encode("utf-16-le")) // 2


def combine_hash(prefix_hash: int, suffix: str) -> int:
    """Unsigned hash of prefix + suffix from the prefix's unsigned hash."""
    if suffix.isascii():
        units: bytes | memoryview = suffix.encode("ascii")
    else:
        units = memoryview(suffix.encode(_UTF16_NATIVE)).cast("H")
    length = len(units)
    power = _POW31[length] if length < len(_POW31) else pow(31, length, 1 << 32)
    return (prefix_hash * power + sum(map(mul, units, _reversed_powers(length)))) & 0xFFFFFFFF


def index_key_hash(text: str) -> int:
    """IndexFile key hash: abs(String.hashCode), 0 for Integer.MIN_VALUE."""
    return _abs_hash(java_hash_unsigned(text))


def _abs_hash(unsigned: int) -> int:
    if unsigned == 0x80000000:
        return 0
    return (1 << 32) - unsigned if unsigned & 0x80000000 else unsigned


def index_key_hash_with_prefix(prefix_hash: int, suffix: str) -> int:
    """IndexFile key hash of prefix + suffix given the prefix's unsigned Java hash."""
    return _abs_hash(combine_hash(prefix_hash, suffix))


def tags_hash_code(tags: str | None) -> int:
    """ConsumeQueue tags code: String.hashCode of TAGS as a long, 0 without tags."""
    return java_hash(tags) if tags else 0


# --- hosts and message ids ---------------------------------------------------------------
def encode_host(address: str) -> bytes:
    """'ip:port' -> 8 bytes (IPv4 4 + port 4). The port must fit Java's InetSocketAddress
    (0..65535), which RocketMQ's decoder builds from it."""
    host, _, port = address.rpartition(":")
    try:
        raw = socket.inet_aton(host) + struct.pack(">i", int(port))
    except (OSError, ValueError, struct.error) as error:
        raise ValueError(f"not an IPv4 'host:port' address: {address!r}") from error
    if not 0 <= int(port) <= 65535 or host.count(".") != 3:
        raise ValueError(f"not an IPv4 'host:port' address with a port in 0..65535: {address!r}")
    return raw


# --- system flags (RocketMQ MessageSysFlag) ----------------------------------------------
SYS_FLAG_COMPRESSED = 0x1
SYS_FLAG_TRANSACTION_MASK = 0xC           # PREPARED 0x4, COMMIT 0x8, ROLLBACK 0xC
SYS_FLAG_TRANSACTION_PREPARED = 0x4
SYS_FLAG_TRANSACTION_ROLLBACK = 0xC
SYS_FLAG_BORN_HOST_V6 = 0x10
SYS_FLAG_STORE_HOST_V6 = 0x20
SYS_FLAG_COMPRESSION_TYPE_MASK = 0x700    # >> 8: 0 or 3 zlib, 1 lz4, 2 zstd
_LZ4_FRAME_MAGIC = b"\x04\x22\x4d\x18"
_ZSTD_FRAME_MAGIC = b"\x28\xb5\x2f\xfd"
# a compressed body is checked by inflating it, at most this much
_INFLATED_BYTES_MAX = 64 * 1024 * 1024


def sys_flag_problem(sys_flag, body: bytes) -> str | None:
    """Why RocketMQ could not read a message with this SYSFLAG and body, or None.

    hastore stores IPv4 hosts only, so the IPv6 host flags would make a decoder read 20
    host bytes where there are 8; RocketMQ neither queues nor indexes transaction prepared
    or rollback records; the compressed flag promises a body a consumer can inflate: zlib
    for compression type 0 or 3 (as ``CompressionType.findByValue``), an LZ4 or zstd frame
    for types 1 and 2."""
    if type(sys_flag) is not int or not 0 <= sys_flag <= 0x7FFFFFFF:
        return "sys_flag must be an int in [0, 2^31)"
    if sys_flag & SYS_FLAG_BORN_HOST_V6:
        return "sys_flag 0x10 (born host IPv6) set, but born_host is an IPv4 address"
    if sys_flag & SYS_FLAG_STORE_HOST_V6:
        return "sys_flag 0x20 (store host IPv6) set, but the store host is an IPv4 address"
    transaction = sys_flag & SYS_FLAG_TRANSACTION_MASK
    if transaction == SYS_FLAG_TRANSACTION_PREPARED:
        return "sys_flag 0x4 (transaction prepared) is not accepted: RocketMQ neither queues nor indexes it"
    if transaction == SYS_FLAG_TRANSACTION_ROLLBACK:
        return "sys_flag 0xC (transaction rollback) is not accepted: RocketMQ neither queues nor indexes it"
    if sys_flag & SYS_FLAG_COMPRESSED:
        return _compressed_body_problem((sys_flag & SYS_FLAG_COMPRESSION_TYPE_MASK) >> 8, body)
    return None


def _compressed_body_problem(compression_type: int, body: bytes) -> str | None:
    if compression_type in (0, 3):
        inflater = zlib.decompressobj()
        try:
            inflater.decompress(body, _INFLATED_BYTES_MAX)
        except zlib.error as error:
            return f"sys_flag 0x1 (compressed, zlib) set, but the body is not zlib data: {error}"
        if inflater.unconsumed_tail:
            return f"sys_flag 0x1 (compressed) set and the body inflates past {_INFLATED_BYTES_MAX} bytes"
        if not inflater.eof or inflater.unused_data:
            return "sys_flag 0x1 (compressed, zlib) set, but the body is not one whole zlib stream"
        return None
    if compression_type == 1:
        return None if bytes(body[:4]) == _LZ4_FRAME_MAGIC else \
            "sys_flag 0x1 with compression type lz4 (0x100) set, but the body is not an LZ4 frame"
    if compression_type == 2:
        return None if bytes(body[:4]) == _ZSTD_FRAME_MAGIC else \
            "sys_flag 0x1 with compression type zstd (0x200) set, but the body is not a zstd frame"
    return f"sys_flag compression type {compression_type} (bits 0x700) is not one RocketMQ knows (1 lz4, 2 zstd, 3 zlib)"


def decode_host(raw: bytes) -> str:
    """8 bytes (IPv4 4 + port 4) -> 'ip:port'."""
    return f"{socket.inet_ntoa(raw[:4])}:{struct.unpack('>i', raw[4:8])[0]}"


def message_id(store_host: bytes, physical_offset: int) -> str:
    """Offset message id: store host (8 bytes) + physical offset (8 bytes), upper hex."""
    return (store_host + physical_offset.to_bytes(8, "big")).hex().upper()


def parse_message_id(text: str) -> tuple[str, int]:
    """Offset message id -> (store host 'ip:port', physical offset)."""
    try:
        raw = bytes.fromhex(text)
    except ValueError as error:
        raise ValueError(f"message id is not hex: {text!r}") from error
    if len(raw) != 16:
        raise ValueError(f"message id must be 32 hex digits, got {len(text)}: {text!r}")
    return decode_host(raw[:8]), int.from_bytes(raw[8:], "big")


# --- properties --------------------------------------------------------------------------
def encode_properties(properties: dict[str, str]) -> bytes:
    """``key\\x01value\\x02`` pairs, UTF-8."""
    return "".join(
        f"{key}{NAME_VALUE_SEPARATOR}{value}{PROPERTY_SEPARATOR}" for key, value in properties.items()
    ).encode("utf-8")


def decode_properties(raw: bytes | str) -> dict[str, str]:
    """Inverse of :func:`encode_properties`; tolerates a missing final separator."""
    text = raw.decode("utf-8") if isinstance(raw, (bytes, bytearray, memoryview)) else raw
    properties: dict[str, str] = {}
    for pair in text.split(PROPERTY_SEPARATOR):
        if pair:
            key, _, value = pair.partition(NAME_VALUE_SEPARATOR)
            properties[key] = value
    return properties


def property_text_problem(text: str) -> str | None:
    """Why a property key or value cannot be stored, or None."""
    if NAME_VALUE_SEPARATOR in text or PROPERTY_SEPARATOR in text:
        return "property keys and values must not contain \\x01 or \\x02"
    return None


def topic_problem(topic: str) -> str | None:
    """Why a topic name is illegal, or None."""
    if not isinstance(topic, str) or not topic:
        return "topic must be a non-empty string"
    if len(topic.encode("utf-8")) > MAX_TOPIC_BYTES:
        return f"topic is longer than {MAX_TOPIC_BYTES} bytes"
    if not TOPIC_PATTERN.match(topic):
        return "topic may hold only [A-Za-z0-9_%-]"
    return None


# --- encoding ----------------------------------------------------------------------------
def encode_topic(topic: str) -> bytes:
    """TOPICLEN + TOPIC, how a record holds its topic (callers check the topic first)."""
    topic_bytes = topic.encode("utf-8")
    return b"%c%s" % (len(topic_bytes), topic_bytes)


def encode_tail(encoded_topic: bytes, properties_bytes: bytes) -> bytes:
    """A record's bytes after the body, up to the CRC digits: TOPICLEN TOPIC (``encoded_topic``,
    see :func:`encode_topic`) PROPLEN PROPERTIES "__CRC32#\x01". None of it depends on where
    the record lands, so a writer builds it before taking the write lock."""
    return b"%s%s%s" % (encoded_topic, (len(properties_bytes) + HCRC_PROPERTY_BYTES).to_bytes(2, "big"),
                        properties_bytes) + HCRC_PREFIX


_SEAL_PREFIX_BYTES = len(SEAL_PREFIX)


def seal(header: bytes, body: bytes, tail: bytes, _crc=crc32, _view=memoryview) -> bytes:
    """The __CRC32# digits and closing separator for a record of ``header``, ``body`` and
    ``tail`` (which ends with "__CRC32#\x01"): the CRC of the record's first TOTALSIZE - 20
    bytes, so of everything but that property."""
    return seal_value(_crc(_view(tail)[:-_SEAL_PREFIX_BYTES], _crc(body, _crc(header))))


def seal_value(crc: int) -> bytes:
    """The 11 bytes after "__CRC32#\x01" for a CRC32 (``crc32``'s unsigned value): the sign
    bit cleared (``UtilAll.crc32``), ten decimal digits least significant first, ``\x02``."""
    return (b"%010d" % (crc & 0x7FFFFFFF))[::-1] + b"\x02"


def encode_message_pieces(topic_bytes, queue_id, body, body_crc, properties_bytes, flag, queue_offset,
                          physical_offset, sys_flag, born_timestamp, born_host, store_timestamp, store_host,
                          reconsume_times, prepared_transaction_offset, _pack=HEADER.pack):
    """Positional form of :func:`encode_message`."""
    tail = encode_tail(b"%c%s" % (len(topic_bytes), topic_bytes), properties_bytes)
    header = _pack(
        HEADER.size + len(body) + len(tail) + SEAL_VALUE_BYTES, MESSAGE_MAGIC, body_crc,
        queue_id, flag, queue_offset, physical_offset, sys_flag, born_timestamp, born_host,
        store_timestamp, store_host, reconsume_times, prepared_transaction_offset, len(body),
    )
    return header, body, tail, seal(header, body, tail)


def encode_message(
    *,
    topic_bytes: bytes,
    queue_id: int,
    body: bytes,
    body_crc: int,
    properties_bytes: bytes,
    flag: int,
    queue_offset: int,
    physical_offset: int,
    sys_flag: int,
    born_timestamp: int,
    born_host: bytes,
    store_timestamp: int,
    store_host: bytes,
    reconsume_times: int = 0,
    prepared_transaction_offset: int = 0,
) -> list[bytes]:
    """One message as a list of byte pieces (header, body, tail, CRC digits).

    ``properties_bytes`` holds the caller's properties without the CRC; the __CRC32#
    property is appended here. The pieces are returned unjoined so a batch writer can join a whole
    batch at once.
    """
    return list(encode_message_pieces(
        topic_bytes, queue_id, body, body_crc, properties_bytes, flag, queue_offset, physical_offset, sys_flag,
        born_timestamp, born_host, store_timestamp, store_host, reconsume_times, prepared_transaction_offset))


def message_size(topic_bytes: bytes, body: bytes, properties_bytes: bytes) -> int:
    """TOTALSIZE of a message as :func:`encode_message` writes it."""
    return FIXED_SIZE + len(body) + len(topic_bytes) + len(properties_bytes) + SEAL_PROPERTY_BYTES


def encode_blank(size: int) -> bytes:
    """The record that closes a segment: TOTALSIZE = remaining bytes, blank magic."""
    assert size >= BLANK_HEADER.size, size
    return BLANK_HEADER.pack(size, BLANK_MAGIC)


# --- decoding ----------------------------------------------------------------------------
class CorruptMessage(ValueError):
    """The bytes at a position are not a whole, valid message."""


@dataclass(slots=True)
class StoredMessage:
    """A message as read back from the CommitLog: every field of the v1 table."""

    total_size: int
    magic_code: int
    body_crc: int
    queue_id: int
    flag: int
    queue_offset: int
    physical_offset: int
    sys_flag: int
    born_timestamp: int
    born_host: str
    store_timestamp: int
    store_host: str
    reconsume_times: int
    prepared_transaction_offset: int
    body: bytes
    topic: str
    properties: dict[str, str] = field(default_factory=dict)
    message_id: str = ""

    @property
    def keys(self) -> list[str]:
        """Business keys from the KEYS property."""
        return [key for key in self.properties.get(PROPERTY_KEYS, "").split(KEY_SEPARATOR) if key]

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROPERTY_TAGS)

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get(PROPERTY_UNIQ_KEY)

    @property
    def user_properties(self) -> dict[str, str]:
        """Properties without the store's own whole-message CRC (__CRC32#, or HCRC)."""
        return {k: v for k, v in self.properties.items() if k not in STORE_PROPERTY_NAMES}


class RecordHeader(NamedTuple):
    """What a scan learns from a record without decoding the body: the kind and size. (A
    NamedTuple: scans build one per record, several times cheaper than a frozen dataclass.)"""

    is_blank: bool
    total_size: int


_unpack_blank = BLANK_HEADER.unpack_from
_unpack_int = struct.Struct(">i").unpack_from
_unpack_props_length = PROPS_LEN.unpack_from


def check_record(buffer, position: int, limit: int, *, check_crc: bool = True,
                 require_hcrc: bool = True) -> RecordHeader:
    """Validate the record at ``position`` (not past ``limit``); raise CorruptMessage.

    Checks the magic, that every length field adds up to TOTALSIZE, the body CRC and the
    whole-message CRC (__CRC32#, or the older HCRC). A zero TOTALSIZE (unwritten space) is
    reported as CorruptMessage too; callers that scan treat it as the end of the log. A
    message with neither is corrupt unless ``require_hcrc`` is False (readers of other
    RocketMQ tools' logs): otherwise a flipped byte in the property's name would silently
    turn the whole-message check off.

    Every scan of the log calls it once per record (the scrub, recovery, repair), so the
    usual record's checks are written out here rather than in helpers.
    """
    if position + 8 > limit:
        raise CorruptMessage(f"no room for a record header at {position}")
    total_size, magic = _unpack_blank(buffer, position)
    if magic == BLANK_MAGIC:
        if total_size < 8 or position + total_size != limit:
            raise CorruptMessage(f"blank record at {position} does not end the segment")
        return RecordHeader(True, total_size)
    if magic != MESSAGE_MAGIC:
        raise CorruptMessage(f"bad magic {magic:#010x} at {position}")
    end = position + total_size
    if total_size < FIXED_SIZE or end > limit:
        raise CorruptMessage(f"bad total size {total_size} at {position}")
    body_length = _unpack_int(buffer, position + BODY_LENGTH_AT)[0]
    body_at = position + 88
    topic_at = body_at + body_length
    if body_length < 0 or topic_at + 1 > end:
        raise CorruptMessage(f"bad body length {body_length} at {position}")
    props_at = topic_at + 1 + buffer[topic_at]
    if props_at + 2 > end:
        raise CorruptMessage(f"bad topic length {buffer[topic_at]} at {position}")
    props_length = _unpack_props_length(buffer, props_at)[0]
    if props_at + 2 + props_length != end:
        raise CorruptMessage(f"lengths do not add up to total size {total_size} at {position}")
    if check_crc:
        if crc32(buffer[body_at:topic_at]) & 0x7FFFFFFF != _unpack_int(buffer, position + 8)[0]:
            raise CorruptMessage(f"body CRC mismatch at {position}")
        if props_length >= 20 and buffer[end - 20:end - 11] == SEAL_PREFIX:
            # compare the exact bytes: the writer's ten digits and separator, nothing else
            if buffer[end - 11:end] != (b"%010d" % (crc32(buffer[position:end - 20]) & 0x7FFFFFFF))[::-1] + b"\x02":
                raise CorruptMessage(f"message CRC (__CRC32#) mismatch at {position}")
        elif props_length >= LEGACY_HCRC_PROPERTY_BYTES and \
                buffer[end - LEGACY_HCRC_PROPERTY_BYTES:end - LEGACY_HCRC_VALUE_BYTES] == LEGACY_HCRC_PREFIX:
            _check_legacy_hcrc(buffer, position, end, topic_at)
        elif require_hcrc:
            raise CorruptMessage(f"no __CRC32# property at {position}")
    return RecordHeader(False, total_size)


def _check_legacy_hcrc(buffer, position: int, end: int, tail_at: int) -> None:
    """hastore's older HCRC: hex CRC32 of the header and the tail, the body and digits left out."""
    body_at = position + HEADER.size
    digits = bytes(buffer[end - LEGACY_HCRC_VALUE_BYTES:end - 1])
    try:
        stored = int(digits, 16)
    except ValueError:
        raise CorruptMessage(f"HCRC digits unreadable at {position}") from None
    crc = crc32(buffer[tail_at:end - LEGACY_HCRC_VALUE_BYTES], crc32(buffer[position:body_at]))
    # compare the exact digits: int() would accept 'A' for 'a', a space for a leading '0'
    if crc != stored or digits != b"%08x" % crc or buffer[end - 1] != 2:
        raise CorruptMessage(f"header CRC (HCRC) mismatch at {position}")


def decode_message(buffer, position: int = 0, *, check_crc: bool = True,
                   require_hcrc: bool = True) -> StoredMessage:
    """Decode the message at ``position``; raise CorruptMessage if it is not whole and valid."""
    header = check_record(buffer, position, len(buffer), check_crc=check_crc, require_hcrc=require_hcrc)
    if header.is_blank:
        raise CorruptMessage(f"blank record at {position}, not a message")
    (total_size, magic, body_crc, queue_id, flag, queue_offset, physical_offset, sys_flag,
     born_timestamp, born_host, store_timestamp, store_host, reconsume_times,
     prepared_offset, body_length) = HEADER.unpack_from(buffer, position)
    body_at = position + HEADER.size
    topic_at = body_at + body_length
    topic_length = buffer[topic_at]
    props_at = topic_at + 1 + topic_length
    properties = decode_properties(bytes(buffer[props_at + 2:position + total_size]))
    return StoredMessage(
        total_size=total_size, magic_code=magic, body_crc=body_crc, queue_id=queue_id, flag=flag,
        queue_offset=queue_offset, physical_offset=physical_offset, sys_flag=sys_flag,
        born_timestamp=born_timestamp, born_host=decode_host(born_host),
        store_timestamp=store_timestamp, store_host=decode_host(store_host),
        reconsume_times=reconsume_times, prepared_transaction_offset=prepared_offset,
        body=bytes(buffer[body_at:topic_at]),
        topic=bytes(buffer[topic_at + 1:props_at]).decode("utf-8"),
        properties=properties,
        message_id=message_id(bytes(store_host), physical_offset),
    )
