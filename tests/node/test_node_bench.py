"""``hastore bench produce`` end to end at a small size: it starts its node and echo server,
measures every figure, stops both cleanly and prints one JSON object. The figures' values
depend on the machine; only their presence and sanity are checked here."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration   # runs hastore bench produce in a process


def test_bench_produce_runs_every_phase_and_prints_its_figures():
    done = subprocess.run([sys.executable, "-m", "node.cli", "bench", "produce", "--json", "--runs", "2",
                           "--messages", "1000", "--samples", "200"],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)
    for name in ("echo_floor_p50_us", "send_single_p50_us", "send_single_p50_ratio_to_floor",
                 "batch_1_in_flight_1_msgs_per_s", "batch_1_in_flight_16_msgs_per_s",
                 "batch_64_in_flight_1_msgs_per_s", "batch_64_in_flight_8_msgs_per_s"):
        assert figures[name] > 0, name
        assert len(figures[f"{name}_runs"]) == 2, name
    assert figures["frame_bytes"]["request"] > 1024 and figures["frame_bytes"]["reply"] > 0
    for send, floor, ratio in zip(figures["send_single_p50_us_runs"], figures["echo_floor_p50_us_runs"],
                                  figures["send_single_p50_ratio_to_floor_runs"]):
        assert abs(send / floor - ratio) < 0.02
    assert set(figures["meets_targets"]) == {"batched_msgs_per_s", "single_p50_ratio_to_floor"}
    assert figures["busy_poll_us"] == 200   # the node's default, as no --busy-poll-us was given
