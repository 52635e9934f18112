"""Free ports of a local cluster come from below the kernel's ephemeral range, where no
outgoing connection can take one between its choice and the listener's bind."""

import socket

from node.cluster import ports
from node.cluster.ports import free_ports


def test_free_ports_are_distinct_bindable_and_below_the_ephemeral_range():
    low, high = ports._unclaimed_range()
    with open(ports.EPHEMERAL_RANGE_FILE) as handle:
        first, _last = (int(field) for field in handle.read().split())
    chosen = free_ports("127.0.0.1", 12)
    assert len(set(chosen)) == 12
    assert all(low <= port <= high for port in chosen)
    if first - ports.LOWEST_PORT >= 4096:
        assert all(port < first for port in chosen)
    for port in chosen:
        # As the node's listener does: a port an earlier test's cluster listened on may
        # still hold that listener's closed connections in TIME_WAIT; free_ports counts
        # it free, and so does a listener with SO_REUSEADDR, but a plain bind does not.
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(("127.0.0.1", port))


def test_free_ports_skip_excluded_and_busy_ports(monkeypatch):
    monkeypatch.setattr(ports, "_unclaimed_range", lambda: (ports.LOWEST_PORT, ports.LOWEST_PORT + 40))
    with socket.socket() as busy:
        busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        busy.bind(("127.0.0.1", ports.LOWEST_PORT))
        busy.listen()
        excluded = set(range(ports.LOWEST_PORT + 1, ports.LOWEST_PORT + 31))
        chosen = free_ports("127.0.0.1", 5, exclude=excluded)
    assert not set(chosen) & (excluded | {ports.LOWEST_PORT})
    assert all(ports.LOWEST_PORT + 31 <= port <= ports.LOWEST_PORT + 40 for port in chosen)
