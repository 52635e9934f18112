"""Messages made ready for the log outside the write lock: checked, encoded, refused.

    preparer = Preparer(segment_bytes)
    columns = preparer.regular_columns(batch)   # a regular batch, column-wise; or None
    outcome = preparer.prepare(message)         # a PreparedMessage, or the PutResult refusing it

MessageStore's one put function asks for the columns first (``put_batch``) and prepares the
messages one by one when there are none. The preparer keeps what repeats across messages:
the encoded prefix of each legal topic and the bytes of each born host (bounded caches); a
topic or host in them is known legal, which is what lets a batch go column-wise.
"""

from __future__ import annotations

from collections.abc import Mapping

from . import codec
from .commit_log import PreparedMessage
from .message import Message, PutResult, PutStatus
from .put_batch import Batch, BatchColumns, regular_columns

MAX_QUEUE_ID = 2**31 - 1
MAX_BODY_BYTES = codec.MAX_BODY_BYTES
# a record is its header, body, tail (codec.encode_tail) and the whole-message CRC's digits
RECORD_BYTES_BESIDE_BODY_AND_TAIL = codec.HEADER.size + codec.HCRC_VALUE_BYTES
CACHED_TOPICS_MAX = 100_000
CACHED_HOSTS_MAX = 100_000
_encode_tail = codec.encode_tail
_crc32 = codec.crc32
_new_tuple = tuple.__new__


class Preparer:
    """Checks and pre-encodes messages for a log of ``segment_bytes`` segments."""

    def __init__(self, segment_bytes: int) -> None:
        self.segment_bytes = segment_bytes
        self.topic_prefixes: dict[str, bytes] = {}   # legal topic -> TOPICLEN + TOPIC bytes
        self.born_hosts: dict[str, bytes] = {}       # legal born host -> its 8 bytes
        # the largest record a segment takes: it must leave room for the closing blank record
        self.largest_record = segment_bytes - codec.END_OF_SEGMENT_MIN_BLANK

    def regular_columns(self, batch: Batch) -> BatchColumns | None:
        """The columns of ``batch`` when it may be written column-wise (``put_batch``)."""
        return regular_columns(batch, self.topic_prefixes, self.born_hosts, self.largest_record)

    def prepare(self, message: Message) -> PreparedMessage | PutResult:
        """Validate and pre-encode a message; a PutResult carries the refusal.

        Runs outside the write lock, so one caller's encoding never holds up another's
        write. Topic and host checks are cached: they repeat across messages.
        """
        topic = message.topic
        topic_prefix = self.topic_prefixes.get(topic) if type(topic) is str else None
        if topic_prefix is None:
            problem = codec.topic_problem(topic)
            if problem:
                return PutResult(PutStatus.MESSAGE_ILLEGAL, reason=problem)
            topic_prefix = codec.encode_topic(topic)
            if len(self.topic_prefixes) < CACHED_TOPICS_MAX:
                self.topic_prefixes[topic] = topic_prefix
        body = message.body
        if type(body) is not bytes:
            if not isinstance(body, (bytes, bytearray, memoryview)):
                return PutResult(PutStatus.MESSAGE_ILLEGAL, reason="body must be bytes")
            body = bytes(body)
        body_length = len(body)
        if body_length > MAX_BODY_BYTES:
            return PutResult(PutStatus.MESSAGE_ILLEGAL,
                             reason=f"body is {body_length} bytes, over the {MAX_BODY_BYTES} byte limit")
        queue_id = message.queue_id
        if type(queue_id) is not int or not 0 <= queue_id <= MAX_QUEUE_ID:
            return PutResult(PutStatus.MESSAGE_ILLEGAL, reason="queue id must be an int in [0, 2^31)")
        if message.sys_flag or type(message.sys_flag) is not int:
            problem = codec.sys_flag_problem(message.sys_flag, body)
            if problem:
                return PutResult(PutStatus.MESSAGE_ILLEGAL, reason=problem)
        properties = _properties_of(message)
        if type(properties) is PutResult:
            return properties
        born_host = self.born_hosts.get(message.born_host) if type(message.born_host) is str else None
        if born_host is None:
            try:
                born_host = codec.encode_host(message.born_host)
            except (ValueError, TypeError, AttributeError) as error:
                return PutResult(PutStatus.MESSAGE_ILLEGAL, reason=f"born_host: {error}")
            if len(self.born_hosts) < CACHED_HOSTS_MAX:
                self.born_hosts[message.born_host] = born_host
        tail = _encode_tail(topic_prefix, properties)
        size = RECORD_BYTES_BESIDE_BODY_AND_TAIL + body_length + len(tail)
        if size > self.largest_record:
            return PutResult(PutStatus.MESSAGE_ILLEGAL,
                             reason=f"message of {size} bytes cannot fit a {self.segment_bytes} "
                                    "byte segment")
        return _new_tuple(PreparedMessage, (
            topic, queue_id, body, _crc32(body) & 0x7FFFFFFF, tail, message.flag, message.sys_flag,
            message.born_timestamp, born_host, message.reconsume_times, message.prepared_transaction_offset, size))


def _properties_of(message: Message) -> bytes | PutResult:
    """The encoded properties (KEYS and TAGS folded in), or the refusal."""
    keys = message.keys
    tags = message.tags
    properties = message.properties
    pairs = 0
    text = ""
    if properties:
        if type(properties) is not dict and not isinstance(properties, Mapping):
            return PutResult(PutStatus.MESSAGE_ILLEGAL, reason="properties must be a map of strings to strings")
        parts = []
        for name, value in properties.items():
            if type(name) is not str or type(value) is not str or not name:
                return PutResult(PutStatus.MESSAGE_ILLEGAL, reason="property names and values must be non-empty strings")
            if name in codec.STORE_PROPERTY_NAMES:
                return PutResult(PutStatus.MESSAGE_ILLEGAL, reason=f"property {name} is reserved for the store")
            if (name == codec.PROPERTY_KEYS and keys) or (name == codec.PROPERTY_TAGS and tags):
                continue  # the fields win over a property of the same name
            parts.append(f"{name}\x01{value}\x02")
        pairs = len(parts)
        text = "".join(parts)
    if keys:
        if type(keys) is str:
            keys = (keys,)
        for key in keys:
            if type(key) is not str or not key or " " in key:
                return PutResult(PutStatus.MESSAGE_ILLEGAL, reason=f"key {key!r} must be a non-empty string without spaces")
        text = f"{text}KEYS\x01{' '.join(keys)}\x02"
        pairs += 1
    if tags:
        if type(tags) is not str:
            return PutResult(PutStatus.MESSAGE_ILLEGAL, reason="tags must be a string")
        text = f"{text}TAGS\x01{tags}\x02"
        pairs += 1
    # every separator must be one this function wrote: none may come from a name or value
    if text.count("\x01") != pairs or text.count("\x02") != pairs:
        return PutResult(PutStatus.MESSAGE_ILLEGAL, reason="property keys and values must not contain \\x01 or \\x02")
    encoded = text.encode("utf-8")
    if len(encoded) + codec.HCRC_PROPERTY_BYTES > codec.MAX_PROPERTIES_BYTES:
        return PutResult(PutStatus.PROPERTIES_SIZE_EXCEEDED,
                         reason=f"properties take {len(encoded)} bytes; at most "
                                f"{codec.MAX_PROPERTIES_BYTES - codec.HCRC_PROPERTY_BYTES} fit")
    return encoded
