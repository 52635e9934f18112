"""LocalCluster's process control, the API failover drills and chaos tests use: kill -9,
SIGSTOP/SIGCONT, restart, down after crashes, a node that fails to start."""

from __future__ import annotations

import os
import signal

import pytest
import trio

from node.client import open_admin
from node.cluster.cli import ClusterError, ClusterStartError, LocalCluster

from cluster_helpers import hastore, node_status, process_alive, small_topology

pytestmark = pytest.mark.integration   # local clusters of node processes


def _states(cluster: LocalCluster) -> dict[str, str]:
    return {item.spec.name: item.state for item in cluster.status(timeout_s=1.0)}


def test_a_killed_node_shows_as_down_and_restarts_on_its_own_ports(cluster):
    slave = cluster.node("g1-n3")
    pid = cluster.pid("g1-n3")
    assert cluster.kill("g1-n3", signal.SIGKILL) == pid
    assert not process_alive(pid)
    assert _states(cluster) == {"g1-n1": "up", "g1-n2": "up", "g1-n3": "down"}
    assert os.path.exists(os.path.join(slave.data_path, "abort"))  # a crash, not a clean stop
    table = hastore("cluster", "status", "--dir", cluster.directory)
    assert table.returncode == 0, table.stderr
    node_rows = [line.split() for line in table.stdout.splitlines() if line.startswith("  g1-n")]
    assert [(row[0], row[1]) for row in node_rows] == [("g1-n1", "up"), ("g1-n2", "up"), ("g1-n3", "down")]
    with pytest.raises(ClusterError, match="not running"):
        cluster.kill("g1-n3")

    report, spec = cluster.restart("g1-n3")
    assert report.outcome == "not running" and report.abort_file
    assert spec.client_address == slave.client_address
    new_pid = cluster.pid("g1-n3")
    assert new_pid is not None and new_pid != pid
    status = node_status(slave.client_address)
    assert status["node_id"] == "g1-n3" and status["role"] == "slave"
    assert status["recovery"] is not None  # it recovered from the crash's abort file
    assert _states(cluster) == {"g1-n1": "up", "g1-n2": "up", "g1-n3": "up"}


def test_restart_of_a_running_master_keeps_its_data(cluster):
    master = cluster.master("g1")

    async def create_topic() -> None:
        with trio.fail_after(10):
            async with open_admin(master.client_address) as admin:
                await admin.create_topic("orders", 2)
    trio.run(create_topic)
    before = node_status(master.client_address)["store"]["max_physical_offset"]
    assert before > 0  # the topic change is logged in the CommitLog

    old_pid = cluster.pid("g1-n1")
    report, _ = cluster.restart("g1-n1")
    assert report.outcome == "clean" and not report.abort_file and report.pid == old_pid
    after = node_status(master.client_address)
    assert after["role"] == "master" and after["store"]["max_physical_offset"] == before
    assert not process_alive(old_pid)


def test_down_after_some_nodes_crashed_reports_each_and_is_idempotent(cluster):
    pids = {name: cluster.pid(name) for name in ("g1-n1", "g1-n2", "g1-n3")}
    cluster.kill("g1-n1")          # the master crashes
    cluster.pause("g1-n2")         # a slave hangs: holds its sockets, answers nothing
    states = _states(cluster)
    assert states == {"g1-n1": "down", "g1-n2": "unresponsive", "g1-n3": "up"}

    reports = {report.name: report for report in cluster.down()}
    assert reports["g1-n1"].outcome == "not running" and reports["g1-n1"].abort_file
    assert reports["g1-n2"].outcome == "clean"     # SIGCONT before SIGTERM lets it stop cleanly
    assert reports["g1-n3"].outcome == "clean" and reports["g1-n3"].exit_status == 0
    assert not any(process_alive(pid) for pid in pids.values())
    assert cluster.running() == []
    assert all(report.outcome == "not running" for report in cluster.down())


def test_up_is_refused_while_running_and_reuses_ports_after_down(cluster_dir):
    first = LocalCluster(cluster_dir, small_topology())
    try:
        addresses = {spec.name: spec.client_address for spec in first.up()}
        with pytest.raises(ClusterError, match="already running"):
            LocalCluster(cluster_dir, small_topology()).up()
        assert first.running() == ["g1-n1", "g1-n2", "g1-n3"]
        first.down()
        # Without a topology, a directory that ran a cluster runs the same one again.
        second = LocalCluster(cluster_dir)
        assert {spec.name: spec.client_address for spec in second.up()} == addresses
        assert second.topology.source["store"]["commitlog_segment_bytes"] == 1 << 20
    finally:
        first.down()


def test_a_node_that_cannot_start_tears_the_cluster_down_with_its_log(cluster_dir):
    os.makedirs(os.path.join(cluster_dir, "g1-n2"))
    with open(os.path.join(cluster_dir, "g1-n2", "store"), "w") as handle:
        handle.write("not a directory")   # the node's store cannot be created
    cluster = LocalCluster(cluster_dir, small_topology())
    with pytest.raises(ClusterStartError, match="g1-n2 exited") as caught:
        cluster.up()
    assert "store" in caught.value.log_tails["g1-n2"]
    assert cluster.running() == []
    # a node the failed start had not spawned yet is "never started"; none may be up
    assert all(item.state in ("down", "never started") for item in cluster.status())
