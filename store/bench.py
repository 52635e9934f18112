"""``hastore bench store``: storage engine throughput and latency against a floor measured in the same run.

The floor is the least work a Python store can do per message: pack one header, copy a
1 KiB body into an mmap and CRC32 it. Every figure is also printed as a ratio to it.
"""

from __future__ import annotations

import json
import mmap
import os
import random
import shutil
import statistics
import struct
import tempfile
import threading
import time

import click

from . import codec
from .config import GIB, StoreConfig
from .message import Message
from .message_store import MessageStore

BODY_BYTES = 1024


def measure_floor(count: int) -> float:
    """Messages per second of pack + copy + CRC32 into an mmap (pages already faulted in),
    with the CRC32 the store uses (``codec.crc32``)."""
    size = 1 << 26
    area = mmap.mmap(-1, size)
    area[:] = bytes(size)
    body = os.urandom(BODY_BYTES)
    header = codec.HEADER
    host = codec.encode_host("127.0.0.1:10911")
    record = header.size + BODY_BYTES
    position = 0
    started = time.perf_counter()
    for sequence in range(count):
        if position + record > size:
            position = 0
        header.pack_into(area, position, record, codec.MESSAGE_MAGIC, codec.crc32(body) & 0x7FFFFFFF, 0, 0,
                         sequence, position, 0, 0, host, 0, host, 0, 0, BODY_BYTES)
        area[position + header.size:position + record] = body
        position += record
    elapsed = time.perf_counter() - started
    area.close()
    return count / elapsed


def _messages(count: int, topic: str, queues: int, offset: int = 0) -> list[Message]:
    body = os.urandom(BODY_BYTES)
    return [Message(topic=topic, queue_id=(offset + i) % queues, body=body, keys=[f"key-{offset + i}"], tags="bench",
                    properties={"UNIQ_KEY": f"{offset + i:032X}"}) for i in range(count)]


def _store(path: str, **settings) -> MessageStore:
    config = StoreConfig(store_path=path, **settings)
    store = MessageStore(config)
    store.start()
    return store


def measure_append(root: str, count: int, batch: int, flush: str, writers: int = 1) -> float:
    """Messages per second through put_batch, dispatch running as usual."""
    path = tempfile.mkdtemp(dir=root)
    store = _store(path, flush=flush, commitlog_segment_bytes=GIB, index_hash_slots=500_000,
                   index_max_entries=2_000_000)
    try:
        per_writer = count // writers
        prepared = [[_messages(batch, "bench", 8, w * per_writer + i) for i in range(0, per_writer, batch)]
                    for w in range(writers)]
        store.put_batch(_messages(batch, "warm", 1))

        def write(batches) -> None:
            for messages in batches:
                store.put_batch(messages)

        started = time.perf_counter()
        threads = [threading.Thread(target=write, args=(prepared[w],)) for w in range(writers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - started
        return per_writer * writers / elapsed
    finally:
        store.shutdown()
        shutil.rmtree(path, ignore_errors=True)


def measure_dispatch(root: str, count: int) -> float:
    """Messages per second of ConsumeQueue + IndexFile building from an undispatched log."""
    path = tempfile.mkdtemp(dir=root)
    store = _store(path, commitlog_segment_bytes=GIB, index_hash_slots=500_000, index_max_entries=2_000_000)
    try:
        store.dispatcher.stop()
        written = 0
        for start in range(0, count, 256):
            written += len(store.append(_messages(min(256, count - start), "bench", 8, start)))
        started = time.perf_counter()
        dispatched = store.dispatcher.catch_up()
        elapsed = time.perf_counter() - started
        if dispatched != written:
            raise RuntimeError(f"dispatched {dispatched} of {written} messages")
        store.dispatcher.start()
        return dispatched / elapsed
    finally:
        store.shutdown()
        shutil.rmtree(path, ignore_errors=True)


def measure_recovery_and_lookup(root: str, store_bytes: int, lookups: int) -> dict:
    """Build a store of ``store_bytes``, kill it (halt), time recovery; then time key lookups."""
    path = tempfile.mkdtemp(dir=root)
    settings = dict(commitlog_segment_bytes=GIB, flush="async")
    store = _store(path, **settings)
    written = 0
    sequence = 0
    batch = 256
    body = os.urandom(BODY_BYTES)
    while written < store_bytes:
        results = store.put_batch([Message(topic="recover", queue_id=(sequence + i) % 16, body=body,
                                           keys=[f"key-{sequence + i}"], tags="bench") for i in range(batch)])
        written += sum(r.wrote_bytes for r in results)
        sequence += batch
    store.wait_dispatched(timeout_s=600)
    time.sleep(settings.get("checkpoint_interval_ms", 1000) / 1000 * 1.5)  # a checkpoint as in steady state
    store.halt()
    started = time.perf_counter()
    store = _store(path, **settings)
    recovery_s = time.perf_counter() - started
    report = store.recovery
    key_indexes = [random.randrange(sequence) for _ in range(lookups)]
    latencies = []
    found = 0
    for key_index in key_indexes:
        begin = time.perf_counter()
        hits = store.query_by_key("recover", f"key-{key_index}", max_count=4)
        latencies.append((time.perf_counter() - begin) * 1e6)
        found += len(hits) == 1
    store.halt()
    # the same store with no usable checkpoint: RocketMQ's rule, last segments CRC-scanned
    os.unlink(os.path.join(path, "checkpoint"))
    started = time.perf_counter()
    store = _store(path, **settings)
    fallback_s = time.perf_counter() - started
    fallback = store.recovery
    store.shutdown()
    shutil.rmtree(path, ignore_errors=True)
    latencies.sort()
    return {
        "store_bytes": written, "messages": sequence,
        "recovery_s": round(recovery_s, 3), "recovery_scanned_bytes": report.end_offset - report.scan_start_offset,
        "recovery_redispatched": report.redispatched_messages,
        "recovery_without_checkpoint_s": round(fallback_s, 3),
        "recovery_without_checkpoint_scanned_bytes": fallback.end_offset - fallback.scan_start_offset,
        "recovery_without_checkpoint_redispatched": fallback.redispatched_messages,
        "key_lookups": lookups, "key_lookups_found": found,
        "key_lookup_p50_us": round(latencies[len(latencies) // 2], 1),
        "key_lookup_p99_us": round(latencies[int(len(latencies) * 0.99)], 1),
    }


def run(count: int, sync_count: int, store_gib: float, lookups: int, runs: int, directory: str | None) -> dict:
    root = tempfile.mkdtemp(prefix="hastore-bench-", dir=directory)
    try:
        samples: dict[str, list[float]] = {}

        def sample(name: str, value: float) -> None:
            samples.setdefault(name, []).append(value)

        for _ in range(runs):
            sample("floor_msgs_per_s", measure_floor(count))
            sample("append_batch1_async_msgs_per_s", measure_append(root, count // 4, 1, "async"))
            sample("append_batch32_async_msgs_per_s", measure_append(root, count, 32, "async"))
            sample("append_batch32_sync_msgs_per_s", measure_append(root, sync_count, 32, "sync"))
            sample("append_batch1_sync_4writers_msgs_per_s", measure_append(root, sync_count // 4, 1, "sync", writers=4))
            sample("dispatch_msgs_per_s", measure_dispatch(root, count))
        result: dict = {"body_bytes": BODY_BYTES, "runs": runs, "messages_per_run": count}
        for name, values in samples.items():
            result[name] = round(statistics.median(values))
        floor = result["floor_msgs_per_s"]
        result["ratios_to_floor"] = {name: round(result[name] / floor, 3) for name in samples if name != "floor_msgs_per_s"}
        if store_gib > 0:
            result["recovery"] = measure_recovery_and_lookup(root, int(store_gib * GIB), lookups)
        result["targets"] = {
            "append_batch32_async_msgs_per_s >= 300000": result["append_batch32_async_msgs_per_s"] >= 300_000,
            "dispatch_msgs_per_s >= 200000": result["dispatch_msgs_per_s"] >= 200_000,
        }
        if store_gib > 0:
            result["targets"]["recovery_s <= 5"] = result["recovery"]["recovery_s"] <= 5
            result["targets"]["key_lookup_p99_us <= 1000"] = result["recovery"]["key_lookup_p99_us"] <= 1000
        return result
    finally:
        shutil.rmtree(root, ignore_errors=True)


@click.command("store")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@click.option("--count", default=200_000, show_default=True, help="Messages per throughput measurement.")
@click.option("--sync-count", default=20_000, show_default=True, help="Messages per sync-flush measurement.")
@click.option("--store-gib", default=2.0, show_default=True,
              help="Size of the store built for the recovery and key-lookup figures (0 skips them).")
@click.option("--lookups", default=2000, show_default=True, help="Key lookups timed.")
@click.option("--runs", default=3, show_default=True, help="Runs of each throughput figure; medians are printed.")
@click.option("--dir", "directory", default=None, help="Where to build the stores (default: the temp directory).")
def bench_store_command(as_json: bool, count: int, sync_count: int, store_gib: float, lookups: int, runs: int,
                        directory: str | None) -> None:
    """Append, dispatch, recovery and key-lookup figures of the storage engine, 1 KiB bodies.

    The floor (pack a header, copy the body into an mmap, CRC32) is measured in the same
    run and every throughput is also given as a ratio to it.
    """
    if count < 1000 or sync_count < 100 or runs < 1:
        raise click.BadParameter("--count >= 1000, --sync-count >= 100 and --runs >= 1")
    result = run(count, sync_count, store_gib, lookups, runs, directory)
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    for name, value in result.items():
        click.echo(f"{name}: {value}")
