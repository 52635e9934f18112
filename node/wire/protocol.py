"""The client wire protocol: codes, framing and request-field checks. Pure: no I/O.

One frame::

    u32 length (big-endian, of what follows) | msgpack map

A request map holds ``code`` (a RequestCode) and ``opaque`` (an int the client picks) plus
the request's fields; its reply holds ``code`` (a ResponseCode), the same ``opaque``,
``flags`` with the REPLY bit, and the reply's fields (``error`` holds the message of an
error reply). Replies may come back in any order, so one connection pipelines many
requests. A batch of messages travels in one frame: in a SEND, either as ``messages``,
a map per message, or as ``message_columns``, a list per field (``body`` and
``properties``: what a producer's plain messages carry), which neither end has to build
or take apart a map per message for. A SEND's reply may likewise come as
``result_columns`` when the request asks for it.

Limits: a frame is at most FRAME_BYTES_MAX; a body at most BODY_BYTES_MAX (the store's
limit); topics as the store allows ([A-Za-z0-9_%-], up to 127 bytes).
"""

from __future__ import annotations

import enum
import struct
import threading

import msgpack

from store import codec

from ..errors import FrameError, RequestError

FRAME_BYTES_MAX = 16 * 1024 * 1024
BODY_BYTES_MAX = codec.MAX_BODY_BYTES
LENGTH = struct.Struct(">I")
assert LENGTH.size == 4
# Replies are built to fit a frame: a pull reply stops adding messages at this many bytes.
PULL_BYTES_MAX = 8 * 1024 * 1024
PULL_COUNT_MAX = 1024
QUERY_COUNT_MAX = 64
BATCH_COUNT_MAX = 4096
OPAQUE_MAX = 2**63 - 1
FLAG_REPLY = 1
SYS_TOPIC_PREFIX = "%SYS%"


class RequestCode(enum.IntEnum):
    AUTH_CHALLENGE = 1   # server -> client, first frame when a secret is set
    AUTH = 2
    SEND = 10
    PULL = 11
    QUERY_BY_KEY = 12
    QUERY_BY_TIME = 13
    QUERY_BY_ID = 14
    QUEUE_OFFSETS = 15
    COMMIT_OFFSETS = 16
    QUERY_OFFSETS = 17
    TOPIC_CREATE = 18
    TOPIC_LIST = 19
    STATUS = 20
    LAG_HISTORY = 21     # replication lag samples per slave since a time (node/server/lag_sampler.py)
    READ_LOG_RANGE = 22  # CommitLog bytes from an offset, below the confirm offset (node/server/log_ranges.py)
    LOG_RANGE_CRCS = 23  # CRC32 per fixed-size CommitLog range up to the confirm offset (cluster verify)


class ResponseCode(enum.IntEnum):
    SUCCESS = 0
    SYSTEM_ERROR = 1
    SYSTEM_BUSY = 2
    REQUEST_CODE_NOT_SUPPORTED = 3
    BAD_REQUEST = 4            # a field is missing or of the wrong type or range
    BAD_FRAME = 5              # not a msgpack map: the connection closes after this reply
    FRAME_TOO_LARGE = 6        # the connection closes after this reply
    BODY_TOO_LARGE = 7
    TOPIC_ILLEGAL = 8
    TOPIC_NOT_EXIST = 9
    NO_PERMISSION = 10
    NOT_MASTER = 11
    AUTH_REQUIRED = 12
    AUTH_FAILED = 13
    MESSAGE_NOT_FOUND = 14
    SERVICE_NOT_AVAILABLE = 15
    QUEUE_ILLEGAL = 16
    RECORD_CORRUPT = 17        # the record asked for fails its CRCs here too (READ_LOG_RANGE)


# --- framing -----------------------------------------------------------------------------
# One msgpack Packer per thread, kept: ``msgpack.packb`` builds a Packer (and its buffer) on
# every call, which costs as much as packing a small reply. A Packer keeps the largest
# buffer it grew to, so one that packed a big frame is dropped after it.
_packers = threading.local()
_PACKER_KEPT_BYTES_MAX = 1 << 20


def encode_frame(payload: dict) -> bytes:
    """One frame: length prefix + msgpack map. Refuses payloads over FRAME_BYTES_MAX."""
    try:
        packer = _packers.packer
    except AttributeError:
        packer = _packers.packer = msgpack.Packer(use_bin_type=True)
    try:
        packed = packer.pack(payload)
    except BaseException:
        del _packers.packer  # a pack that failed half way may leave bytes behind in the buffer
        raise
    if len(packed) > _PACKER_KEPT_BYTES_MAX:
        del _packers.packer
    if len(packed) > FRAME_BYTES_MAX:
        raise FrameError(f"frame of {len(packed)} bytes is over the {FRAME_BYTES_MAX} byte limit")
    return LENGTH.pack(len(packed)) + packed


def decode_payload(packed) -> object:
    """The msgpack object of one frame (any bytes-like object; what it decodes to holds no
    reference to it); FrameError when it is not msgpack at all."""
    try:
        return msgpack.unpackb(packed, raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException, TypeError, UnicodeDecodeError) as error:
        raise FrameError(f"frame is not msgpack: {type(error).__name__}: {error}") from None


class FrameDecoder:
    """Splits a byte stream into frames. ``feed`` returns whole frames' payloads, decoded.

    When a length is over the limit or a frame does not decode, ``feed`` still returns the
    good frames before it and sets ``error``; the decoder stays broken (the stream can no
    longer be trusted to be in step) and every later ``feed`` raises that error.
    """

    def __init__(self, frame_bytes_max: int = FRAME_BYTES_MAX) -> None:
        self.frame_bytes_max = frame_bytes_max
        self._buffer = bytearray()
        self.error: FrameError | None = None

    @property
    def buffered_bytes(self) -> int:
        return len(self._buffer)

    def feed(self, data: bytes) -> list[object]:
        if self.error is not None:
            raise self.error
        buffer = self._buffer
        if buffer:
            buffer += data
            with memoryview(buffer) as view:  # released before the buffer is resized
                frames, position = self._split(view)
            if self.error is not None:
                buffer.clear()
            elif position:
                del buffer[:position]
            return frames
        # nothing buffered (the usual case): frames are decoded straight from ``data`` and
        # only a partial frame at its end is kept
        with memoryview(data) as view:
            frames, position = self._split(view)
            if self.error is None and position < len(view):
                buffer += view[position:]
        return frames

    def _split(self, view: memoryview) -> tuple[list[object], int]:
        """The whole frames at the start of ``view``, decoded, and where they end (setting
        ``error`` at an oversized length or an undecodable frame)."""
        frames = []
        position = 0
        size = len(view)
        unpack_length = LENGTH.unpack_from
        while size - position >= LENGTH.size:
            (length,) = unpack_length(view, position)
            if length > self.frame_bytes_max:
                self.error = FrameTooLarge(f"frame of {length} bytes is over the {self.frame_bytes_max} byte limit")
                break
            end = position + LENGTH.size + length
            if end > size:
                break
            try:
                frames.append(decode_payload(view[position + LENGTH.size:end]))
            except FrameError as error:
                self.error = error
                break
            position = end
        return frames, position

    def feed_strict(self, data: bytes) -> list[object]:
        """``feed``, raising the FrameError at once if the data broke the framing."""
        frames = self.feed(data)
        if self.error is not None:
            raise self.error
        return frames


class FrameTooLarge(FrameError):
    """A frame's length prefix is over the limit."""


# --- replies -----------------------------------------------------------------------------
def reply(opaque: object, **fields) -> dict:
    """A SUCCESS reply to the request with ``opaque``."""
    return {"code": ResponseCode.SUCCESS, "opaque": opaque, "flags": FLAG_REPLY, **fields}


def error_reply(opaque: object, code: ResponseCode | str, message: str, **fields) -> dict:
    """An error reply; ``code`` is a ResponseCode or its name."""
    if isinstance(code, str):
        code = ResponseCode[code]
    return {"code": int(code), "opaque": opaque, "flags": FLAG_REPLY, "error": message, **fields}


def opaque_of(payload: object) -> int | None:
    """The request's opaque if it has a usable one (error replies echo it)."""
    if isinstance(payload, dict):
        opaque = payload.get("opaque")
        if isinstance(opaque, int) and not isinstance(opaque, bool) and 0 <= opaque <= OPAQUE_MAX:
            return opaque
    return None


# --- request fields ----------------------------------------------------------------------
_REQUIRED = object()


# topic names found legal, kept (up to a bound) so a request's topic is not checked again
LEGAL_TOPICS_KEPT = 4096
_LEGAL_TOPICS: set[str] = set()


class Fields:
    """Typed access to a request's fields; a bad one raises BAD_REQUEST naming the field."""

    def __init__(self, payload: dict, prefix: str = "") -> None:
        self.payload = payload
        self.prefix = prefix

    def _get(self, name: str, default: object) -> object:
        if name in self.payload and self.payload[name] is not None:
            return self.payload[name]
        if default is _REQUIRED:
            raise bad_request(f"field {self.prefix}{name} is required")
        return default

    def _fail(self, name: str, expected: str, value: object) -> RequestError:
        return bad_request(f"field {self.prefix}{name} must be {expected}, not {type(value).__name__}")

    def int(self, name: str, low: int, high: int, default: object = _REQUIRED) -> int:
        value = self._get(name, default)
        if not isinstance(value, int) or isinstance(value, bool):
            raise self._fail(name, "an integer", value)
        if not low <= value <= high:
            raise bad_request(f"field {self.prefix}{name} must be in [{low}, {high}], not {value}")
        return value

    def str(self, name: str, max_bytes: int = 4096, default: object = _REQUIRED) -> str:
        value = self._get(name, default)
        if not isinstance(value, str):
            raise self._fail(name, "a string", value)
        if len(value) > max_bytes or len(value.encode("utf-8")) > max_bytes:
            raise bad_request(f"field {self.prefix}{name} is longer than {max_bytes} bytes")
        return value

    def optional_str(self, name: str, max_bytes: int = 4096) -> str | None:
        return self.str(name, max_bytes, default=None) if self.payload.get(name) is not None else None

    def bytes(self, name: str, max_bytes: int) -> bytes:
        value = self._get(name, _REQUIRED)
        if not isinstance(value, bytes):
            raise self._fail(name, "binary", value)
        if len(value) > max_bytes:
            raise RequestError("BODY_TOO_LARGE", f"field {self.prefix}{name} is {len(value)} bytes, over the "
                                                 f"{max_bytes} byte limit")
        return value

    def list(self, name: str, max_count: int, default: object = _REQUIRED) -> list:
        value = self._get(name, default)
        if not isinstance(value, list):
            raise self._fail(name, "a list", value)
        if len(value) > max_count:
            raise bad_request(f"field {self.prefix}{name} holds {len(value)} items, over {max_count}")
        return value

    def str_list(self, name: str, max_count: int, max_bytes: int = 4096) -> list[str]:
        values = self.list(name, max_count, default=[])
        for value in values:
            if not isinstance(value, str) or len(value.encode("utf-8")) > max_bytes:
                raise bad_request(f"field {self.prefix}{name} must hold strings of at most {max_bytes} bytes")
        return values

    def str_map(self, name: str, max_count: int = 256) -> dict[str, str]:
        value = self._get(name, {})
        if not isinstance(value, dict) or len(value) > max_count:
            raise self._fail(name, f"a map of at most {max_count} strings", value)
        for key, item in value.items():
            if not isinstance(key, str) or not isinstance(item, str):
                raise bad_request(f"field {self.prefix}{name} must map strings to strings")
        return value

    def bool(self, name: str, default: object = _REQUIRED) -> bool:
        value = self._get(name, default)
        if not isinstance(value, bool):
            raise self._fail(name, "a boolean", value)
        return value

    def topic(self, name: str = "topic", *, allow_system: bool = False) -> str:
        value = self._get(name, _REQUIRED)
        if not isinstance(value, str):
            raise self._fail(name, "a string", value)
        if value not in _LEGAL_TOPICS:   # a regular expression and an encoding per request, else
            problem = codec.topic_problem(value)
            if problem:
                raise RequestError("TOPIC_ILLEGAL", f"{value[:160]!r}: {problem}")
            if len(_LEGAL_TOPICS) < LEGAL_TOPICS_KEPT:
                _LEGAL_TOPICS.add(value)
        if not allow_system and value.startswith(SYS_TOPIC_PREFIX):
            raise RequestError("NO_PERMISSION", f"topic {value!r} is reserved for the node's own records")
        return value


def bad_request(message: str) -> RequestError:
    return RequestError("BAD_REQUEST", message)
