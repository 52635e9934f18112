"""``hastore bench replicate --peer redis`` at a tiny size: both sides start, every
workload runs, both sides hold what they acknowledged, the JSON has its shape; without
redis-server on the PATH it says how to install it and measures hastore alone. The
figures' values depend on the machine; only their presence and sanity are checked here.
The medians and ratios are checked on rounds made up here (no process)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from node.bench import cpu_meter, redis_peer, sync_compare

TINY = ["--rounds", "1", "--seconds", "0.5", "--samples", "30", "--json"]


def _bench(env=None, *extra: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "node.cli", "bench", "replicate", "--peer", "redis", *TINY, *extra],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout), done.stderr


def _check_floor(report: dict, sides: set[str]) -> None:
    """The relay floor was timed in every round, and each side's single p50 and CPU set over it."""
    for figures in report["rounds"]:
        floor = figures["floor"]["single"]
        assert floor["acked"] == 30 and 0 < floor["p50_us"] <= floor["p99_us"]
        assert set(floor["cpu_us_per_msg"]) == {"master", "slave0", "slave1", "client", "total"}
    assert set(report["floor_ratios"]) == {f"{side}_single_{figure}" for side in sides for figure in ("p50", "cpu")}
    assert report["floor_ratios"]["hastore_single_p50"] == round(
        report["medians"]["hastore"]["single"]["p50_us"] / report["medians"]["floor"]["single"]["p50_us"], 3)


def _check_side(figures: dict, processes: set[str]) -> None:
    batched = figures["batched"]
    assert batched["acked"] > 0 and batched["failed"] == 0
    assert batched["msgs_per_s"] > 0 and batched["msgs_per_cpu_s"] > 0
    assert set(batched["cpu_us_per_msg"]) == processes | {"client", "total"}
    assert batched["cpu_us_per_msg"]["total"] > 0
    for workload in ("single", "alone"):
        latency = figures[workload]
        assert latency["acked"] == 30 and latency["failed"] == 0
        assert 0 < latency["p50_us"] <= latency["p99_us"]


@pytest.mark.integration
@pytest.mark.skipif(redis_peer.peer_problem() is not None, reason=f"{redis_peer.peer_problem()}")
def test_comparison_runs_both_sides_and_both_hold_what_they_acked():
    report, _ = _bench(None, "--batch-costs", "8,32")
    assert report["peer_missing"] is None and report["redis_version"]
    # every process ran on the test's own interpreter, and the report names it
    assert report["python"]["version"] == platform.python_version()
    assert report["python"]["executable"] == os.path.realpath(sys._base_executable)
    (only,) = report["rounds"]
    _check_side(only["hastore"], {"master", "slave0", "slave1"})
    _check_side(only["redis"], {"primary", "replica0", "replica1"})
    for side in ("hastore", "redis"):
        for workload in ("batched", "single"):
            check = only["stored"][side][workload]
            assert check["ok"], (side, workload, check)
            assert min(check["held"].values()) >= check["acked"] > 0
    assert report["stored_ok"] is True
    assert set(report["ratios"]) == {"batched", "batched_per_cpu", "single_p50", "single_p99"}
    assert all(value > 0 for value in report["ratios"].values())
    medians = report["medians"]
    assert report["ratios"]["batched"] == round(
        medians["hastore"]["batched"]["msgs_per_s"] / medians["redis"]["batched"]["msgs_per_s"], 3)
    assert set(report["targets_met"]) == set(report["ratios"])
    _check_floor(report, {"hastore", "redis"})
    # --batch-costs: the batched workload again at each size, on both sides, every ack held
    costs = report["batch_costs"]
    assert costs["sizes"] == [8, 32]
    (costs_round,) = costs["rounds"]
    assert costs_round["stored_ok"] is True
    for side, processes in (("hastore", {"master", "slave0", "slave1"}), ("redis", {"primary", "replica0", "replica1"})):
        for size in ("8", "32"):
            run = costs_round[side][size]
            assert run["acked"] > 0 and run["failed"] == 0
            assert set(run["cpu_us_per_msg"]) == processes | {"client", "total"}
        assert set(costs["fit"][side]) == processes | {"client", "total"}
    assert set(costs["ratios"]) == {"per_message", "per_batch"}


@pytest.mark.integration
def test_without_redis_server_it_says_how_to_install_it_and_measures_hastore_alone(tmp_path):
    env = {**os.environ, "PATH": str(tmp_path)}  # no redis-server there
    report, stderr = _bench(env, "--client-busy-poll-us", "300")
    assert report["settings"]["client_busy_poll_us"] == 300   # the single sends' Producer polled
    assert "apt-get install redis-server" in stderr
    assert "apt-get install redis-server" in report["peer_missing"]
    assert report["ratios"] is None and report["targets_met"] is None
    (only,) = report["rounds"]
    assert only["redis"] is None
    _check_side(only["hastore"], {"master", "slave0", "slave1"})
    assert only["stored"]["hastore"]["batched"]["ok"] and report["stored_ok"]
    _check_floor(report, {"hastore"})


def _side(msgs_per_s: float, per_cpu: float, p50: float, p99: float) -> dict:
    cpu = {"cpu_us_per_msg": {"master": 1.0, "client": 1.0, "total": 2.0}}
    return {"batched": {"msgs_per_s": msgs_per_s, "msgs_per_cpu_s": per_cpu, **cpu},
            "single": {"p50_us": p50, "p99_us": p99, **cpu}, "alone": {"p50_us": p50 / 2, "p99_us": p99, **cpu}}


def test_ratios_are_of_the_medians_hastore_over_redis():
    rounds = [{"hastore": _side(30_000, 20_000, 300, 900), "redis": _side(20_000, 10_000, 250, 600)},
              {"hastore": _side(10_000, 5_000, 900, 3_000), "redis": _side(19_000, 11_000, 200, 500)},
              {"hastore": _side(28_000, 16_000, 400, 1_000), "redis": _side(21_000, 9_000, 300, 700)}]
    summary = sync_compare.summarize(rounds)
    assert summary["medians"]["hastore"]["batched"]["msgs_per_s"] == 28_000
    assert summary["medians"]["redis"]["single"]["p50_us"] == 250
    assert summary["ratios"] == {"batched": round(28_000 / 20_000, 3), "batched_per_cpu": 1.6,
                                 "single_p50": 1.6, "single_p99": round(1_000 / 600, 3)}
    assert sync_compare.targets_met(summary["ratios"]) == {"batched": False, "batched_per_cpu": True,
                                                           "single_p50": False, "single_p99": False}
    lines = sync_compare.table("medians", summary["medians"]["hastore"], summary["medians"]["redis"])
    assert any(line.split()[:2] == ["batched", "msgs/s"] and line.split()[-1] == "1.4" for line in lines)


def test_each_side_over_the_floor_is_the_ratio_of_the_medians():
    floor = [{"single": {"p50_us": p50, "p99_us": 2 * p50, "cpu_us_per_msg": {"master": 1.0, "total": cpu}}}
             for p50, cpu in ((200, 400), (100, 300), (250, 500))]
    rounds = [{"hastore": _side(1_000, 500, 600, 900), "redis": _side(1_000, 500, 300, 900), "floor": floor[0]},
              {"hastore": _side(1_000, 500, 500, 900), "redis": _side(1_000, 500, 200, 900), "floor": floor[1]},
              {"hastore": _side(1_000, 500, 700, 900), "redis": _side(1_000, 500, 250, 900), "floor": floor[2]}]
    summary = sync_compare.summarize(rounds)
    assert summary["medians"]["floor"]["single"]["p50_us"] == 200
    assert summary["medians"]["floor"]["single"]["cpu_us_per_msg"]["total"] == 400
    # _side charges 2 µs of CPU a send on each side
    assert summary["floor_ratios"] == {"hastore_single_p50": 3.0, "hastore_single_cpu": 0.005,
                                       "redis_single_p50": 1.25, "redis_single_cpu": 0.005}
    lines = sync_compare.table("medians", summary["medians"]["hastore"], summary["medians"]["redis"],
                               summary["medians"]["floor"])
    assert any(line.strip().startswith("relay floor (no store) single p50 200 µs") for line in lines)
    without = sync_compare.summarize([{"hastore": _side(1_000, 500, 300, 900), "redis": None, "floor": floor[0]}])
    assert without["floor_ratios"] == {"hastore_single_p50": 1.5, "hastore_single_cpu": 0.005}
    assert sync_compare.summarize([{"hastore": _side(1_000, 500, 300, 900), "redis": None}])["floor_ratios"] is None


def test_without_a_peer_there_are_no_ratios():
    summary = sync_compare.summarize([{"hastore": _side(1_000, 500, 300, 900), "redis": None}])
    assert summary["ratios"] is None and "redis" not in summary["medians"]
    assert sync_compare.targets_met(None) is None


def test_cpu_seconds_of_this_process_grow_with_work():
    meter = cpu_meter.CpuMeter({})
    meter.begin()
    total = 0
    for value in range(3_000_000):  # ~0.1 s of CPU: well over a clock tick
        total += value * value
    meter.end()
    assert total > 0
    assert meter.spent["client"] > 0
    assert meter.per_message_us(1)["total"] == round(meter.spent["client"] * 1e6, 1)


def test_the_report_says_when_the_single_sends_busy_polled():
    summary = sync_compare.summarize([{"hastore": _side(1_000, 500, 300, 900), "redis": None}])
    rounds = [{"round": 1, "first": "hastore", "hastore": _side(1_000, 500, 300, 900), "redis": None}]
    report = {"peer_missing": None, "rounds": rounds, **summary, "stored_ok": True,
              "settings": {"client_busy_poll_us": 0}}
    assert not any("busy-polls" in line for line in sync_compare.report_lines(report))
    report["settings"]["client_busy_poll_us"] = 250
    assert "hastore's single sends: the Producer busy-polls 250 µs for each reply" in sync_compare.report_lines(report)


def test_client_busy_polling_is_refused_without_the_comparison():
    from click.testing import CliRunner

    from node.bench.replicate import bench_replicate_command
    refused = CliRunner().invoke(bench_replicate_command, ["--client-busy-poll-us", "100"])
    assert refused.exit_code == 2 and "it needs --peer redis" in refused.output
    over = CliRunner().invoke(bench_replicate_command, ["--peer", "redis", "--client-busy-poll-us", "1001"])
    assert over.exit_code == 2 and "0<=x<=1000" in over.output
