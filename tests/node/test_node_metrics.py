"""The hot path's metrics: plain numbers (RequestTally) exported at scrape time under the
names a prometheus_client counter and histogram would give them."""

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.exposition import generate_latest

from node.server.client_limits import ConnectionCounts
from node.server.metrics import PUT_LATENCY_BUCKETS_S, NodeMetrics


def _samples(text: bytes, prefix: bytes) -> list[bytes]:
    return [line for line in text.splitlines() if line.startswith(prefix)]


def test_the_tally_exports_what_a_prometheus_histogram_would():
    metrics = NodeMetrics("n1")
    registry = CollectorRegistry()
    reference = Histogram("hastore_put_latency_seconds", "Send request latency inside the node",
                          labelnames=["node"], buckets=PUT_LATENCY_BUCKETS_S, registry=registry).labels(node="n1")
    latencies = [0.00005, 0.0001, 0.0003, 0.002, 0.002, 0.7, 9.0]
    for index, latency in enumerate(latencies):
        metrics.tally.count_put(ok_count=2, ok_bytes=100, failed=index % 2, latency_s=latency)
        reference.observe(latency)
    metrics.tally.count_request("SEND", "SUCCESS")
    metrics.tally.count_request("SEND", "SUCCESS")
    metrics.tally.count_request("PULL", "BAD_REQUEST")
    text = metrics.render()
    for suffix in (b"_bucket", b"_count", b"_sum"):
        name = b"hastore_put_latency_seconds" + suffix
        assert _parsed(_samples(text, name)) == _parsed(_samples(generate_latest(registry), name))
    assert b'hastore_put_latency_seconds_bucket{le="0.0001",node="n1"} 2.0' in text  # le is inclusive
    assert b'hastore_put_messages_total{node="n1"} 14.0' in text
    assert b'hastore_put_bytes_total{node="n1"} 700.0' in text
    assert b'hastore_put_failures_total{node="n1"} 3.0' in text
    assert b'hastore_requests_total{node="n1",request="SEND",response="SUCCESS"} 2.0' in text
    assert b'hastore_requests_total{node="n1",request="PULL",response="BAD_REQUEST"} 1.0' in text


def _parsed(lines: list[bytes]) -> list[tuple[frozenset, float]]:
    """(labels, value) of sample lines, label order ignored."""
    parsed = []
    for line in lines:
        head, value = line.rsplit(b" ", 1)
        labels = head[head.index(b"{") + 1:-1].split(b",") if b"{" in head else []
        parsed.append((frozenset(labels), float(value)))
    assert parsed
    return sorted(parsed, key=lambda item: item[1])


def test_the_client_counters_are_exported_under_their_names():
    metrics = NodeMetrics("n1")
    counts = ConnectionCounts(open=3, connections_max=64, accepted=11, refused_busy=2, shed_idle=4,
                              shed_unauthenticated=5, idle_timeouts=6, auth_failures=9, auth_timeouts=7,
                              frame_errors=8, held_bytes=1234, peak_held_bytes=5678, backpressure_pauses=10,
                              closed_for_memory=1)
    metrics.watch_clients(counts)
    text = metrics.render()
    expected = {
        b'hastore_connections{node="n1"}': 3, b'hastore_connections_max{node="n1"}': 64,
        b'hastore_connections_accepted_total{node="n1"}': 11, b'hastore_connections_refused_busy_total{node="n1"}': 2,
        b'hastore_connections_shed_total{node="n1",reason="idle"}': 4,
        b'hastore_connections_shed_total{node="n1",reason="unauthenticated"}': 5,
        b'hastore_connections_idle_timeouts_total{node="n1"}': 6, b'hastore_connections_auth_timeouts_total{node="n1"}': 7,
        b'hastore_connections_auth_failures_total{node="n1"}': 9, b'hastore_connections_frame_errors_total{node="n1"}': 8,
        b'hastore_client_held_bytes{node="n1"}': 1234, b'hastore_client_held_bytes_peak{node="n1"}': 5678,
        b'hastore_client_backpressure_pauses_total{node="n1"}': 10,
        b'hastore_connections_closed_for_memory_total{node="n1"}': 1}
    found = {head: float(value) for head, value in (line.rsplit(b" ", 1) for line in text.splitlines()
                                                     if line.startswith((b"hastore_connections", b"hastore_client_")))}
    assert found == expected
    counts.open, counts.shed_idle = 1, 40     # read at each scrape, not copied once
    text = metrics.render()
    assert b'hastore_connections{node="n1"} 1.0' in text
    assert b'hastore_connections_shed_total{node="n1",reason="idle"} 40.0' in text
    # the status reply's section holds the same figures
    assert counts.status() == {"open": 1, "limit": 64, "accepted": 11, "refused_busy": 2, "shed_idle": 40,
                               "shed_unauthenticated": 5, "idle_timeouts": 6, "auth_timeouts": 7, "auth_failures": 9,
                               "frame_errors": 8, "held_bytes": 1234, "peak_held_bytes": 5678,
                               "backpressure_pauses": 10, "closed_for_memory": 1}
