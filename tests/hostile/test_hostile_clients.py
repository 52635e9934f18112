"""Hostile and careless clients against a real node process over real sockets: memory is
bounded when clients do not read their replies (measured from /proc) while another client
is answered within a second, and idle connections far past the limit lock no real client
out. Each test prints its figures as one JSON line."""

from __future__ import annotations

import json
import re
import socket
import time
import urllib.request

import pytest
import trio

from node.client import OutgoingMessage, open_admin, open_producer
from node.wire import protocol
from node.wire.protocol import RequestCode

from hostile_helpers import NodeProcess, run_hastore, write_config

pytestmark = pytest.mark.integration

MIB = 1 << 20
CONNECTION_REPLY_BYTES_MAX = 16 * MIB
CLIENT_BUFFER_BYTES_MAX = 64 * MIB
# what RSS may grow besides the bounded buffers: the reply being built (msgpack, a copy or
# two of 8 MiB), the store's pages of the topic mapped in, allocator slack
SLACK_BYTES = 48 * MIB


def _pulls(count: int) -> bytes:
    return b"".join(protocol.encode_frame({"code": int(RequestCode.PULL), "opaque": i, "topic": "big",
                                           "queue_id": 0, "offset": 0, "max_count": 4, "max_bytes": 8 * MIB})
                    for i in range(count))


def _connect(address: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


async def _fill_topic(address: str) -> None:
    async with open_admin(address) as admin:
        await admin.create_topic("big", queue_count=1)
    async with open_producer(address) as producer:
        for _ in range(4):
            await producer.send_batch("big", [OutgoingMessage(b"m" * (2 * MIB), queue_id=0)])


async def _answer_times(address: str, seconds: float) -> list[float]:
    """A well-behaved client: a status and a small pull, again and again; each one's latency."""
    latencies = []
    async with open_admin(address) as admin:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            started = time.monotonic()
            with trio.fail_after(10):
                await admin.status()
                await admin.pull("big", 0, 3, max_count=1)
            latencies.append(time.monotonic() - started)
            await trio.sleep(0.05)
    return latencies


def test_clients_that_do_not_read_hold_bounded_memory_and_others_are_answered(tmp_path):
    node = NodeProcess(write_config(tmp_path, connection_reply_bytes_max=CONNECTION_REPLY_BYTES_MAX,
                                    client_buffer_bytes_max=CLIENT_BUFFER_BYTES_MAX))
    hostile = []
    try:
        trio.run(_fill_topic, node.client_address)
        trio.run(_answer_times, node.client_address, 0.5)   # warm: the topic's pages mapped, code loaded
        baseline = node.rss_bytes()
        baseline_detail = node.memory_status()
        # the reproduction: 2 connections, 1,000 pipelined 8 MiB pulls each, no reply read
        for _ in range(2):
            sock = _connect(node.client_address)
            sock.sendall(_pulls(1000))
            hostile.append(sock)
        samples = []

        async def watch_rss() -> None:
            for _ in range(60):
                samples.append(node.rss_bytes())
                await trio.sleep(0.1)

        async def both() -> list[float]:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch_rss)
                return await _answer_times(node.client_address, 6)
        latencies = trio.run(both)
        peak = max(samples)
        metrics = _scrape(node.ready["metrics_address"])   # while the hostile connections still hold replies
        held_peak = _sample(metrics, 'hastore_client_held_bytes_peak{node="n1"}')
        paused = _sample(metrics, 'hastore_client_backpressure_pauses_total{node="n1"}')
        for sock in hostile:
            sock.close()
        hostile.clear()
        time.sleep(2)
        after = node.rss_bytes()
        print(json.dumps({"before": baseline_detail, "after": node.memory_status()}))
        figures = {"baseline_rss_mib": round(baseline / MIB, 1), "peak_rss_mib": round(peak / MIB, 1),
                   "growth_mib": round((peak - baseline) / MIB, 1),
                   "bound_mib": (CLIENT_BUFFER_BYTES_MAX + SLACK_BYTES) / MIB,
                   "after_close_rss_mib": round(after / MIB, 1), "requests_answered": len(latencies),
                   "max_latency_s": round(max(latencies), 3), "held_peak_mib": round(held_peak / MIB, 1),
                   "backpressure_pauses": paused}
        print(json.dumps({"memory_case_1": figures}))
        assert peak - baseline < CLIENT_BUFFER_BYTES_MAX + SLACK_BYTES, figures
        assert max(latencies) < 1.0, figures
        assert after - baseline < 24 * MIB, figures   # returned once the connections closed
        # the metrics show it: readers paused for clients that did not read, bytes held within the bound
        assert paused >= 2 and CONNECTION_REPLY_BYTES_MAX <= held_peak <= CLIENT_BUFFER_BYTES_MAX + 16 * MIB, figures
    finally:
        for sock in hostile:
            sock.close()
        node.stop()


@pytest.mark.parametrize("secret", [None, "s3cret"])
def test_idle_connections_far_past_the_limit_lock_no_real_client_out(tmp_path, secret):
    limit = 64
    settings = {"connections_max": limit, **({"secret": secret} if secret else {})}
    node = NodeProcess(write_config(tmp_path, **settings))
    idle = []
    try:
        for _ in range(5 * limit):
            try:
                idle.append(_connect(node.client_address))
            except OSError:
                break
        # the kernel completes the connections before the node accepts them: wait (through the
        # metrics port, which takes no client place) until the node has taken every one, then
        # until they are older than a new connection's grace, so that they may be shed
        deadline = time.monotonic() + 30
        while _accepted_or_refused(node) < len(idle) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)

        async def real_client() -> dict:
            started = time.monotonic()
            async with open_admin(node.client_address, secret=secret) as admin:
                status = await admin.status()
            return {"served_in_s": round(time.monotonic() - started, 3), "connections": status["connections"]}
        served = [trio.run(real_client) for _ in range(3)]
        env = {"HASTORE_SECRET": secret or ""}
        status = run_hastore("status", "--bootstrap", node.client_address, "--json", env=env)
        text = run_hastore("status", "--bootstrap", node.client_address, env=env)
        metrics = _scrape(node.ready["metrics_address"])
        clients = json.loads(status.stdout)["clients"]
        figures = {"secret": bool(secret), "limit": limit, "idle_opened": len(idle), "real_clients": served,
                   "clients": clients}
        print(json.dumps({"lock_out": figures}))
        assert len(idle) == 5 * limit
        assert all(item["served_in_s"] < 5 for item in served), figures
        # what the node did shows in status (JSON and text) and in its metrics
        assert clients["limit"] == limit and clients["open"] <= limit, figures
        # at least the first real client took a shed connection's place (the next may take the
        # place a real client before it left, or one the backlog's idle connections freed)
        assert clients["shed_unauthenticated"] >= 1 and clients["shed_idle"] == 0, figures
        # every idle connection past the limit took a silent one's place, or was refused if none was old enough
        assert clients["shed_unauthenticated"] + clients["refused_busy"] >= 4 * limit, figures
        assert clients["accepted"] >= limit + clients["shed_unauthenticated"], figures
        assert text.returncode == 0 and f"of {limit} connections; refused busy" in text.stdout, text.stdout
        # the text status came later (its own connection took one more place)
        assert int(re.search(r"shed unauthenticated (\d+)", text.stdout).group(1)) >= clients["shed_unauthenticated"]
        assert _sample(metrics, 'hastore_connections_max{node="n1"}') == limit
        assert _sample(metrics, 'hastore_connections_shed_total{node="n1",reason="unauthenticated"}') >= \
            clients["shed_unauthenticated"]
        assert _sample(metrics, 'hastore_connections_refused_busy_total{node="n1"}') == clients["refused_busy"]
    finally:
        for sock in idle:
            sock.close()
        node.stop()


def _scrape(address: str) -> str:
    """The node's Prometheus text, over HTTP."""
    host, port = address.rsplit(":", 1)
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as response:
        return response.read().decode()


def _sample(text: str, head: str) -> float:
    (value,) = [line.rsplit(" ", 1)[1] for line in text.splitlines() if line.startswith(head + " ")]
    return float(value)


def _accepted_or_refused(node: NodeProcess) -> float:
    text = _scrape(node.ready["metrics_address"])
    return (_sample(text, 'hastore_connections_accepted_total{node="n1"}')
            + _sample(text, 'hastore_connections_refused_busy_total{node="n1"}'))
