"""Bits flipped in a running 3-node group (LocalCluster, real processes), with static roles
and under a ZooKeeper controller (a real ZooKeeper and two controllers elect the master): one
random bit of a random flushed record of a random node, FLIPS times, under a light produce
load. Every flip is repaired from a replica or reported by offset, no acked message is
lost, none is served corrupt, and `hastore cluster verify` finds the same log on every node.
(`hastore bench flips --flips 1000` is the soak version, with the time to repair.)"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import trio

from node.bench.flips import flips_topology, run_flips
from node.cluster import LocalCluster

pytestmark = pytest.mark.integration
FLIPS = 100


@pytest.fixture(params=["static", "controller"])
def group(request, tmp_path):
    cluster = LocalCluster(str(tmp_path / "cluster"), flips_topology(request.param))
    cluster.up()
    try:
        yield cluster
    finally:
        cluster.down()


def test_flipped_bits_in_a_running_group_are_repaired_and_nothing_acked_is_lost(group):
    report = trio.run(lambda: run_flips(group, FLIPS, seed=16, messages=1000))
    summary = report.summary()
    print(json.dumps({"mode": "controller" if group.topology.controller.enabled else "static", **summary}))
    assert report.flips == FLIPS and not report.unresolved, summary
    assert report.repaired + report.reported_lost == FLIPS
    assert report.repaired == FLIPS, summary     # two intact replicas of every record: none is lost
    assert report.acked >= 1000 and report.acked_lost == 0 and report.corrupt_served == 0, summary
    assert report.divergences == 0 and not report.verify_errors, summary
    verify = subprocess.run([sys.executable, "-m", "node.cli", "cluster", "verify", "--dir", group.directory,
                             "--json"], capture_output=True, text=True, timeout=60)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert json.loads(verify.stdout)["ok"]
    for spec in group.nodes("g1"):
        assert "Traceback" not in group.log_tail(spec.name, lines=400)
