"""The master's view of its replicas: acks, the sync-state set and the confirm offset. Pure.

The sync-state set (SSS) holds the master and the slaves that are caught up. A slave
joins when its ack reaches the confirm offset; it leaves once it has been behind for
longer than ``max_time_not_catchup_ms`` (behind = the age of the oldest message it has not
acknowledged; a disconnected slave is also behind by the time since it left). The confirm
offset is the least ack over the SSS (the master's own "ack" is its max offset) and never
goes back within a term.

A sync put ending at offset E is acknowledged once E <= ``replicated_offset``: the
``min_in_sync_replicas``-th highest ack over the SSS, or the least of them all when
``all_ack_in_sync_state_set``. Time and the master's log are inputs, so every rule here is
testable without a clock or a socket.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Callable

RATE_WINDOW_MS = 2_000
RATE_SAMPLES_MAX = 64


@dataclass(frozen=True, slots=True)
class SyncSettings:
    min_in_sync_replicas: int = 1
    all_ack_in_sync_state_set: bool = False
    max_time_not_catchup_ms: int = 15_000


@dataclass(slots=True)
class ReplicaProgress:
    """What the master knows of one slave."""

    node_id: str
    address: str
    ack_offset: int
    connected: bool = True
    connected_at_ms: int = 0
    disconnected_at_ms: int | None = None
    last_ack_ms: int = 0
    sent_offset: int = 0
    samples: collections.deque = field(default_factory=lambda: collections.deque(maxlen=RATE_SAMPLES_MAX))

    def rate_bytes_per_s(self, now_ms: int) -> float:
        """Acked bytes per second over the last RATE_WINDOW_MS (0 when idle)."""
        recent = [(t, offset) for t, offset in self.samples if now_ms - t <= RATE_WINDOW_MS]
        if len(recent) < 2 or recent[-1][0] == recent[0][0]:
            return 0.0
        span_ms = max(now_ms - recent[0][0], recent[-1][0] - recent[0][0])
        return (recent[-1][1] - recent[0][1]) * 1000 / span_ms


class ReplicaTracker:
    """Acks, SSS and confirm offset of one master term."""

    def __init__(self, master_id: str, settings: SyncSettings, confirm_offset: int, now_ms: int,
                 sync_state_set: frozenset[str] | None = None) -> None:
        self.master_id = master_id
        self.settings = settings
        self.replicas: dict[str, ReplicaProgress] = {}
        self.sync_state_set = frozenset(sync_state_set or ()) | {master_id}
        self._confirm_offset = confirm_offset
        # members handed over at term start (by a controller) count as disconnected since
        # now: they stay until they connect or max_time_not_catchup_ms passes without them
        for node_id in self.sync_state_set - {master_id}:
            self.replicas[node_id] = ReplicaProgress(node_id, "", 0, connected=False, disconnected_at_ms=now_ms)

    # --- events --------------------------------------------------------------------------
    def connected(self, node_id: str, address: str, ack_offset: int, now_ms: int) -> None:
        replica = self.replicas.get(node_id)
        if replica is None:
            replica = self.replicas[node_id] = ReplicaProgress(node_id, address, ack_offset)
        replica.address = address
        replica.ack_offset = ack_offset
        replica.sent_offset = ack_offset
        replica.connected = True
        replica.connected_at_ms = now_ms
        replica.disconnected_at_ms = None
        replica.last_ack_ms = now_ms
        replica.samples.clear()
        replica.samples.append((now_ms, ack_offset))

    def acked(self, node_id: str, ack_offset: int, now_ms: int) -> None:
        replica = self.replicas[node_id]
        replica.ack_offset = ack_offset
        replica.last_ack_ms = now_ms
        replica.samples.append((now_ms, ack_offset))

    def disconnected(self, node_id: str, now_ms: int) -> None:
        replica = self.replicas.get(node_id)
        if replica is not None and replica.connected:
            replica.connected = False
            replica.disconnected_at_ms = now_ms

    # --- derived -------------------------------------------------------------------------
    def acks_in_sync(self, master_max_offset: int) -> list[int]:
        """Ack offsets of the SSS members, the master's (its max offset) included."""
        acks = [master_max_offset]
        for node_id in self.sync_state_set:
            if node_id != self.master_id:
                replica = self.replicas.get(node_id)
                acks.append(replica.ack_offset if replica is not None else 0)
        return acks

    def confirm_offset(self, master_max_offset: int) -> int:
        """Least ack over the SSS; never lower than before in this term."""
        self._confirm_offset = max(self._confirm_offset, min(self.acks_in_sync(master_max_offset)))
        return self._confirm_offset

    def enough_in_sync(self) -> bool:
        return len(self.sync_state_set) >= self.settings.min_in_sync_replicas

    def replicated_offset(self, master_max_offset: int) -> int:
        """Puts ending at or below this are acknowledged; -1 when the SSS is too small."""
        if not self.enough_in_sync():
            return -1
        acks = sorted(self.acks_in_sync(master_max_offset), reverse=True)
        if self.settings.all_ack_in_sync_state_set:
            return acks[-1]
        return acks[self.settings.min_in_sync_replicas - 1]

    def behind_ms(self, replica: ReplicaProgress, master_max_offset: int, now_ms: int,
                  oldest_unacked_age_ms: Callable[[int], int]) -> int:
        """How long ``replica`` has been behind: its oldest unacked message's age, and for a
        disconnected one at least the time since it left."""
        behind = 0 if replica.ack_offset >= master_max_offset else oldest_unacked_age_ms(replica.ack_offset)
        if not replica.connected and replica.disconnected_at_ms is not None:
            behind = max(behind, now_ms - replica.disconnected_at_ms)
        return behind

    def wanted_sync_state_set(self, master_max_offset: int, now_ms: int,
                              oldest_unacked_age_ms: Callable[[int], int]) -> frozenset[str]:
        """The SSS the rules call for now: laggards out, slaves at the confirm offset in."""
        confirm = self.confirm_offset(master_max_offset)
        members = {self.master_id}
        limit = self.settings.max_time_not_catchup_ms
        for node_id, replica in self.replicas.items():
            behind = self.behind_ms(replica, master_max_offset, now_ms, oldest_unacked_age_ms)
            if node_id in self.sync_state_set:
                if behind <= limit:
                    members.add(node_id)
            elif replica.connected and replica.ack_offset >= confirm and behind <= limit:
                members.add(node_id)
        return frozenset(members)

    def apply_sync_state_set(self, members: frozenset[str]) -> None:
        self.sync_state_set = frozenset(members) | {self.master_id}
