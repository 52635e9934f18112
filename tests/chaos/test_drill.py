"""The failover drill end to end: kill -9 the master of a real controller-mode cluster under
a sync-replicated send workload; nothing acked may be lost and the old master must rejoin."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import trio

from chaos import DrillSettings, run_failover_drill
from chaos.drill import read_topic_keys

pytestmark = pytest.mark.integration   # a controller-mode local cluster: ZooKeeper, controllers and node processes
REJOINED_INDEX_WAIT_S = 10.0   # bounded: a slave's queues catch up with its log within dispatch_delay_ms


def test_two_rounds_fail_over_without_losing_an_acked_message(controller_cluster):
    first_master = controller_cluster.current_master("g1")
    seen = []
    report = run_failover_drill(controller_cluster, 2, DrillSettings(), on_round=seen.append)
    assert [record.round for record in seen] == [1, 2]
    assert report.ok, report.to_json()
    one, two = report.rounds
    assert one.killed == first_master.node_id and one.new_master != one.killed
    assert two.killed == one.new_master and two.new_epoch > one.new_epoch > one.old_epoch
    session_ms = controller_cluster.topology.controller.session_timeout_ms
    for record in report.rounds:
        assert record.recovered and record.rejoined_as_slave and record.caught_up
        assert record.lost == 0 and record.duplicates == 0 and record.failed_present == 0
        assert record.acked >= DrillSettings().warmup_acks + DrillSettings().after_acks
        # a dead master cannot be noticed before its session expires, and not much after it
        # (detection is polled from ZooKeeper every 10 ms, so the first ack may be seen a
        # little before it)
        assert 0.5 * session_ms <= record.detection_ms <= record.failover_ms + 250
        assert record.failover_ms < session_ms + 10_000
    verdict = report.verdict
    assert verdict.valid and verdict.acked == sum(r.acked for r in report.rounds)
    assert report.summary()["failover_ms_p99"] == max(r.failover_ms for r in report.rounds)

    # Independently of the drill's own check: every acked key is readable from the current
    # master, and the rejoined node holds the same messages.
    master = controller_cluster.current_master("g1")
    topic = next(t for t in _topics(master.client_address) if t.startswith("drill-"))
    on_master = trio.run(read_topic_keys, master.client_address, topic, 4)
    rejoined = controller_cluster.node(two.killed).client_address
    # a slave indexes what it received up to dispatch_delay_ms (50) after it arrived: its
    # queues may still lack the last messages its log holds; ask again for a bounded while
    deadline = time.monotonic() + REJOINED_INDEX_WAIT_S
    on_rejoined = trio.run(read_topic_keys, rejoined, topic, 4)
    while sorted(on_rejoined) != sorted(on_master) and time.monotonic() < deadline:
        time.sleep(0.1)
        on_rejoined = trio.run(read_topic_keys, rejoined, topic, 4)
    assert sorted(on_master) == sorted(on_rejoined)
    assert len(on_master) >= verdict.acked


def test_the_command_refuses_a_directory_without_a_running_cluster(tmp_path):
    result = subprocess.run([sys.executable, "-m", "node.cli", "drill", "failover", "--dir", str(tmp_path / "none")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "no cluster is running" in result.stderr and "--up" in result.stderr


def test_the_command_prints_rounds_and_summary_as_json(controller_cluster):
    result = subprocess.run([sys.executable, "-m", "node.cli", "drill", "failover", "--dir",
                             controller_cluster.directory, "--rounds", "1", "--json"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr + result.stdout
    report = json.loads(result.stdout)
    assert report["summary"]["rounds"] == 1 and report["summary"]["lost"] == 0 and report["summary"]["ok"]
    assert report["rounds"][0]["recovered"] and report["verdict"]["valid"]


def _topics(address: str) -> list[str]:
    from node.client import open_admin

    async def ask():
        async with open_admin(address) as admin:
            return list(await admin.list_topics())
    return trio.run(ask)
