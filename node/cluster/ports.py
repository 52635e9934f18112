"""Ports of a local cluster: each node's three, kept across ``up``s while free, and free
loopback ports for ZooKeeper, the Toxiproxy API and the proxies.

``assign_ports`` takes a topology (topology.py) duck-typed: its ``host`` and its ``nodes``
(each with ``node_id`` and ``fixed_ports``).
"""

from __future__ import annotations

import random
import socket
from dataclasses import dataclass

from .errors import ClusterError

PORTS_PER_NODE = 3


@dataclass(frozen=True, slots=True)
class NodePorts:
    """The three ports of one node on the cluster's host."""

    client_port: int
    ha_port: int
    metrics_port: int

    def as_list(self) -> list[int]:
        return [self.client_port, self.ha_port, self.metrics_port]


def assign_ports(topology, previous: dict[str, NodePorts]) -> dict[str, NodePorts]:
    """Ports of every node: fixed ones as given; otherwise the ones a previous run used in the
    same directory (so addresses and message ids stay put) when they are still free; else
    fresh free ports. Raises ClusterError when a fixed port is taken."""
    assigned: dict[str, NodePorts] = {}
    for node in topology.nodes:
        if node.fixed_ports:
            busy = [port for port in node.fixed_ports.as_list() if not port_is_free(topology.host, port)]
            if busy:
                raise ClusterError(f"node {node.node_id}: port(s) {', '.join(map(str, busy))} on {topology.host} "
                                   f"are in use; free them or choose another base_port")
            assigned[node.node_id] = node.fixed_ports
    taken = {port for ports in assigned.values() for port in ports.as_list()}
    for node in topology.nodes:
        if node.node_id in assigned:
            continue
        old = previous.get(node.node_id)
        if old and not taken & set(old.as_list()) and all(port_is_free(topology.host, p) for p in old.as_list()):
            assigned[node.node_id] = old
            taken |= set(old.as_list())
    wanted = [node.node_id for node in topology.nodes if node.node_id not in assigned]
    fresh = free_ports(topology.host, PORTS_PER_NODE * len(wanted), exclude=taken)
    for index, node_id in enumerate(wanted):
        assigned[node_id] = NodePorts(*fresh[PORTS_PER_NODE * index:PORTS_PER_NODE * (index + 1)])
    return assigned


def port_is_free(host: str, port: int) -> bool:
    """Whether a listener could bind ``host:port`` now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the node's listener does
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def free_ports(host: str, count: int, exclude: set[int] = frozenset()) -> list[int]:
    """``count`` distinct free ports, all bound at once so none repeats, chosen below the
    kernel's ephemeral range. A port the kernel hands out for ``bind(host, 0)`` comes from
    that range, and so does the local port of every outgoing connection: between this choice
    and the listener's bind, any connection a starting cluster makes (controllers to
    ZooKeeper, proxies to their upstreams) could take it, and the node would fail to start
    with its port "in use". Below the range only another listener can."""
    low, high = _unclaimed_range()
    candidates = [port for port in random.sample(range(low, high + 1), min(high - low + 1, 4 * count + 64))
                  if port not in exclude]
    sockets: list[socket.socket] = []
    ports: list[int] = []
    try:
        for port in candidates:   # bounded by the sample's size
            if len(ports) == count:
                break
            probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the node's listener does
            try:
                probe.bind((host, port))
            except OSError:
                probe.close()
                continue
            sockets.append(probe)
            ports.append(port)
    finally:
        for probe in sockets:
            probe.close()
    if len(ports) != count:
        raise ClusterError(f"could not find {count} free ports on {host} in {low}-{high}")
    return ports


EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
LOWEST_PORT = 10_000


def _unclaimed_range() -> tuple[int, int]:
    """The ports from LOWEST_PORT up to the ephemeral range's start (Linux default 32768), or,
    if that range starts too low to leave room, the ports above its end."""
    try:
        with open(EPHEMERAL_RANGE_FILE) as handle:
            first, last = (int(field) for field in handle.read().split())
    except (OSError, ValueError):
        first, last = 32768, 60999
    if first - LOWEST_PORT >= 4096:
        return LOWEST_PORT, first - 1
    if 65535 - last >= 4096:
        return last + 1, 65535
    return 1024, 65535   # no room outside it: any port, as the kernel would pick
