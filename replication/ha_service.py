"""HAService: the master's side of replication.

    service = HAService(store.replica_log, settings, epoch, epochs)   # a ReplicaStore
    await nursery.start(serve_ha, service, listeners)     # listeners on ha_address
    ...
    await service.wait_for_replicas(result.end_offset)    # a sync put; raises ReplicaWaitError

Per slave connection: HELLO, the slave's authenticated HANDSHAKE, the WELCOME with the
consistent point, then the slave's first ack (its log now ends there) and two tasks: a
sender cutting the log from that offset into frames of whole records (at most
``chunk_bytes_max``, never across a segment or an epoch boundary; views of the mapping)
and writing them to the socket (heartbeats when idle), and an ack reader feeding the
ReplicaTracker. A put writes a caught-up slave's new frame itself, with no sender task
woken (log_sender.py); a sender far behind reads and checksums frames in a worker
thread, the next one while the one before is sent. A slave that stops acking
for ``ack_timeout_ms`` is dropped; it reconnects when it can.

Sync puts park in a heap ordered by end offset and are released as acks move the
replicated offset (see sync_state): a put waits in its own task (wait_for_replicas) or, with
no task, has its reply called from the task that releases it (wait_for_replicas_then; one
task times all of those out, in the order they came). One maintenance task keeps the
sync-state set: laggards out, caught-up slaves in, each change handed first to
``on_sync_state_set_change`` (the controller agent persists it in ZooKeeper; a change it
refuses is not applied). The confirm offset the tracker computes is published to the store
(``publish_confirm_offset``) and ``on_confirm_advanced`` is told.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import logging
import math
import os
import time
from dataclasses import dataclass
from typing import Awaitable, Callable

import trio

from store.codec import BLANK_HEADER, BLANK_MAGIC
from store.errors import StoreError

from . import protocol
from .ack_reader import AckReaders
from .epochs import EpochEntry, Resync, find_resync
from .errors import (FlushSlaveTimeout, HaAuthError, HaProtocolError, InSyncReplicasNotEnough, ReplicationError,
                     ReplicationFenced, expected_failure)
from .log_sender import LogSenders
from .protocol import Handshake, Hello, Welcome
from .store_protocol import ReplicaStore
from .sync_state import ReplicaProgress, ReplicaTracker, SyncSettings
from .transport import StreamReader

log = logging.getLogger(__name__)

MIB = 1024 * 1024
ACK_READER_BUFFER_BYTES = 64 * 1024
WAITERS_MAX = 100_000
ACCEPT_RETRY_S = 0.1
# what ends a slave's connection without being a bug in this node
CONNECTION_FAILURES = (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError, ReplicationError,
                       OSError, StoreError)

SyncStateSetHook = Callable[[frozenset], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class HaServiceSettings:
    node_id: str
    group: str
    cluster: str
    secret: str | None = None
    sync: SyncSettings = SyncSettings()
    slave_timeout_ms: int = 3_000
    heartbeat_interval_ms: int = 1_000
    handshake_timeout_ms: int = 5_000
    first_ack_timeout_ms: int = 120_000    # the slave truncates (or resets) its log first
    ack_timeout_ms: int = 10_000
    chunk_bytes_max: int = 4 * MIB
    connections_max: int = 32
    sync_state_check_interval_ms: int = 100


@dataclass(frozen=True, slots=True)
class SlaveStatistics:
    """One slave as the master sees it (what ``hastore lag`` shows)."""

    node_id: str
    address: str
    connected: bool
    ack_offset: int
    sent_offset: int
    lag_bytes: int
    lag_ms: int
    in_sync: bool
    rate_bytes_per_s: float
    last_ack_age_ms: int


@dataclass(frozen=True, slots=True)
class HaServiceStatistics:
    epoch: int
    max_offset: int
    confirm_offset: int
    sync_state_set: tuple[str, ...]
    min_in_sync_replicas: int
    all_ack_in_sync_state_set: bool
    slaves: tuple[SlaveStatistics, ...]
    connections: int
    handshakes: int
    refused: int
    auth_failures: int
    waiting_puts: int
    fenced: str | None


class _Waiter:
    """One put waiting for acks: woken through ``event`` (wait_for_replicas) or answered by
    ``callback(error)`` (wait_for_replicas_then), once: ``finish`` does either."""

    __slots__ = ("end_offset", "event", "error", "done", "callback", "deadline")

    def __init__(self, end_offset: int, callback: Callable[[ReplicationError | None], None] | None = None,
                 deadline: float = math.inf) -> None:
        self.end_offset = end_offset
        self.event = trio.Event() if callback is None else None
        self.error: ReplicationError | None = None
        self.done = False
        self.callback = callback
        self.deadline = deadline

    def finish(self, error: ReplicationError | None) -> None:
        if self.done:
            return
        self.done = True
        self.error = error
        if self.event is not None:
            self.event.set()
        else:
            callback, self.callback = self.callback, None   # what the reply holds goes with it
            try:
                callback(error)
            except Exception:  # a bug in the put's reply: it must not end the task answering it
                log.exception("a waiting put's reply failed")


class HAService:
    """Streams this master's log to its slaves and tracks what they hold."""

    def __init__(self, store: ReplicaStore, settings: HaServiceSettings, epoch: int, epochs: list[EpochEntry], *,
                 sync_state_set: frozenset | None = None,
                 on_sync_state_set_change: SyncStateSetHook | None = None,
                 on_confirm_advanced: Callable[[], None] | None = None) -> None:
        self.store = store
        self.settings = settings
        self.epoch = epoch
        self.epochs = list(epochs)
        self.tracker = ReplicaTracker(settings.node_id, settings.sync, store.confirm_offset, _now_ms(),
                                      sync_state_set)
        self.on_sync_state_set_change = on_sync_state_set_change
        # called (on the trio thread) whenever the confirm offset moves: readers capped at it
        # (under a controller) may have new messages
        self.on_confirm_advanced = on_confirm_advanced
        self.senders = LogSenders(store, self.epochs, chunk_bytes_max=settings.chunk_bytes_max,
                                  heartbeat_interval_ms=settings.heartbeat_interval_ms)
        self.acks = AckReaders(self._on_ack)   # acks read by their tasks, or by a poller (take_now)
        self._sync_state_wake = trio.Event()
        self._waiters: list[tuple[int, int, _Waiter]] = []
        self._sequence = itertools.count()
        # callback waiters in the order they came, so by deadline (one timeout for all):
        # timed out by one task (_expire_waiters) instead of a cancel scope per put
        self._timed: collections.deque[_Waiter] = collections.deque()
        self._timed_wake = trio.Event()
        self._expiring = False
        self._sessions: dict[str, trio.CancelScope] = {}
        self._client_addresses: dict[str, str] = {}   # slave node id -> client address (repairs)
        self._fenced: str | None = None
        self._connections = 0
        self._handshakes = self._refused = self._auth_failures = 0

    # --- the put path --------------------------------------------------------------------
    def notify_appended(self) -> None:
        """The log grew (call after every local write, on the trio thread): each caught-up
        slave's new frame is written from this call (log_sender.py). A sender not parked
        looks at the log's end before it parks again, so only parked ones need it."""
        self.senders.notify_appended()
        if len(self.tracker.sync_state_set) == 1:
            self._advance_confirm()  # the master alone is the whole sync-state set

    def _advance_confirm(self) -> None:
        confirm = self.tracker.confirm_offset(self.store.max_offset)
        if confirm > self.store.confirm_offset:
            self.store.publish_confirm_offset(confirm)
            if self.on_confirm_advanced is not None:
                self.on_confirm_advanced()

    def check_replicas_for_put(self) -> None:
        """Before a sync put is written: refuse it if it could not be acknowledged."""
        if self._fenced is not None:
            raise ReplicationFenced(f"this master is fenced ({self._fenced}): it acknowledges no write")
        if not self.tracker.enough_in_sync():
            raise InSyncReplicasNotEnough(
                f"the sync-state set {sorted(self.tracker.sync_state_set)} holds fewer than "
                f"min_in_sync_replicas={self.settings.sync.min_in_sync_replicas} members")

    async def wait_for_replicas(self, end_offset: int, timeout_ms: int | None = None) -> None:
        """Return once enough in-sync replicas hold the log up to ``end_offset``.

        FlushSlaveTimeout after ``slave_timeout_ms``; InSyncReplicasNotEnough when the SSS is
        (or becomes) too small; ReplicationFenced when the master is fenced or stops.
        """
        self.check_replicas_for_put()
        if end_offset <= self.tracker.replicated_offset(self.store.max_offset):
            return
        if len(self._waiters) >= WAITERS_MAX:
            raise FlushSlaveTimeout(f"{WAITERS_MAX} puts already wait for replicas")
        waiter = _Waiter(end_offset)
        heapq.heappush(self._waiters, (end_offset, next(self._sequence), waiter))
        # a writer that did not call notify_appended: the senders still owe these bytes (a
        # sender that has sent them is left alone, so no second wake or CONFIRM frame per put)
        self.senders.notify_appended()
        timeout_ms = self.settings.slave_timeout_ms if timeout_ms is None else timeout_ms
        with trio.move_on_after(timeout_ms / 1000):
            await waiter.event.wait()
        if not waiter.done:
            waiter.finish(self._timeout_error(end_offset, timeout_ms))  # leaves the heap at the next release
        if waiter.error is not None:
            raise waiter.error

    @property
    def puts_waiting(self) -> bool:
        """Some put waits for acks (one answered may stay until the next release)."""
        return bool(self._waiters)

    @property
    def answers_waiting_puts(self) -> bool:
        """wait_for_replicas_then may be used: the task timing its waiters out runs."""
        return self._expiring

    def wait_for_replicas_then(self, end_offset: int, callback: Callable[[ReplicationError | None], None]) -> bool:
        """wait_for_replicas without a task: False when the put is acknowledged already
        (``callback`` is never called), else True and ``callback(error)`` is called once,
        later, from the task that learns the outcome (an ack, the timeout after
        ``slave_timeout_ms``, a shrunk sync-state set, fencing): ``error`` None once enough
        in-sync replicas hold the log up to ``end_offset``, else what wait_for_replicas would
        raise. Raises at once what wait_for_replicas raises before waiting. Only while
        ``answers_waiting_puts``."""
        self.check_replicas_for_put()
        if end_offset <= self.tracker.replicated_offset(self.store.max_offset):
            return False
        if len(self._waiters) >= WAITERS_MAX:
            raise FlushSlaveTimeout(f"{WAITERS_MAX} puts already wait for replicas")
        waiter = _Waiter(end_offset, callback, trio.current_time() + self.settings.slave_timeout_ms / 1000)
        heapq.heappush(self._waiters, (end_offset, next(self._sequence), waiter))
        if not self._timed:
            self._timed_wake.set()
        self._timed.append(waiter)
        self.senders.notify_appended()  # as in wait_for_replicas
        return True

    def _timeout_error(self, end_offset: int, timeout_ms: int) -> FlushSlaveTimeout:
        return FlushSlaveTimeout(
            f"replicas did not acknowledge offset {end_offset} within slave_timeout_ms={timeout_ms}")

    async def _expire_waiters(self) -> None:
        """Fail each callback waiter still waiting at its deadline: one sleep until the
        oldest one's deadline (all share one timeout, so the oldest is due first)."""
        timed = self._timed
        self._expiring = True
        try:
            while True:
                while timed and timed[0].done:
                    timed.popleft()
                if not timed:
                    self._timed_wake = trio.Event()
                    await self._timed_wake.wait()
                    continue
                await trio.sleep_until(timed[0].deadline)
                now = trio.current_time()
                while timed and (timed[0].done or timed[0].deadline <= now):
                    waiter = timed.popleft()
                    waiter.finish(self._timeout_error(waiter.end_offset, self.settings.slave_timeout_ms))
                self._release_waiters()  # the heap lets go of them
        finally:
            self._expiring = False

    def fence(self, reason: str) -> None:
        """Acknowledge nothing from now on; every waiting put fails (ReplicationFenced)."""
        if self._fenced is None:
            self._fenced = reason
            log.warning("HA service fenced: %s", reason)
        self._fail_waiters(ReplicationFenced(f"this master was fenced while the put waited ({reason})"))

    def unfence(self) -> None:
        """Acknowledge writes again (the controller confirmed this master's term)."""
        if self._fenced is not None:
            log.warning("HA service unfenced (was: %s)", self._fenced)
        self._fenced = None

    @property
    def fenced(self) -> str | None:
        return self._fenced

    def _release_waiters(self) -> None:
        replicated = self.tracker.replicated_offset(self.store.max_offset)
        waiters = self._waiters
        while waiters and (waiters[0][0] <= replicated or waiters[0][2].done):
            heapq.heappop(waiters)[2].finish(None)

    def _fail_waiters(self, error: ReplicationError) -> None:
        waiters, self._waiters = self._waiters, []
        for _, _, waiter in sorted(waiters):   # in the order of their offsets
            waiter.finish(error)

    # --- serving -------------------------------------------------------------------------
    async def serve(self, listeners: list, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Accept slaves on ``listeners`` until cancelled. The listeners stay open afterwards:
        they belong to the node, whose HA address must not move across role changes."""
        self._advance_confirm()  # a term may start with the master alone in the sync-state set
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._maintain_sync_state_set)
                nursery.start_soon(self._expire_waiters)
                for listener in listeners:
                    nursery.start_soon(self._accept, listener, nursery)
                task_status.started(self)
        finally:
            self.fence("the HA service stopped")

    async def _accept(self, listener, nursery: trio.Nursery) -> None:
        while True:
            try:
                stream = await listener.accept()
            except OSError as error:  # out of file descriptors and the like: wait, bounded
                log.error("HA accept failed: %s; retrying in %.1f s", error, ACCEPT_RETRY_S)
                await trio.sleep(ACCEPT_RETRY_S)
                continue
            nursery.start_soon(self.handle_connection, stream)

    async def handle_connection(self, stream: trio.abc.Stream) -> None:
        """Serve one slave connection until it fails or the service stops; never raises for
        anything the peer does."""
        if self._connections >= self.settings.connections_max or self._fenced is not None:
            self._refused += 1
            await _refuse(stream, "the master takes no more slave connections")
            return
        self._connections += 1
        try:
            await self._serve_slave(stream)
        except BaseException as raised:
            error = expected_failure(raised, CONNECTION_FAILURES)
            if error is None:
                raise
            log.info("slave connection ended: %s", error or type(error).__name__)
        finally:
            self._connections -= 1
            await trio.aclose_forcefully(stream)

    async def _serve_slave(self, stream: trio.abc.Stream) -> None:
        reader = StreamReader(stream, ACK_READER_BUFFER_BYTES + protocol.CONTROL_BYTES_MAX)
        with trio.fail_after(self.settings.handshake_timeout_ms / 1000):
            handshake, resync = await self._handshake(stream, reader)
        with trio.fail_after(self.settings.first_ack_timeout_ms / 1000):
            first_ack = protocol.parse_ack(await reader.exactly(protocol.ACK.size))
        if first_ack != resync.offset:
            raise HaProtocolError(f"slave {handshake.node_id} acked {first_ack} first; its log must end at "
                                  f"{resync.offset}")
        node_id = handshake.node_id
        if handshake.client_address:
            self._client_addresses[node_id] = handshake.client_address
        previous = self._sessions.get(node_id)
        if previous is not None:
            previous.cancel()  # a reconnect replaces its half-open predecessor
        with trio.CancelScope() as scope:
            self._sessions[node_id] = scope
            self.tracker.connected(node_id, _peer(stream), first_ack, _now_ms())
            replica = self.tracker.replicas[node_id]
            log.info("slave %s streaming from %d (%s)", node_id, first_ack, resync.reason)
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._read_acks, reader, replica, nursery.cancel_scope)
                    await self.senders.stream(stream, replica, first_ack)
            finally:
                if self._sessions.get(node_id) is scope:
                    del self._sessions[node_id]
                    self.tracker.disconnected(node_id, _now_ms())
                    self._sync_state_wake.set()

    async def _handshake(self, stream, reader: StreamReader) -> tuple[Handshake, Resync]:
        nonce = os.urandom(protocol.NONCE_BYTES)
        await stream.send_all(Hello(self.settings.cluster, nonce).encode())
        payload = await reader.control()
        try:
            slave_nonce = Handshake.authenticate(payload, self.settings.secret, nonce)
        except HaAuthError:
            self._auth_failures += 1
            await _refuse(stream, "authentication failed")
            raise
        handshake = Handshake.decode(payload)
        problem = None
        if handshake.cluster != self.settings.cluster or handshake.group != self.settings.group:
            problem = (f"slave {handshake.node_id} is in {handshake.cluster}/{handshake.group}, this master in "
                       f"{self.settings.cluster}/{self.settings.group}")
        elif handshake.node_id == self.settings.node_id:
            problem = f"slave claims this master's own node id {handshake.node_id!r}"
        if problem:
            self._refused += 1
            await _refuse(stream, problem)
            raise HaProtocolError(problem)
        store = self.store
        resync = find_resync(self.epochs, store.min_offset, store.max_offset,
                             handshake.epochs, handshake.min_offset, handshake.max_offset)
        await stream.send_all(Welcome(protocol.master_proof(self.settings.secret, nonce, slave_nonce),
                                      self.settings.node_id, self.epoch, self.epochs, store.min_offset,
                                      store.max_offset, resync).encode())
        self._handshakes += 1
        log.info("slave %s (max %d): %s to %d", handshake.node_id, handshake.max_offset, resync.kind.value,
                 resync.offset)
        return handshake, resync

    async def _read_acks(self, reader: StreamReader, replica: ReplicaProgress, scope: trio.CancelScope) -> None:
        """One slave's acks until they stop (ack_reader.py); then ``scope`` is cancelled."""
        await self.acks.read(reader, replica, self.settings.ack_timeout_ms / 1000, scope)

    def _on_ack(self, replica: ReplicaProgress, offset: int, now: float) -> None:
        moved = offset != replica.ack_offset
        self.tracker.acked(replica.node_id, offset, int(now * 1000))
        if moved:
            self._release_waiters()
            self._advance_confirm()
            if replica.node_id not in self.tracker.sync_state_set:
                self._sync_state_wake.set()

    # --- the sync-state set --------------------------------------------------------------
    def _oldest_unacked_age_ms(self, ack_offset: int) -> int:
        """Age of the oldest message a slave acked up to ``ack_offset`` lacks. A slave whose
        ack ends a segment sits at its closing blank record, which has no store time (its
        bytes there read 0, "decades behind", and dropped every such slave from the
        sync-state set at once): the message it lacks starts the next segment."""
        store = self.store
        if store.min_offset <= ack_offset < store.max_offset:
            try:
                head = store.read(ack_offset, BLANK_HEADER.size)
            except StoreError:   # no record there (a damaged one): its store time, as before
                head = b""
            if len(head) >= BLANK_HEADER.size and BLANK_HEADER.unpack_from(head)[1] == BLANK_MAGIC:
                ack_offset += len(head)   # the blank runs to the segment's end
        stored_at = store.store_timestamp_at(ack_offset)
        return max(0, int(time.time() * 1000) - stored_at) if stored_at >= 0 else 0

    async def _maintain_sync_state_set(self) -> None:
        interval_s = self.settings.sync_state_check_interval_ms / 1000
        while True:
            wake = self._sync_state_wake
            with trio.move_on_after(interval_s):
                await wake.wait()
            if wake.is_set():
                self._sync_state_wake = trio.Event()
            await self.update_sync_state_set()

    async def update_sync_state_set(self) -> None:
        """Apply what the SSS rules call for now (after the hook accepts it); update the
        confirm offset; release or fail waiting puts accordingly."""
        tracker = self.tracker
        master_max = self.store.max_offset
        wanted = tracker.wanted_sync_state_set(master_max, _now_ms(), self._oldest_unacked_age_ms)
        if wanted != tracker.sync_state_set and self._fenced is None:
            if self.on_sync_state_set_change is not None:
                try:
                    await self.on_sync_state_set_change(wanted)
                except Exception as error:  # the controller refused or is unreachable: keep the old set
                    log.warning("sync-state set change to %s not persisted: %s", sorted(wanted), error)
                    return
            log.info("sync-state set: %s -> %s", sorted(tracker.sync_state_set), sorted(wanted))
            tracker.apply_sync_state_set(wanted)
            if not tracker.enough_in_sync():
                self._fail_waiters(InSyncReplicasNotEnough(
                    f"the sync-state set shrank to {sorted(wanted)}, fewer than min_in_sync_replicas="
                    f"{self.settings.sync.min_in_sync_replicas}"))
        self._advance_confirm()
        self._release_waiters()

    def sync_state_client_addresses(self) -> list[str]:
        """Client addresses of the sync-state set's other members (as their handshakes told
        them), in-sync and connected ones first: where a corrupt record is fetched again."""
        tracker = self.tracker
        members = [node for node in sorted(tracker.sync_state_set) if node != self.settings.node_id]
        members.sort(key=lambda node: not (node in tracker.replicas and tracker.replicas[node].connected))
        return [self._client_addresses[node] for node in members if node in self._client_addresses]

    # --- statistics ----------------------------------------------------------------------
    def statistics(self) -> HaServiceStatistics:
        tracker = self.tracker
        master_max = self.store.max_offset
        now = _now_ms()
        slaves = []
        for node_id, replica in sorted(tracker.replicas.items()):
            slaves.append(SlaveStatistics(
                node_id=node_id, address=replica.address, connected=replica.connected,
                ack_offset=replica.ack_offset, sent_offset=replica.sent_offset,
                lag_bytes=max(0, master_max - replica.ack_offset),
                lag_ms=tracker.behind_ms(replica, master_max, now, self._oldest_unacked_age_ms),
                in_sync=node_id in tracker.sync_state_set, rate_bytes_per_s=round(replica.rate_bytes_per_s(now), 1),
                last_ack_age_ms=max(0, now - replica.last_ack_ms)))
        return HaServiceStatistics(
            epoch=self.epoch, max_offset=master_max, confirm_offset=tracker.confirm_offset(master_max),
            sync_state_set=tuple(sorted(tracker.sync_state_set)),
            min_in_sync_replicas=self.settings.sync.min_in_sync_replicas,
            all_ack_in_sync_state_set=self.settings.sync.all_ack_in_sync_state_set, slaves=tuple(slaves),
            connections=self._connections, handshakes=self._handshakes, refused=self._refused,
            auth_failures=self._auth_failures, waiting_puts=len(self._waiters), fenced=self._fenced)


async def serve_ha(service: HAService, listeners: list, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Serve slaves on ``listeners`` until cancelled; ``task_status.started(service)`` once listening."""
    await service.serve(listeners, task_status=task_status)


async def _refuse(stream, error: str) -> None:
    try:
        with trio.move_on_after(1):
            await stream.send_all(protocol.encode_refusal(error))
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass


def _peer(stream) -> str:
    if isinstance(stream, trio.SocketStream):
        try:
            host, port = stream.socket.getpeername()[:2]
            return f"{host}:{port}"
        except OSError:
            return "?"
    return "memory"


def _now_ms() -> int:
    return int(trio.current_time() * 1000)
