"""Helpers shared by the node tests: small store settings, a node configuration on
loopback ports, a wait without sleeps, and the node's parts served on in-memory streams. A module of its own (not conftest.py), so that importing it by name does
not collide with another folder's conftest when several test folders run together."""

from __future__ import annotations

import trio
import trio.testing

from node.client import connect_stream
from node.server.config import NodeConfig
from node.server.connections import ClientServer
from node.server.handlers import RequestHandlers
from node.server.metrics import NodeMetrics
from node.server.node import serve_node
from node.server.role import Role, RoleMachine
from node.server.sys_config import SysConfig
from store import MessageStore

SMALL_STORE = {"commitlog_segment_bytes": 1 << 24, "index_hash_slots": 1024, "index_max_entries": 8192,
               "consume_queue_entries_per_file": 4096, "preallocate_next_segment": False}


def small_config(path, **changes) -> NodeConfig:
    """A node configuration with a small store under ``path``, every address on port 0."""
    base = dict(store_path=str(path), client_address="127.0.0.1:0", metrics_address="127.0.0.1:0",
                ha_address="127.0.0.1:0",
                store=dict(SMALL_STORE))
    base.update(changes)
    return NodeConfig(**base)


async def wait_until(predicate, what: str, timeout_s: float = 20.0) -> None:
    """Until ``predicate()`` holds, checked each time every task of this trio run has been
    blocked for a millisecond: work done in this run (in-memory streams, loopback sockets
    served in this process, passes dispatched in the loop) is waited for without sleeping,
    and a thread of the store still gets its turn. Bounded by ``timeout_s``. A run
    kept busy by a load never goes quiet: it is looked at again every 10 ms then."""
    with trio.move_on_after(timeout_s):
        while not predicate():
            with trio.move_on_after(0.01):
                await trio.testing.wait_all_tasks_blocked(cushion=0.001)
        return
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


async def start_master_and_slave(nursery, tmp_path, **changes):
    """Node ``m`` (master) and node ``s`` (a static slave following it) served in ``nursery``,
    stores under ``tmp_path``; ``changes`` go to both configs."""
    master = await nursery.start(serve_node, small_config(tmp_path / "m", node_id="m", **changes))
    slave = await nursery.start(serve_node, small_config(
        tmp_path / "s", node_id="s", role="slave", master_ha_address=master.ha_address,
        master_client_address=master.client_address, **changes))
    return master, slave


class MemoryNode:
    """The node's parts over a real store, served on in-memory streams."""

    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.store = MessageStore(config.store_config())
        self.store.start()
        self.sys_config = SysConfig(self.store)
        self.sys_config.replay()
        self.role = RoleMachine(Role.MASTER, 0, "127.0.0.1:10911")
        self.metrics = NodeMetrics(config.node_id)
        self.handlers = RequestHandlers(config, self.store, self.role, self.sys_config, self.metrics)
        self.server = ClientServer(config, self.handlers, self.metrics)

    def wire_dispatcher(self) -> None:
        token = trio.lowlevel.current_trio_token()

        def on_dispatch(_offset, grown):
            try:
                token.run_sync_soon(self.handlers.waiters.notify, grown)
            except trio.RunFinishedError:
                pass
        self.store.add_dispatch_listener(on_dispatch)

    async def connect(self, nursery: trio.Nursery, secret: str | None = None):
        client_end, server_end = trio.testing.memory_stream_pair()
        nursery.start_soon(self.server.handle_connection, server_end)
        return await connect_stream(client_end, "memory", nursery, secret=secret)

    def raw(self, nursery: trio.Nursery):
        """A raw client stream end whose server end is being served."""
        client_end, server_end = trio.testing.memory_stream_pair()
        nursery.start_soon(self.server.handle_connection, server_end)
        return client_end
