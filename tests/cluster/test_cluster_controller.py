"""`hastore cluster` in controller mode (the default): with no config at all, `up` starts a
ZooKeeper, two controllers and three nodes, a master is elected, `status` shows it, and
`down` stops nodes, then controllers, then ZooKeeper."""

from __future__ import annotations

import json
import os
import time

import pytest

from node.cluster.cli import LocalCluster

from cluster_helpers import hastore, node_status, process_alive

pytestmark = pytest.mark.integration   # a local cluster with ZooKeeper, controllers and node processes


def test_up_with_no_config_runs_zookeeper_two_controllers_and_three_nodes(cluster_dir):
    up = hastore("cluster", "up", "--dir", cluster_dir, "--json", timeout_s=120)
    assert up.returncode == 0, up.stderr
    started = json.loads(up.stdout)
    assert started["mode"] == "controller"
    processes = started["processes"]
    assert [(p["name"], p["kind"]) for p in processes] == [
        ("zookeeper", "zookeeper"), ("controller-1", "controller"), ("controller-2", "controller"),
        ("g1-n1", "node"), ("g1-n2", "node"), ("g1-n3", "node")]
    assert all(process_alive(p["pid"]) for p in processes)
    zk_hosts = started["zk_hosts"]
    assert zk_hosts == processes[0]["client_address"] and zk_hosts.startswith("127.0.0.1:")
    assert os.path.exists(os.path.join(cluster_dir, "zookeeper", "data"))
    with open(os.path.join(cluster_dir, "g1-n2", "node.yaml"), encoding="utf-8") as handle:
        node_yaml = handle.read()
    assert f"zk_hosts: {zk_hosts}" in node_yaml and "priority: 1" in node_yaml
    assert "zk_session_timeout_ms: 2000" in node_yaml and "master_ha_address" not in node_yaml

    # One master, elected by the controller and agreed on by ZooKeeper and the nodes.
    cluster = LocalCluster(cluster_dir)
    master = cluster.current_master("g1")
    assert started["masters"] == {"g1": master.node_id} and master.epoch >= 1
    roles = {p["name"]: node_status(p["client_address"])["role"] for p in processes if p["kind"] == "node"}
    assert roles[master.node_id] == "master"
    assert sorted(roles.values()) == ["master", "slave", "slave"]

    status = hastore("cluster", "status", "--dir", cluster_dir, "--json")
    assert status.returncode == 0, status.stderr
    report = json.loads(status.stdout)
    group = report["controller"]["groups"]["g1"]
    assert group["has_master"] and group["master"]["node_id"] == master.node_id
    assert master.node_id in group["sync_state_set"]
    assert [n["state"] for n in report["groups"]["g1"]] == ["up", "up", "up"]
    assert [n["state"] for n in report["groups"]["controller"]] == ["up", "up"]
    assert report["groups"]["zookeeper"][0]["status"]["mode"] == "standalone"
    table = hastore("cluster", "status", "--dir", cluster_dir)
    assert table.returncode == 0, table.stderr
    assert f"master {master.node_id} (epoch {master.epoch}" in table.stdout
    assert "sync-state set: [" in table.stdout and "control plane" in table.stdout
    assert any(line.split()[:8] == ["node", "state", "role", "epoch", "client", "address", "max", "offset"]
               and line.split()[8] == "lag" for line in table.stdout.splitlines() if line.strip())

    # commands find the master through ZooKeeper with --zk
    via_zk = hastore("status", "--zk", zk_hosts, "--json")
    assert via_zk.returncode == 0, via_zk.stderr
    assert json.loads(via_zk.stdout)["node_id"] == master.node_id
    missing = hastore("status", "--zk", zk_hosts, "--zk-group", "nope")
    assert missing.returncode != 0 and "no master of group nope" in missing.stderr

    down = hastore("cluster", "down", "--dir", cluster_dir, "--json", timeout_s=120)
    assert down.returncode == 0, down.stderr
    reports = json.loads(down.stdout)
    # reverse start order: the nodes leave while ZooKeeper still runs, ZooKeeper goes last
    assert [r["name"] for r in reports][-1] == "zookeeper"
    assert {r["name"] for r in reports[:3]} == {"g1-n1", "g1-n2", "g1-n3"}
    assert all(r["outcome"] == "clean" for r in reports), reports
    assert not any(process_alive(p["pid"]) for p in processes)
    assert LocalCluster(cluster_dir).running() == []


def test_a_killed_master_is_replaced_and_comes_back_as_a_slave(cluster_dir):
    cluster = LocalCluster(cluster_dir)
    with cluster:
        cluster.up()
        old = cluster.current_master("g1")
        # only a member of the sync-state set may be elected: kill the master once a slave
        # has caught up and joined it (before that, no master is the right outcome)
        _wait_for_sync_state_set(cluster.node(old.node_id).client_address, 2)
        with cluster.records() as records:     # what drills read: master record, sync-state set, waits
            successors = _wait_for_successors(records, old.node_id)
            assert set(successors) <= {spec.name for spec in cluster.nodes("g1")} - {old.node_id}
            assert records.group("g1").master == old
            cluster.kill(old.node_id)
            moved = records.wait_for_new_master("g1", old, timeout_s=15, interval_s=0.01)
            # any member of the sync-state set at the kill may win; it may have grown since
            # ``successors`` was read, so only a live g1 node other than the old master is asked
            assert moved.node_id in {spec.name for spec in cluster.nodes("g1")} - {old.node_id}
            assert moved.epoch > old.epoch
        new = cluster.wait_for_master("g1", timeout_s=15, not_node=old.node_id)
        assert new.node_id != old.node_id and new.epoch > old.epoch
        assert cluster.master("g1").name == new.node_id
        cluster.start(old.node_id)
        assert node_status(cluster.node(old.node_id).client_address)["role"] == "slave"
        assert cluster.current_master("g1").node_id == new.node_id
    assert cluster.running() == []


def _wait_for_sync_state_set(master_address: str, members: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        replication = node_status(master_address).get("replication") or {}
        if len(replication.get("sync_state_set") or []) >= members:
            return
        time.sleep(0.05)
    raise AssertionError(f"the sync-state set of {master_address} did not reach {members} members in {timeout_s} s")


def _wait_for_successors(records, master_id: str, timeout_s: float = 30.0) -> tuple[str, ...]:
    """The live sync-state set members besides ``master_id`` once ZooKeeper records one."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        successors = records.group("g1").successors(master_id)
        if successors:
            return successors
        time.sleep(0.05)
    raise AssertionError(f"ZooKeeper recorded no live sync-state set member besides {master_id} in {timeout_s} s")
