"""Prometheus metrics of one node, in its own CollectorRegistry, served over HTTP by trio.

A per-node registry (not prometheus_client's global one) lets several nodes share a
process, as tests do. Store figures are read from ``store.statistics()`` at scrape time.
The figures every request touches (request counts by outcome, put counts, bytes and
latency) are plain numbers in a ``RequestTally``, exported by a collector at scrape time:
a prometheus_client counter or histogram takes a lock on every update, and a send made
five such updates. Only the trio thread updates and scrapes them.
"""

from __future__ import annotations

import logging
from bisect import bisect_left

import trio
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.utils import floatToGoString

from replication.lag_history import LagStatus

from ..wire.address import split_address

log = logging.getLogger(__name__)

REQUEST_HEAD_BYTES_MAX = 8192
SCRAPE_TIMEOUT_S = 10
PUT_LATENCY_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


class RequestTally:
    """Counts of the hot path as plain numbers: requests by (request, response), and puts
    (messages, bytes, failures, latency histogram). Updated and read on the trio thread."""

    __slots__ = ("requests", "put_messages", "put_bytes", "put_failures", "put_latency_counts",
                 "put_latency_sum_s")

    def __init__(self) -> None:
        self.requests: dict[tuple[str, str], int] = {}
        self.put_messages = 0
        self.put_bytes = 0
        self.put_failures = 0
        self.put_latency_counts = [0] * (len(PUT_LATENCY_BUCKETS_S) + 1)   # the last: +Inf
        self.put_latency_sum_s = 0.0

    def count_request(self, request: str, response: str) -> None:
        key = (request, response)
        self.requests[key] = self.requests.get(key, 0) + 1

    def count_put(self, ok_count: int, ok_bytes: int, failed: int, latency_s: float) -> None:
        self.put_messages += ok_count
        self.put_bytes += ok_bytes
        self.put_failures += failed
        self.put_latency_counts[bisect_left(PUT_LATENCY_BUCKETS_S, latency_s)] += 1
        self.put_latency_sum_s += latency_s


class NodeMetrics:
    """The node's counters, histograms and gauges."""

    def __init__(self, node_id: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        labels = {"node": node_id}
        r = self.registry
        self.tally = RequestTally()
        r.register(_TallyCollector(node_id, self.tally))
        self.pull_messages = Counter("hastore_pull_messages", "Messages returned by pull requests", registry=r,
                                     labelnames=["node"]).labels(**labels)
        self.pull_bytes = Counter("hastore_pull_bytes", "Message bytes returned by pull requests", registry=r,
                                  labelnames=["node"]).labels(**labels)
        self.long_polls = Gauge("hastore_long_polling_pulls", "Pulls waiting for new messages", registry=r,
                                labelnames=["node"]).labels(**labels)
        self._store_gauges = {
            name: Gauge(f"hastore_store_{name}", help_text, registry=r, labelnames=["node"]).labels(**labels)
            for name, help_text in (
                ("max_physical_offset", "CommitLog max offset"),
                ("min_physical_offset", "CommitLog min offset"),
                ("flushed_offset", "CommitLog offset on disk"),
                ("dispatched_offset", "CommitLog offset dispatched to ConsumeQueue and IndexFile"),
                ("dispatch_lag_bytes", "CommitLog bytes written but not yet dispatched"),
            )
        }
        self._node = node_id

    def watch_store(self, store) -> None:
        """Read the store gauges from ``store.statistics()`` at each scrape."""
        for name, gauge in self._store_gauges.items():
            gauge.set_function(lambda name=name: getattr(store.statistics(), name))

    def watch_clients(self, counts) -> None:
        """Client connection gauges and counters read from ``counts`` (the client server's
        ConnectionCounts, node/server/client_limits.py) at each scrape."""
        self.registry.register(_ClientCollector(self._node, counts))

    def watch_replication(self, status) -> None:
        """Per-slave lag gauges (and the master's confirm offset) read from ``status()`` (the
        node's replication section) at each scrape; slaves come and go, so a collector."""
        self.registry.register(_ReplicationCollector(self._node, status))

    def render(self) -> bytes:
        """Prometheus text exposition of every metric."""
        return generate_latest(self.registry)


class _TallyCollector:
    """Prometheus collector over a RequestTally (the same metric names as counters and a
    histogram would have)."""

    def __init__(self, node_id: str, tally: RequestTally) -> None:
        self._node = node_id
        self._tally = tally

    def describe(self):
        return []

    def collect(self):
        tally, node = self._tally, self._node
        requests = CounterMetricFamily("hastore_requests", "Requests by code and outcome",
                                       labels=["node", "request", "response"])
        for (request, response), count in sorted(tally.requests.items()):
            requests.add_metric([node, request, response], count)
        yield requests
        for name, help_text, value in (
                ("hastore_put_messages", "Messages stored by send requests", tally.put_messages),
                ("hastore_put_bytes", "Bytes written to the CommitLog by send requests", tally.put_bytes),
                ("hastore_put_failures", "Messages refused or not confirmed", tally.put_failures)):
            family = CounterMetricFamily(name, help_text, labels=["node"])
            family.add_metric([node], value)
            yield family
        latency = HistogramMetricFamily("hastore_put_latency_seconds", "Send request latency inside the node",
                                        labels=["node"])
        cumulative, buckets = 0, []
        for bound, count in zip((*PUT_LATENCY_BUCKETS_S, float("inf")), tally.put_latency_counts):
            cumulative += count
            buckets.append((floatToGoString(bound), cumulative))
        latency.add_metric([node], buckets, sum_value=tally.put_latency_sum_s)
        yield latency


class _ClientCollector:
    """Prometheus collector over a client server's ConnectionCounts: connections open and
    the limit, how connections ended that the node closed or refused, and the bytes held
    for clients (node/server/client_limits.py)."""

    GAUGES = (
        ("open", "hastore_connections", "Open client connections"),
        ("connections_max", "hastore_connections_max", "Client connections the node holds at most (connections_max)"),
        ("held_bytes", "hastore_client_held_bytes",
         "Bytes held for clients: replies built and not yet written, partial request frames"),
        ("peak_held_bytes", "hastore_client_held_bytes_peak", "The most bytes held for clients at once"),
    )
    COUNTERS = (
        ("accepted", "hastore_connections_accepted", "Client connections accepted"),
        ("refused_busy", "hastore_connections_refused_busy",
         "Connections refused (SYSTEM_BUSY) at the limit with every connection working"),
        ("idle_timeouts", "hastore_connections_idle_timeouts",
         "Connections closed after idle_timeout_ms with no request or reply"),
        ("auth_timeouts", "hastore_connections_auth_timeouts", "Connections closed for no AUTH within auth_timeout_ms"),
        ("auth_failures", "hastore_connections_auth_failures",
         "Connections that failed authentication (timeouts included)"),
        ("frame_errors", "hastore_connections_frame_errors", "Connections closed for a broken frame"),
        ("closed_for_memory", "hastore_connections_closed_for_memory",
         "Connections closed because all clients together held over client_buffer_bytes_max"),
        ("backpressure_pauses", "hastore_client_backpressure_pauses",
         "Times a connection's reader waited for its client to read replies before reading more requests"),
    )

    def __init__(self, node_id: str, counts) -> None:
        self._node = node_id
        self._counts = counts

    def describe(self):
        return []

    def collect(self):
        counts, node = self._counts, self._node
        for field, name, help_text in self.GAUGES:
            family = GaugeMetricFamily(name, help_text, labels=["node"])
            family.add_metric([node], getattr(counts, field))
            yield family
        for field, name, help_text in self.COUNTERS:
            family = CounterMetricFamily(name, help_text, labels=["node"])
            family.add_metric([node], getattr(counts, field))
            yield family
        shed = CounterMetricFamily("hastore_connections_shed",
                                   "Connections closed to make room for a new one at the limit: the idle longest, "
                                   "or one not authenticated or silent since it opened", labels=["node", "reason"])
        shed.add_metric([node, "idle"], counts.shed_idle)
        shed.add_metric([node, "unauthenticated"], counts.shed_unauthenticated)
        yield shed


class _ReplicationCollector:
    """Prometheus collector over the replication status section."""

    _SLAVE_GAUGES = (
        ("ack_offset", "hastore_replication_slave_ack_offset", "CommitLog offset the slave acknowledged"),
        ("lag_bytes", "hastore_replication_slave_lag_bytes", "Master max offset minus the slave's ack"),
        ("lag_ms", "hastore_replication_slave_lag_ms", "Age of the oldest message the slave has not acknowledged"),
        ("in_sync", "hastore_replication_slave_in_sync", "1 when the slave is in the sync-state set"),
        ("connected", "hastore_replication_slave_connected", "1 while the slave is connected"),
        ("rate_bytes_per_s", "hastore_replication_slave_rate_bytes_per_s", "Bytes per second the slave acks"),
    )

    def __init__(self, node_id: str, status) -> None:
        self._node = node_id
        self._status = status

    def describe(self):
        return []

    def collect(self):
        status = self._status()
        node = self._node
        role = GaugeMetricFamily("hastore_replication_is_master", "1 on a master, 0 on a slave", labels=["node"])
        role.add_metric([node], 1 if status.get("role") == "master" else 0)
        yield role
        fenced = GaugeMetricFamily("hastore_replication_fenced", "1 while the node acks no write", labels=["node"])
        fenced.add_metric([node], 1 if status.get("fenced") else 0)
        yield fenced
        if "confirm_offset" in status:
            confirm = GaugeMetricFamily("hastore_replication_confirm_offset", "Least ack over the sync-state set",
                                        labels=["node"])
            confirm.add_metric([node], status["confirm_offset"])
            yield confirm
            members = GaugeMetricFamily("hastore_replication_sync_state_set_size",
                                        "Members of the sync-state set, the master included", labels=["node"])
            members.add_metric([node], len(status["sync_state_set"]))
            yield members
            for key, name, help_text in self._SLAVE_GAUGES:
                family = GaugeMetricFamily(name, help_text, labels=["node", "slave"])
                for slave in status["slaves"]:
                    family.add_metric([node, slave["node_id"]], float(slave[key]))
                yield family
            yield from self._lag_families(node, status["slaves"])
        if "master_max_offset" in status:
            for key, name, help_text in (("lag_bytes", "hastore_replication_lag_bytes", "Bytes this slave is behind"),
                                         ("connected", "hastore_replication_connected", "1 while following")):
                family = GaugeMetricFamily(name, help_text, labels=["node"])
                family.add_metric([node], float(status[key]))
                yield family


    @staticmethod
    def _lag_families(node: str, slaves: list[dict]):
        """Lag in seconds and the lag status per slave (replication/lag_history.py): one series
        per status value, 1 for the slave's current one, so an alert reads ``== 1``."""
        seconds = GaugeMetricFamily("hastore_replication_slave_lag_seconds",
                                    "Age of the oldest message the slave has not acknowledged, in seconds",
                                    labels=["node", "slave"])
        for slave in slaves:
            seconds.add_metric([node, slave["node_id"]], slave["lag_ms"] / 1000)
        yield seconds
        judged = GaugeMetricFamily("hastore_replication_slave_status",
                                   "1 for the slave's lag status (OK, CATCHING_UP, FALLING_BEHIND, STALLED, OFFLINE), "
                                   "judged from the trend of its lag with no threshold", labels=["node", "slave", "status"])
        for slave in slaves:
            current = slave.get("lag_status")
            if current is None:
                continue   # a status section read without the lag sampler (bare handlers)
            for value in LagStatus:
                judged.add_metric([node, slave["node_id"], value.value], 1.0 if value.value == current else 0.0)
        yield judged


async def serve_metrics(listeners: list, metrics: NodeMetrics, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Answer every HTTP request on ``listeners`` with the Prometheus text of ``metrics``."""

    async def handle(stream: trio.abc.Stream) -> None:
        try:
            with trio.move_on_after(SCRAPE_TIMEOUT_S):
                head = b""
                while b"\r\n\r\n" not in head and len(head) < REQUEST_HEAD_BYTES_MAX:
                    chunk = await stream.receive_some(4096)
                    if not chunk:
                        return
                    head += chunk
                path = head.split(b" ", 2)[1] if head.count(b" ") >= 2 else b"/"
                if path.split(b"?")[0] in (b"/", b"/metrics"):
                    body, status = metrics.render(), b"200 OK"
                else:
                    body, status = b"not found: try /metrics\n", b"404 Not Found"
                await stream.send_all(b"HTTP/1.1 " + status + b"\r\nContent-Type: "
                                      + CONTENT_TYPE_LATEST.encode() + b"\r\nContent-Length: "
                                      + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            await trio.aclose_forcefully(stream)

    await trio.serve_listeners(handle, listeners, task_status=task_status)


async def open_listeners(address: str) -> list:
    host, port = split_address(address)
    return await trio.open_tcp_listeners(port, host=host)
