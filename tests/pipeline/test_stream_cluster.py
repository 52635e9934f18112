"""The ``hastore`` source and sink against a real local cluster in controller mode (ZooKeeper,
one controller, three node processes): the sink's acks, a streaming query with a 100 ms
trigger through a master failover (every acked message in its output exactly once), and a
restarted query replaying from its checkpoint."""

from __future__ import annotations

import collections
import threading
import time

import pytest

from node.client import SyncAdmin, SyncProducer
from node.cluster import LocalCluster, topology_from_mapping
from node.errors import NodeError, UnknownOutcomeError

from pipeline_helpers import pull_every_message

pytestmark = pytest.mark.integration   # ZooKeeper, a controller, node processes and Spark

SMALL_STORE = {"commitlog_segment_bytes": 1 << 20, "consume_queue_entries_per_file": 4096,
               "index_hash_slots": 1024, "index_max_entries": 8192}
QUEUES = 4


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """A controller-mode cluster of one group (g1, three nodes) for the module."""
    directory = str(tmp_path_factory.mktemp("stream-cluster") / "cluster")
    cluster = LocalCluster(directory, topology_from_mapping({
        "store": dict(SMALL_STORE), "startup_timeout_s": 30,
        "controller": {"mode": "controller", "controllers": 1}}))
    try:
        cluster.up()
        _wait_for_sync_state_set(cluster, 3)
        yield cluster
    finally:
        cluster.down()


def _wait_for_sync_state_set(cluster: LocalCluster, members: int, timeout_s: float = 60) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            address = cluster.current_master("g1").client_address
            with SyncAdmin(address, timeout_ms=5000) as admin:
                replication = admin.status().get("replication") or {}
            if len(replication.get("sync_state_set") or []) >= members:
                return address
        except Exception:   # no master yet, or it is starting: look again
            pass
        time.sleep(0.1)
    raise AssertionError(f"g1's sync-state set did not reach {members} members in {timeout_s} s")


def _options(cluster: LocalCluster) -> dict:
    return {"zk": cluster.zk_hosts, "cluster": cluster.topology.cluster, "group": "g1"}


def _create_topic(cluster: LocalCluster, topic: str) -> None:
    with SyncAdmin(cluster.current_master("g1").client_address, timeout_ms=10_000) as admin:
        admin.create_topic(topic, QUEUES)


def test_sink_sends_rows_as_acked_messages_with_keys_tags_and_properties(spark, live):
    _create_topic(live, "sink-t")
    rows = [(b"row-%d" % i, [f"k{i}", "shared"], "red" if i % 2 else None, {"n": str(i)}) for i in range(60)]
    df = spark.createDataFrame(rows, "body BINARY, keys ARRAY<STRING>, tags STRING, properties MAP<STRING, STRING>")
    writer = df.repartition(3).write.format("hastore").mode("append").option("topic", "sink-t")
    for key, value in _options(live).items():
        writer = writer.option(key, value)
    writer.save()
    stored = {m.body: m for m in pull_every_message(live.current_master("g1").client_address, "sink-t", QUEUES)}
    assert set(stored) == {row[0] for row in rows}
    for body, keys, tags, properties in rows:
        message = stored[body]
        assert message.keys == keys and message.tags == tags and message.properties["n"] == properties["n"]

    without_body = spark.createDataFrame([("x",)], "topic STRING").write.format("hastore").mode("append")
    with pytest.raises(Exception, match="needs a body column"):
        without_body.option("zk", live.zk_hosts).save()


class _Load:
    """A bounded producer of numbered messages that follows the master through ZooKeeper;
    records which were acknowledged (and which outcomes are unknown)."""

    def __init__(self, cluster: LocalCluster, topic: str, count: int, pause_s: float = 0.01) -> None:
        self.cluster, self.topic, self.count, self.pause_s = cluster, topic, count, pause_s
        self.acked: list[bytes] = []
        self.unknown: list[bytes] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _producer(self):
        deadline = time.monotonic() + 60
        while not self.stop.is_set() and time.monotonic() < deadline:
            try:
                return SyncProducer(self.cluster.current_master("g1").client_address, timeout_ms=10_000)
            except Exception:   # no live master yet (failover under way)
                time.sleep(0.1)
        return None

    def _run(self) -> None:
        producer = self._producer()
        index = 0
        started = time.monotonic()
        while producer is not None and index < self.count and not self.stop.is_set() \
                and time.monotonic() - started < 120:
            body = b"fo-%06d" % index
            try:
                result = producer.send(self.topic, body, keys=[f"key-{index}"])
                if result.ok:
                    self.acked.append(body)
                index += 1
            except UnknownOutcomeError:
                self.unknown.append(body)
                index += 1
            except NodeError:   # refused or not sent: send it again to the master found again
                try:
                    producer.close()
                except Exception:
                    pass
                producer = self._producer()
            time.sleep(self.pause_s)
        if producer is not None:
            try:
                producer.close()
            except Exception:
                pass


def _stream(spark, cluster, topic: str, name: str, **extra):
    reader = spark.readStream.format("hastore").option("topics", topic).option("startingOffsets", "earliest")
    for key, value in {**_options(cluster), **extra}.items():
        reader = reader.option(key, value)
    return reader.load().selectExpr("CAST(body AS STRING) AS body", "queue_id", "queue_offset")


def _output(spark, name: str) -> list[str]:
    return [row.body for row in spark.sql(f"SELECT body FROM {name}").collect()]


def test_streaming_query_holds_every_acked_message_once_across_a_master_failover(spark, live):
    topic = "failover-t"
    _create_topic(live, topic)
    query = (_stream(spark, live, topic, "failover_out").writeStream.format("memory").queryName("failover_out")
             .trigger(processingTime="100 milliseconds").start())
    load = _Load(live, topic, count=500)
    try:
        load.thread.start()
        deadline = time.monotonic() + 60
        while len(load.acked) < 150 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(load.acked) >= 150, "the load got too few acks before the kill"
        old = live.current_master("g1")
        live.kill(old.node_id)
        new = live.wait_for_master("g1", timeout_s=30, not_node=old.node_id)
        assert new.node_id != old.node_id
        load.thread.join(150)
        assert not load.thread.is_alive()
        acked_after = [b for b in load.acked if int(b[3:]) > 150]
        assert acked_after, "no message was acked after the failover"
        wanted = {body.decode() for body in load.acked}
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            assert query.exception() is None, query.exception()
            if wanted <= set(_output(spark, "failover_out")):
                break
            time.sleep(0.5)
        out = collections.Counter(_output(spark, "failover_out"))
        missing = sorted(wanted - set(out))
        assert not missing, f"{len(missing)} acked messages missing from the output, e.g. {missing[:5]}"
        twice = {body: n for body, n in out.items() if n > 1}
        assert not twice, f"messages in the output more than once: {list(twice.items())[:5]}"
        print({"acked": len(load.acked), "unknown": len(load.unknown), "output": sum(out.values()),
               "killed": old.node_id, "new_master": new.node_id})
    finally:
        load.stop.set()
        query.stop()


def test_restarted_query_replays_from_its_checkpoint_with_max_offsets_per_trigger(spark, live, tmp_path):
    topic = "replay-t"
    _create_topic(live, topic)
    with SyncProducer(live.current_master("g1").client_address, timeout_ms=10_000) as producer:
        for index in range(120):
            assert producer.send(topic, b"rp-%04d" % index, queue_id=index % QUEUES).ok
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")

    def run_once() -> None:
        query = (_stream(spark, live, topic, "replay", maxOffsetsPerTrigger="25").writeStream.format("parquet")
                 .option("path", out).option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
        query.awaitTermination(120)
        assert query.exception() is None, query.exception()

    run_once()
    first = spark.read.parquet(out)
    assert first.count() == 120
    with SyncProducer(live.current_master("g1").client_address, timeout_ms=10_000) as producer:
        for index in range(120, 150):
            assert producer.send(topic, b"rp-%04d" % index, queue_id=index % QUEUES).ok
    run_once()     # resumes from the checkpoint's per-queue offsets: only the 30 new ones
    rows = spark.read.parquet(out).collect()
    bodies = collections.Counter(row.body for row in rows)
    assert sorted(bodies) == [f"rp-{i:04d}" for i in range(150)] and set(bodies.values()) == {1}
    per_queue = collections.defaultdict(list)
    for row in rows:
        per_queue[row.queue_id].append(row.queue_offset)
    assert all(sorted(offsets) == list(range(len(offsets))) for offsets in per_queue.values())
