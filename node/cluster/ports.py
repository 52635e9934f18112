"""Ports of a local cluster: each node's three, kept across ``up``s while free, and free
loopback ports for ZooKeeper, the Toxiproxy API and the proxies.

``assign_ports`` takes a topology (topology.py) duck-typed: its ``host`` and its ``nodes``
(each with ``node_id`` and ``fixed_ports``).
"""

from __future__ import annotations

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
    """``count`` distinct ports the kernel hands out as free, all bound at once so none repeats."""
    sockets: list[socket.socket] = []
    ports: list[int] = []
    try:
        for _ in range(count + len(exclude) + 16):  # bounded: a few spare tries for excluded ports
            if len(ports) == count:
                break
            probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(probe)
            probe.bind((host, 0))
            port = probe.getsockname()[1]
            if port not in exclude:
                ports.append(port)
    finally:
        for probe in sockets:
            probe.close()
    if len(ports) != count:
        raise ClusterError(f"could not find {count} free ports on {host}")
    return ports

