"""`hastore pipeline` refuses bad input before starting Spark (no process: a unit test)."""

from __future__ import annotations

from click.testing import CliRunner

from pipeline.cli import pipeline_group
from pipeline.history_jobs import lag_samples


def test_missing_and_non_store_directories_exit_2_with_the_reason(tmp_path):
    runner = CliRunner()
    result = runner.invoke(pipeline_group, ["stats", str(tmp_path / "missing")])
    assert result.exit_code == 2 and "no such directory" in result.output
    result = runner.invoke(pipeline_group, ["audit", str(tmp_path), str(tmp_path)])
    assert result.exit_code == 2 and "not a store directory" in result.output


def test_every_job_explains_itself():
    runner = CliRunner()
    for job in ("export", "stats", "audit", "check", "lag"):
        result = runner.invoke(pipeline_group, [job, "--help"])
        assert result.exit_code == 0 and "--master" in result.output and "Example:" in result.output


def test_lag_lines_of_both_shapes():
    assert lag_samples('{"time_s": 3, "slave": "n2", "lag_bytes": 10, "lag_ms": 4}', 0, 1000) == \
        [(3.0, "n2", 10, 4, None)]
    watch = '{"node": "n1", "replication": {"slaves": [{"node_id": "n2", "lag_bytes": 5, "lag_ms": 2}]}}'
    assert lag_samples(watch, 7, 500) == [(3.5, "n2", 5, 2, None)]
    assert lag_samples('{"node": "n1", "replication": {"slaves": []}}', 0, 1000) == []
    assert lag_samples("[1]", 4, 1000)[0][4].startswith("line 5")
