"""The HA wire protocol between a master's HAService and a slave's HAClient. Pure: no I/O.

A connection has two phases. Control frames first, each ``u32 length | msgpack map``::

    master -> slave  HELLO      {v, cluster, nonce}                     32 random bytes
    slave  -> master HANDSHAKE  {v, proof, nonce, node_id, group, cluster,
                                 epochs: [[epoch, start], ...], min_offset, max_offset}
    master -> slave  WELCOME    {proof, node_id, epoch, epochs, min_offset, max_offset,
                                 resync: "truncate" | "reset", resync_offset, reason}
                  or REFUSAL    {error}                                  then the master closes

``proof`` in HANDSHAKE is HMAC-SHA256(secret, "hastore-ha slave" | master nonce | slave
nonce); the master checks it before it reads any other field or sends a byte about its log,
so a peer without the secret gets only the HELLO nonce and a refusal. The WELCOME's proof
(label "hastore-ha master") lets the slave check that its master holds the secret too. A
node without a secret uses the empty key: the exchange still runs, but proves nothing.

Then the stream, binary::

    master -> slave  [phyOffset u64][size u32][crc32 u32][bytes]   size 0: heartbeat
                     [confirmOffset u64][0 u32][1 u32]               confirm offset
    slave  -> master [ackOffset u64]

A data frame's bytes are whole records of one segment and one epoch, starting at
``phyOffset``. A heartbeat's ``phyOffset`` is the master's max offset when it was sent, so
an idle slave still knows how far behind it is. A CONFIRM frame is a header of size 0 whose
CRC field is 1 (a heartbeat's is 0): it carries the master's confirm offset (what every
member of the sync-state set holds), sent when a stream starts and whenever it moved, so
that a slave under a controller serves reads only up to it. It is additive: a slave from
before it takes the frame for a heartbeat naming an offset at or below the master's end,
which changes nothing there. The slave's first ack, sent once its log
ends at the resync offset, tells the master where to start streaming; after that it acks
after each applied frame and on an interval.

Departure from DESIGN.md: the data frame header carries a CRC32 of the frame's bytes
(``store.codec.crc32``: zlib's CRC32, computed by ISA-L), so a transport fault is caught
before the bytes reach the log, where record CRCs would only catch it on a later read.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from dataclasses import dataclass

import msgpack

from store.codec import crc32

from .epochs import EpochEntry, Resync, ResyncKind, check_order, epoch_at, next_epoch_start
from .errors import EpochFileError, HaAuthError, HandshakeRefused, HaProtocolError

PROTOCOL_VERSION = 1
NONCE_BYTES = 32
CONTROL_LENGTH = struct.Struct(">I")
CONTROL_BYTES_MAX = 4 * 1024 * 1024
DATA_HEADER = struct.Struct(">QII")
ACK = struct.Struct(">Q")
assert CONTROL_LENGTH.size == 4 and DATA_HEADER.size == 16 and ACK.size == 8
# A data frame holds at most this many bytes; a record is at most ~4 MiB + headers, and a
# chunk always carries at least one record, so the bound leaves room for the largest one.
DATA_FRAME_BYTES_MAX = 8 * 1024 * 1024
EPOCHS_MAX = 100_000
SLAVE_LABEL = b"hastore-ha slave"
MASTER_LABEL = b"hastore-ha master"
OFFSET_MAX = 2**63 - 1


# --- authentication ------------------------------------------------------------------------
def _key(secret: str | None) -> bytes:
    return (secret or "").encode("utf-8")


def slave_proof(secret: str | None, master_nonce: bytes, slave_nonce: bytes) -> bytes:
    """What the slave sends to show it holds the secret."""
    return hmac.new(_key(secret), SLAVE_LABEL + master_nonce + slave_nonce, hashlib.sha256).digest()


def master_proof(secret: str | None, master_nonce: bytes, slave_nonce: bytes) -> bytes:
    """What the master sends back to show it holds the secret too (another label: no reflection)."""
    return hmac.new(_key(secret), MASTER_LABEL + master_nonce + slave_nonce, hashlib.sha256).digest()


def check_proof(expected: bytes, got: object, who: str) -> None:
    if not isinstance(got, bytes) or not hmac.compare_digest(expected, got):
        raise HaAuthError(f"the {who} did not prove it holds the cluster secret (HMAC mismatch)")


# --- control frames ------------------------------------------------------------------------
def encode_control(payload: dict) -> bytes:
    packed = msgpack.packb(payload, use_bin_type=True)
    if len(packed) > CONTROL_BYTES_MAX:
        raise HaProtocolError(f"control frame of {len(packed)} bytes is over {CONTROL_BYTES_MAX}")
    return CONTROL_LENGTH.pack(len(packed)) + packed


def control_length(prefix: bytes) -> int:
    """The body length a control frame's 4-byte prefix announces (checked against the limit)."""
    (length,) = CONTROL_LENGTH.unpack(prefix)
    if length > CONTROL_BYTES_MAX:
        raise HaProtocolError(f"control frame of {length} bytes is over {CONTROL_BYTES_MAX}")
    return length


def decode_control(body: bytes) -> dict:
    try:
        payload = msgpack.unpackb(body, raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException, TypeError, UnicodeDecodeError) as error:
        raise HaProtocolError(f"control frame is not msgpack: {error}") from None
    if not isinstance(payload, dict):
        raise HaProtocolError("control frame is not a map")
    return payload


def _field(payload: dict, name: str, kind: type, frame: str):
    value = payload.get(name)
    if kind is int:
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= OFFSET_MAX:
            raise HaProtocolError(f"{frame}.{name} must be an integer in [0, 2^63)")
    elif not isinstance(value, kind):
        raise HaProtocolError(f"{frame}.{name} must be {kind.__name__}")
    return value


def _epochs_field(payload: dict, frame: str) -> list[EpochEntry]:
    raw = payload.get("epochs")
    if not isinstance(raw, list) or len(raw) > EPOCHS_MAX:
        raise HaProtocolError(f"{frame}.epochs must be a list of at most {EPOCHS_MAX} [epoch, start] pairs")
    entries = []
    for item in raw:
        if not (isinstance(item, (list, tuple)) and len(item) == 2
                and all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= OFFSET_MAX for v in item)):
            raise HaProtocolError(f"{frame}.epochs must hold [epoch, start offset] integer pairs")
        entries.append(EpochEntry(item[0], item[1]))
    try:
        check_order(entries)
    except EpochFileError as error:
        raise HaProtocolError(f"{frame}.epochs out of order: {error}") from None
    return entries


def _wire_epochs(entries) -> list[list[int]]:
    return [[entry.epoch, entry.start_offset] for entry in entries]


@dataclass(frozen=True, slots=True)
class Hello:
    """Master -> slave, first frame: the challenge."""

    cluster: str
    nonce: bytes

    def encode(self) -> bytes:
        return encode_control({"type": "hello", "v": PROTOCOL_VERSION, "cluster": self.cluster, "nonce": self.nonce})

    @classmethod
    def decode(cls, payload: dict) -> "Hello":
        if payload.get("type") != "hello" or payload.get("v") != PROTOCOL_VERSION:
            raise HaProtocolError(f"expected a version {PROTOCOL_VERSION} HELLO, got {payload.get('type')!r} "
                                  f"v{payload.get('v')!r}")
        nonce = _field(payload, "nonce", bytes, "hello")
        if len(nonce) != NONCE_BYTES:
            raise HaProtocolError(f"hello.nonce must be {NONCE_BYTES} bytes")
        return cls(_field(payload, "cluster", str, "hello"), nonce)


@dataclass(frozen=True, slots=True)
class Handshake:
    """Slave -> master: its proof, then who it is and what its log holds."""

    proof: bytes
    nonce: bytes
    node_id: str
    group: str
    cluster: str
    epochs: list[EpochEntry]
    min_offset: int
    max_offset: int
    client_address: str = ""    # where the master asks it for an intact copy of a record (repair)

    def encode(self) -> bytes:
        return encode_control({"type": "handshake", "v": PROTOCOL_VERSION, "proof": self.proof, "nonce": self.nonce,
                               "node_id": self.node_id, "group": self.group, "cluster": self.cluster,
                               "epochs": _wire_epochs(self.epochs), "min_offset": self.min_offset,
                               "max_offset": self.max_offset, "client_address": self.client_address})

    @staticmethod
    def authenticate(payload: dict, secret: str | None, master_nonce: bytes) -> bytes:
        """Check the proof before anything else is read; returns the slave's nonce."""
        if payload.get("type") != "handshake":
            raise HaAuthError(f"expected a HANDSHAKE, got {payload.get('type')!r}")
        nonce = payload.get("nonce")
        if not isinstance(nonce, bytes) or len(nonce) != NONCE_BYTES:
            raise HaAuthError(f"handshake.nonce must be {NONCE_BYTES} bytes")
        check_proof(slave_proof(secret, master_nonce, nonce), payload.get("proof"), "slave")
        return nonce

    @classmethod
    def decode(cls, payload: dict) -> "Handshake":
        """The fields (call ``authenticate`` first)."""
        if payload.get("v") != PROTOCOL_VERSION:
            raise HaProtocolError(f"handshake version {payload.get('v')!r}, expected {PROTOCOL_VERSION}")
        handshake = cls(payload["proof"], payload["nonce"], _field(payload, "node_id", str, "handshake"),
                        _field(payload, "group", str, "handshake"), _field(payload, "cluster", str, "handshake"),
                        _epochs_field(payload, "handshake"), _field(payload, "min_offset", int, "handshake"),
                        _field(payload, "max_offset", int, "handshake"),
                        payload.get("client_address") if isinstance(payload.get("client_address"), str) else "")
        if handshake.min_offset > handshake.max_offset:
            raise HaProtocolError("handshake.min_offset is past max_offset")
        return handshake


@dataclass(frozen=True, slots=True)
class Welcome:
    """Master -> slave: its proof, its epochs and log bounds, and where the slave's log must end."""

    proof: bytes
    node_id: str
    epoch: int
    epochs: list[EpochEntry]
    min_offset: int
    max_offset: int
    resync: Resync

    def encode(self) -> bytes:
        return encode_control({"type": "welcome", "proof": self.proof, "node_id": self.node_id,
                               "epoch": self.epoch, "epochs": _wire_epochs(self.epochs),
                               "min_offset": self.min_offset, "max_offset": self.max_offset,
                               "resync": self.resync.kind.value, "resync_offset": self.resync.offset,
                               "common_epoch": self.resync.common_epoch, "reason": self.resync.reason})

    @classmethod
    def decode(cls, payload: dict, secret: str | None, master_nonce: bytes, slave_nonce: bytes) -> "Welcome":
        """The master's answer; HandshakeRefused for a REFUSAL, HaAuthError for a bad proof."""
        if payload.get("type") == "refusal":
            raise HandshakeRefused(f"the master refused the handshake: {payload.get('error')}")
        if payload.get("type") != "welcome":
            raise HaProtocolError(f"expected WELCOME, got {payload.get('type')!r}")
        check_proof(master_proof(secret, master_nonce, slave_nonce), payload.get("proof"), "master")
        try:
            kind = ResyncKind(payload.get("resync"))
        except ValueError:
            raise HaProtocolError(f"welcome.resync {payload.get('resync')!r} is unknown") from None
        common = payload.get("common_epoch")
        if common is not None and (not isinstance(common, int) or isinstance(common, bool) or common < 0):
            raise HaProtocolError("welcome.common_epoch must be an integer or null")
        resync = Resync(kind, _field(payload, "resync_offset", int, "welcome"), common,
                        str(payload.get("reason", "")))
        return cls(payload["proof"], _field(payload, "node_id", str, "welcome"),
                   _field(payload, "epoch", int, "welcome"), _epochs_field(payload, "welcome"),
                   _field(payload, "min_offset", int, "welcome"), _field(payload, "max_offset", int, "welcome"),
                   resync)


def encode_refusal(error: str) -> bytes:
    return encode_control({"type": "refusal", "error": error[:1000]})


# --- stream frames -------------------------------------------------------------------------
def data_header(offset: int, data) -> bytes:
    """Header of a data frame carrying ``data`` (bytes-like) from ``offset``."""
    return DATA_HEADER.pack(offset, len(data), crc32(data))


def heartbeat(master_max_offset: int) -> bytes:
    return DATA_HEADER.pack(master_max_offset, 0, 0)


CONFIRM_MARK = 1   # the CRC field of a size-0 header that carries the confirm offset


def confirm(confirm_offset: int) -> bytes:
    """A CONFIRM frame: the master's confirm offset (a heartbeat to slaves from before it)."""
    return DATA_HEADER.pack(confirm_offset, 0, CONFIRM_MARK)


@dataclass(frozen=True, slots=True)
class DataHeader:
    offset: int
    size: int
    crc: int

    @property
    def is_heartbeat(self) -> bool:
        """No bytes: a heartbeat, or a CONFIRM frame (``is_confirm``)."""
        return self.size == 0

    @property
    def is_confirm(self) -> bool:
        return self.size == 0 and self.crc == CONFIRM_MARK


def parse_data_header(raw) -> DataHeader:
    """A data frame header, its size checked against the frame limit."""
    if len(raw) != DATA_HEADER.size:
        raise HaProtocolError(f"a data frame header is {DATA_HEADER.size} bytes, not {len(raw)}")
    return DataHeader(*read_data_header(raw, 0))


def read_data_header(buffer, position: int) -> tuple[int, int, int]:
    """``parse_data_header`` of the header at ``position`` in ``buffer``, as a plain
    (offset, size, crc) tuple: a slave's follow thread reads one per frame."""
    offset, size, crc = header = DATA_HEADER.unpack_from(buffer, position)
    if size > DATA_FRAME_BYTES_MAX or offset > OFFSET_MAX:
        raise HaProtocolError(f"data frame at {offset} of {size} bytes is over the {DATA_FRAME_BYTES_MAX} limit")
    return header


def check_data(header: DataHeader, data) -> None:
    """HaProtocolError when the bytes are not the ones the master sent."""
    check_crc(header.offset, data, header.crc)


def check_crc(offset: int, data, crc: int) -> None:
    """``check_data`` for a frame at ``offset`` whose header claims ``crc``."""
    if crc32(data) != crc:
        raise HaProtocolError(f"data frame at {offset} ({len(data)} bytes): CRC mismatch")


def place_frame(epochs: list[EpochEntry], offset: int, size: int, expected: int) -> EpochEntry:
    """The master epoch a data frame of ``size`` bytes at ``offset`` belongs to, when it
    starts exactly at ``expected`` (the log's end) and lies inside that one epoch; else
    HaProtocolError."""
    if offset != expected:
        raise HaProtocolError(f"frame at {offset}, but this log ends at {expected}")
    entry = epoch_at(epochs, offset)
    boundary = next_epoch_start(epochs, offset)
    if entry is None or (boundary is not None and offset + size > boundary):
        raise HaProtocolError(f"frame [{offset}, {offset + size}) is not inside one master epoch")
    return entry


def ack(offset: int) -> bytes:
    return ACK.pack(offset)


def parse_ack(raw) -> int:
    (offset,) = ACK.unpack(raw)
    if offset > OFFSET_MAX:
        raise HaProtocolError(f"ack offset {offset} is out of range")
    return offset
