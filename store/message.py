"""What callers put (Message) and what a put returns (PutStatus, PutResult)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from itertools import repeat
from typing import NamedTuple

from .codec import StoredMessage  # re-exported: the decoded form

__all__ = ["Message", "PutStatus", "PutResult", "PutColumns", "StoredMessage"]


@dataclass(slots=True)
class Message:
    """A message to store. ``keys`` and ``tags`` become the KEYS and TAGS properties."""

    topic: str
    body: bytes
    queue_id: int = 0
    keys: list[str] | tuple[str, ...] = ()
    tags: str | None = None
    properties: dict[str, str] = field(default_factory=dict)
    flag: int = 0
    sys_flag: int = 0
    born_timestamp: int = 0          # 0: the store stamps its own time
    born_host: str = "127.0.0.1:0"
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0


class PutStatus(enum.Enum):
    """Outcome of a put, mirroring RocketMQ's PutMessageStatus."""

    PUT_OK = "PUT_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"
    IN_SYNC_REPLICAS_NOT_ENOUGH = "IN_SYNC_REPLICAS_NOT_ENOUGH"
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"
    MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL"
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"

    @property
    def ok(self) -> bool:
        return self is PutStatus.PUT_OK


class PutResult(NamedTuple):
    """One message's outcome. Offsets are -1 when nothing was written.

    A NamedTuple rather than a frozen dataclass: a batch put builds one per message, and
    tuple construction is several times cheaper on the hot path.
    """

    status: PutStatus
    physical_offset: int = -1
    queue_offset: int = -1
    message_id: str = ""
    store_timestamp: int = 0
    wrote_bytes: int = 0
    reason: str = ""

    @property
    def end_offset(self) -> int:
        """CommitLog offset just past this message: what flush and replication wait for."""
        return self.physical_offset + self.wrote_bytes


class PutColumns(NamedTuple):
    """A batch written column-wise with every message PUT_OK, its results as columns: what
    ``MessageStore.append(..., as_columns=True)`` returns for such a batch, so a caller that
    answers with columns (the node's SEND) builds no PutResult per message. ``results()``
    gives the PutResults ``append`` returns otherwise."""

    physical_offsets: list[int]
    queue_offsets: list[int]
    sizes: list[int]
    store_timestamp: int
    message_id_prefix: str

    @property
    def end_offset(self) -> int:
        """CommitLog offset just past the batch (its records are in order)."""
        return self.physical_offsets[-1] + self.sizes[-1]

    def message_ids(self) -> list[str]:
        return list(map(f"{self.message_id_prefix}%016X".__mod__, self.physical_offsets))

    def results(self) -> list[PutResult]:
        return list(map(tuple.__new__, repeat(PutResult), zip(
            repeat(PutStatus.PUT_OK), self.physical_offsets, self.queue_offsets, self.message_ids(),
            repeat(self.store_timestamp), self.sizes, repeat(""))))
