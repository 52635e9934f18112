"""The commitlog data source in a real local Spark session (shared, see conftest)."""

from __future__ import annotations

import datetime as dt
import os

import pytest

from pipeline_helpers import SteppedClock, sample_messages, write_store

pytestmark = pytest.mark.integration

START_MS = 1_700_000_000_000


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    root = tmp_path_factory.mktemp("cluster")
    paths = []
    for node in ("g1-n1", "g1-n2"):
        write_store(str(root / node), sample_messages(1500), clock=SteppedClock(START_MS, 10), node=node, group="g1")
        paths.append(str(root / node))
    return paths


def test_rows_columns_and_counts_per_topic(spark, two_nodes):
    packed = spark.read.format("commitlog").option("maxBytesPerPartition", 65536).load(",".join(two_nodes))
    assert packed.rdd.getNumPartitions() <= (os.cpu_count() or 1)      # slices packed: a task per core
    df = spark.read.format("commitlog").option("maxBytesPerPartition", 65536).option("numPartitions", 64) \
        .load(",".join(two_nodes))
    assert df.rdd.getNumPartitions() > 4
    assert df.count() == packed.count()
    counts = {(r["node"], r["topic"]): r["count"] for r in df.groupBy("node", "topic").count().collect()}
    assert counts == {(node, topic): 500 for node in ("g1-n1", "g1-n2") for topic in ("orders", "payments", "audit")}
    row = df.filter("node = 'g1-n1' and queue_offset = 3 and topic = 'orders' and queue_id = 0").collect()[0]
    assert row["group"] == "g1" and row["crc_ok"] and row["body"].startswith(b"body-")
    assert row["store_timestamp"] > dt.datetime(2023, 1, 1)


def test_filters_and_options_narrow_the_read(spark, two_nodes):
    def reader():     # DataFrameReader.option changes the reader it is called on: a fresh one each time
        return spark.read.format("commitlog").option("paths", two_nodes[0])
    everything = reader().load().select("physical_offset", "topic", "store_timestamp").collect()
    middle = sorted(r["physical_offset"] for r in everything)[700]
    assert reader().load().filter(f"physical_offset >= {middle}").count() == 800
    assert reader().option("startOffset", middle).load().count() == 800
    assert reader().option("topics", "audit,orders").load().count() == 1000
    assert reader().load().filter("topic in ('audit')").count() == 500
    pivot = sorted(r["store_timestamp"] for r in everything)[1000]
    from pyspark.sql import functions as F
    assert reader().load().filter(F.col("store_timestamp") >= F.lit(pivot)).count() == \
        sum(1 for r in everything if r["store_timestamp"] >= pivot)
    iso = pivot.replace(tzinfo=dt.timezone.utc).isoformat() if pivot.tzinfo is None else pivot.isoformat()
    assert reader().option("startTime", iso).load().count() == sum(1 for r in everything if r["store_timestamp"] >= pivot)


def test_without_bodies_and_with_a_projected_schema(spark, two_nodes):
    no_body = spark.read.format("commitlog").option("includeBody", "false").load(two_nodes[0])
    assert "body" not in no_body.columns and no_body.count() == 1500
    projected = spark.read.format("commitlog").schema("topic STRING, size INT").load(two_nodes[0])
    assert projected.columns == ["topic", "size"] and projected.count() == 1500


def test_corrupt_record_is_a_row_or_a_failure_under_failfast(spark, tmp_path):
    store = write_store(str(tmp_path), sample_messages(40), segment_bytes=1 << 20)
    segment = os.path.join(store, "commitlog", "0" * 20)
    with open(segment, "r+b") as handle:
        handle.seek(88 + 2)
        byte = handle.read(1)
        handle.seek(88 + 2)
        handle.write(bytes([byte[0] ^ 0xFF]))
    df = spark.read.format("commitlog").load(store)
    bad = df.filter("not crc_ok").select("physical_offset").collect()
    assert [r["physical_offset"] for r in bad] == [0] and df.count() == 40
    with pytest.raises(Exception, match="FAILFAST"):
        spark.read.format("commitlog").option("mode", "FAILFAST").load(store).count()


def test_bad_paths_fail_with_a_clear_message(spark, tmp_path):
    with pytest.raises(Exception, match="not a store directory"):
        spark.read.format("commitlog").load(str(tmp_path)).count()
