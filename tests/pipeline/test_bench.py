"""``hastore bench pipeline``'s figures, at a small size: every case runs and counts what the
store holds (the no-work Python source as many rows), the ratios are the rows/s over Parquet's, and the streaming half receives every
message and says where a micro-batch's time went."""

from __future__ import annotations

import os

import pytest

from pipeline import bench, bench_stream


@pytest.mark.integration   # Spark
def test_every_case_of_the_scan_bench_runs_on_a_small_store(spark, tmp_path):
    built = bench.build_store(str(tmp_path / "store"), 3000, spread=100)
    assert built["messages"] == 3000 and built["body_spread"] == 100
    figures = bench.measure(spark, str(tmp_path / "store"), str(tmp_path / "export"), 3000, 1, built["body_bytes"])
    cases = ("commitlog_no_body", "commitlog_no_body_no_crc", "commitlog_topic_only", "commitlog_topic_crc",
             "commitlog_with_body", "parquet_no_body", "parquet_with_body", "python_source_no_work",
             "python_source_no_work_all_columns")
    for case in cases:
        assert 0 < figures[case]["best_s"] <= figures[case]["median_s"] and figures[case]["rows_per_s"] > 0, case
        assert len(figures[case]["runs_s"]) == 1
    parquet = figures["parquet_no_body"]["median_s"]
    ratio = figures["ratios"]["commitlog_topic_only_vs_parquet_no_body"]
    assert ratio == round(parquet / figures["commitlog_topic_only"]["median_s"], 3)
    assert figures["target"]["with_projected_schema"] == ratio
    assert figures["target"]["met_with_projected_schema"] == (ratio >= 0.5)
    ceiling = figures["target"]["python_source_ceiling"]
    assert ceiling == figures["ratios"]["python_source_no_work_vs_parquet_no_body"] > 0
    assert figures["target"]["projected_share_of_ceiling"] == round(ratio / ceiling, 3)
    assert figures["target"]["all_columns_ceiling"] == \
        figures["ratios"]["python_source_no_work_all_columns_vs_parquet_no_body"] > 0
    assert figures["record_bytes"] > built["body_bytes"]        # headers and properties besides
    assert os.path.isdir(tmp_path / "export")


@pytest.mark.integration   # Spark and a local cluster's node processes
def test_the_streaming_half_receives_every_message_and_times_its_batches(spark):
    figures = bench_stream.measure_stream_latency(spark, count=20, pace_s=0.01, timeout_s=60)
    assert figures["messages"] == 20 and figures["received"] == 20
    assert 0 < figures["p50_ms"] <= figures["p99_ms"] <= figures["max_ms"]
    phases = figures["micro_batch_ms_p50"]
    assert phases["triggerExecution"] > 0 and "addBatch" in phases, phases


def test_batch_phases_are_medians_over_batches_that_read_rows():
    reports = [{"durationMs": {"addBatch": 10, "triggerExecution": 30}, "numInputRows": 4},
               {"durationMs": {"addBatch": 900, "triggerExecution": 900}, "numInputRows": 0},   # empty: left out
               {"durationMs": {"addBatch": 20, "triggerExecution": 40}, "numInputRows": 1},
               {"durationMs": {"addBatch": 30, "triggerExecution": 50}, "numInputRows": 2}]
    assert bench_stream.batch_phases(reports) == {"addBatch": 20.0, "triggerExecution": 40.0}
    assert bench_stream.batch_phases([]) == {}


def test_the_ceiling_source_gives_the_rows_asked_for_in_partitions():
    from pipeline.bench_ceiling import ReadyRowsSource
    reader = ReadyRowsSource({"rows": "40000", "topics": "a,b,c,d", "partitions": "3"}).reader(None)
    parts = reader.partitions()
    assert [part.value for part in parts] == [13334, 13333, 13333]
    batches = list(reader.read(parts[0]))
    assert sum(batch.num_rows for batch in batches) == 13334
    assert batches[0].column("topic").to_pylist()[:5] == ["a", "b", "c", "d", "a"]
