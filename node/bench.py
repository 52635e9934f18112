"""``hastore bench produce`` and ``hastore bench consume``: a node started by the benchmark
on loopback (async flush, 1 KiB messages), measured against a bare trio echo round trip
in the same run (the floor). Every loop is bounded by a count and a deadline."""

from __future__ import annotations

import functools
import json
import statistics
import tempfile
import time

import click
import trio

from .client import OutgoingMessage, open_admin, open_producer
from .config import NodeConfig
from .node import serve_node
from .protocol import RequestCode

BODY = b"b" * 1024
DEADLINE_S = 60


def _bench_config(root: str) -> NodeConfig:
    return NodeConfig(node_id="bench", store_path=root, client_address="127.0.0.1:0", metrics_address="127.0.0.1:0",
                      store={"commitlog_segment_bytes": 1 << 30, "index_hash_slots": 500_000,
                             "index_max_entries": 2_000_000})


async def _echo_floor(samples: int) -> list[float]:
    """Round trips of one small frame through a bare trio echo server on loopback (µs)."""
    async def echo(stream):
        while data := await stream.receive_some(65536):
            await stream.send_all(data)
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, echo, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        frame = b"x" * 1100
        times = []
        for _ in range(samples):
            started = time.perf_counter()
            await stream.send_all(frame)
            got = 0
            while got < len(frame):
                got += len(await stream.receive_some(65536))
            times.append((time.perf_counter() - started) * 1e6)
        await stream.aclose()
        nursery.cancel_scope.cancel()
    return times


def _percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


async def _throughput(address: str, total: int, batch: int, in_flight: int) -> float:
    async with open_producer(address, batch_count_max=batch, in_flight_max=in_flight) as producer:
        slots = trio.Semaphore(in_flight)
        started = time.perf_counter()
        async def one(count):
            try:
                results = await producer.send_batch("bench", [OutgoingMessage(BODY) for _ in range(count)])
                assert all(r.ok for r in results)
            finally:
                slots.release()
        with trio.fail_after(DEADLINE_S):
            async with trio.open_nursery() as nursery:
                for first in range(0, total, batch):
                    await slots.acquire()
                    nursery.start_soon(one, min(batch, total - first))
        return total / (time.perf_counter() - started)


async def _produce(messages: int, samples: int) -> dict:
    floor = await _echo_floor(samples)
    with tempfile.TemporaryDirectory(prefix="hastore-bench-") as root:
        async with trio.open_nursery() as nursery:
            node = await nursery.start(serve_node, _bench_config(root))
            address = node.client_address
            async with open_admin(address) as admin:
                await admin.create_topic("bench", 4)
                latencies = []
                wire = [OutgoingMessage(BODY).to_wire()]
                with trio.fail_after(DEADLINE_S):
                    for _ in range(samples):
                        started = time.perf_counter()
                        await admin.connection.request(RequestCode.SEND, topic="bench", messages=wire)
                        latencies.append((time.perf_counter() - started) * 1e6)
            figures = {
                "batch_1_in_flight_1_msgs_per_s": await _throughput(address, messages // 10, 1, 1),
                "batch_1_in_flight_16_msgs_per_s": await _throughput(address, messages // 10, 1, 16),
                "batch_64_in_flight_1_msgs_per_s": await _throughput(address, messages, 64, 1),
                "batch_64_in_flight_8_msgs_per_s": await _throughput(address, messages, 64, 8),
            }
            nursery.cancel_scope.cancel()
    floor_p50, floor_p99 = _percentile(floor, 50), _percentile(floor, 99)
    p50, p99 = _percentile(latencies, 50), _percentile(latencies, 99)
    return {"message_bytes": len(BODY), "flush": "async",
            "echo_floor_p50_us": round(floor_p50, 1), "echo_floor_p99_us": round(floor_p99, 1),
            "send_single_p50_us": round(p50, 1), "send_single_p99_us": round(p99, 1),
            "send_single_p50_ratio_to_floor": round(p50 / floor_p50, 2),
            "send_single_p99_ratio_to_floor": round(p99 / floor_p99, 2),
            **{k: round(v) for k, v in figures.items()},
            "targets": {"batched_msgs_per_s_min": 100_000, "single_p50_ratio_max": 1.7}}


@click.command("produce")
@click.option("--messages", default=200_000, show_default=True, type=click.IntRange(1000, 5_000_000),
              help="Messages per batched run (single-message runs send a tenth).")
@click.option("--samples", default=2000, show_default=True, type=click.IntRange(100, 100_000),
              help="Round trips for the latency figures and the echo floor.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as one JSON object.")
def bench_produce_command(messages: int, samples: int, as_json: bool) -> None:
    """Send throughput (batches of 1 and 64, several in flight) and single-send latency
    against a node on loopback, with a bare trio echo round trip as the floor."""
    figures = trio.run(_produce, messages, samples)
    click.echo(json.dumps(figures, indent=None if as_json else 2))


async def _consume(messages: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="hastore-bench-") as root:
        async with trio.open_nursery() as nursery:
            node = await nursery.start(serve_node, _bench_config(root))
            address = node.client_address
            async with open_admin(address) as admin:
                await admin.create_topic("bench", 1)
            await _throughput(address, messages, 64, 8)
            async with open_admin(address) as admin:
                with trio.fail_after(DEADLINE_S):
                    while (await admin.queue_offsets("bench", 0))[1] < messages:
                        await trio.sleep(0.01)
                    started = time.perf_counter()
                    offset = received = 0
                    while received < messages:
                        reply = await admin.pull("bench", 0, offset, 1024)
                        received += len(reply["messages"])
                        offset = reply["next_offset"]
                    elapsed = time.perf_counter() - started
            nursery.cancel_scope.cancel()
    return {"message_bytes": len(BODY), "messages": messages, "pull_batch": 1024,
            "consume_msgs_per_s": round(messages / elapsed), "consume_mib_per_s": round(messages * 1024 / elapsed / 2**20, 1)}


@click.command("consume")
@click.option("--messages", default=100_000, show_default=True, type=click.IntRange(1000, 5_000_000))
@click.option("--json", "as_json", is_flag=True, help="Print the figures as one JSON object.")
def bench_consume_command(messages: int, as_json: bool) -> None:
    """Pull throughput of one queue (batches of 1024) from a node on loopback."""
    figures = trio.run(_consume, messages)
    click.echo(json.dumps(figures, indent=None if as_json else 2))
