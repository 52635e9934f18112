"""The ``hastore`` source and sink over a topic routed across two groups of a real local
cluster (ZooKeeper, controllers, two groups of three node processes): with ``zk`` and no
``group`` the sink spreads batches over both groups and the source reads every queue of
both, offsets keyed ``group/queue``, a restarted query resuming from them."""

from __future__ import annotations

import collections
import json
import subprocess
import sys

import pytest

from node.client import SyncProducer
from node.cluster import LocalCluster, topology_from_mapping

from pipeline_helpers import pull_every_message

pytestmark = pytest.mark.integration   # ZooKeeper, controllers, six node processes and Spark

TOPOLOGY = {"cluster": "spread", "startup_timeout_s": 60,
            "store": {"commitlog_segment_bytes": 1 << 20, "consume_queue_entries_per_file": 4096,
                      "index_hash_slots": 1024, "index_max_entries": 8192},
            "groups": {"g1": {}, "g2": {}}}
GROUPS = ("g1", "g2")


@pytest.fixture(scope="module")
def two_groups(tmp_path_factory):
    cluster = LocalCluster(str(tmp_path_factory.mktemp("stream-groups") / "cluster"), topology_from_mapping(TOPOLOGY))
    try:
        cluster.up()
        yield cluster
    finally:
        cluster.down()


def _create_routed(cluster: LocalCluster, topic: str, queues: int) -> list:
    created = subprocess.run([sys.executable, "-m", "node.cli", "topic", "create", topic, "--queues", str(queues),
                              "--dir", cluster.directory, "--json"], capture_output=True, text=True, timeout=60)
    assert created.returncode == 0, created.stderr
    return json.loads(created.stdout)["queues"]


def _options(cluster: LocalCluster) -> dict:
    return {"zk": cluster.zk_hosts, "cluster": cluster.topology.cluster}     # no group: routed


def test_sink_spreads_a_routed_topic_over_both_groups(spark, two_groups):
    assert _create_routed(two_groups, "spread-sink", 4) == [["g1", [0, 1]], ["g2", [0, 1]]]
    df = spark.createDataFrame([(b"s-%04d" % i, [f"k{i}"]) for i in range(600)], "body BINARY, keys ARRAY<STRING>")
    writer = df.repartition(3).write.format("hastore").mode("append").option("topic", "spread-sink") \
        .option("batchSize", "50")
    for key, value in _options(two_groups).items():
        writer = writer.option(key, value)
    writer.save()
    stored = {group: pull_every_message(two_groups.current_master(group).client_address, "spread-sink", 2) for group in GROUPS}
    bodies = collections.Counter(m.body for group in GROUPS for m in stored[group])
    assert sorted(bodies) == [b"s-%04d" % i for i in range(600)] and set(bodies.values()) == {1}
    assert all(len(stored[group]) >= 100 for group in GROUPS), {g: len(m) for g, m in stored.items()}

    with_queue = spark.createDataFrame([(b"x", 0)], "body BINARY, queue_id INT").write.format("hastore") \
        .mode("append").option("topic", "spread-sink")
    with pytest.raises(Exception, match="queue_id column"):
        with_queue.options(**_options(two_groups)).save()


def test_source_reads_every_queue_of_both_groups_and_resumes(spark, two_groups, tmp_path):
    topic = "spread-src"
    _create_routed(two_groups, topic, 8)
    sent = collections.defaultdict(list)

    def produce(first: int, count: int) -> None:
        for group in GROUPS:
            with SyncProducer(two_groups.current_master(group).client_address, timeout_ms=10_000) as producer:
                for index in range(first, first + count):
                    body = b"%s-%04d" % (group.encode(), index)
                    assert producer.send(topic, body, queue_id=index % 4).ok
                    sent[group].append(body)
    produce(0, 80)
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")

    def run_once() -> dict:
        query = (spark.readStream.format("hastore").options(**_options(two_groups)).option("topics", topic)
                 .option("maxOffsetsPerTrigger", "50").load()
                 .writeStream.format("parquet").option("path", out).option("checkpointLocation", checkpoint)
                 .trigger(availableNow=True).start())
        query.awaitTermination(180)
        assert query.exception() is None, query.exception()
        progress = query.lastProgress
        return json.loads(progress["sources"][0]["endOffset"]) if isinstance(progress["sources"][0]["endOffset"],
                                                                             str) else progress["sources"][0]["endOffset"]

    end = run_once()
    assert set(end[topic]) == {f"{g}/{q}" for g in GROUPS for q in range(4)} and sum(end[topic].values()) == 160
    produce(80, 20)
    run_once()       # from the checkpoint's per-group offsets: only the 40 new ones
    rows = spark.read.parquet(out).collect()
    bodies = collections.Counter(bytes(row.body) for row in rows)
    assert set(bodies.values()) == {1} and set(bodies) == {b for group in GROUPS for b in sent[group]}
    assert all(row.group == bytes(row.body).split(b"-")[0].decode() for row in rows)
    per_queue = collections.defaultdict(list)
    for row in rows:
        per_queue[(row.group, row.queue_id)].append(row.queue_offset)
    assert sorted(per_queue) == [(g, q) for g in GROUPS for q in range(4)]
    assert all(sorted(offsets) == list(range(len(offsets))) for offsets in per_queue.values())
