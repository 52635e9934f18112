"""The store jobs of ``hastore pipeline``: export, stats, audit. Each takes a Spark session and
resolved store directories and returns a JSON-ready dict; the CLI prints it.

Several directories of one group are replicas: where a job counts messages (stats, check), a
record is counted once per (group, physical offset), so giving every node of a group does not
multiply the counts.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, functions as F

from .arrow_decode import spark_ddl
from .errors import OptionError
from .stores import StoreDir

TOP_KEYS_DEFAULT = 10
# Everything but where the copy lives: two replicas of one record agree on all of it.
_RECORD_FIELDS = ("size", "topic", "queue_id", "queue_offset", "sys_flag", "flag", "born_timestamp",
                  "store_timestamp", "born_host", "store_host", "keys", "tags", "uniq_key", "crc_ok")
DIVERGENCE_EXAMPLES_MAX = 20
ONE_COPY_COLUMNS = ("node", "group", "physical_offset", "topic")      # what one_copy_per_record reads
STATS_COLUMNS = ONE_COPY_COLUMNS + ("queue_id", "size", "keys", "store_timestamp", "body", "crc_ok")


def read_commitlog(spark, stores: list[StoreDir], *, include_body: bool = True, columns: tuple[str, ...] | None = None,
                   **options) -> DataFrame:
    """The commitlog source over ``stores`` (extra options as keyword arguments). ``columns``:
    only these (a projection the reader honours: PySpark does not tell a Python source which
    columns a query uses, so without it every column is built and converted for each row)."""
    reader = spark.read.format("commitlog").option("paths", ",".join(store.path for store in stores))
    reader = reader.option("includeBody", str(include_body).lower())
    if columns is not None:
        reader = reader.schema(spark_ddl(columns))
    for key, value in options.items():
        if value is not None:
            reader = reader.option(key, str(value))
    return reader.load()


def one_copy_per_record(df: DataFrame, stores: list[StoreDir]) -> DataFrame:
    """Rows of whole messages, one per (group, physical offset): replicas of a group count once.
    A store without a group (no node.yaml) counts as a group of its own."""
    df = df.filter(F.col("topic").isNotNull())
    replica_sets = [store.group or f"node:{store.node}" for store in stores]
    if len(set(replica_sets)) == len(replica_sets):
        return df
    replica_set = F.when(F.col("group") == "", F.concat(F.lit("node:"), F.col("node"))).otherwise(F.col("group"))
    return df.withColumn("_replica_set", replica_set).dropDuplicates(["_replica_set", "physical_offset"]) \
        .drop("_replica_set")


# --- export ------------------------------------------------------------------------------------
def export(spark, stores: list[StoreDir], out: str, *, overwrite: bool = False, include_body: bool = True) -> dict:
    """CommitLog rows to Parquet at ``out``, partitioned by topic and store date (UTC)."""
    df = read_commitlog(spark, stores, include_body=include_body).withColumn("date", F.to_date("store_timestamp"))
    df.write.mode("overwrite" if overwrite else "errorifexists").partitionBy("topic", "date").parquet(out)
    written = spark.read.parquet(out)
    per_topic = {row["topic"]: row["count"] for row in written.groupBy("topic").count().collect()}
    return {"out": out, "rows": sum(per_topic.values()), "rows_per_topic": per_topic,
            "stores": [store.path for store in stores]}


# --- stats -------------------------------------------------------------------------------------
def stats(spark, stores: list[StoreDir], *, top_keys: int = TOP_KEYS_DEFAULT) -> dict:
    """Messages and bytes per topic, per queue and per minute; the top keys; body size percentiles."""
    df = one_copy_per_record(read_commitlog(spark, stores, columns=STATS_COLUMNS), stores)
    df = df.select("topic", "queue_id", "size", "keys", "store_timestamp",
                   F.length("body").alias("body_bytes"), "crc_ok").cache()
    try:
        per_topic = [{"topic": r["topic"], "messages": r["messages"], "bytes": r["bytes"]} for r in
                     df.groupBy("topic").agg(F.count("*").alias("messages"), F.sum("size").alias("bytes"))
                     .orderBy("topic").collect()]
        per_queue = [{"topic": r["topic"], "queue_id": r["queue_id"], "messages": r["messages"], "bytes": r["bytes"]}
                     for r in df.groupBy("topic", "queue_id").agg(F.count("*").alias("messages"),
                                                                 F.sum("size").alias("bytes"))
                     .orderBy("topic", "queue_id").collect()]
        per_minute = [{"minute": r["minute"].strftime("%Y-%m-%dT%H:%MZ"), "topic": r["topic"],
                       "messages": r["messages"], "bytes": r["bytes"]}
                      for r in df.groupBy(F.date_trunc("minute", "store_timestamp").alias("minute"), "topic")
                      .agg(F.count("*").alias("messages"), F.sum("size").alias("bytes"))
                      .orderBy("minute", "topic").collect()]
        keys = [{"key": r["key"], "messages": r["count"]} for r in
                df.select(F.explode("keys").alias("key")).groupBy("key").count()
                .orderBy(F.desc("count"), "key").limit(top_keys).collect()]
        sizes = df.agg(F.count("*").alias("messages"), F.sum("size").alias("bytes"),
                       F.sum(F.when(F.col("crc_ok"), 0).otherwise(1)).alias("crc_failures"),
                       F.percentile_approx("body_bytes", [0.5, 0.9, 0.99], 10000).alias("p"),
                       F.max("body_bytes").alias("max")).collect()[0]
    finally:
        df.unpersist()
    percentiles = sizes["p"] or [None, None, None]
    return {"messages": sizes["messages"], "bytes": sizes["bytes"] or 0, "crc_failures": sizes["crc_failures"] or 0,
            "body_bytes": {"p50": percentiles[0], "p90": percentiles[1], "p99": percentiles[2], "max": sizes["max"]},
            "topics": per_topic, "queues": per_queue, "minutes": per_minute, "top_keys": keys}


# --- audit -------------------------------------------------------------------------------------
def audit(spark, stores: list[StoreDir]) -> dict:
    """Replica divergence across the nodes of one group, per physical offset up to their common end.

    Every node's whole records below the common end (the least end of data among the nodes)
    must match: same record boundaries, same fields, same body, CRCs intact on each copy.
    ``divergent`` lists offsets where they do not; records past the common end exist on some
    nodes only (lag, reported, not a divergence)."""
    if len(stores) < 2:
        raise OptionError("audit needs the store directories of at least two nodes of one group")
    groups = sorted({store.group for store in stores})
    if len(groups) > 1:
        raise OptionError(f"audit compares the nodes of one group; these belong to {', '.join(groups)}")
    nodes = sorted(store.node for store in stores)
    if len(set(nodes)) != len(nodes):
        raise OptionError(f"two directories name the same node ({', '.join(nodes)}); give each node once")
    df = read_commitlog(spark, stores)
    fingerprint = F.xxhash64(*[F.col(name) for name in _RECORD_FIELDS], F.to_json("properties"), F.col("body"))
    records = df.select("node", "physical_offset", "size", F.col("topic").isNotNull().alias("whole"),
                        F.when(F.col("topic").isNull(), F.lit(None)).otherwise(fingerprint).alias("fingerprint"),
                        "crc_ok").cache()
    try:
        ends = {r["node"]: r["end"] for r in records.filter("whole").groupBy("node")
                .agg(F.max(F.col("physical_offset") + F.col("size")).alias("end")).collect()}
        common_end = min(ends.get(node) or 0 for node in nodes)
        below = records.filter(F.col("physical_offset") < common_end)
        per_offset = below.groupBy("physical_offset").agg(
            F.collect_list(F.struct("node", "fingerprint", "crc_ok")).alias("copies"),
            F.count_distinct(F.coalesce(F.col("fingerprint"), F.lit(0))).alias("versions"),
            F.count("*").alias("holders"),
            F.min(F.coalesce(F.col("crc_ok"), F.lit(False)).cast("int")).alias("all_crc_ok"))
        divergent = per_offset.filter((F.col("versions") > 1) | (F.col("holders") < len(nodes)) |
                                      (F.col("all_crc_ok") == 0) | F.exists("copies", lambda c: c["fingerprint"].isNull()))
        divergent_count = divergent.count()
        examples = [{"physical_offset": r["physical_offset"],
                     "copies": {c["node"]: {"crc_ok": c["crc_ok"], "fingerprint": c["fingerprint"]} for c in r["copies"]},
                     "missing_on": sorted(set(nodes) - {c["node"] for c in r["copies"]})}
                    for r in divergent.orderBy("physical_offset").limit(DIVERGENCE_EXAMPLES_MAX).collect()]
        beyond = {r["node"]: {"messages": r["messages"], "first_offset": r["first"]} for r in
                  records.filter(F.col("whole") & (F.col("physical_offset") >= common_end)).groupBy("node")
                  .agg(F.count("*").alias("messages"), F.min("physical_offset").alias("first")).collect()}
        compared = below.filter("whole").select("physical_offset").distinct().count()
    finally:
        records.unpersist()
    return {"group": groups[0], "nodes": nodes, "ends": {node: ends.get(node, 0) for node in nodes},
            "common_end": common_end, "records_compared": compared, "divergent_offsets": divergent_count,
            "divergent": examples, "only_on_some_nodes_past_common_end": beyond, "ok": divergent_count == 0}
