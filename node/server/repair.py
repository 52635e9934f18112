"""Repair of corrupt CommitLog records from a replica, and the report of those it cannot repair.

A record whose CRCs fail here (found by a pull or by the scrub, named by physical offset
in the store's integrity statistics) is fetched again from a replica that holds it:

- a slave asks its master;
- a master asks the members of its sync-state set, one after the other.

The request is READ_LOG_RANGE ``{offset, size: 1}`` on the peer's client port (the node's
secret answers its challenge): the peer sends the one whole record at that offset, below
its confirm offset, after checking its CRCs itself. The copy is checked again here and
written over the damaged bytes by ``store.repair.overwrite_range`` (whole valid records,
in place, synced) in a worker thread. A record no peer can give (none reachable, none
holding an intact copy) is reported lost by offset: logged at WARNING once, kept in
``statistics().lost`` (status, metrics) and tried again after ``retry_interval_s``, so a
peer that comes back still repairs it.

Repairs of one offset never run twice at once; at most ``concurrent_max`` run together.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import trio

from store import codec
from store.codec import CorruptMessage
from store.repair import RepairError, overwrite_range

from ..client.connection import open_connection
from ..errors import NodeError
from ..wire.protocol import RequestCode

if TYPE_CHECKING:
    from store import MessageStore

log = logging.getLogger(__name__)

LOST_KEPT_MAX = 256
REPAIR_TIMES_KEPT = 1024


@dataclass(frozen=True, slots=True)
class RepairSettings:
    peer_timeout_ms: int = 5_000      # connect + answer, per peer
    retry_interval_s: float = 5.0     # a record that could not be repaired is tried again after this
    concurrent_max: int = 4


@dataclass(frozen=True, slots=True)
class LostRecord:
    """A corrupt record no replica could give an intact copy of (yet)."""

    physical_offset: int
    reason: str
    since_ms: int      # wall clock, when it was first reported lost


@dataclass(frozen=True, slots=True)
class RepairStatistics:
    attempts: int
    repaired: int
    failed_attempts: int
    already_intact: int
    lost: tuple[LostRecord, ...]
    repair_ms_last: float
    repair_ms_max: float
    repair_ms_total: float


class Repairer:
    """Repairs corrupt records of ``store`` from the peers ``peers()`` names (client
    addresses, best first), authenticating with ``secret``."""

    def __init__(self, store: MessageStore, peers: Callable[[], list[str]], *, secret: str | None,
                 settings: RepairSettings = RepairSettings(), clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.peers = peers
        self.secret = secret
        self.settings = settings
        self.clock = clock
        self._in_flight: dict[int, trio.Event] = {}
        self._next_try_s: dict[int, float] = {}
        self._lost: dict[int, LostRecord] = {}
        self._limit = trio.CapacityLimiter(settings.concurrent_max)
        self.attempts = self.repaired = self.failed_attempts = self.already_intact = 0
        self.repair_ms_last = self.repair_ms_max = self.repair_ms_total = 0.0

    def due(self, offsets) -> list[int]:
        """Those of ``offsets`` not being repaired and not waiting for their retry time."""
        now = self.clock()
        return [offset for offset in dict.fromkeys(offsets)
                if offset not in self._in_flight and self._next_try_s.get(offset, 0.0) <= now]

    async def repair_all(self, offsets) -> None:
        """Repair each of ``offsets`` (waiting for repairs already under way)."""
        async with trio.open_nursery() as nursery:
            for offset in dict.fromkeys(offsets):
                nursery.start_soon(self.repair, offset)

    async def repair(self, physical_offset: int) -> bool:
        """Repair the record at ``physical_offset``; True when it is intact afterwards."""
        running = self._in_flight.get(physical_offset)
        if running is not None:
            await running.wait()
            return physical_offset not in self._lost and physical_offset not in self._next_try_s
        done = self._in_flight[physical_offset] = trio.Event()
        started = self.clock()
        try:
            async with self._limit:
                return await self._repair(physical_offset, started)
        finally:
            del self._in_flight[physical_offset]
            done.set()

    async def _repair(self, offset: int, started: float) -> bool:
        self.attempts += 1
        if await trio.to_thread.run_sync(self._intact_here, offset):
            self.already_intact += 1
            self._forget(offset)
            return True
        peers = [peer for peer in self.peers() if peer]
        problems = []
        for peer in peers:
            try:
                data = await self._fetch(peer, offset)
                written = await trio.to_thread.run_sync(overwrite_range, self.store.commit_log,
                                                        self.store.integrity, offset, data)
            except (NodeError, RepairError, OSError, trio.TooSlowError) as error:
                problems.append(f"{peer}: {error or type(error).__name__}")
                continue
            elapsed_ms = (self.clock() - started) * 1000
            self.repaired += 1
            self.repair_ms_last = elapsed_ms
            self.repair_ms_max = max(self.repair_ms_max, elapsed_ms)
            self.repair_ms_total += elapsed_ms
            self._forget(offset)
            log.warning("commit log record at %d repaired from %s (%d record(s), %.1f ms)", offset, peer, written,
                        elapsed_ms)
            return True
        self.failed_attempts += 1
        reason = "; ".join(problems) if problems else "no replica to ask (no master, or no other member of the " \
                                                       "sync-state set)"
        self._report_lost(offset, reason)
        return False

    def _intact_here(self, offset: int) -> bool:
        """Whether a valid record starts at ``offset`` now (repaired meanwhile, or a stale report)."""
        commit_log = self.store.commit_log
        segment = commit_log.segments.find(offset)
        if segment is None or not commit_log.record_starts_at(offset):
            return False
        try:
            codec.check_record(segment.mm, offset - segment.start_offset, segment.size)
        except CorruptMessage:
            return False
        self.store.integrity.forget_corrupt(offset, offset + 1)
        return True

    async def _fetch(self, peer: str, offset: int) -> bytes:
        with trio.fail_after(self.settings.peer_timeout_ms / 1000):
            async with open_connection(peer, secret=self.secret,
                                       connect_timeout_ms=self.settings.peer_timeout_ms) as connection:
                reply = await connection.request(RequestCode.READ_LOG_RANGE, offset=offset, size=1,
                                                 reply_timeout_ms=self.settings.peer_timeout_ms)
        data = reply.get("data")
        if not isinstance(data, bytes) or not data:
            raise RepairError(f"{peer} answered no bytes for offset {offset}")
        return data

    def _report_lost(self, offset: int, reason: str) -> None:
        self._next_try_s[offset] = self.clock() + self.settings.retry_interval_s
        if offset not in self._lost:
            log.warning("commit log record at %d is corrupt and no replica gave an intact copy: reported lost "
                        "(tried again every %.0f s): %s", offset, self.settings.retry_interval_s, reason)
            if len(self._lost) >= LOST_KEPT_MAX:
                self._lost.pop(next(iter(self._lost)))
        self._lost[offset] = LostRecord(offset, reason, self._lost[offset].since_ms if offset in self._lost
                                        else int(time.time() * 1000))

    def _forget(self, offset: int) -> None:
        self._lost.pop(offset, None)
        self._next_try_s.pop(offset, None)

    def statistics(self) -> RepairStatistics:
        return RepairStatistics(self.attempts, self.repaired, self.failed_attempts, self.already_intact,
                                tuple(self._lost.values()), round(self.repair_ms_last, 3),
                                round(self.repair_ms_max, 3), round(self.repair_ms_total, 3))
