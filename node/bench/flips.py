"""Bit flips in a running group: one random bit of a random flushed record of a random node,
N times, under a light produce load; then every acked message is read back from every node
and the nodes' logs are compared.

    hastore bench flips --flips 1000 [--seed 7] [--mode static|controller] [--json]

It starts its own 3-node group: static roles, or (``--mode controller``) a ZooKeeper and two
controllers that elect the master, as ``hastore cluster up`` does by default.

Each flip is written into the node's segment file (the node maps it: its reads and its
scrub see the page), on a record below both that node's flushed offset and the master's
confirm offset, so every replica holds an intact copy. A flip is resolved when the node
serves that record's original bytes again (READ_LOG_RANGE on it answers them: repaired)
or names it in its status as lost; the time from the flip to that is the time to repair.
Afterwards: every acked message must be served by every node with its exact body (0 lost,
0 corrupt served) and ``verify_group`` must find the logs the same.

``run_flips`` is the same run against a LocalCluster that is already up (the integration
test calls it with a smaller N).
"""

from __future__ import annotations

import json
import os
import random
import tempfile
import time
from dataclasses import asdict, dataclass, field

import click
import trio

from store import codec
from store.codec import CorruptMessage

from ..client import OutgoingMessage, open_admin, open_producer
from ..client.connection import open_connection
from ..cluster import ClusterTopology, LocalCluster, topology_from_mapping
from ..cluster.verify import group_nodes, verify_group
from ..errors import NodeError, RequestError
from ..wire.protocol import RequestCode

TOPIC = "flips"
QUEUES = 4
FLIP_TIMEOUT_S = 30.0
POLL_S = 0.02
PICK_TRIES_MAX = 50
SECRET = "flip-secret"
BENCH_STORE = {"commitlog_segment_bytes": 1 << 20, "consume_queue_entries_per_file": 4096,
               "index_hash_slots": 1024, "index_max_entries": 65536,
               "scrub_pass_interval_ms": 0,    # the walk goes around at once: a flip is found within a walk
               "scrub_bytes_per_s": 8 * 1024 * 1024,   # as in the figures published before (the default is 4)
               "scrub_busy_bytes_per_s": 8 * 1024 * 1024}   # and as fast while the log grows
MODES = ("static", "controller")


def flips_topology(mode: str = "static") -> ClusterTopology:
    """The bench's 3-node group with small stores; ``mode`` says who picks the master."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not one of {MODES}")
    return topology_from_mapping({"store": dict(BENCH_STORE), "secret": SECRET, "startup_timeout_s": 60,
                                  "controller": {"mode": mode}})


@dataclass(slots=True)
class FlipReport:
    flips: int = 0
    repaired: int = 0
    reported_lost: int = 0
    unresolved: list[dict] = field(default_factory=list)
    repair_ms: list[float] = field(default_factory=list)
    acked: int = 0
    acked_lost: int = 0
    corrupt_served: int = 0
    corrupt_named: int = 0
    divergences: int = 0
    verify_errors: list[str] = field(default_factory=list)

    def summary(self) -> dict:
        times = sorted(self.repair_ms)

        def pct(p: float) -> float | None:
            return round(times[min(len(times) - 1, int(p * len(times)))], 1) if times else None
        data = {k: v for k, v in asdict(self).items() if k != "repair_ms"}
        data["repair_ms"] = {"p50": pct(0.5), "p95": pct(0.95), "p99": pct(0.99),
                             "max": round(times[-1], 1) if times else None,
                             "mean": round(sum(times) / len(times), 1) if times else None}
        data["ok"] = (self.acked_lost == 0 and self.corrupt_served == 0 and not self.unresolved
                      and self.repaired + self.reported_lost == self.flips and self.divergences == 0
                      and not self.verify_errors)
        return data


def flushed_records(segment_path: str, segment_start: int, limit: int) -> list[tuple[int, int]]:
    """(physical offset, size) of the message records of one segment file below ``limit``."""
    with open(segment_path, "rb") as handle:
        data = handle.read()
    records, position = [], 0
    while segment_start + position < limit:
        try:
            header = codec.check_record(data, position, len(data), check_crc=False)
        except CorruptMessage:
            break
        if header.is_blank or segment_start + position + header.total_size > limit:
            break
        records.append((segment_start + position, header.total_size))
        position += header.total_size
    return records


def pick_record(rng: random.Random, store_path: str, limit: int) -> tuple[str, int, int, int] | None:
    """A random flushed record below ``limit``: (segment path, its start, record offset, size)."""
    directory = os.path.join(store_path, "commitlog")
    segments = sorted((int(name), os.path.join(directory, name)) for name in os.listdir(directory) if name.isdigit())
    segments = [(start, path) for start, path in segments if start < limit]
    if not segments:
        return None
    start, path = rng.choice(segments)
    records = flushed_records(path, start, limit)
    if not records:
        return None
    offset, size = rng.choice(records)
    return path, start, offset, size


def flip_bit(path: str, position: int, bit: int) -> bytes:
    """Flip ``bit`` of the byte at ``position`` of ``path``; returns the byte before."""
    fd = os.open(path, os.O_RDWR)
    try:
        before = os.pread(fd, 1, position)
        os.pwrite(fd, bytes([before[0] ^ (1 << bit)]), position)
        return before
    finally:
        os.close(fd)


async def _status(address: str, secret: str | None) -> dict:
    async with open_admin(address, secret=secret) as admin:
        return await admin.status()


async def _produce_load(address: str, secret: str | None, acked: dict, stop: trio.Event, count_max: int) -> None:
    """Small batches until ``stop`` (at most ``count_max`` messages); acked ones into ``acked``."""
    async with open_producer(address, secret=secret, batch_count_max=32) as producer:
        sent = 0
        while not stop.is_set() and sent < count_max:
            bodies = [b"flip-load-%d-" % (sent + i) + os.urandom(24).hex().encode() for i in range(20)]
            try:
                results = await producer.send_batch(TOPIC, [OutgoingMessage(body) for body in bodies])
            except NodeError:
                results = []
            for body, result in zip(bodies, results):
                if result.ok:
                    acked[result.uniq_key] = body
            sent += len(bodies)
            await trio.sleep(0.05)


async def _one_flip(rng: random.Random, nodes: dict, master_address: str, report: FlipReport) -> None:
    for _ in range(PICK_TRIES_MAX):   # a node that has flushed nothing below the confirm offset yet: another
        name, (address, secret, store_path) = rng.choice(sorted(nodes.items()))
        status = await _status(address, secret)
        master_status = await _status(master_address, secret)
        limit = min(status["store"]["flushed_offset"], master_status["replication"].get("confirm_offset", 0))
        picked = await trio.to_thread.run_sync(pick_record, rng, store_path, limit)
        if picked is not None:
            break
        await trio.sleep(0.1)
    else:
        raise NodeError(f"no flushed record below the confirm offset on any node after {PICK_TRIES_MAX} tries")
    path, start, offset, size = picked
    async with open_connection(address, secret=secret) as connection:
        original = (await connection.request(RequestCode.READ_LOG_RANGE, offset=offset, size=1))["data"]
        bit = rng.randrange(size * 8)
        flip_bit(path, offset - start + bit // 8, bit % 8)
        flipped_at = time.monotonic()
        report.flips += 1
        deadline = flipped_at + FLIP_TIMEOUT_S
        polls = 0
        while time.monotonic() < deadline:
            await trio.sleep(POLL_S)
            polls += 1
            try:
                reply = await connection.request(RequestCode.READ_LOG_RANGE, offset=offset, size=1)
                if reply["data"] == original:
                    report.repaired += 1
                    report.repair_ms.append((time.monotonic() - flipped_at) * 1000)
                    return
            except RequestError:
                pass   # RECORD_CORRUPT (or a damaged header: no record starts there) until repaired
            if polls % 10 == 0:
                lost = (await _status(address, secret))["integrity"]["repair"]["lost"]
                if any(item["physical_offset"] == offset for item in lost):
                    report.reported_lost += 1
                    return
    report.unresolved.append({"node": name, "offset": offset, "bit": bit})


async def _read_back(nodes: dict, acked: dict, report: FlipReport) -> None:
    """Every node serves every acked message with its exact body."""
    report.acked = len(acked)
    for name, (address, secret, _) in sorted(nodes.items()):
        served: dict[str, bytes] = {}
        async with open_admin(address, secret=secret) as admin:
            for queue_id in range(QUEUES):
                offset = 0
                for _ in range(100_000):
                    reply = await admin.pull(TOPIC, queue_id, offset, max_count=256)
                    report.corrupt_named += len(reply.get("corrupt") or [])
                    for message in reply["messages"]:
                        served[message.uniq_key] = message.body
                    if reply["next_offset"] <= offset:
                        break
                    offset = reply["next_offset"]
        for key, body in acked.items():
            if key not in served:
                report.acked_lost += 1
            elif served[key] != body:
                report.corrupt_served += 1


async def run_flips(cluster: LocalCluster, flips: int, *, seed: int = 1, group: str = "g1",
                    messages: int = 2000, progress=None) -> FlipReport:
    """Flip ``flips`` bits in ``group`` of a running cluster (see the module docstring)."""
    rng = random.Random(seed)
    members = group_nodes(cluster, group)
    specs = {spec.name: spec for spec in cluster.nodes(group)}
    nodes = {name: (address, secret, specs[name].data_path) for name, (address, secret) in members.items()}
    master_name = cluster.master(group).name
    master_address, secret = members[master_name]
    report = FlipReport()
    acked: dict[str, bytes] = {}
    async with open_admin(master_address, secret=secret) as admin:
        await admin.create_topic(TOPIC, QUEUES)
    async with open_producer(master_address, secret=secret, batch_count_max=100) as producer:
        for first in range(0, messages, 100):
            bodies = [b"flip-%d-" % i + os.urandom(40).hex().encode() for i in range(first, min(first + 100, messages))]
            for body, result in zip(bodies, await producer.send_batch(TOPIC, [OutgoingMessage(b) for b in bodies])):
                if result.ok:
                    acked[result.uniq_key] = body
    async with trio.open_nursery() as nursery:
        stop = trio.Event()
        nursery.start_soon(_produce_load, master_address, secret, acked, stop, 20 * flips + 1000)
        for _ in range(flips):
            await _one_flip(rng, nodes, master_address, report)
            if progress is not None:
                progress()
        stop.set()
    await trio.sleep(1.0)    # the last acks reach every replica's confirm offset
    await _read_back(nodes, acked, report)
    verified = await verify_group(group, members)
    report.divergences = len(verified.divergences)
    report.verify_errors = verified.errors
    return report


@click.command("flips")
@click.option("--flips", "flips", default=1000, show_default=True, type=click.IntRange(1, 100_000))
@click.option("--seed", default=1, show_default=True, type=int)
@click.option("--messages", default=2000, show_default=True, type=click.IntRange(100, 1_000_000),
              help="Messages produced before the first flip (a light load keeps producing during the flips).")
@click.option("--mode", default="static", show_default=True, type=click.Choice(MODES),
              help="static: roles fixed in the topology; controller: a ZooKeeper and two controllers elect the master.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def bench_flips_command(flips, seed, messages, mode, as_json) -> None:
    """Flip random bits in a running 3-node group; time to repair, acked messages lost, corrupt served."""
    with tempfile.TemporaryDirectory(prefix="hastore-flips-") as directory:
        cluster = LocalCluster(directory, flips_topology(mode))
        cluster.up()
        try:
            started = time.monotonic()
            report = trio.run(lambda: run_flips(cluster, flips, seed=seed, messages=messages))
            elapsed = time.monotonic() - started
        finally:
            cluster.down()
    summary = {"bench": "flips", "mode": mode, "seed": seed, "seconds": round(elapsed, 1), **report.summary()}
    if as_json:
        click.echo(json.dumps(summary))
    else:
        for key, value in summary.items():
            click.echo(f"{key}: {value}")
    if not summary["ok"]:
        raise SystemExit(1)
