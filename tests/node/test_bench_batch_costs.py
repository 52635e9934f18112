"""The batch-cost split of ``bench replicate --peer redis --batch-costs``: the sizes it
takes, the line it fits and the report, on figures made up here (no process; the
integration test in test_bench_sync_compare.py runs it for real)."""

from __future__ import annotations

import click
import pytest

from node.bench import batch_costs


def test_sizes_are_two_or_more_distinct_ones_in_range_sorted():
    assert batch_costs.parse_sizes("256,16,64,16") == (16, 64, 256)
    assert batch_costs.parse_sizes(" 1, 512 ") == (1, 512)
    for bad, says in (("64", "at least two"), ("64,64", "at least two"), ("a,b", "not a comma-separated"),
                      ("0,8", "1..512"), ("8,513", "1..512"), (",".join(map(str, range(1, 10))), "at most 8")):
        with pytest.raises(click.BadParameter, match=says):
            batch_costs.parse_sizes(bad)


def test_the_fit_recovers_per_message_and_per_batch_costs():
    # 20 µs a message and 640 µs a batch, exactly
    exact = batch_costs.fit({size: 20 + 640 / size for size in (16, 64, 256)})
    assert exact == {"per_message_us": 20.0, "per_batch_us": 640.0, "residual_us": 0.0}
    # off the line: the largest miss says so
    points = {16: 60.0, 64: 30.0, 256: 24.0}
    noisy = batch_costs.fit(points)
    misses = [abs(noisy["per_message_us"] + noisy["per_batch_us"] / size - us) for size, us in points.items()]
    assert noisy["residual_us"] == pytest.approx(max(misses), abs=0.05) and noisy["residual_us"] > 0.5
    assert 20 < noisy["per_message_us"] < 24 and 550 < noisy["per_batch_us"] < 700
    with pytest.raises(ValueError):
        batch_costs.fit({64: 30.0})


def _run(total: float, per_message: float, per_batch: float, size: int, first: str) -> dict:
    us = per_message + per_batch / size
    return {"acked": 1000, "failed": 0, "msgs_per_s": 1e6 / us,
            "cpu_us_per_msg": {first: us - 1.0, "client": 1.0, "total": us}}


def test_summary_takes_medians_then_fits_and_compares_totals():
    sizes = (16, 64)
    rounds = []
    for noise in (0.0, 50.0, 0.0):   # one round far off: the median ignores it
        rounds.append({"round": len(rounds) + 1, "stored_ok": True,
                       "hastore": {str(size): _run(0, 40 + noise, 1200, size, "master") for size in sizes},
                       "redis": {str(size): _run(0, 50, 300, size, "primary") for size in sizes}})
    costs = batch_costs.summarize(rounds, sizes)
    assert costs["medians"]["hastore"]["16"]["cpu_us_per_msg"]["total"] == round(40 + 1200 / 16, 1)
    hastore, redis = costs["fit"]["hastore"]["total"], costs["fit"]["redis"]["total"]
    assert hastore["per_message_us"] == pytest.approx(40, abs=0.1)
    assert hastore["per_batch_us"] == pytest.approx(1200, abs=5)   # medians kept to 0.1 µs
    assert redis["per_message_us"] == pytest.approx(50, abs=0.1)
    assert costs["ratios"]["per_message"] == pytest.approx(0.8, abs=0.01)
    assert costs["ratios"]["per_batch"] == pytest.approx(4.0, abs=0.02)
    lines = batch_costs.report_lines(costs)
    assert lines[0].startswith("batch costs")
    assert any("per message:" in line and "master 39.1" in line for line in lines)
    assert any(line.split()[:2] == ["batch", "16:"] and "total 115" in line for line in lines)
    assert lines[-1].startswith("  hastore/redis: per message 0.8")


def test_without_a_peer_there_is_hastore_alone_and_no_ratio():
    rounds = [{"round": 1, "stored_ok": True, "redis": None,
               "hastore": {str(size): _run(0, 40, 1200, size, "master") for size in (16, 64)}}]
    costs = batch_costs.summarize(rounds, (16, 64))
    assert set(costs["fit"]) == {"hastore"} and costs["ratios"] is None
    assert not any("hastore/redis" in line for line in batch_costs.report_lines(costs))


def test_the_command_refuses_bad_sizes_and_costs_without_a_peer_before_starting_anything():
    from click.testing import CliRunner

    from node.bench.replicate import bench_replicate_command
    runner = CliRunner()
    without_peer = runner.invoke(bench_replicate_command, ["--batch-costs", "16,64"])
    assert without_peer.exit_code == 2 and "it needs --peer redis" in without_peer.output
    bad = runner.invoke(bench_replicate_command, ["--peer", "redis", "--batch-costs", "16"])
    assert bad.exit_code == 2
    assert "Invalid value for '--batch-costs'" in bad.output and "at least two" in bad.output
