"""The streaming half of ``hastore bench pipeline``: end-to-end latency of the ``hastore``
source, from a producer's send to the micro-batch that holds the message, with a 100 ms
trigger.

A static local cluster of one group (a master and two slaves, sync replication: what a
message needs before it is acknowledged and readable) is started in a temporary directory;
a streaming query reads its topic with ``processingTime=100 ms`` and hands each micro-batch
to ``foreachBatch``, which notes the time it sees each message. A producer sends ``count``
messages, each carrying its send time, at a steady pace. The latency of a message is the
time its micro-batch was seen minus its send time; p50, p99 and max are reported.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time

TOPIC = "bench-stream"
QUEUES = 4
TRIGGER = "100 milliseconds"
SMALL_STORE = {"commitlog_segment_bytes": 16 << 20, "consume_queue_entries_per_file": 4096,
               "index_hash_slots": 1024, "index_max_entries": 8192}


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def measure_stream_latency(spark, count: int = 300, pace_s: float = 0.02, timeout_s: float = 120,
                           options: dict | None = None) -> dict:
    """Latency figures (ms) of ``count`` messages through a 100 ms trigger query (``options``:
    more options of the source, e.g. ``{"rowsPerPartition": 1}`` for a task per queue)."""
    from node.client import SyncAdmin, SyncProducer
    from node.cluster import LocalCluster, topology_from_mapping
    directory = tempfile.mkdtemp(prefix="hastore-bench-stream-")
    cluster = LocalCluster(os.path.join(directory, "cluster"), topology_from_mapping(
        {"store": dict(SMALL_STORE), "startup_timeout_s": 30, "controller": {"mode": "static"}}))
    seen: dict[int, float] = {}
    lock = threading.Lock()

    def note(batch_df, batch_id) -> None:
        rows = batch_df.select("body").collect()
        now = time.time()
        with lock:
            for row in rows:
                seen.setdefault(int(bytes(row.body).split(b" ")[0]), now)
    query = None
    phases: dict[str, float] = {}
    try:
        cluster.up()
        master = cluster.master("g1").client_address
        with SyncAdmin(master, timeout_ms=10_000) as admin:
            admin.create_topic(TOPIC, QUEUES)
        reader = spark.readStream.format("hastore").options(**(options or {}))
        query = (reader.option("bootstrap", master).option("topics", TOPIC).option("startingOffsets", "latest").load()
                 .writeStream.foreachBatch(note).trigger(processingTime=TRIGGER).start())
        _wait_for_first_batch(query, timeout_s)
        sent: dict[int, float] = {}
        with SyncProducer(master, timeout_ms=10_000) as producer:
            for index in range(count):
                at = time.time()
                result = producer.send(TOPIC, b"%d %.6f" % (index, at))
                if result.ok:
                    sent[index] = at
                time.sleep(pace_s)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with lock:
                if set(sent) <= set(seen):
                    break
            if query.exception() is not None:
                raise RuntimeError(f"the streaming query failed: {query.exception()}")
            time.sleep(0.2)
        phases = batch_phases(query.recentProgress)
    finally:
        if query is not None:
            query.stop()
        cluster.down()
        shutil.rmtree(directory, ignore_errors=True)
    latencies = [(seen[index] - at) * 1000 for index, at in sent.items() if index in seen]
    figures = {"trigger": TRIGGER, "options": dict(options or {}), "messages": len(sent), "received": len(latencies)}
    if latencies:
        figures.update(p50_ms=round(_percentile(latencies, 0.5), 1), p99_ms=round(_percentile(latencies, 0.99), 1),
                       max_ms=round(max(latencies), 1))
    figures["micro_batch_ms_p50"] = phases
    return figures


def batch_phases(progress: list) -> dict[str, float]:
    """The median of each phase Spark timed over the query's recent micro-batches that read
    rows (``durationMs`` of its progress reports: ``triggerExecution`` is the whole batch,
    ``latestOffset`` the source's offsets query, ``addBatch`` the read and the sink): where a
    message's latency beyond the trigger interval goes."""
    timed: dict[str, list[float]] = {}
    for report in progress:
        durations, rows = _field(report, "durationMs"), _field(report, "numInputRows")
        if not durations or not rows:
            continue
        for phase, value in dict(durations).items():
            timed.setdefault(phase, []).append(float(value))
    return {phase: _percentile(values, 0.5) for phase, values in sorted(timed.items())}


def _wait_for_first_batch(query, timeout_s: float) -> None:
    """Until the query has run a micro-batch (its planning connection is open, its start done)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not query.recentProgress:
        if query.exception() is not None:
            raise RuntimeError(f"the streaming query failed: {query.exception()}")
        time.sleep(0.1)


def _field(report, name: str):
    """A field of a progress report: a StreamingQueryProgress (PySpark 4) or its dict form."""
    value = getattr(report, name, None)     # StreamingQueryProgress is a dict too: its property first
    return report.get(name) if value is None and isinstance(report, dict) else value
