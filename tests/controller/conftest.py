"""Fixtures for the controller tests: one real ZooKeeper for the session, a fresh cluster name
per test (every test works under its own ``/hastore/{cluster}``), and the server's log
attached to the report of a test that fails."""

from __future__ import annotations

import uuid

import pytest
from kazoo.client import KazooClient

from controller import ZooKeeperServer
from controller_fakes import TICK_MS



@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        for value in getattr(item, "funcargs", {}).values():
            if isinstance(value, ZooKeeperServer):
                report.sections.append((f"ZooKeeper log ({value.base_dir})", value.log_tail(120)))


@pytest.fixture(scope="session")
def zk_server_session(tmp_path_factory):
    server = ZooKeeperServer(tmp_path_factory.mktemp("zookeeper"), tick_ms=TICK_MS, die_with_parent=True)
    with server:
        yield server


@pytest.fixture
def zk_server(zk_server_session):
    """The suite's ZooKeeper (a function-scoped name, so that a failing test shows its log)."""
    assert zk_server_session.running, "the session's ZooKeeper died:\n" + zk_server_session.log_tail()
    return zk_server_session


@pytest.fixture
def cluster() -> str:
    return f"test-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def zk(zk_server):
    """A plain kazoo client, to look at what the components wrote."""
    client = KazooClient(hosts=zk_server.hosts, timeout=5.0)
    client.start(timeout=10)
    yield client
    client.stop()
    client.close()
