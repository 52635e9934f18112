"""Fixtures for the local cluster tests: real node processes on loopback, small stores,
a fresh directory per test, and every process of it stopped afterwards, pass or fail."""

from __future__ import annotations

import os

import pytest

from node.cluster.cli import LocalCluster

from cluster_helpers import small_topology


@pytest.fixture
def cluster_dir(tmp_path):
    """A cluster directory; whatever runs in it at the end of the test is stopped."""
    directory = tmp_path / "cluster"
    yield str(directory)
    if os.path.exists(directory / "cluster.json"):
        LocalCluster(str(directory)).down()


@pytest.fixture
def cluster(cluster_dir):
    """A running small-store cluster (g1-n1 master, g1-n2 and g1-n3 slaves) driven from Python."""
    running = LocalCluster(cluster_dir, small_topology())
    try:
        running.up()
        yield running
    finally:
        running.down()
