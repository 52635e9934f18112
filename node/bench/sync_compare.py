"""``hastore bench replicate --peer redis``: hastore's sync replication beside Redis + WAIT.

Both sides run at once on this machine, each a primary with two replicas on loopback:

    hastore   one master and two slaves (``hastore node start`` processes), sync replication,
              every member of the sync-state set acks (``all_ack_in_sync_state_set``), async
              flush; plus one node alone (no slave) for what replication adds to a send
    redis     a primary and two replicas (node/bench/redis_peer.py), AOF everysec

and the same workloads, 1 KiB messages, from this process:

    batched   hastore's Producer, batches of 64, 8 in flight  |  pipelines of 100 XADD + WAIT 2
    single    one send at a time, p50 / p99 of its round trip |  XADD + WAIT 2 per message
    alone     one send at a time to the node alone            |  XADD alone (no WAIT)

The floor: single sends also alternate with round trips through a relay of the same shape
(node/bench/relay_floor.py: a trio master relaying each request to two slaves that hold
it in memory and ack, the reply leaving with the last ack), with nothing of a store in it.
Its p50 is what Python, trio and this machine's loopback take for the message flow alone;
each side's single p50 over it (``floor_ratios``) is what that side's own work adds.

Each round runs every workload on both sides, alternating which side goes first; single
and alone sends alternate between the sides (single sends with the floor's round trips
too) in blocks of ``LATENCY_BLOCK``, so that all meet the same spells of a noisy machine.
Over ``--rounds`` rounds (3 by default) the medians of each figure are taken and their
ratios reported, hastore over Redis: ``batched`` and ``batched_per_cpu`` above 1,
``single_p50`` and ``single_p99`` below 1 favour hastore.

CPU: utime + stime (+ children reaped) of every process of a side, and of this client
process, from /proc/PID/stat, read right before and after each measured window; per
message in µs, and messages per CPU-second of the whole side (client included).

Stored what was acked: after each workload, every member of both sides is asked what it
holds: hastore's slaves must end their log past the last acked message at once (an ack
means every member of the sync-state set holds it), and each node's queues must count
every acked message once dispatched; Redis's XLEN on each member must reach the acked
count. Every loop is bounded by a count and a deadline; every process is stopped by pid.

Where the time went, round by round, and what was tried: docs/sync-performance.md.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import tempfile
import time
from operator import attrgetter

import click
import trio

from ..client import OutgoingMessage, open_admin, open_producer
from ..errors import BenchPeerError
from . import batch_costs, redis_peer
from .cpu_meter import CpuMeter
from .relay_floor import FloorClient, RelayFloor

BODY = b"r" * 1024
REPLICAS = 2
BATCH_MESSAGES = 64
IN_FLIGHT = 8
QUEUES = 4
LATENCY_BLOCK = 100
SETUP_DEADLINE_S = 120
FLOOR_REPLY_BYTES = 64   # about a single send's reply
STORED_DEADLINE_S = 60
_STATUS = attrgetter("status")   # a SendResult's; "PUT_OK" is what ``ok`` checks
_PUT_OK = "PUT_OK"
TARGETS = {"batched_min": 1.5, "batched_per_cpu_min": 1.5, "single_p50_max": 1.3, "single_p99_max": 1.5}
# big segments and index files: no roll-over mid-measurement (as node/bench/produce.py)
NODE_SETTINGS = {"flush": "async",
                 "store": {"commitlog_segment_bytes": 1 << 30, "index_hash_slots": 1_000_000,
                           "index_max_entries": 4_000_000}}
SYNC_SETTINGS = {"replication": "sync", "min_in_sync_replicas": REPLICAS + 1, "all_ack_in_sync_state_set": True}


# --- the hastore side ----------------------------------------------------------------------
class HastoreSide:
    """A master with two slaves (all-ack sync replication) and a node alone, as processes."""

    def __init__(self) -> None:
        self.nodes: dict[str, object] = {}

    @property
    def group_pids(self) -> dict[str, int]:
        return {name: node.pid for name, node in self.nodes.items() if name != "alone"}

    @property
    def master_address(self) -> str:
        return self.nodes["master"].client_address

    @property
    def alone_address(self) -> str:
        return self.nodes["alone"].client_address

    @classmethod
    def start(cls, directory: str) -> "HastoreSide":
        from ..cluster.process import NodeProcess, free_port
        side = cls()
        try:
            master_ha = f"127.0.0.1:{free_port()}"
            side.nodes["master"] = NodeProcess.start(os.path.join(directory, "master"), {
                **NODE_SETTINGS, **SYNC_SETTINGS, "node_id": "master", "ha_address": master_ha})
            for index in range(REPLICAS):
                side.nodes[f"slave{index}"] = NodeProcess.start(os.path.join(directory, f"slave{index}"), {
                    **NODE_SETTINGS, **SYNC_SETTINGS, "node_id": f"slave{index}", "role": "slave",
                    "ha_address": f"127.0.0.1:{free_port()}", "master_ha_address": master_ha,
                    "master_client_address": side.master_address})
            side.nodes["alone"] = NodeProcess.start(os.path.join(directory, "alone"),
                                                    {**NODE_SETTINGS, "node_id": "alone"})
        except BaseException:
            side.stop()
            raise
        return side

    def stop(self) -> None:
        for node in reversed(list(self.nodes.values())):
            node.stop()

    async def wait_in_sync(self) -> None:
        """Until the master's sync-state set holds both slaves."""
        with trio.fail_after(SETUP_DEADLINE_S):
            while len((await _status(self.master_address))["replication"]["sync_state_set"]) < REPLICAS + 1:
                await trio.sleep(0.05)

    async def create_topics(self, topics: list[str]) -> None:
        for address in (self.master_address, self.alone_address):
            async with open_admin(address) as admin:
                for topic in topics:
                    await admin.create_topic(topic, queue_count=QUEUES)

    async def stored(self, topic: str, acked: int, last_acked_offset: int) -> dict:
        """What each member of the group holds of ``topic`` right after a workload."""
        names = list(self.group_pids)
        addresses = {name: self.nodes[name].client_address for name in names}
        # first, at once: every slave's log ends past the last acked message
        log_ends = {name: (await _status(address))["store"]["max_physical_offset"]
                    for name, address in addresses.items()}
        counts = {}
        with trio.move_on_after(STORED_DEADLINE_S):  # then the queues, once dispatched
            for name, address in addresses.items():
                while True:
                    counts[name] = await _message_count(address, topic)
                    if counts[name] >= acked:
                        break
                    await trio.sleep(0.05)
        ok = all(end > last_acked_offset for end in log_ends.values()) and \
            all(counts.get(name, 0) >= acked for name in names)
        return {"acked": acked, "held": counts, "log_end": log_ends, "last_acked_offset": last_acked_offset,
                "ok": ok}


async def _status(address: str) -> dict:
    async with open_admin(address) as admin:
        return await admin.status()


async def _message_count(address: str, topic: str) -> int:
    async with open_admin(address) as admin:
        total = 0
        for queue_id in range(QUEUES):
            total += (await admin.queue_offsets(topic, queue_id))[1]
        return total


async def hastore_batched(address: str, topic: str, meter: CpuMeter, *, seconds: float,
                          messages_max: int, batch_messages: int = BATCH_MESSAGES) -> dict:
    """Batches of ``batch_messages`` (64), 8 in flight, until ``seconds`` pass or
    ``messages_max`` are sent."""
    acked = failed = 0
    last_offset = -1
    async with open_producer(address, batch_count_max=batch_messages, in_flight_max=IN_FLIGHT) as producer:
        started = time.perf_counter()
        deadline = started + seconds

        async def worker() -> None:
            nonlocal acked, failed, last_offset
            while time.perf_counter() < deadline and acked + failed < messages_max:
                results = await producer.send_batch(topic, [OutgoingMessage(BODY) for _ in range(batch_messages)])
                ok = sum(map(_PUT_OK.__eq__, map(_STATUS, results)))   # no Python frame a message,
                acked += ok                                             # as Redis's side counts a
                failed += len(results) - ok                             # pipeline by its WAIT
                if ok:
                    # a batch's records are written in its order: its last ok result is its highest
                    last_offset = max(last_offset, next(r.physical_offset for r in reversed(results) if r.ok))

        meter.begin()
        with trio.fail_after(seconds + SETUP_DEADLINE_S):
            async with trio.open_nursery() as nursery:
                for _ in range(IN_FLIGHT):
                    nursery.start_soon(worker)
        meter.end()
        elapsed = time.perf_counter() - started
    return {"acked": acked, "failed": failed, "seconds": round(elapsed, 3), "msgs_per_s": round(acked / elapsed, 1),
            "msgs_per_cpu_s": meter.messages_per_cpu_s(acked), "cpu_us_per_msg": meter.per_message_us(acked),
            "last_acked_offset": last_offset}


class _HastoreSingle:
    """One send at a time on one producer, timed; blocks of it alternate with Redis's."""

    def __init__(self, producer, topic: str, meter: CpuMeter) -> None:
        self.producer, self.topic, self.meter = producer, topic, meter
        self.times: list[float] = []
        self.failed = 0
        self.last_offset = -1

    async def block(self, count: int, deadline: float) -> None:
        self.meter.begin()
        for _ in range(count):
            if time.perf_counter() > deadline:
                break
            began = time.perf_counter()
            result = await self.producer.send(self.topic, BODY)
            if result.ok:
                self.times.append((time.perf_counter() - began) * 1e6)
                self.last_offset = max(self.last_offset, result.physical_offset)
            else:
                self.failed += 1
        self.meter.end()

    def figures(self) -> dict:
        figures = redis_peer.latency_figures(self.times, self.failed)
        return {**figures, "cpu_us_per_msg": self.meter.per_message_us(figures["acked"]),
                "last_acked_offset": self.last_offset}


class _RedisSingle:
    """The Redis side of a latency block: XADD (+ WAIT 2) one at a time."""

    def __init__(self, client, key: str, meter: CpuMeter, wait: bool) -> None:
        self.client, self.key, self.meter, self.wait = client, key, meter, wait
        self.times: list[float] = []
        self.failed = 0

    def block(self, count: int, deadline: float) -> None:
        self.meter.begin()
        figures = redis_peer.run_single_times(self.client, self.key, samples=count, deadline=deadline,
                                              wait=self.wait)
        self.meter.end()
        self.times.extend(figures[0])
        self.failed += figures[1]

    def figures(self) -> dict:
        figures = redis_peer.latency_figures(self.times, self.failed)
        return {**figures, "cpu_us_per_msg": self.meter.per_message_us(figures["acked"])}


class _FloorSingle:
    """The relay floor's round trips, in blocks beside the sides' single sends."""

    def __init__(self, client: FloorClient, meter: CpuMeter) -> None:
        self.client, self.meter = client, meter

    async def block(self, count: int, deadline: float) -> None:
        self.meter.begin()
        await self.client.round_trips(count, deadline)
        self.meter.end()

    def figures(self) -> dict:
        figures = redis_peer.latency_figures(self.client.times, 0)
        return {**figures, "cpu_us_per_msg": self.meter.per_message_us(figures["acked"])}


# --- rounds --------------------------------------------------------------------------------
class Comparison:
    """Both sides, started once; ``run_round`` measures every workload on both."""

    def __init__(self, hastore: HastoreSide, redis_group, *, seconds: float, samples: int,
                 messages_max: int, floor: RelayFloor | None = None, client_busy_poll_us: int = 0) -> None:
        self.hastore = hastore
        self.client_busy_poll_us = client_busy_poll_us   # the single sends' Producer's busy_poll_us
        self.redis_group = redis_group
        self.floor = floor
        self.redis = redis_group.primary_client() if redis_group is not None else None
        self.seconds = seconds
        self.samples = samples
        self.messages_max = messages_max

    def close(self) -> None:
        if self.redis is not None:
            self.redis.close()

    async def run_round(self, index: int) -> dict:
        """Every workload on both sides (hastore first in even rounds, Redis in odd ones)."""
        names = {workload: f"sync-compare-{index}-{workload}" for workload in ("batched", "single", "alone")}
        await self.hastore.create_topics(list(names.values()))
        hastore_first = index % 2 == 0
        figures: dict = {"round": index + 1, "first": "hastore" if hastore_first or self.redis is None else "redis",
                         "hastore": {}, "redis": {} if self.redis is not None else None,
                         "floor": {} if self.floor is not None else None}
        for side in (("hastore", "redis") if hastore_first else ("redis", "hastore")):
            if side == "hastore":
                figures["hastore"]["batched"] = await hastore_batched(
                    self.hastore.master_address, names["batched"], CpuMeter(self.hastore.group_pids),
                    seconds=self.seconds, messages_max=self.messages_max)
            elif self.redis is not None:
                figures["redis"]["batched"] = self._redis_batched(names["batched"])
        for workload, wait in (("single", True), ("alone", False)):
            address = self.hastore.master_address if wait else self.hastore.alone_address
            pids = self.hastore.group_pids if wait else {"alone": self.hastore.nodes["alone"].pid}
            await self._latency(figures, workload, address, pids, names[workload], wait, hastore_first)
        figures["stored"] = await self._stored(figures, names)
        if self.redis_group is not None:
            for key in names.values():
                self.redis_group.delete(key)
        return figures

    def _redis_batched(self, key: str) -> dict:
        meter = CpuMeter(self.redis_group.pids)
        meter.begin()
        figures = redis_peer.run_batched(self.redis, key, seconds=self.seconds, messages_max=self.messages_max)
        meter.end()
        return {**figures, "msgs_per_cpu_s": meter.messages_per_cpu_s(figures["acked"]),
                "cpu_us_per_msg": meter.per_message_us(figures["acked"])}

    async def _latency(self, figures: dict, workload: str, address: str, pids: dict, topic: str, wait: bool,
                       hastore_first: bool) -> None:
        """Single sends to both sides, alternating in blocks of LATENCY_BLOCK."""
        deadline = time.perf_counter() + max(30.0, self.samples * 0.05)
        async with open_producer(address, batch_count_max=1, linger_ms=0,
                                 busy_poll_us=self.client_busy_poll_us) as producer:
            await producer.send(topic, BODY)  # the connection is open before timing starts
            hastore = _HastoreSingle(producer, topic, CpuMeter(pids))
            redis = None
            if self.redis is not None:
                redis_pids = self.redis_group.pids if wait else {"primary": self.redis_group.primary.pid}
                redis = _RedisSingle(self.redis, topic, CpuMeter(redis_pids), wait)
            floor = None
            if wait and self.floor is not None:
                floor = _FloorSingle(await FloorClient.connect(self.floor.client_port, BODY, FLOOR_REPLY_BYTES),
                                     CpuMeter(self.floor.pids))
                await floor.client.round_trips(1, deadline)   # the connection is open before timing starts
                floor.client.times.clear()
            try:
                done = 0
                while done < self.samples and time.perf_counter() < deadline:
                    count = min(LATENCY_BLOCK, self.samples - done)
                    if hastore_first or redis is None:
                        await hastore.block(count, deadline)
                    if redis is not None:
                        redis.block(count, deadline)
                    if not hastore_first and redis is not None:
                        await hastore.block(count, deadline)
                    if floor is not None:
                        await floor.block(count, deadline)
                    done += count
            finally:
                if floor is not None:
                    await floor.client.aclose()
        figures["hastore"][workload] = hastore.figures()
        if redis is not None:
            figures["redis"][workload] = redis.figures()
        if floor is not None:
            figures["floor"][workload] = floor.figures()

    async def _stored(self, figures: dict, names: dict) -> dict:
        stored: dict = {"hastore": {}, "redis": {} if self.redis is not None else None}
        for workload in ("batched", "single"):
            mine = figures["hastore"][workload]
            # the single workload's topic also holds the one untimed send that opened its connection
            acked = mine["acked"] + (1 if workload == "single" else 0)
            stored["hastore"][workload] = await self.hastore.stored(names[workload], acked,
                                                                     mine["last_acked_offset"])
            if self.redis is not None:
                acked = figures["redis"][workload]["acked"]
                counts = self.redis_group.stored_counts(names[workload])
                stored["redis"][workload] = {"acked": acked, "held": counts,
                                             "ok": all(count >= acked for count in counts.values())}
        return stored


# --- medians, ratios, the table ------------------------------------------------------------
def _median(values: list) -> float | None:
    values = [value for value in values if value is not None]
    return round(statistics.median(values), 1) if values else None


def _run_medians(runs: list[dict], keys: tuple[str, ...]) -> dict:
    """The median over ``runs`` of each of ``keys`` and of each process's CPU a message."""
    medians = {key: _median([run[key] for run in runs]) for key in keys}
    medians["cpu_us_per_msg"] = {name: _median([run["cpu_us_per_msg"][name] for run in runs])
                                 for name in runs[0]["cpu_us_per_msg"]}
    return medians


def side_medians(rounds: list[dict], side: str) -> dict:
    """Each workload's figures, the median over rounds (per process CPU too)."""
    return {workload: _run_medians([figures[side][workload] for figures in rounds],
                                   ("msgs_per_s", "msgs_per_cpu_s") if workload == "batched" else ("p50_us", "p99_us"))
            for workload in ("batched", "single", "alone")}


def _ratio(mine: float | None, theirs: float | None) -> float | None:
    return round(mine / theirs, 3) if mine is not None and theirs else None


def floor_medians(rounds: list[dict]) -> dict | None:
    """The relay floor's single round trips, the median over rounds; None if not measured."""
    runs = [figures["floor"]["single"] for figures in rounds if (figures.get("floor") or {}).get("single")]
    return {"single": _run_medians(runs, ("p50_us", "p99_us"))} if runs else None


def floor_ratios(medians: dict) -> dict | None:
    """Each side's single-send p50 and CPU a send over the relay floor's (what its own work adds)."""
    floor = medians.get("floor")
    if floor is None:
        return None
    ratios = {}
    for side in ("hastore", "redis"):
        if side in medians:
            single = medians[side]["single"]
            ratios[f"{side}_single_p50"] = _ratio(single["p50_us"], floor["single"]["p50_us"])
            ratios[f"{side}_single_cpu"] = _ratio(single["cpu_us_per_msg"]["total"],
                                                  floor["single"]["cpu_us_per_msg"]["total"])
    return ratios


def summarize(rounds: list[dict]) -> dict:
    """Medians of both sides (and of the floor) and the ratios of the medians (hastore over
    Redis; each side over the floor)."""
    medians = {"hastore": side_medians(rounds, "hastore")}
    floor = floor_medians(rounds)
    if floor is not None:
        medians["floor"] = floor
    if rounds[0]["redis"] is None:
        return {"medians": medians, "ratios": None, "floor_ratios": floor_ratios(medians)}
    medians["redis"] = theirs = side_medians(rounds, "redis")
    mine = medians["hastore"]
    ratios = {"batched": _ratio(mine["batched"]["msgs_per_s"], theirs["batched"]["msgs_per_s"]),
              "batched_per_cpu": _ratio(mine["batched"]["msgs_per_cpu_s"], theirs["batched"]["msgs_per_cpu_s"]),
              "single_p50": _ratio(mine["single"]["p50_us"], theirs["single"]["p50_us"]),
              "single_p99": _ratio(mine["single"]["p99_us"], theirs["single"]["p99_us"])}
    return {"medians": medians, "ratios": ratios, "floor_ratios": floor_ratios(medians)}


def targets_met(ratios: dict | None) -> dict | None:
    if ratios is None or None in ratios.values():
        return None
    return {"batched": ratios["batched"] >= TARGETS["batched_min"],
            "batched_per_cpu": ratios["batched_per_cpu"] >= TARGETS["batched_per_cpu_min"],
            "single_p50": ratios["single_p50"] <= TARGETS["single_p50_max"],
            "single_p99": ratios["single_p99"] <= TARGETS["single_p99_max"]}


def _cell(value) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.1f}"


def _cpu_line(figures: dict) -> str:
    return " ".join(f"{name} {_cell(us)}" for name, us in figures["cpu_us_per_msg"].items())


def table(title: str, hastore: dict, redis: dict | None, floor: dict | None = None) -> list[str]:
    """One round's (or the medians') figures, side by side, with ratios; the relay floor's
    single round trips below them."""
    rows = [("batched msgs/s", "batched", "msgs_per_s"), ("batched msgs/CPU-s", "batched", "msgs_per_cpu_s"),
            ("single p50 µs", "single", "p50_us"), ("single p99 µs", "single", "p99_us"),
            ("alone p50 µs", "alone", "p50_us"), ("alone p99 µs", "alone", "p99_us")]
    lines = [title, f"  {'figure':<22}{'hastore':>12}{'redis':>12}{'ratio':>9}"]
    for label, workload, key in rows:
        mine = hastore[workload].get(key)
        theirs = redis[workload].get(key) if redis is not None else None
        ratio = _ratio(mine, theirs)
        lines.append(f"  {label:<22}{_cell(mine):>12}{_cell(theirs):>12}{'' if ratio is None else ratio:>9}")
    for workload in ("batched", "single"):
        lines.append(f"  CPU µs/msg {workload:<8} hastore: {_cpu_line(hastore[workload])}")
        if redis is not None:
            lines.append(f"  {'':<20} redis:   {_cpu_line(redis[workload])}")
    if floor is not None:
        single = floor["single"]
        lines.append(f"  relay floor (no store) single p50 {_cell(single['p50_us'])} µs, "
                     f"p99 {_cell(single['p99_us'])} µs; CPU µs/msg {_cpu_line(single)}")
    return lines


def report_lines(report: dict) -> list[str]:
    """The human-readable report: a table per round, the medians, ratios against targets."""
    lines = []
    python = report.get("python")
    if python:
        lines.append(f"python {python['version']} ({python['executable']}, {python['compiler']})")
    if report["peer_missing"]:
        lines.append(f"note: {report['peer_missing']}; hastore measured alone")
    busy_poll_us = report["settings"].get("client_busy_poll_us")
    if busy_poll_us:
        lines.append(f"hastore's single sends: the Producer busy-polls {busy_poll_us} µs for each reply")
    for figures in report["rounds"]:
        lines += table(f"round {figures['round']} ({figures['first']} first)", figures["hastore"], figures["redis"],
                       figures.get("floor"))
    medians = report["medians"]
    lines += table(f"medians of {len(report['rounds'])} rounds", medians["hastore"], medians.get("redis"),
                   medians.get("floor"))
    ratios = report["ratios"]
    if ratios is not None:
        met = report["targets_met"] or {}
        lines.append("ratios hastore/redis: " + ", ".join(
            f"{name} {value} ({'met' if met.get(name) else 'not met'})" for name, value in ratios.items()))
        lines.append(f"targets: batched >= {TARGETS['batched_min']}, per CPU >= {TARGETS['batched_per_cpu_min']}, "
                     f"single p50 <= {TARGETS['single_p50_max']}, p99 <= {TARGETS['single_p99_max']}")
    if report.get("floor_ratios"):
        lines.append("over the relay floor (single p50, CPU a send): " + ", ".join(
            f"{side} {report['floor_ratios'][f'{side}_single_p50']}x, {report['floor_ratios'][f'{side}_single_cpu']}x"
            for side in ("hastore", "redis") if f"{side}_single_p50" in report["floor_ratios"]))
    if "batch_costs" in report:
        lines += batch_costs.report_lines(report["batch_costs"])
    lines.append("stored what was acked: " + ("yes, on every member of both sides" if report["stored_ok"]
                                              else "NO: see stored in --json"))
    return lines


# --- the whole comparison ------------------------------------------------------------------
def run_comparison(directory: str, *, peer: str = "redis", rounds: int = 3, seconds: float = 5.0,
                   samples: int = 1000, messages_max: int = 1_000_000,
                   batch_sizes: tuple[int, ...] | None = None, client_busy_poll_us: int = 0) -> dict:
    """Start both sides under ``directory``, run ``rounds`` rounds, stop every process; the
    report. With ``batch_sizes``, then the batched workload at each size (batch_costs.py)."""
    if peer != "redis":
        raise BenchPeerError(f"unknown peer {peer!r}: the comparison knows 'redis'")
    peer_missing = redis_peer.peer_problem()
    hastore = HastoreSide.start(os.path.join(directory, "hastore"))
    floor = None
    try:
        floor = RelayFloor.start(REPLICAS)
        redis_group = None if peer_missing else redis_peer.RedisGroup.start(os.path.join(directory, "redis"))
        try:
            comparison = Comparison(hastore, redis_group, seconds=seconds, samples=samples,
                                    messages_max=messages_max, floor=floor, client_busy_poll_us=client_busy_poll_us)
            try:
                async def main() -> tuple[list[dict], dict | None]:
                    await hastore.wait_in_sync()
                    rounds_measured = [await comparison.run_round(index) for index in range(rounds)]
                    costs = await batch_costs.measure(comparison, batch_sizes, rounds) if batch_sizes else None
                    return rounds_measured, costs
                measured, costs = trio.run(main)
            finally:
                comparison.close()
        finally:
            if redis_group is not None:
                redis_group.stop()
    finally:
        try:
            if floor is not None:
                floor.stop()
        finally:
            hastore.stop()
    summary = summarize(measured)
    stored_ok = all(check["ok"] for figures in measured for side in ("hastore", "redis")
                    for check in (figures["stored"][side] or {}).values())
    if costs is not None:
        stored_ok = stored_ok and all(figures["stored_ok"] for figures in costs["rounds"])
    return {"peer": peer, "peer_missing": peer_missing, "redis_version": redis_peer.redis_version(),
            "hiredis": _hiredis(), "python": _interpreter(),
            "settings": {"rounds": rounds, "seconds": seconds, "samples": samples, "messages_max": messages_max,
                         "body_bytes": len(BODY), "client_busy_poll_us": client_busy_poll_us},
            "rounds": measured, **summary, "targets": TARGETS, "targets_met": targets_met(summary["ratios"]),
            "stored_ok": stored_ok, **({"batch_costs": costs} if costs is not None else {})}


def _interpreter() -> dict:
    """The CPython every process of both sides ran on (the nodes, the relay and both clients
    share the venv's): its build moved hastore's CPU a message by 15-25 % (Makefile)."""
    return {"version": platform.python_version(), "executable": os.path.realpath(sys._base_executable),
            "compiler": platform.python_compiler()}


def _hiredis() -> bool | None:
    try:
        from redis.utils import HIREDIS_AVAILABLE
    except ImportError:
        return None
    return bool(HIREDIS_AVAILABLE)


def compare_command(peer: str, rounds: int, seconds: float, samples: int, directory: str | None,
                    as_json: bool, batch_sizes: tuple[int, ...] | None = None, client_busy_poll_us: int = 0) -> None:
    """What ``hastore bench replicate --peer redis`` does: run, print, exit 1 if a side lost an ack."""
    try:
        if directory:
            os.makedirs(directory, exist_ok=True)
            report = run_comparison(directory, peer=peer, rounds=rounds, seconds=seconds, samples=samples,
                                    batch_sizes=batch_sizes, client_busy_poll_us=client_busy_poll_us)
        else:
            with tempfile.TemporaryDirectory(prefix="hastore-bench-sync-compare-") as root:
                report = run_comparison(root, peer=peer, rounds=rounds, seconds=seconds, samples=samples,
                                        batch_sizes=batch_sizes, client_busy_poll_us=client_busy_poll_us)
    except BenchPeerError as error:
        raise click.ClickException(str(error)) from None
    if report["peer_missing"]:
        click.echo(f"note: {report['peer_missing']}; measuring hastore alone", err=True)
    click.echo(json.dumps(report) if as_json else "\n".join(report_lines(report)))
    if not report["stored_ok"]:
        raise click.ClickException("a side did not hold every message it acknowledged (see stored in --json)")
