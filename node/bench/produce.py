"""``hastore bench produce`` and ``hastore bench consume``: a node in its own process
(``hastore node start``, async flush, 1 KiB messages) driven over loopback by the client
library in this process, measured against a floor taken in the same run: a bare trio
frame echo server, also in its own process, answering frames of the same sizes as a
single send's request and reply (node/bench/echo.py). Single sends and echo round trips
alternate in blocks (``LATENCY_BLOCK``), so the ratio of their medians compares the two
under the same conditions.

Every phase is bounded by a count and a deadline; the node and the echo server are always
stopped (SIGTERM, then SIGKILL), even when a phase fails. ``--runs`` repeats the
measurements and reports each figure's median with every run's value beside it.
``--profile-node`` / ``--profile-client`` write cProfile output and print the top entries.
"""

from __future__ import annotations

import cProfile
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time

import click
import trio

from ..wire import protocol
from ..client import OutgoingMessage, open_connection, open_producer
from ..client.progress import progress_bar
from ..server.config import NodeConfig
from .echo import LENGTH, echo_request
from ..errors import NodeError, NodeProcessError
from ..cluster.process import NodeProcess
from ..cluster.processes import read_ready_line, stop_child
from ..wire.protocol import RequestCode

BODY = b"b" * 1024
TOPIC = "bench"
PHASE_DEADLINE_S = 120
PROFILE_LINES = 30
# Big segments and index files so that no run rolls over to a new file mid-measurement.
NODE_SETTINGS = {"node_id": "bench", "flush": "async",
                 "store": {"commitlog_segment_bytes": 1 << 30, "index_hash_slots": 1_000_000,
                           "index_max_entries": 4_000_000}}
TARGETS = {"batched_msgs_per_s_min": 100_000, "single_p50_ratio_to_floor_max": 1.7}


# --- measurements (run in this process, against the other two) ---------------------------
def _percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


# single sends and echo round trips alternate in blocks of this many, so that both see
# the same spells of a noisy machine (taken one after the other, each could meet a
# different one, and the ratio showed it)
LATENCY_BLOCK = 100


async def _echo_round_trips(stream: trio.SocketStream, frame: bytes, expected: int, count: int,
                            times: list[float]) -> None:
    """``count`` round trips (µs, appended to ``times``) of ``frame`` answered by
    ``expected`` bytes."""
    for _ in range(count):
        started = time.perf_counter()
        await stream.send_all(frame)
        got = 0
        while got < expected:
            data = await stream.receive_some(65536)
            if not data:
                raise NodeError("the echo server closed the connection")
            got += len(data)
        times.append((time.perf_counter() - started) * 1e6)


async def _single_sends(connection, count: int, times: list[float]) -> dict:
    """``count`` one-message sends through the client's Connection, one at a time (µs,
    appended to ``times``); the last reply."""
    reply = {}
    for _ in range(count):
        started = time.perf_counter()
        reply = await connection.request(RequestCode.SEND, topic=TOPIC, messages=[OutgoingMessage(BODY).to_wire()])
        times.append((time.perf_counter() - started) * 1e6)
        if reply["results"][0]["status"] != "PUT_OK":
            raise NodeError(f"send refused: {reply['results'][0]}")
    return reply


async def _latencies(address: str, echo_port: int, samples: int) -> tuple[list[float], list[float], int, int]:
    """Single-send round trips and, as their floor, echo round trips of frames the sizes of
    a send's request and reply, ``samples`` of each, alternating in blocks; and those two
    frame sizes."""
    sends: list[float] = []
    floor: list[float] = []
    async with open_connection(address) as connection:
        with trio.fail_after(PHASE_DEADLINE_S):
            reply = await _single_sends(connection, 1, [])   # the reply's size, for the echo frames
            reply_bytes = len(protocol.encode_frame(reply)) - LENGTH.size
            request_bytes = len(protocol.encode_frame({
                "code": int(RequestCode.SEND), "opaque": samples, "topic": TOPIC,
                "messages": [OutgoingMessage(BODY).to_wire()]})) - LENGTH.size
            frame = echo_request(request_bytes, reply_bytes)
            stream = await trio.open_tcp_stream("127.0.0.1", echo_port)
            async with stream:
                while len(sends) < samples:
                    block = min(LATENCY_BLOCK, samples - len(sends))
                    await _single_sends(connection, block, sends)
                    await _echo_round_trips(stream, frame, LENGTH.size + reply_bytes, block, floor)
    return sends, floor, request_bytes, reply_bytes


async def _throughput(address: str, total: int, batch: int, in_flight: int) -> float:
    """Messages per second through a Producer: ``total`` messages in batches of ``batch``,
    at most ``in_flight`` batches unanswered."""
    async with open_producer(address, batch_count_max=batch, in_flight_max=in_flight) as producer:
        slots = trio.Semaphore(in_flight)
        failures = []

        async def one(count: int) -> None:
            try:
                results = await producer.send_batch(TOPIC, [OutgoingMessage(BODY) for _ in range(count)])
                failures.extend(r for r in results if not r.ok)
            finally:
                slots.release()
        started = time.perf_counter()
        with trio.fail_after(PHASE_DEADLINE_S):
            async with trio.open_nursery() as nursery:
                for first in range(0, total, batch):
                    await slots.acquire()
                    nursery.start_soon(one, min(batch, total - first))
        elapsed = time.perf_counter() - started
    if failures:
        raise NodeError(f"{len(failures)} sends failed, first: {failures[0]}")
    return total / elapsed


async def _produce_run(address: str, echo_port: int, messages: int, samples: int) -> dict:
    sends, floor, request_bytes, reply_bytes = await _latencies(address, echo_port, samples)
    singles = max(1000, messages // 10)
    figures = {
        "batch_1_in_flight_1_msgs_per_s": await _throughput(address, singles, 1, 1),
        "batch_1_in_flight_16_msgs_per_s": await _throughput(address, singles, 1, 16),
        "batch_64_in_flight_1_msgs_per_s": await _throughput(address, messages, 64, 1),
        "batch_64_in_flight_8_msgs_per_s": await _throughput(address, messages, 64, 8),
    }
    floor_p50, floor_p99 = _percentile(floor, 50), _percentile(floor, 99)
    p50, p99 = _percentile(sends, 50), _percentile(sends, 99)
    return {"echo_floor_p50_us": floor_p50, "echo_floor_p99_us": floor_p99,
            "send_single_p50_us": p50, "send_single_p99_us": p99,
            "send_single_p50_ratio_to_floor": p50 / floor_p50, "send_single_p99_ratio_to_floor": p99 / floor_p99,
            **figures, "frame_bytes": {"request": request_bytes, "reply": reply_bytes}}


# --- processes -----------------------------------------------------------------------------
class _EchoProcess:
    """``python -m node.echo`` as a subprocess; stopped on exit."""

    def __enter__(self) -> "_EchoProcess":
        self.process = subprocess.Popen([sys.executable, "-P", "-m", "node.bench.echo"], stdout=subprocess.PIPE,
                                        stdin=subprocess.DEVNULL)
        try:
            self.port = read_ready_line(self.process, 30)["port"]
        except BaseException:
            stop_child(self.process, 5)
            self.process.stdout.close()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        stop_child(self.process, 10)
        self.process.stdout.close()


def _node_options(profile_path: str | None) -> tuple[str, ...]:
    return ("-m", "cProfile", "-o", os.path.abspath(profile_path)) if profile_path else ()


def _print_profile(path: str, title: str) -> None:
    click.echo(f"--- {title}: {path} (top {PROFILE_LINES} by own time) ---", err=True)
    stats = pstats.Stats(path, stream=sys.stderr)
    stats.sort_stats("tottime").print_stats(PROFILE_LINES)


def _run_client(async_fn, args, profile_path: str | None):
    if not profile_path:
        return trio.run(async_fn, *args)
    profiler = cProfile.Profile()
    try:
        return profiler.runcall(trio.run, async_fn, *args)
    finally:
        profiler.dump_stats(profile_path)


def _with_node(runs: int, profile_node: str | None, profile_client: str | None, measure,
               settings: dict = NODE_SETTINGS) -> list[dict]:
    """Start a node with ``settings`` (and an echo server) in their own processes, run
    ``measure(address, echo_port)`` ``runs`` times, stop both, and check the node stopped
    cleanly."""
    results = []
    with tempfile.TemporaryDirectory(prefix="hastore-bench-") as root:
        with _EchoProcess() as echo:
            node = NodeProcess.start(root, settings, python_options=_node_options(profile_node))
            try:
                with progress_bar("bench runs", total=runs) as bar:   # stderr, on a terminal only
                    for run in range(runs):
                        click.echo(f"run {run + 1}/{runs} ...", err=True)
                        results.append(measure(node.client_address, echo.port))
                        bar.advance()
            finally:
                node.stop()
            if not node.stopped_cleanly():
                raise NodeProcessError(f"the bench node exited with {node.exit_status} or left an abort file:\n"
                                       f"{node.stderr_tail()}")
    if profile_node:
        _print_profile(profile_node, "node process")
    if profile_client:
        _print_profile(profile_client, "client process")
    return results


def _summary(runs: list[dict]) -> dict:
    """Each numeric figure's median over the runs, with every run's value."""
    summary = {}
    for name, value in runs[0].items():
        if isinstance(value, (int, float)):
            values = [run[name] for run in runs]
            summary[name] = _rounded(name, statistics.median(values))
            if len(runs) > 1:
                summary[f"{name}_runs"] = [_rounded(name, v) for v in values]
        else:
            summary[name] = value
    return summary


def _rounded(name: str, value: float) -> float:
    return round(value, 2) if "ratio" in name else round(value, 1) if name.endswith("_us") else round(value)


def _echo(figures: dict, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(figures))
        return
    for name, value in figures.items():
        click.echo(f"{name:42} {value}")


runs_option = click.option("--runs", default=3, show_default=True, type=click.IntRange(1, 20),
                           help="Repeat the measurements; figures are the medians of the runs.")
json_option = click.option("--json", "as_json", is_flag=True, help="Print the figures as one JSON object.")
profile_options = [
    click.option("--profile-node", default=None, type=click.Path(dir_okay=False),
                 help="Run the node under cProfile, write its stats here and print the top entries."),
    click.option("--profile-client", default=None, type=click.Path(dir_okay=False),
                 help="Profile this (client) process, write its stats here and print the top entries."),
]


def _with_profile_options(command):
    for option in reversed(profile_options):
        command = option(command)
    return command


@click.command("produce")
@click.option("--messages", default=200_000, show_default=True, type=click.IntRange(1000, 5_000_000),
              help="Messages per batched run (single-message runs send a tenth, at least 1000).")
@click.option("--samples", default=2000, show_default=True, type=click.IntRange(100, 100_000),
              help="Round trips for the latency figures and for the echo floor.")
@click.option("--busy-poll-us", default=None, type=click.IntRange(0, 10_000),
              help="The node's busy_poll_us (default: the node's default); 0 measures the node "
                   "without busy polling.")
@runs_option
@json_option
@_with_profile_options
def bench_produce_command(messages: int, samples: int, busy_poll_us: int | None, runs: int, as_json: bool,
                          profile_node: str | None, profile_client: str | None) -> None:
    """Send throughput (batches of 1 and 64, several in flight) and single-send latency
    against a node in its own process, with a two-process trio echo round trip as the floor."""
    def measure(address: str, echo_port: int) -> dict:
        return _run_client(_produce_run, (address, echo_port, messages, samples), profile_client)
    settings = NODE_SETTINGS if busy_poll_us is None else {**NODE_SETTINGS, "busy_poll_us": busy_poll_us}
    results = _run_bench(runs, profile_node, profile_client, measure, settings)
    busy_poll = NodeConfig().busy_poll_us if busy_poll_us is None else busy_poll_us
    figures = {"message_bytes": len(BODY), "flush": "async", "busy_poll_us": busy_poll, "runs": runs,
               **_summary(results), "targets": TARGETS}
    batched = figures["batch_64_in_flight_8_msgs_per_s"]
    figures["meets_targets"] = {
        "batched_msgs_per_s": batched >= TARGETS["batched_msgs_per_s_min"],
        "single_p50_ratio_to_floor": figures["send_single_p50_ratio_to_floor"]
        <= TARGETS["single_p50_ratio_to_floor_max"]}
    _echo(figures, as_json)


@click.command("consume")
@click.option("--messages", default=100_000, show_default=True, type=click.IntRange(1000, 5_000_000))
@runs_option
@json_option
@_with_profile_options
def bench_consume_command(messages: int, runs: int, as_json: bool, profile_node: str | None,
                          profile_client: str | None) -> None:
    """Pull throughput of one queue (pulls of 1024) from a node in its own process."""
    def measure(address: str, echo_port: int) -> dict:
        return _run_client(_consume_setup_and_run, (address, messages), profile_client)
    results = _run_bench(runs, profile_node, profile_client, measure)
    _echo({"message_bytes": len(BODY), "messages": messages, "pull_batch": protocol.PULL_COUNT_MAX, "runs": runs,
           **_summary(results)}, as_json)


async def _consume_setup_and_run(address: str, messages: int) -> dict:
    # one queue, so a pull reads a contiguous run; each run reads what it wrote
    async with open_connection(address) as connection:
        await connection.request(RequestCode.TOPIC_CREATE, topic=TOPIC, queue_count=1)
        offsets = await connection.request(RequestCode.QUEUE_OFFSETS, topic=TOPIC, queue_id=0)
    return await _consume_run_from(address, messages, offsets["max_offset"])


async def _consume_run_from(address: str, messages: int, base: int) -> dict:
    await _throughput(address, messages, 64, 8)
    async with open_connection(address) as connection:
        with trio.fail_after(PHASE_DEADLINE_S):
            while (await connection.request(RequestCode.QUEUE_OFFSETS, topic=TOPIC, queue_id=0))["max_offset"] \
                    < base + messages:
                await trio.sleep(0.01)
            started = time.perf_counter()
            offset, received = base, 0
            while received < messages:
                reply = await connection.request(RequestCode.PULL, topic=TOPIC, queue_id=0, offset=offset,
                                                 max_count=protocol.PULL_COUNT_MAX)
                if not reply["messages"]:
                    raise NodeError(f"pull at {offset} returned nothing ({reply['status']})")
                received += len(reply["messages"])
                offset = reply["next_offset"]
            elapsed = time.perf_counter() - started
    return {"consume_msgs_per_s": received / elapsed, "consume_mib_per_s": received * len(BODY) / elapsed / 2**20}


def _run_bench(runs: int, profile_node: str | None, profile_client: str | None, measure,
               settings: dict = NODE_SETTINGS) -> list[dict]:
    try:
        return _with_node(runs, profile_node, profile_client, measure, settings)
    except NodeError as error:
        raise click.ClickException(str(error)) from None
