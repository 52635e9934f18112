"""The pipeline jobs in the shared local Spark session: export, stats, audit, check, lag."""

from __future__ import annotations

import csv
import json
import os
import shutil
from collections import Counter

import pytest

from chaos.checker import check_sends
from chaos.history import History
from pipeline import history_jobs, jobs
from pipeline.errors import InputFormatError, OptionError
from pipeline.stores import resolve_stores
from store import Message

from pipeline_helpers import SteppedClock, sample_messages, write_store

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def group_dirs(tmp_path_factory):
    """Two identical replicas of group g1 (same messages, same store clock)."""
    root = tmp_path_factory.mktemp("g1")
    for node in ("g1-n1", "g1-n2"):
        write_store(str(root / node), sample_messages(900), clock=SteppedClock(1_700_000_000_000, 50),
                    node=node, group="g1")
    return [str(root / "g1-n1"), str(root / "g1-n2")]


def test_export_writes_parquet_by_topic_and_date(spark, group_dirs, tmp_path):
    out = str(tmp_path / "export")
    result = jobs.export(spark, resolve_stores(group_dirs[:1]), out)
    assert result["rows"] == 900 and result["rows_per_topic"] == {"orders": 300, "payments": 300, "audit": 300}
    assert sorted(os.listdir(os.path.join(out, "topic=orders")))[0].startswith("date=2023-11-14")
    back = spark.read.parquet(out)
    assert back.filter("topic = 'audit'").count() == 300 and "body" in back.columns
    with pytest.raises(Exception, match="already exists"):
        jobs.export(spark, resolve_stores(group_dirs[:1]), out)


def test_stats_counts_replicas_once(spark, group_dirs):
    result = jobs.stats(spark, resolve_stores(group_dirs), top_keys=3)
    assert result["messages"] == 900 and result["crc_failures"] == 0
    assert {row["topic"]: row["messages"] for row in result["topics"]} == {"orders": 300, "payments": 300, "audit": 300}
    assert sum(row["messages"] for row in result["queues"]) == 900
    assert sum(row["messages"] for row in result["minutes"]) == 900 and len(result["minutes"]) > 1
    counts = Counter(key for message in sample_messages(900) for key in message.keys)
    top = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:3]
    assert [(row["key"], row["messages"]) for row in result["top_keys"]] == top
    assert 7 <= result["body_bytes"]["p50"] <= result["body_bytes"]["p99"] <= result["body_bytes"]["max"]


def test_audit_finds_divergence_and_tells_lag_apart(spark, group_dirs, tmp_path):
    stores = resolve_stores(group_dirs)
    clean = jobs.audit(spark, stores)
    assert clean["ok"] and clean["records_compared"] == 900 and clean["common_end"] == clean["ends"]["g1-n1"]
    # a third replica that diverges at one record and holds messages the others lack
    third = str(tmp_path / "g1-n3")
    shutil.copytree(group_dirs[0], third)
    with open(os.path.join(third, "node.yaml"), "w", encoding="utf-8") as handle:
        json.dump({"node_id": "g1-n3", "group": "g1"}, handle)
    segment = os.path.join(third, "store", "commitlog", "0" * 20)
    with open(segment, "r+b") as handle:
        handle.seek(88 + 3)                                 # a body byte of the first record
        handle.write(b"#")
    lagging = jobs.audit(spark, resolve_stores(group_dirs + [third]))
    assert not lagging["ok"] and lagging["divergent_offsets"] == 1
    assert lagging["divergent"][0]["physical_offset"] == 0 and lagging["divergent"][0]["copies"]["g1-n3"]["crc_ok"] is False
    with pytest.raises(OptionError, match="one group"):
        other = str(tmp_path / "other")
        write_store(other, [Message("t", b"x")], node="g2-n1", group="g2")
        jobs.audit(spark, resolve_stores(group_dirs[:1] + [other]))


def test_audit_reports_messages_past_the_common_end(spark, tmp_path):
    base = sample_messages(300)
    short = write_store(str(tmp_path / "n1"), base, clock=SteppedClock(1_700_000_000_000, 5), node="n1", group="g")
    longer = write_store(str(tmp_path / "n2"), base + sample_messages(20), clock=SteppedClock(1_700_000_000_000, 5),
                         node="n2", group="g")
    result = jobs.audit(spark, resolve_stores([short, longer]))
    assert result["ok"] and result["only_on_some_nodes_past_common_end"]["n2"]["messages"] == 20


def test_check_gives_the_chaos_checkers_verdict(spark, tmp_path):
    history = History(origin_s=0.0, clock=lambda: 1.0)
    stored = []
    for index in range(60):
        key = f"key-{index}"
        history.record("invoke", key)
        kind = index % 6
        if kind in (0, 1):
            history.record("ok", key)
        elif kind == 2:
            history.record("fail", key)
        elif kind == 3:
            history.record("info", key)
        # kind 4, 5: pending (no outcome)
        if kind in (0, 2, 3) or (kind == 1 and index % 4 != 1):
            stored.append(key)              # acked and stored, failed but present, unknown present
    stored += ["key-0", "stranger"]         # a duplicate and a message nobody sent
    path = tmp_path / "history.jsonl"
    path.write_text(history.to_json_lines())
    store = write_store(str(tmp_path / "n"), [Message("chaos", b"v", keys=[key]) for key in stored]
                        + [Message("other", b"v", keys=["elsewhere"])])
    result = history_jobs.check(spark, resolve_stores([store]), str(path), topic="chaos")
    expected = check_sends(history.ops, stored).to_json()
    assert result == expected and not result["valid"] and result["lost"]
    path.write_text('{"type": "invoke", "f": "send", "value": "a", "time_s": 0}\nnot json\n')
    with pytest.raises(InputFormatError, match="not a chaos history op"):
        history_jobs.check(spark, resolve_stores([store]), str(path), topic="chaos")


def test_lag_percentiles_csv_and_chart(spark, tmp_path):
    lines = []
    for second in range(60):
        lines.append(json.dumps({"time_s": second, "slave": "n2", "lag_bytes": second * 100, "lag_ms": second}))
        lines.append(json.dumps({"node": "n1", "replication": {"slaves": [
            {"node_id": "n3", "lag_bytes": 7, "lag_ms": 1}]}, "time_ms": second * 1000}))
    path = tmp_path / "lag.jsonl"
    path.write_text("\n".join(lines) + "\n")
    result = history_jobs.lag(spark, [str(path)], str(tmp_path / "out"), bucket_s=20)
    assert result["buckets"] == 6 and result["slaves"]["n3"]["lag_bytes_p99"] == 7
    assert 5800 <= result["slaves"]["n2"]["lag_bytes_p99"] <= 5900
    with open(result["csv"], newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert {row["slave"] for row in rows} == {"n2", "n3"} and len(rows) == 6
    assert open(result["png"], "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    path.write_text('{"nothing": 1}\n')
    with pytest.raises(InputFormatError, match="not a lag sample"):
        history_jobs.lag(spark, [str(path)], str(tmp_path / "out2"))
