"""Fixtures for the drill tests: a real controller-mode cluster (ZooKeeper, two controllers,
three nodes on loopback) in a fresh directory, always stopped afterwards, with the log tails
of every process attached to a failing test's report."""

from __future__ import annotations

import pytest

from node.cluster.cli import LocalCluster, topology_from_mapping

from chaos_helpers import DRILL_TOPOLOGY


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    cluster = getattr(item, "funcargs", {}).get("controller_cluster")
    if report.failed and isinstance(cluster, LocalCluster):
        for spec in cluster.specs:
            report.sections.append((f"log of {spec.name}", cluster.log_tail(spec.name, 60)))


@pytest.fixture
def controller_cluster(tmp_path):
    """A running controller-mode cluster with a master elected."""
    cluster = LocalCluster(str(tmp_path / "cluster"), topology_from_mapping(DRILL_TOPOLOGY))
    try:
        cluster.up()
        yield cluster
    finally:
        cluster.down()
