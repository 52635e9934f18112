"""`hastore demo`: two groups of three nodes, one topic spread over both, g1 failing over
alone; exit status 0 only when every step worked."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration   # the whole demo: ZooKeeper, controllers, six node processes


def test_the_demo_spreads_one_topic_over_two_groups_and_fails_over_g1_alone(tmp_path):
    done = subprocess.run([sys.executable, "-m", "node.cli", "demo", "--messages", "100", "--dir", str(tmp_path / "d")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "two groups of three nodes" in out and "master of g1:" in out and "master of g2:" in out
    assert "g1 queues [0, 1, 2, 3], g2 queues [0, 1, 2, 3]" in out
    assert "consumed all 100 back from both groups" in out
    assert "g2 was left alone" in out and "takes sends on both groups again" in out
    assert "done: every step worked." in out
