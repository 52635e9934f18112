"""The node's replication parts and the one place that moves it between roles.

    runtime = HaRuntime(config, store, role, sys_config, epochs, ha_listeners, ha_address, client_address,
                        on_confirm_advanced=waiters.notify_all)  # and, under a controller, its permit
    await nursery.start(runtime.run)                       # owns the HA tasks' nursery
    await runtime.change_role(Role.MASTER, epoch)          # or Role.SLAVE with the master's addresses
    runtime.fence("ZooKeeper session SUSPENDED")            # at once: nothing more is acked

Becoming master: stop the HA client (an append in flight finishes first), record
(epoch, max offset) in the epoch file (with no epoch recorded yet: (epoch, min offset), so
a log written before replication belongs to the first term and can be streamed), let dispatch catch up and replay %SYS%CONFIG
records that arrived by replication, start the HAService on the node's HA listeners,
then accept writes. Becoming slave: stop accepting writes, fence and stop the HAService
(sync puts waiting for replicas fail), start the HA client, which handshakes, cuts the
log at the consistent point and streams. Changes run one at a time; an epoch older than
the node's is refused.

The HA listeners are bound once, when the node starts, and stay open across role
changes, so a node's HA address never moves (a slave's connection waits in the backlog
until the node is master again, then its handshake times out and it retries).
"""

from __future__ import annotations

import logging
from typing import Awaitable, Callable

import trio

from replication import (EpochFile, HAClient, HaClientSettings, HAService, HaServiceSettings, SyncSettings,
                         serve_ha, serve_ha_client)
from replication.errors import ReplicaWaitError, ReplicationFenced
from store import MessageStore

from .config import NodeConfig
from .role import Role, RoleChangeRefused, RoleMachine
from .sys_config import SYS_CONFIG_TOPIC, SysConfig

log = logging.getLogger(__name__)

DISPATCH_CATCH_UP_TIMEOUT_S = 120


class _Part:
    """A long-running HA task in its own cancel scope, so a role change can stop it and wait."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.scope = trio.CancelScope()
        self.done = trio.Event()

    async def stop(self) -> None:
        self.scope.cancel()
        await self.done.wait()


class HaRuntime:
    """Owns the epoch file, the HAService (master) or HAClient (slave), and role changes."""

    def __init__(self, config: NodeConfig, store: MessageStore, role: RoleMachine, sys_config: SysConfig,
                 epochs: EpochFile, ha_listeners: list, ha_address: str, client_address: str, *,
                 write_permit: Callable[[int], bool] | None = None,
                 on_sync_state_set_change: Callable[[frozenset], Awaitable[None]] | None = None,
                 on_confirm_advanced: Callable[[], None] | None = None) -> None:
        """``epochs``: the store's epoch file, loaded by ``run``. Controller mode passes
        ``write_permit`` (the agent's ``may_ack``, checked before a put is written and when it
        is acknowledged; revoked on kazoo's threads at once) and ``on_sync_state_set_change``
        (persists a master's set before it counts). ``on_confirm_advanced`` is told when the
        confirm offset moves (the node wakes long polls capped at it)."""
        self.config = config
        self.store = store
        self.role = role
        self.sys_config = sys_config
        self.ha_listeners = ha_listeners
        self.ha_address = ha_address
        self.client_address = client_address
        self.epochs = epochs
        self._write_permit = write_permit
        self._on_sync_state_set_change = on_sync_state_set_change
        self._on_confirm_advanced = on_confirm_advanced
        self.sync_replication = config.replication == "sync"
        self.ha_service: HAService | None = None
        self.ha_client: HAClient | None = None
        self._service_part: _Part | None = None
        self._client_part: _Part | None = None
        self._master_ha_address: str | None = None
        self._nursery: trio.Nursery | None = None
        self._lock = trio.Lock()

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Hold the nursery the HA parts run in until cancelled."""
        await trio.to_thread.run_sync(self.epochs.load, self.store.max_physical_offset)
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started(self)
            await trio.sleep_forever()

    # --- the role-change entry point -----------------------------------------------------
    async def change_role(self, role: Role, epoch: int, *, master_client_address: str | None = None,
                          master_ha_address: str | None = None,
                          sync_state_set: frozenset | None = None) -> None:
        """Move the node to ``role`` in ``epoch`` (see the module docstring for the steps)."""
        async with self._lock:
            current = self.role.state
            if epoch < current.epoch:
                raise RoleChangeRefused(f"role change to {role.value} in epoch {epoch} refused: the node is "
                                        f"already in epoch {current.epoch}")
            if role is Role.MASTER:
                await self._become_master(epoch, sync_state_set)
            else:
                if not master_ha_address:
                    raise RoleChangeRefused("a slave needs master_ha_address")
                await self._become_slave(epoch, master_client_address, master_ha_address)

    async def _become_master(self, epoch: int, sync_state_set: frozenset | None) -> None:
        state = self.role.state
        if state.role is Role.MASTER and state.epoch == epoch and self.ha_service is not None:
            self.unfence()  # told again after a fence: resume acking in the same term
            return
        last = self.epochs.last_epoch
        if epoch < last or (epoch == last and self.epochs.last.start_offset != self.store.max_physical_offset):
            raise RoleChangeRefused(f"cannot become master in epoch {epoch}: this node's log already holds "
                                    f"epoch {last}")
        await self._stop_client()
        await self._stop_service("stepping down to a new term")
        if epoch > last:
            # the first term of a log written before any epoch was recorded (a store from
            # before replication) owns that log from its start: its bytes must be streamable
            start = self.store.max_physical_offset if self.epochs.entries else self.store.min_physical_offset
            await trio.to_thread.run_sync(self.epochs.append, epoch, start)
        caught_up = await trio.to_thread.run_sync(self.store.wait_dispatched, None, DISPATCH_CATCH_UP_TIMEOUT_S)
        if not caught_up:
            log.warning("dispatch did not catch up within %d s of becoming master", DISPATCH_CATCH_UP_TIMEOUT_S)
        await trio.to_thread.run_sync(self.sys_config.replay)
        service = HAService(self.store.replica_log, self._service_settings(), epoch, self.epochs.entries,
                            sync_state_set=sync_state_set,
                            on_sync_state_set_change=self._on_sync_state_set_change,
                            on_confirm_advanced=self._on_confirm_advanced)
        # under a controller a failover elects any member of the sync-state set, so a consumer
        # reads only what all of them hold (DESIGN.md); a static master serves what it has
        self.store.limit_reads_to_confirm_offset(self.config.zk_hosts is not None)
        self._service_part = await self._start_part("ha-service", serve_ha, service, self.ha_listeners)
        self.ha_service = service
        self.store.commit_log.run_listener = service.senders.appended_run   # a put's frames before its reply's work
        self.role.change(Role.MASTER, epoch, self.client_address)
        log.info("node %s is master in epoch %d from offset %d", self.config.node_id, epoch,
                 self.store.max_physical_offset)

    async def _become_slave(self, epoch: int, master_client_address: str | None, master_ha_address: str) -> None:
        # a proxied cluster: dial this master through the proxy of this slave -> master pair
        master_ha_address = self.config.peer_ha_addresses.get(master_ha_address, master_ha_address)
        self.role.change(Role.SLAVE, epoch, master_client_address)  # no write is accepted from here on
        # under a controller a slave serves only up to the confirm offset its master sent it
        # (until then its own: a deposed master's, which its successor holds); a divergent
        # tail past it is cut at the handshake. A static slave serves what it has replicated
        self.store.limit_reads_to_confirm_offset(self.config.zk_hosts is not None)
        await self._stop_service("stepped down to slave")
        if self._client_part is not None and self._master_ha_address == master_ha_address:
            return  # already following that master
        await self._stop_client()
        client = HAClient(self.store.replica_log, self.epochs, self._client_settings(master_ha_address),
                          on_truncated=self._after_truncation, on_confirm_advanced=self._on_confirm_advanced)
        self._client_part = await self._start_part("ha-client", serve_ha_client, client)
        self.ha_client = client
        self._master_ha_address = master_ha_address
        log.info("node %s is slave in epoch %d of master %s", self.config.node_id, epoch, master_ha_address)

    # --- fencing -------------------------------------------------------------------------
    def fence(self, reason: str) -> None:
        """Stop acknowledging writes at once (callable from the trio thread only; another
        thread hands it over with ``trio.from_thread.run_sync``). Waiting sync puts fail."""
        self.role.fence(reason)
        if self.ha_service is not None:
            self.ha_service.fence(reason)

    def unfence(self) -> None:
        """Acknowledge writes again in the current term (the controller confirmed it)."""
        self.role.unfence()
        if self.ha_service is not None:
            self.ha_service.unfence()

    # --- the put path (handlers) ---------------------------------------------------------
    def check_for_put(self) -> None:
        """Before a put is written: ReplicaWaitError if it could not be acknowledged."""
        permit = self._write_permit
        if permit is not None and not permit(self.role.state.epoch):
            raise ReplicationFenced("this node holds no write permit from the controller (ZooKeeper session "
                                    "suspended or lost, or a newer master elected): it acknowledges no write")
        if self.sync_replication and self.ha_service is not None:
            self.ha_service.check_replicas_for_put()

    def notify_appended(self) -> None:
        if self.ha_service is not None:
            self.ha_service.notify_appended()

    def take_acks_now(self) -> bool:
        """The master's acks that wait in their sockets, read and applied now (a busy poll
        saw the loop's descriptor ready; replication/ack_reader.py): whether there were any."""
        service = self.ha_service
        return service is not None and service.acks.take_now()

    def acks_awaited(self) -> bool:
        """Some put waits for the slaves' acks now."""
        service = self.ha_service
        return service is not None and service.puts_waiting

    async def wait_for_replicas(self, end_offset: int) -> str | None:
        """None once the put ending at ``end_offset`` is acknowledged as the replication mode
        asks; otherwise the PutStatus name it failed with (and why, for the reply)."""
        service = self.ha_service
        if not self.sync_replication or service is None:
            return None
        try:
            await service.wait_for_replicas(end_offset)
        except ReplicaWaitError as error:
            return error.status
        return None

    def read_refusal(self) -> str | None:
        """Why this node may not serve reads now, or None. A master under a controller serves
        only while it holds its permit in its epoch and is not fenced: after its session
        was lost, or a pause outlasted its lease, a new master may already be serving and
        cutting what this one still holds, until a fresh read of the master znode says
        otherwise. A slave serves up to the confirm offset it learned from its master."""
        state = self.role.state
        if state.role is not Role.MASTER:
            return None
        if state.fenced is not None:
            return f"this master is fenced ({state.fenced}): it serves no read until its role is confirmed"
        permit = self._write_permit
        if permit is not None and not permit(state.epoch):
            return ("this master holds no permit from the controller in its epoch (ZooKeeper session suspended "
                    "or lost, or its lease ran out after a pause): it serves no read until ZooKeeper confirms it")
        return None

    def may_ack(self, epoch: int) -> bool:
        """True while this node may acknowledge a write it took in ``epoch``."""
        state = self.role.state
        permit = self._write_permit
        return state.role is Role.MASTER and state.epoch == epoch and state.fenced is None \
            and (permit is None or permit(epoch))

    # --- internals -----------------------------------------------------------------------
    async def _start_part(self, name: str, serve, *args) -> _Part:
        part = _Part(name)

        async def run(task_status=trio.TASK_STATUS_IGNORED) -> None:
            try:
                with part.scope:
                    await serve(*args, task_status=task_status)
            finally:
                part.done.set()

        await self._nursery.start(run)
        return part

    async def _stop_service(self, reason: str) -> None:
        self.store.commit_log.run_listener = None
        if self._service_part is not None:
            self.ha_service.fence(reason)
            await self._service_part.stop()
            self._service_part = None
        self.ha_service = None

    async def _stop_client(self) -> None:
        if self._client_part is not None:
            await self._client_part.stop()
            self._client_part = None
            self._master_ha_address = None
        self.ha_client = None

    def _after_truncation(self, offset: int) -> None:
        """The log was cut: %SYS%CONFIG records past the cut are gone, replay from there later."""
        self.sys_config.forget_from(self.store.max_offset(SYS_CONFIG_TOPIC, 0))

    def _service_settings(self) -> HaServiceSettings:
        c = self.config
        return HaServiceSettings(
            node_id=c.node_id, group=c.group, cluster=c.cluster, secret=c.secret,
            sync=SyncSettings(c.min_in_sync_replicas, c.all_ack_in_sync_state_set,
                              c.ha_max_time_slave_not_catchup_ms),
            slave_timeout_ms=c.slave_timeout_ms, heartbeat_interval_ms=c.ha_heartbeat_interval_ms,
            ack_timeout_ms=c.ha_connection_timeout_ms, chunk_bytes_max=c.ha_chunk_bytes_max)

    def _client_settings(self, master_ha_address: str) -> HaClientSettings:
        c = self.config
        return HaClientSettings(
            node_id=c.node_id, group=c.group, cluster=c.cluster, master_ha_address=master_ha_address,
            secret=c.secret, ack_interval_ms=c.ha_heartbeat_interval_ms, read_timeout_ms=c.ha_connection_timeout_ms,
            backoff_max_ms=c.ha_reconnect_backoff_max_ms, client_address=self.client_address,
            follow_thread=c.ha_follow_thread)

    def repair_peers(self) -> list[str]:
        """Client addresses to fetch an intact copy of a corrupt record from (node/server/repair.py):
        a slave its master, a master the other members of its sync-state set."""
        state = self.role.state
        if state.role is Role.MASTER:
            return self.ha_service.sync_state_client_addresses() if self.ha_service is not None else []
        address = state.master_client_address
        return [address] if address and address != self.client_address else []

    # --- status --------------------------------------------------------------------------
    def status(self) -> dict:
        """The ``replication`` section of a status reply."""
        state = self.role.state
        common = {"role": state.role.value, "epoch": state.epoch, "fenced": state.fenced,
                  "mode": self.config.replication, "ha_address": self.ha_address,
                  "max_offset": self.store.max_physical_offset,
                  "epochs": [[entry.epoch, entry.start_offset] for entry in self.epochs.entries]}
        if self.ha_service is not None:
            stats = self.ha_service.statistics()
            return {**common, "confirm_offset": stats.confirm_offset, "sync_state_set": list(stats.sync_state_set),
                    "min_in_sync_replicas": stats.min_in_sync_replicas,
                    "all_ack_in_sync_state_set": stats.all_ack_in_sync_state_set,
                    "waiting_puts": stats.waiting_puts,
                    "slaves": [{"node_id": s.node_id, "address": s.address, "connected": s.connected,
                                "ack_offset": s.ack_offset, "lag_bytes": s.lag_bytes, "lag_ms": s.lag_ms,
                                "in_sync": s.in_sync, "rate_bytes_per_s": s.rate_bytes_per_s,
                                "last_ack_age_ms": s.last_ack_age_ms} for s in stats.slaves]}
        if self.ha_client is not None:
            stats = self.ha_client.statistics()
            return {**common, "master_ha_address": stats.master_ha_address,
                    "master_client_address": state.master_client_address, "master_node_id": stats.master_node_id,
                    "master_epoch": stats.master_epoch, "connected": stats.connected,
                    "master_max_offset": stats.master_max_offset, "lag_bytes": stats.lag_bytes,
                    "sessions": stats.sessions, "reconnects": stats.reconnects,
                    "truncated_bytes": stats.truncated_bytes, "resets": stats.resets,
                    "last_error": stats.last_error}
        return common
