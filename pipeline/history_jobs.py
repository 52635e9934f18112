"""The history jobs of ``hastore pipeline``: ``check`` (a chaos history against the stored
messages) and ``lag`` (replication lag samples as percentiles, a CSV and a PNG chart).

``check`` computes, in Spark, the verdict ``chaos.checker.check_sends`` computes in Python
(the tests hold the two equal): a send history (JSON lines of ``chaos.history``: ``invoke``
then one of ``ok`` / ``fail`` / ``info`` per key) against the first key of every stored
message of the topic, one copy per (group, physical offset).

``lag`` reads JSON lines in either of two shapes, one sample per line:

- flat samples: ``{"time_s" | "time_ms", "slave" | "node_id", "lag_bytes", "lag_ms"}``;
- status objects, as ``hastore lag --json --watch`` prints them (``replication.slaves`` or
  ``master.slaves``, each with ``node_id``, ``lag_bytes``, ``lag_ms``), with ``time_s`` /
  ``time_ms`` when present; lines without a time are taken ``--interval-ms`` apart.
"""

from __future__ import annotations

import csv
import json
import os

from pyspark.sql import functions as F
from pyspark.sql.types import (ArrayType, DoubleType, IntegerType, LongType, StringType, StructField, StructType)

from .errors import InputFormatError
from .jobs import ONE_COPY_COLUMNS, one_copy_per_record, read_commitlog
from .stores import StoreDir

HISTORY_SCHEMA = StructType([
    StructField("type", StringType()), StructField("f", StringType()), StructField("value", StringType()),
    StructField("time_s", DoubleType()), StructField("node", StringType()), StructField("error", StringType()),
    StructField("process", StringType()), StructField("queue_id", IntegerType()), StructField("offset", LongType()),
    StructField("keys", ArrayType(StringType())),
])
OP_TYPES = ("invoke", "ok", "fail", "info")
BUCKET_S_DEFAULT = 10.0
INTERVAL_MS_DEFAULT = 1000


# --- check -------------------------------------------------------------------------------------
def read_history(spark, path: str):
    """A chaos history's send ops as a DataFrame (type, value, time_s); InputFormatError on a bad line."""
    if not os.path.isfile(path):
        raise InputFormatError(f"{path}: no such history file (the JSON lines `hastore chaos run` writes)")
    # the line number orders ops recorded in the same instant, as the history's list does
    lines = spark.read.text(path).withColumn("line_number", F.monotonically_increasing_id()) \
        .filter(F.trim("value") != "")
    parsed = lines.select(F.col("value").alias("line"), "line_number", F.from_json("value", HISTORY_SCHEMA).alias("op"))
    bad = parsed.filter(F.col("op").isNull() | F.col("op.type").isNull() | F.col("op.value").isNull()
                        | ~F.col("op.type").isin(*OP_TYPES)).limit(1).collect()
    if bad:
        raise InputFormatError(f"{path}: not a chaos history op: {bad[0]['line'][:200]!r}")
    ops = parsed.select("line_number", "op.*").withColumn("f", F.coalesce(F.col("f"), F.lit("send")))
    return ops.filter(F.col("f") == "send").select("type", "value", "time_s", "line_number")


def check(spark, stores: list[StoreDir], history_path: str, *, topic: str | None = None) -> dict:
    """The send verdict (lost, duplicated, failed-but-present, unknown present/absent,
    unexpected) of a history against the stores, as ``chaos.checker.SendVerdict.to_json``."""
    sends = read_history(spark, history_path)
    per_key = sends.groupBy("value").agg(
        F.sum((F.col("type") == "invoke").cast("int")).alias("invokes"),
        F.sum((F.col("type") != "invoke").cast("int")).alias("outcomes"),
        F.min(F.when(F.col("type") == "invoke", F.col("line_number"))).alias("invoked_at"),
        F.max(F.when(F.col("type") != "invoke", F.col("type"))).alias("outcome")).cache()
    problems = per_key.filter((F.col("invokes") != 1) | (F.col("outcomes") > 1)).limit(1).collect()
    if problems:
        key = problems[0]
        raise InputFormatError(f"{history_path}: key {key['value']!r} has {key['invokes']} invokes and "
                               f"{key['outcomes']} outcomes; a send history needs one invoke and at most one "
                               f"outcome per unique key")
    messages = read_commitlog(spark, stores, include_body=False, topics=topic, columns=ONE_COPY_COLUMNS + ("keys",))
    messages = one_copy_per_record(messages, stores)
    if topic is None:
        messages = messages.filter(~F.col("topic").startswith("%SYS%"))
    read = messages.select(F.coalesce(F.element_at("keys", 1), F.lit("")).alias("value")) \
        .groupBy("value").agg(F.count("*").alias("reads"))
    joined = per_key.withColumn("outcome", F.coalesce("outcome", F.lit("pending"))) \
        .join(read, "value", "full_outer").fillna(0, ["reads"]).cache()
    try:
        counts = joined.agg(*[F.sum(condition.cast("int")).alias(name) for name, condition in (
            ("invoked", F.col("invokes").isNotNull()),
            ("acked", F.col("outcome") == "ok"), ("failed", F.col("outcome") == "fail"),
            ("unknown", F.col("outcome") == "info"), ("pending", F.col("outcome") == "pending"),
            ("unknown_present", F.col("outcome").isin("info", "pending") & (F.col("reads") > 0)),
            ("unknown_absent", F.col("outcome").isin("info", "pending") & (F.col("reads") == 0)))]).collect()[0]

        def keys(condition, order: str) -> list[str]:
            return [row["value"] for row in joined.filter(condition).orderBy(order, "value").select("value").collect()]
        lost = keys((F.col("outcome") == "ok") & (F.col("reads") == 0), "invoked_at")
        duplicated = keys(F.col("reads") > 1, "value")
        failed_present = keys((F.col("outcome") == "fail") & (F.col("reads") > 0), "invoked_at")
        unexpected = keys(F.col("invokes").isNull(), "value")
    finally:
        joined.unpersist()
        per_key.unpersist()
    valid = not (lost or duplicated or failed_present or unexpected)
    return {"valid": valid, **{name: counts[name] or 0 for name in ("invoked", "acked", "failed", "unknown", "pending")},
            "lost": lost, "duplicated": duplicated, "failed_present": failed_present,
            "unknown_present": counts["unknown_present"] or 0, "unknown_absent": counts["unknown_absent"] or 0,
            "unexpected": unexpected}


# --- lag ---------------------------------------------------------------------------------------
def lag_samples(line: str, index: int, interval_ms: int) -> list[tuple]:
    """(time_s, slave, lag_bytes, lag_ms, bad_line) rows of one JSON line (pure; runs on executors).
    A line that is neither shape gives one row with ``bad_line`` set."""
    if not line.strip():
        return []
    try:
        item = json.loads(line)
        if not isinstance(item, dict):
            raise ValueError("not an object")
        time_s = _time_s(item, index, interval_ms)
        slaves = _slaves_of(item)
        if slaves is None:
            slave = item.get("slave") or item.get("node_id") or item.get("slave_id")
            lag_ms = item["lag_ms"] if "lag_ms" in item else float(item["lag_s"]) * 1000
            return [(time_s, str(slave), int(item["lag_bytes"]), int(lag_ms), None)] if slave else \
                [(None, None, None, None, f"line {index + 1}: no slave or node_id")]
        return [(time_s, str(s["node_id"]), int(s["lag_bytes"]), int(s.get("lag_ms", 0)), None) for s in slaves]
    except (ValueError, KeyError, TypeError) as error:
        return [(None, None, None, None, f"line {index + 1}: {error}")]


def _time_s(item: dict, index: int, interval_ms: int) -> float:
    if "time_s" in item:
        return float(item["time_s"])
    if "time_ms" in item:
        return float(item["time_ms"]) / 1000
    return index * interval_ms / 1000


def _slaves_of(item: dict) -> list | None:
    for holder in (item, item.get("replication") or {}, item.get("master") or {}):
        if isinstance(holder, dict) and isinstance(holder.get("slaves"), list) and holder["slaves"]:
            return holder["slaves"]
    if isinstance(item.get("replication"), dict) or ("master" in item and "slave" not in item):
        return []         # a status with no slave connected: no sample (a lag_history_path
                          # sample names its master too, and its slave)
    return None


def lag(spark, paths: list[str], out_dir: str, *, bucket_s: float = BUCKET_S_DEFAULT,
        interval_ms: int = INTERVAL_MS_DEFAULT) -> dict:
    """Lag p50/p99 per slave per ``bucket_s`` of time: ``lag.csv`` and ``lag.png`` in ``out_dir``."""
    for path in paths:
        if not os.path.isfile(path):
            raise InputFormatError(f"{path}: no such lag samples file")
    rows = spark.sparkContext.textFile(",".join(paths)).zipWithIndex() \
        .flatMap(lambda pair: lag_samples(pair[0], pair[1], interval_ms))
    schema = "time_s DOUBLE, slave STRING, lag_bytes BIGINT, lag_ms BIGINT, bad_line STRING"
    samples = spark.createDataFrame(rows, schema).cache()
    try:
        bad = samples.filter(F.col("bad_line").isNotNull()).limit(1).collect()
        if bad:
            raise InputFormatError(f"{', '.join(paths)}: not a lag sample ({bad[0]['bad_line']})")
        samples = samples.drop("bad_line")
        percentiles = [F.percentile_approx("lag_bytes", [0.5, 0.99]).alias("bytes"),
                       F.percentile_approx("lag_ms", [0.5, 0.99]).alias("ms"), F.count("*").alias("samples")]
        buckets = samples.groupBy("slave", (F.floor(F.col("time_s") / bucket_s) * bucket_s).alias("time_s")) \
            .agg(*percentiles).orderBy("slave", "time_s").collect()
        overall = samples.groupBy("slave").agg(*percentiles).orderBy("slave").collect()
    finally:
        samples.unpersist()
    if not buckets:
        raise InputFormatError(f"{', '.join(paths)}: no lag samples (no slave in any line)")
    os.makedirs(out_dir, exist_ok=True)
    table = [{"time_s": r["time_s"], "slave": r["slave"], "samples": r["samples"], "lag_bytes_p50": r["bytes"][0],
              "lag_bytes_p99": r["bytes"][1], "lag_ms_p50": r["ms"][0], "lag_ms_p99": r["ms"][1]} for r in buckets]
    csv_path, png_path = os.path.join(out_dir, "lag.csv"), os.path.join(out_dir, "lag.png")
    with open(csv_path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(table[0]))
        writer.writeheader()
        writer.writerows(table)
    _chart(table, png_path, bucket_s)
    return {"csv": csv_path, "png": png_path, "bucket_s": bucket_s, "buckets": len(table),
            "slaves": {r["slave"]: {"samples": r["samples"], "lag_bytes_p50": r["bytes"][0],
                                    "lag_bytes_p99": r["bytes"][1], "lag_ms_p50": r["ms"][0],
                                    "lag_ms_p99": r["ms"][1]} for r in overall}}


def _chart(table: list[dict], path: str, bucket_s: float) -> None:
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot
    figure, (by_bytes, by_ms) = pyplot.subplots(2, 1, figsize=(10, 6), sharex=True)
    for slave in sorted({row["slave"] for row in table}):
        mine = [row for row in table if row["slave"] == slave]
        times = [row["time_s"] for row in mine]
        for axis, unit in ((by_bytes, "bytes"), (by_ms, "ms")):
            line, = axis.plot(times, [row[f"lag_{unit}_p50"] for row in mine], label=f"{slave} p50")
            axis.plot(times, [row[f"lag_{unit}_p99"] for row in mine], linestyle="--", color=line.get_color(),
                      label=f"{slave} p99")
    by_bytes.set_ylabel("lag (bytes)")
    by_ms.set_ylabel("lag (ms)")
    by_ms.set_xlabel(f"time (s), {bucket_s:g} s buckets")
    by_bytes.set_title("replication lag per slave, p50 and p99")
    by_bytes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    pyplot.close(figure)
