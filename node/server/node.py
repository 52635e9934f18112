"""The node: one store, its role, the client server and the metrics endpoint, in one trio run.

    async with trio.open_nursery() as nursery:
        node = await nursery.start(serve_node, config)   # a Node, once it is serving
        ...
        nursery.cancel_scope.cancel()                   # clean shutdown (abort file removed)

Start order: bind the listeners (so port 0 resolves and the store host is the real client
address), start the store (recovery) in a worker thread, with its dispatch run in this
trio loop rather than on a thread of its own (dispatch_loop.py), replay %SYS%CONFIG records past
the checkpointed config files, take the static role from the config (replication parts
started, see ha_roles.py) or, with ``zk_hosts``, start the controller agent and wait fenced
for its assignment (controller_mode.py), then serve.

Every part gets its collaborators through its constructor, so the parts are built in an
order that follows who needs whom: the epoch file and, under a controller, the agent
(whose write permit and sync-state set persister the replication runtime takes); the long
polls' table (the replication runtime wakes it when the confirm offset moves); the
replication runtime; the connection counters and busy poll (which the status reply
reads); the handlers; the client server. Cancellation persists the config files and
shuts the store down cleanly, shielded, so a SIGTERM never leaves an abort file behind.
"""

from __future__ import annotations

import logging
import signal
import time
from dataclasses import dataclass
from typing import Callable

import trio

from controller import NodeAgent
from replication import EpochFile
from replication.lag_history import LagHistory
from store import MessageStore

from .busy_poll import BusyPoll
from .config import NodeConfig
from .controller_mode import ControllerMode, Registration, agent_settings
from .dispatch_loop import LoopCaller, idle_pass, serve_dispatch
from .ha_roles import HaRuntime
from .handlers import RequestHandlers
from .pull_waiters import PullWaiters
from .integrity import IntegrityCollector, IntegrityGuard, serve_integrity
from .log_ranges import LogRangeHandlers
from .repair import Repairer
from .lag_sampler import LagJournal, LagSampler, serve_lag_sampler
from .metrics import NodeMetrics, open_listeners, serve_metrics
from .role import Role, RoleMachine
from .connections import ClientServer, ConnectionCounts, serve_clients
from .sys_config import SYS_CONFIG_QUEUE, SysConfig

log = logging.getLogger(__name__)


@dataclass
class Node:
    """A running node's parts, as ``serve_node`` hands them to its starter."""

    config: NodeConfig
    client_address: str
    metrics_address: str
    store: MessageStore
    role: RoleMachine
    sys_config: SysConfig
    handlers: RequestHandlers
    server: ClientServer
    metrics: NodeMetrics
    ha: HaRuntime
    ha_address: str
    agent: NodeAgent | None = None     # controller mode: the controller.NodeAgent

    async def change_role(self, role: Role, epoch: int, master_client_address: str | None = None, *,
                          master_ha_address: str | None = None, sync_state_set: frozenset | None = None) -> None:
        """Move this node between roles (the static role and tests; controller mode calls the same
        ``HaRuntime.change_role`` from ``ControllerMode.serve``).

        Becoming master: stop the HA client, record (epoch, max offset) in the epoch file,
        wait for dispatch, start the HAService, accept writes (``sync_state_set``: the set a
        controller hands over; the master alone by default). Becoming slave: stop accepting
        writes, stop the HAService, follow ``master_ha_address`` (handshake, cut, stream);
        ``master_client_address`` is what NOT_MASTER replies name. RoleChangeRefused for an
        epoch older than the node's.
        """
        await self.ha.change_role(role, epoch, master_client_address=master_client_address,
                                  master_ha_address=master_ha_address, sync_state_set=sync_state_set)

    def fence(self, reason: str) -> None:
        """Stop acknowledging writes at once, sync puts waiting for replicas included; sends
        fail closed (SERVICE_NOT_AVAILABLE) until ``unfence`` or a role change. Call it on
        the node's trio thread (from another: ``trio.from_thread.run_sync(node.fence, why)``)."""
        self.ha.fence(reason)

    def unfence(self) -> None:
        """Acknowledge writes again in the current role and epoch."""
        self.ha.unfence()


def _bound_address(listeners: list) -> str:
    host, port = listeners[0].socket.getsockname()[:2]
    return f"{host}:{port}"


async def serve_node(config: NodeConfig, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Run a node until cancelled; ``task_status.started(node)`` once it serves clients."""
    client_listeners = await open_listeners(config.client_address)
    metrics_listeners = await open_listeners(config.metrics_address)
    ha_listeners = await open_listeners(config.ha_address)
    client_address = _bound_address(client_listeners)
    metrics_address = _bound_address(metrics_listeners)
    ha_address = _bound_address(ha_listeners)
    # what others are told: ZooKeeper records, NOT_MASTER replies, the replication handshake
    advertised_client, advertised_ha = config.advertised_addresses(client_address, ha_address)
    store = MessageStore(config.store_config(store_host=client_address).replace(dispatcher_thread=False))
    await trio.to_thread.run_sync(store.start)
    in_loop = LoopCaller()
    listener = None
    sys_config: SysConfig | None = None
    busy_poll: BusyPoll | None = None
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_dispatch, store.dispatcher)
            sys_config = SysConfig(store)
            replayed = await trio.to_thread.run_sync(sys_config.replay)
            log.info("node %s: replayed %d %%SYS%%CONFIG records", config.node_id, replayed)
            # a slave until the static role (or a controller) says otherwise: no write before HA is up
            role = RoleMachine(Role.SLAVE, 0, config.master_client_address)
            epochs = EpochFile(store.config.store_path)  # loaded by ha.run
            controller = None
            if config.zk_hosts is not None:
                controller = ControllerMode(agent_settings(config), Registration(
                    advertised_client, advertised_ha, config.priority, max_offset=lambda: store.max_physical_offset,
                    last_epoch=lambda: epochs.last_epoch))
            waiters = PullWaiters()
            ha = HaRuntime(config, store, role, sys_config, epochs, ha_listeners, ha_address, advertised_client,
                           write_permit=controller.agent.may_ack if controller is not None else None,
                           on_sync_state_set_change=controller.persist_sync_state_set if controller is not None
                           else None,
                           on_confirm_advanced=_confirm_listeners(waiters.notify_all, sys_config.confirm_advanced))
            # lag samples per slave while master; status reply and metrics read lag status through it
            lag = LagSampler(config.node_id, config.group, ha.status, LagHistory(time.time), journal=LagJournal(
                config.lag_history_path, config.group) if config.lag_history_path else None)
            metrics = NodeMetrics(config.node_id)
            metrics.watch_store(store)
            metrics.watch_replication(lag.replication_status)
            # corrupt records repaired from a replica (a slave's master, a master's sync-state set)
            integrity = IntegrityGuard(store, Repairer(store, ha.repair_peers, secret=config.secret))
            metrics.registry.register(IntegrityCollector(config.node_id, integrity))
            counts = ConnectionCounts()
            busy_poll = BusyPoll(config.busy_poll_us, idle_work=idle_pass(store.dispatcher), poll_loop_waits=True,
                                 ready_work=ha.take_acks_now, awaiting=ha.acks_awaited)
            status = StatusSources(client_address, ha_address, metrics_address, config.busy_poll_us, counts,
                                   busy_poll, advertised=(advertised_client, advertised_ha),
                                   replication=lag.replication_status,
                                   controller=controller.status if controller is not None else None,
                                   integrity=integrity.status)
            handlers = RequestHandlers(config, store, role, sys_config, metrics, status, waiters=waiters, replicas=ha,
                                       lag_history=lag.lag_history_reply, log_ranges=LogRangeHandlers(store),
                                       integrity=integrity)
            server = ClientServer(config, handlers, metrics, busy_poll, counts)

            def on_dispatch(dispatched_offset: int, grown_queues: set) -> None:
                # only when a long poll waits on a grown queue. Passes run in this loop
                # (serve_dispatch, or a put's catch_up_for_writes); one on another thread (a
                # store method run with to_thread) hands over without blocking that thread
                if grown_queues and waiters.any_waiting(grown_queues):
                    in_loop.call(waiters.notify, grown_queues)
                if SYS_CONFIG_QUEUE in grown_queues:  # a slave applies config records as they replicate in
                    in_loop.call(sys_config.catch_up_soon)

            listener = on_dispatch
            store.add_dispatch_listener(on_dispatch)
            node = Node(config, client_address, metrics_address, store, role, sys_config, handlers, server, metrics, ha,
                        ha_address, controller.agent if controller is not None else None)
            await nursery.start(ha.run)
            if config.zk_hosts is None:
                await _take_static_role(node)
            else:
                # controller mode: a fenced slave until the controller says otherwise
                node.fence("waiting for the controller's assignment")
                await nursery.start(controller.serve, ha)
            await nursery.start(serve_clients, server, client_listeners)
            await nursery.start(serve_metrics, metrics_listeners, metrics)
            await nursery.start(serve_lag_sampler, lag)
            await nursery.start(serve_integrity, integrity)
            nursery.start_soon(_persist_config_periodically, sys_config, config.config_persist_interval_ms)
            task_status.started(node)
    finally:
        if busy_poll is not None:
            busy_poll.close()
        with trio.CancelScope(shield=True):
            for ha_listener in ha_listeners:
                await ha_listener.aclose()
            if listener is not None:
                store.dispatcher.remove_listener(listener)
            await trio.to_thread.run_sync(_shutdown, store, sys_config)


@dataclass(frozen=True)
class StatusSources:
    """The sections a node's status reply adds to the handlers' own (``status_extra``), read
    from parts made before the handlers: the bound and advertised addresses, the connection counters and
    busy poll the client server will use, the replication runtime's status and, under a
    controller, the agent's."""

    client_address: str
    ha_address: str
    metrics_address: str
    busy_poll_us: int
    counts: ConnectionCounts
    busy_poll: BusyPoll
    replication: Callable[[], dict]
    controller: Callable[[], dict] | None
    integrity: Callable[[], dict] | None = None    # scrub progress and repairs (node/server/integrity.py)
    advertised: tuple[str, str] | None = None      # (client, HA) others are told; None: the bound ones

    def __call__(self) -> dict:
        polled = self.busy_poll.statistics()
        advertised = self.advertised or (self.client_address, self.ha_address)
        return {"connections": self.counts.open, "clients": self.counts.status(),
                "busy_poll": {"window_us": self.busy_poll_us if self.busy_poll.enabled else 0,
                              "reads": polled.reads, "seconds": round(polled.seconds, 6),
                              "loop_polls": polled.loop_polls, "loop_polls_woken": polled.loop_polls_woken,
                              "loop_seconds": round(polled.loop_seconds, 6), "ready_taken": polled.ready_taken},
                "client_address": self.client_address, "ha_address": self.ha_address,
                "metrics_address": self.metrics_address, "advertised_client_address": advertised[0],
                "advertised_ha_address": advertised[1], "replication": self.replication(),
                "controller": self.controller() if self.controller is not None else None,
                "integrity": self.integrity() if self.integrity is not None else None}


def _confirm_listeners(*listeners: Callable[[], None]) -> Callable[[], None]:
    """One callback telling each of ``listeners`` that the confirm offset moved: the long
    polls capped at it, and the %SYS%CONFIG records it now covers on a slave."""
    def confirm_advanced() -> None:
        for listener in listeners:
            listener()
    return confirm_advanced


async def _take_static_role(node: Node) -> None:
    """The role from the config, as classic RocketMQ: a master starts a new term (epoch file's
    last epoch + 1, at its max offset), so bytes an old term left unreplicated can never pass
    for the new term's; a slave keeps its epoch and follows ``master_ha_address``."""
    config = node.config
    last_epoch = node.ha.epochs.last_epoch
    if config.role == "master":
        await node.change_role(Role.MASTER, last_epoch + 1)
    else:
        await node.change_role(Role.SLAVE, last_epoch, config.master_client_address,
                               master_ha_address=config.master_ha_address)


def _shutdown(store: MessageStore, sys_config: SysConfig | None) -> None:
    """Checkpoint the config files with their replay offset, then stop the store cleanly."""
    try:
        if sys_config is not None:
            sys_config.persist()
    finally:
        store.shutdown()


async def _persist_config_periodically(sys_config: SysConfig, interval_ms: int) -> None:
    while True:
        await trio.sleep(interval_ms / 1000)
        await trio.to_thread.run_sync(sys_config.persist)


async def run_node_until_signalled(config: NodeConfig, on_ready=None) -> None:
    """Run a node in the foreground until SIGTERM or SIGINT, then shut it down cleanly."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            node = await nursery.start(serve_node, config)
            if on_ready is not None:
                on_ready(node)
            async for signum in signals:
                log.warning("node %s: %s received, shutting down", config.node_id, signal.Signals(signum).name)
                nursery.cancel_scope.cancel()
                break
