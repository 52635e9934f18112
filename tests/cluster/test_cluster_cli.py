"""`hastore cluster` end to end through the real command line: no config at all, real
node processes on loopback, checked with the client library rather than the supervisor."""

from __future__ import annotations

import json
import os

import pytest

from node.cluster.cli import LocalCluster
from node.cluster.processes import thread_states

from cluster_helpers import hastore, node_status, process_alive

pytestmark = pytest.mark.integration   # local clusters of node processes, and the hastore command in a process


def test_up_status_down_with_static_roles(cluster_dir, tmp_path):
    config = tmp_path / "cluster.yaml"
    config.write_text("controller: {mode: static}\n")
    up = hastore("cluster", "up", "--dir", cluster_dir, "--config", str(config), "--json")
    assert up.returncode == 0, up.stderr
    started = json.loads(up.stdout)["processes"]
    assert [(p["name"], p["role"]) for p in started] == [("g1-n1", "master"), ("g1-n2", "slave"), ("g1-n3", "slave")]

    # The nodes serve with the roles the topology gave them, and the slaves name their master.
    statuses = [node_status(p["client_address"]) for p in started]
    assert [(s["node_id"], s["group"], s["role"]) for s in statuses] == [
        ("g1-n1", "g1", "master"), ("g1-n2", "g1", "slave"), ("g1-n3", "g1", "slave")]
    master_address = started[0]["client_address"]
    assert statuses[0]["master_address"] == master_address
    assert all(s["master_address"] == master_address for s in statuses[1:])
    # Slave configs point at the master's HA and client addresses; ports are written, never 0.
    with open(os.path.join(cluster_dir, "g1-n2", "node.yaml"), encoding="utf-8") as handle:
        slave_yaml = handle.read()
    assert f"master_ha_address: {started[0]['ha_address']}" in slave_yaml
    assert f"master_client_address: {master_address}" in slave_yaml
    assert ":0\n" not in slave_yaml
    assert "replication: sync" in slave_yaml

    status = hastore("cluster", "status", "--dir", cluster_dir, "--json")
    assert status.returncode == 0, status.stderr
    nodes = json.loads(status.stdout)["groups"]["g1"]
    assert [(n["name"], n["state"], n["status"]["role"]) for n in nodes] == [
        ("g1-n1", "up", "master"), ("g1-n2", "up", "slave"), ("g1-n3", "up", "slave")]
    assert all(isinstance(n["status"]["store"]["max_physical_offset"], int) for n in nodes)

    table = hastore("cluster", "status", "--dir", cluster_dir)
    assert table.returncode == 0, table.stderr
    assert "group g1" in table.stdout and table.stdout.count(" up ") == 3

    # A second `up` in the same directory is refused while the cluster runs.
    again = hastore("cluster", "up", "--dir", cluster_dir)
    assert again.returncode != 0
    assert "already running" in again.stderr and "cluster down" in again.stderr

    # STOP returns once every thread of the node has stopped, CONT once none is stopped
    stop = hastore("cluster", "kill", "g1-n3", "--signal", "STOP", "--dir", cluster_dir)
    assert stop.returncode == 0 and stop.stdout.strip().endswith("; it has stopped"), stop.stderr
    assert set(thread_states(nodes[2]["pid"])) == {"T"}
    resume = hastore("cluster", "kill", "g1-n3", "--signal", "CONT", "--dir", cluster_dir)
    assert resume.returncode == 0 and resume.stdout.strip().endswith("; it goes on"), resume.stderr
    assert "T" not in thread_states(nodes[2]["pid"])

    pids = [n["pid"] for n in nodes]
    down = hastore("cluster", "down", "--dir", cluster_dir, "--json")
    assert down.returncode == 0, down.stderr
    reports = json.loads(down.stdout)
    assert sorted(r["name"] for r in reports) == ["g1-n1", "g1-n2", "g1-n3"]
    assert all(r["outcome"] == "clean" and not r["abort_file"] for r in reports), reports
    assert not any(process_alive(pid) for pid in pids)
    for name in ("g1-n1", "g1-n2", "g1-n3"):
        assert not os.path.exists(os.path.join(cluster_dir, name, "store", "abort"))
        assert os.path.getsize(os.path.join(cluster_dir, name, "node.log")) > 0

    # down is idempotent; status after down shows every node down, not a crash.
    second = hastore("cluster", "down", "--dir", cluster_dir)
    assert second.returncode == 0, second.stderr
    assert "no process was running" in second.stdout
    after = json.loads(hastore("cluster", "status", "--dir", cluster_dir, "--json").stdout)
    assert [n["state"] for n in after["groups"]["g1"]] == ["down", "down", "down"]
    assert LocalCluster(cluster_dir).running() == []


def test_bad_config_key_is_refused_with_the_key_named(cluster_dir, tmp_path):
    config = tmp_path / "cluster.yaml"
    config.write_text("groups:\n  g1:\n    nodes: 3\n    replicaton: async\n")
    result = hastore("cluster", "up", "--dir", cluster_dir, "--config", str(config))
    assert result.returncode != 0
    assert "groups.g1.replicaton: unknown key" in result.stderr
    assert not os.path.exists(os.path.join(cluster_dir, "cluster.json"))

    config.write_text("nodes:\n  g1-n2:\n    store: {segment_size: 1}\n")
    result = hastore("cluster", "up", "--dir", cluster_dir, "--config", str(config))
    assert result.returncode != 0
    assert "g1-n2" in result.stderr and "store.segment_size: unknown key" in result.stderr


def test_commands_on_a_directory_without_a_cluster(cluster_dir):
    down = hastore("cluster", "down", "--dir", cluster_dir)
    assert down.returncode == 0 and "nothing to stop" in down.stdout
    status = hastore("cluster", "status", "--dir", cluster_dir)
    assert status.returncode != 0 and "no cluster in" in status.stderr
    kill = hastore("cluster", "kill", "g1-n1", "--dir", cluster_dir)
    assert kill.returncode != 0 and "g1-n1" in kill.stderr


def test_help_texts_explain_every_command():
    for command in ("up", "down", "status", "kill", "restart", "logs"):
        result = hastore("cluster", command, "--help")
        assert result.returncode == 0, result.stderr
        assert "--dir" in result.stdout
    assert "cluster.yaml" in hastore("cluster", "up", "--help").stdout
