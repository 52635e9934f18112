"""Fixtures for the node tests: small stores, a node served over real sockets, and the
node's parts served over trio in-memory streams."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from node.client import connect_stream
from node.server.config import NodeConfig
from node.server.handlers import RequestHandlers
from node.server.metrics import NodeMetrics
from node.server.node import serve_node
from node.server.role import Role, RoleMachine
from node.server.connections import ClientServer
from node.server.sys_config import SysConfig
from store import MessageStore

from node_helpers import SMALL_STORE, small_config


@pytest.fixture
def config(tmp_path) -> NodeConfig:
    return small_config(tmp_path / "store")


@pytest.fixture
async def node(config):
    """A node served on loopback (port 0)."""
    async with trio.open_nursery() as nursery:
        running = await nursery.start(serve_node, config)
        yield running
        nursery.cancel_scope.cancel()


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


@pytest.fixture
def memory_node(config):
    parts = MemoryNode(config)
    yield parts
    parts.store.shutdown()


@pytest.fixture
def node_process(tmp_path):
    """``node_process(name, **settings)`` starts a real ``hastore node start`` process on
    loopback with a small store; every one started is stopped at teardown (SIGTERM, then
    SIGKILL), and a failing test shows its log."""
    from node.cluster.process import NodeProcess
    started = []

    def start(name: str = "n1", **settings):
        config = {"node_id": name, "store": dict(SMALL_STORE), **settings}
        process = NodeProcess.start(str(tmp_path / name), config)
        started.append(process)
        return process
    yield start
    for process in started:
        process.stop(timeout_s=20)
