"""Bits flipped in a running 3-node group (LocalCluster, static roles, real processes): one
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

from node.bench.flips import BENCH_STORE, SECRET, run_flips
from node.cluster import LocalCluster, topology_from_mapping

pytestmark = pytest.mark.integration
FLIPS = 20


@pytest.fixture
def group(tmp_path):
    topology = topology_from_mapping({"store": dict(BENCH_STORE), "secret": SECRET, "startup_timeout_s": 30,
                                      "controller": {"mode": "static"}})
    cluster = LocalCluster(str(tmp_path / "cluster"), topology)
    cluster.up()
    try:
        yield cluster
    finally:
        cluster.down()


def test_flipped_bits_in_a_running_group_are_repaired_and_nothing_acked_is_lost(group):
    report = trio.run(lambda: run_flips(group, FLIPS, seed=16, messages=1000))
    summary = report.summary()
    print(json.dumps(summary))
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
