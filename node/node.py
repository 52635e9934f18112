"""The node: one store, its role, the client server and the metrics endpoint, in one trio run.

    async with trio.open_nursery() as nursery:
        node = await nursery.start(serve_node, config)   # a Node, once it is serving
        ...
        nursery.cancel_scope.cancel()                   # clean shutdown (abort file removed)

Start order: bind the listeners (so port 0 resolves and the store host is the real client
address), start the store (recovery) in a worker thread, replay %SYS%CONFIG records past
the checkpointed config files, then serve. Cancellation persists the config files and
shuts the store down cleanly, shielded, so a SIGTERM never leaves an abort file behind.
"""

from __future__ import annotations

import logging
import signal
from dataclasses import dataclass

import trio

from store import MessageStore

from .config import NodeConfig, split_address
from .handlers import RequestHandlers
from .metrics import NodeMetrics, open_listeners, serve_metrics
from .role import Role, RoleMachine
from .server import ClientServer, serve_clients
from .sys_config import SysConfig

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

    def change_role(self, role: Role, epoch: int, master_client_address: str | None = None):
        """The one entry point replication and the controller agent use to move this node between roles."""
        return self.role.change(role, epoch, master_client_address)


def _bound_address(listeners: list) -> str:
    host, port = listeners[0].socket.getsockname()[:2]
    return f"{host}:{port}"


async def serve_node(config: NodeConfig, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Run a node until cancelled; ``task_status.started(node)`` once it serves clients."""
    client_listeners = await open_listeners(config.client_address)
    metrics_listeners = await open_listeners(config.metrics_address)
    client_address = _bound_address(client_listeners)
    metrics_address = _bound_address(metrics_listeners)
    store = MessageStore(config.store_config(store_host=client_address))
    await trio.to_thread.run_sync(store.start)
    token = trio.lowlevel.current_trio_token()
    listener = None
    sys_config: SysConfig | None = None
    try:
        sys_config = SysConfig(store)
        replayed = await trio.to_thread.run_sync(sys_config.replay)
        log.info("node %s: replayed %d %%SYS%%CONFIG records", config.node_id, replayed)
        role = RoleMachine(Role(config.role), 0,
                           client_address if config.role == "master" else config.master_client_address)
        metrics = NodeMetrics(config.node_id)
        metrics.watch_store(store)
        server_box: list[ClientServer] = []
        handlers = RequestHandlers(config, store, role, sys_config, metrics,
                                   status_extra=lambda: {"connections": server_box[0].connections,
                                                         "client_address": client_address,
                                                         "ha_address": config.ha_address,
                                                         "metrics_address": metrics_address})
        server = ClientServer(config, handlers, metrics)
        server_box.append(server)

        def on_dispatch(dispatched_offset: int, grown_queues: set) -> None:
            # dispatcher thread: hand over without blocking it (shutdown joins this thread)
            if grown_queues:
                try:
                    token.run_sync_soon(handlers.waiters.notify, grown_queues)
                except trio.RunFinishedError:
                    pass

        listener = on_dispatch
        store.add_dispatch_listener(on_dispatch)
        node = Node(config, client_address, metrics_address, store, role, sys_config, handlers, server, metrics)
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_clients, server, client_listeners)
            await nursery.start(serve_metrics, metrics_listeners, metrics)
            nursery.start_soon(_persist_config_periodically, sys_config, config.config_persist_interval_ms)
            task_status.started(node)
    finally:
        with trio.CancelScope(shield=True):
            if listener is not None:
                store.dispatcher.remove_listener(listener)
            await trio.to_thread.run_sync(_shutdown, store, sys_config)


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
