"""Fixtures for the node tests: small stores, a node served over real sockets, and the
node's parts served over trio in-memory streams."""

from __future__ import annotations

import pytest
import trio

from node.server.config import NodeConfig
from node.server.node import serve_node

from node_helpers import SMALL_STORE, MemoryNode, small_config


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
