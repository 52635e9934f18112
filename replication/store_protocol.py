"""What replication needs from the store: the ``ReplicaStore`` protocol.

HAService (master) and HAClient (slave) see the store only through this narrow surface,
never MessageStore itself. The store's ``replica_log`` (store/replica_log.py) satisfies
it; tests may hand in any object that does.

    master: max_offset, min_offset, read, store_timestamp_at, confirm_offset,
            publish_confirm_offset
    slave:  max_offset, min_offset, append, wake_dispatch, dispatch_now, cut, reset

Every offset is a physical CommitLog offset at a record boundary. The blocking calls
(``append`` of a large chunk, ``cut``, ``reset``) are run in a worker thread by the callers.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class ReplicaStore(Protocol):
    """A CommitLog as replication reads, extends, cuts and confirms it."""

    @property
    def min_offset(self) -> int:
        """Start of the log (retention moves it up)."""

    @property
    def max_offset(self) -> int:
        """End of the log: always a record boundary."""

    @property
    def confirm_offset(self) -> int:
        """The least offset every member of the sync-state set holds (kept across restarts)."""

    def publish_confirm_offset(self, offset: int) -> None:
        """The master's new confirm offset; an older (lower) one changes nothing."""

    def read(self, offset: int, max_bytes: int) -> memoryview:
        """Whole records from ``offset`` within one segment, at most ``max_bytes`` unless one
        record is larger; empty at the end of the log."""

    def append(self, offset: int, data, *, wake_dispatch: bool = True, read_ahead: bool = True) -> int:
        """Append whole records exactly at the end of the log; returns the new end. Refuses
        (a StoreError) anything else before a byte is written. Without ``wake_dispatch``
        the records are indexed once ``wake_dispatch()`` is called. Without ``read_ahead``
        the store does not bring the pages ahead of the write in on another thread (a
        replica that keeps up: its writes' own page allocation costs less)."""

    def wake_dispatch(self) -> None:
        """Index what was appended without ``wake_dispatch`` (cheap, never blocks)."""

    def dispatch_now(self, bytes_max: int) -> int | None:
        """Index what was appended, one pass of at most ``bytes_max`` on the calling thread;
        the bytes still to index (0: nothing left for the caller), None if no pass could run now."""

    def cut(self, offset: int) -> None:
        """Drop the log and its indexes from ``offset`` (a record boundary) on, crash-safe."""

    def reset(self, start_offset: int) -> None:
        """Replace the log with an empty one starting at ``start_offset`` (a segment boundary)."""

    def store_timestamp_at(self, offset: int) -> int:
        """Store time (ms) of the message starting at ``offset``; -1 when there is none."""
