"""``hastore bench toxiproxy``: what a proxy without toxics costs, measured against a direct
connection in the same run.

    hastore bench toxiproxy [--samples 2000] [--transfer-mb 64] [--runs 5] [--time-limit-s 120] [--json]

Three processes: the upstream server (``python -m chaos.toxiproxy.probe``), the Toxiproxy
server (``hastore chaos toxiproxy serve``; or the real one named by TOXIPROXY_URL), and
this one, the client, with blocking sockets. Per run:

- round trip: 64-byte messages echoed one at a time on two open connections, one direct and
  one through the proxy, alternating in blocks of 100 (so a slow spell of the machine hits
  both alike); p50 and p99 of each;
- throughput: the upstream sends ``--transfer-mb`` MB, read until the end, direct then
  through the proxy; MB/s of each.

Reported: the medians over the runs, the microseconds the proxy adds at p50 and p99, and the
ratios. Toxiproxy's README claims under 100 us of added latency for its Go server.
Bounded: at most ``--runs`` runs, stopped early after ``--time-limit-s``.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager
from typing import Iterator

import click

from .client import ToxiproxyClient
from .errors import ToxiproxyError, ToxiproxyStartError
from .runner import START_TIMEOUT_S, STOP_TIMEOUT_S, toxiproxy_subprocess

MESSAGE_BYTES = 64
BLOCK = 100
RECEIVE_BYTES = 1 << 20


@contextmanager
def upstream_process() -> Iterator[tuple[str, int]]:
    """The probe's upstream server in a child process; its (host, port)."""
    process = subprocess.Popen([sys.executable, "-P", "-m", "chaos.toxiproxy.probe", "--port", "0"],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        line = process.stdout.readline()
        if "listening on" not in line or time.monotonic() > deadline:
            raise ToxiproxyStartError(f"the bench's upstream server did not start: {line!r}")
        host, _, port = line.split()[-1].rpartition(":")
        yield host, int(port)
    finally:
        process.terminate()
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        process.stdout.close()


def _connect(address: tuple[str, int], line: bytes) -> socket.socket:
    sock = socket.create_connection(address, timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(line)
    return sock


def _round_trips_us(sock: socket.socket, count: int, message: bytes) -> list[float]:
    samples = []
    for _ in range(count):
        start = time.perf_counter_ns()
        sock.sendall(message)
        received = 0
        while received < len(message):
            data = sock.recv(65536)
            if not data:
                raise ConnectionError("the echo connection closed")
            received += len(data)
        samples.append((time.perf_counter_ns() - start) / 1000)
    return samples


def _percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def measure_round_trips(direct: tuple[str, int], proxied: tuple[str, int], samples: int) -> dict:
    """p50/p99 in us of direct and proxied round trips, alternating in blocks."""
    message = b"m" * MESSAGE_BYTES
    results = {"direct": [], "proxy": []}
    connections = {"direct": _connect(direct, b"ECHO\n"), "proxy": _connect(proxied, b"ECHO\n")}
    try:
        for sock in connections.values():
            _round_trips_us(sock, 20, message)  # warm-up
        while len(results["direct"]) < samples:
            for path, sock in connections.items():
                results[path] += _round_trips_us(sock, min(BLOCK, samples - len(results[path])), message)
    finally:
        for sock in connections.values():
            sock.close()
    return {path: {"p50": _percentile(values, 0.50), "p99": _percentile(values, 0.99)}
            for path, values in results.items()}


def measure_throughput_mb_s(address: tuple[str, int], transfer_bytes: int) -> float:
    """MB/s of reading ``transfer_bytes`` sent by the upstream, to its end."""
    buffer = bytearray(RECEIVE_BYTES)
    start = time.perf_counter()
    with _connect(address, f"SEND {transfer_bytes} close\n".encode()) as sock:
        received = 0
        while count := sock.recv_into(buffer):
            received += count
    elapsed = time.perf_counter() - start
    if received != transfer_bytes:
        raise ConnectionError(f"received {received} of {transfer_bytes} bytes")
    return transfer_bytes / 1e6 / elapsed


def run_bench(samples: int, transfer_mb: int, runs: int, time_limit_s: float) -> dict:
    """The whole bench; the report as a JSON-ready dict."""
    url = os.environ.get("TOXIPROXY_URL")
    with upstream_process() as upstream, (_existing(url) if url else toxiproxy_subprocess()) as api_url:
        client = ToxiproxyClient(api_url)
        name = f"bench_{uuid.uuid4().hex[:8]}"
        proxy = client.create_proxy(name, f"{upstream[0]}:{upstream[1]}")
        try:
            host, _, port = proxy.listen.rpartition(":")
            proxied = (host, int(port))
            per_run = []
            deadline = time.monotonic() + time_limit_s
            for _ in range(runs):
                trips = measure_round_trips(upstream, proxied, samples)
                direct_mb_s = measure_throughput_mb_s(upstream, transfer_mb * 1_000_000)
                proxy_mb_s = measure_throughput_mb_s(proxied, transfer_mb * 1_000_000)
                per_run.append((trips, direct_mb_s, proxy_mb_s))
                if time.monotonic() > deadline:
                    break
        finally:
            client.destroy_proxy(name)
            client.close()
    return _report(per_run, samples, transfer_mb, "toxiproxy at " + url if url else "hastore's server")


@contextmanager
def _existing(url: str) -> Iterator[str]:
    yield url


def _report(per_run: list, samples: int, transfer_mb: int, server: str) -> dict:
    def median(values) -> float:
        return round(statistics.median(values), 1)

    trips = {path: {q: median(run[0][path][q] for run in per_run) for q in ("p50", "p99")}
             for path in ("direct", "proxy")}
    direct_mb_s = median(run[1] for run in per_run)
    proxy_mb_s = median(run[2] for run in per_run)
    return {
        "server": server, "runs": len(per_run), "samples_per_run": samples, "message_bytes": MESSAGE_BYTES,
        "transfer_mb": transfer_mb,
        "round_trip_us": {**trips,
                          "added_p50_us": median(run[0]["proxy"]["p50"] - run[0]["direct"]["p50"] for run in per_run),
                          "added_p99_us": median(run[0]["proxy"]["p99"] - run[0]["direct"]["p99"] for run in per_run),
                          "ratio_p50": round(trips["proxy"]["p50"] / trips["direct"]["p50"], 2)},
        "throughput_mb_s": {"direct": direct_mb_s, "proxy": proxy_mb_s, "ratio": round(proxy_mb_s / direct_mb_s, 2)},
    }


@click.command("toxiproxy")
@click.option("--samples", default=2000, show_default=True, type=click.IntRange(100, 100_000),
              help="Round trips per path per run.")
@click.option("--transfer-mb", default=64, show_default=True, type=click.IntRange(1, 1024),
              help="MB read per path per run for the throughput.")
@click.option("--runs", default=5, show_default=True, type=click.IntRange(1, 50))
@click.option("--time-limit-s", default=120.0, show_default=True, type=click.FloatRange(1, 3600),
              help="No new run starts after this long.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def bench_toxiproxy_command(samples: int, transfer_mb: int, runs: int, time_limit_s: float, as_json: bool) -> None:
    """Round trip and throughput through a proxy without toxics, against direct, in one run.

    Uses hastore's Toxiproxy-compatible server in a child process, or the real Toxiproxy at
    TOXIPROXY_URL if set.
    """
    try:
        report = run_bench(samples, transfer_mb, runs, time_limit_s)
    except (ToxiproxyError, OSError) as error:
        raise click.ClickException(str(error)) from None
    if as_json:
        click.echo(json.dumps(report))
        return
    trips, throughput = report["round_trip_us"], report["throughput_mb_s"]
    click.echo(f"{report['server']}, {report['runs']} run(s), medians over runs")
    click.echo(f"round trip ({MESSAGE_BYTES} B, {samples} a path a run): direct p50 {trips['direct']['p50']} us "
               f"p99 {trips['direct']['p99']} us; proxy p50 {trips['proxy']['p50']} us p99 {trips['proxy']['p99']} us")
    click.echo(f"  added by the proxy: p50 {trips['added_p50_us']} us, p99 {trips['added_p99_us']} us "
               f"(ratio {trips['ratio_p50']}x; Toxiproxy claims < 100 us)")
    click.echo(f"throughput ({transfer_mb} MB): direct {throughput['direct']} MB/s, proxy {throughput['proxy']} MB/s "
               f"(ratio {throughput['ratio']})")
