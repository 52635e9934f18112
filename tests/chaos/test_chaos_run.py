"""``hastore chaos run`` end to end on a real controller-mode cluster (ZooKeeper, controllers,
three nodes): a short fixed seed of kill and pause faults under the concurrent workload."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from chaos.errors import RunError
from chaos.history import History
from chaos.run import RunSettings, run_chaos
from chaos.workload import LoadSettings
from node.cluster import LocalCluster

pytestmark = pytest.mark.integration   # real ZooKeeper, controller and node processes

SHORT = dict(hold_s=(1.0, 2.0), rest_s=(0.5, 1.0), time_limit_s=90.0,
             load=LoadSettings(producers=2, send_interval_ms=10.0))


def test_kill_faults_on_a_fixed_seed_lose_nothing_and_recover(controller_cluster):
    seen = []
    settings = RunSettings(nemesis="kill-master,kill-slave", cycles=3, seed=11, **SHORT)
    report = run_chaos(controller_cluster, settings, on_cycle=seen.append)
    assert [c.cycle for c in seen] == [1, 2, 3]
    assert [c.kind for c in report.cycles] == [p.kind for p in report.schedule]
    verdict = report.verdict
    # the message guarantees, and the replicas' bytes, hold under kill -9
    assert verdict.sends.valid, verdict.to_json()
    assert not verdict.dirty_reads and not verdict.order and not verdict.divergence, verdict.to_json()
    assert report.caught_up and all(c.recovered for c in report.cycles), report.to_json()
    assert verdict.sends.acked > 100 and sum(c.acked for c in report.cycles) == verdict.sends.acked
    session_ms = controller_cluster.topology.controller.session_timeout_ms
    for cycle in report.cycles:
        assert cycle.unavailable_ms is not None and cycle.unavailable_ms < session_ms + 20_000
    # the history file holds every op, nemesis ops included, and reads back
    with open(report.history_path, encoding="utf-8") as handle:
        history = History.from_json_lines(handle)
    assert len(history.ops) >= verdict.sends.invoked * 2
    assert sum(op.f == "nemesis" for op in history.ops) == 6
    assert {op.f for op in history.ops} >= {"send", "read", "commit"}


def test_the_command_prints_json_and_its_exit_status_follows_the_verdict(controller_cluster):
    command = [sys.executable, "-m", "node.cli", "chaos", "run", "--dir", controller_cluster.directory,
               "--nemesis", "pause-slave", "--cycles", "1", "--seed", "2", "--time-limit", "60", "--json"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=170)
    report = json.loads(result.stdout)
    summary = report["summary"]
    assert result.returncode == (0 if summary["ok"] else 1), result.stderr
    assert summary["cycles_run"] == 1 and report["cycles"][0]["kind"] == "pause-slave"
    assert summary["lost"] == 0 and summary["dirty_reads"] == 0 and summary["divergence"] == 0
    assert summary["history"].endswith(".jsonl")


def test_proxied_faults_are_refused_without_proxies(tmp_path):
    with pytest.raises(RunError, match="--proxied"):
        run_chaos(LocalCluster(str(tmp_path)), RunSettings(nemesis="kill,partition"))
    result = subprocess.run([sys.executable, "-m", "node.cli", "chaos", "run", "--dir", str(tmp_path / "none")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "no cluster is running" in result.stderr


def test_a_run_ending_on_a_long_zookeeper_pause_reads_the_master_once_it_is_confirmed(controller_cluster):
    """A ZooKeeper pause longer than a few ticks suspends every node's session: the master is
    fenced, and refuses reads, until its role is confirmed again. A run whose last fault is
    such a pause still reads the topic back (the final read waits out the refusal) instead
    of failing with SERVICE_NOT_AVAILABLE."""
    settings = RunSettings(nemesis="pause-zookeeper", cycles=1, seed=3,
                           **{**SHORT, "hold_s": (3.9, 4.0), "rest_s": (0.5, 0.6)})
    report = run_chaos(controller_cluster, settings)
    assert [c.kind for c in report.cycles] == ["pause-zookeeper"]
    verdict = report.verdict
    assert verdict.sends.valid and not verdict.dirty_reads and not verdict.divergence, verdict.to_json()
    assert report.caught_up and verdict.sends.acked > 0, report.to_json()
