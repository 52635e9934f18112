"""Fixtures of the routing tests: one real ZooKeeper for the session (integration tests only)
and a fresh cluster name per test, so that every test works under its own /hastore/{cluster}."""

from __future__ import annotations

import uuid

import pytest


@pytest.fixture(scope="session")
def zk_server(tmp_path_factory):
    from controller import ZooKeeperServer
    server = ZooKeeperServer(tmp_path_factory.mktemp("zookeeper"), tick_ms=250, die_with_parent=True)
    with server:
        yield server


@pytest.fixture
def cluster_name() -> str:
    return f"route-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def zk(zk_server):
    """A started kazoo client on the session's ZooKeeper."""
    from controller.znodes import make_client, start_client
    client = make_client(zk_server.hosts)
    start_client(client, 10, "routing tests")
    yield client
    client.stop()
    client.close()
