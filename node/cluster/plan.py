"""Which processes a topology runs, and how: a ``ProcessSpec`` per process, with each node's
config written on the way, and for a proxied cluster the proxy of every link.

    phase -1 toxiproxy    proxied only: DIR/toxiproxy/ (toxiproxy.log; `hastore chaos toxiproxy
                          serve`), unless TOXIPROXY_URL names a Toxiproxy to use instead
    phase 0  zookeeper    DIR/zookeeper/ (conf/zoo.cfg, data/, zookeeper.log)
    phase 1  controller   DIR/controller-N/ (controller.log; `hastore controller start`)
    phase 2  node         DIR/<node>/ (node.yaml, node.log, store/)

In static mode (``controller: {mode: static}``) only nodes run (and the proxy server):
masters in phase 0, slaves in phase 1. Ports a previous ``up`` in the same directory used
(nodes, ZooKeeper, the proxy server, each proxy) are kept while they are free, so addresses
stay stable across restarts.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass

import yaml
from controller import ZooKeeperServer
from controller.errors import ZooKeeperServerError

from ..wire.address import split_address
from .proxies import (TOXIPROXY, TOXIPROXY_URL_ENV, ProxyLink, ToxiproxyAPI, client_proxies, node_routes,
                      plan_links, toxiproxy_spec, with_listen_addresses)
from .state import ProcessSpec, write_atomically
from .topology import ClusterError, ClusterTopology, NodePorts, assign_ports, free_ports, port_is_free

ZOOKEEPER = "zookeeper"


@dataclass(frozen=True, slots=True)
class ClusterPlan:
    """What ``up`` starts: the processes, and for a proxied cluster its proxies
    (``{"api": URL, "external": bool, "links": [...]}``, as cluster.json keeps it) or None."""

    processes: list[ProcessSpec]
    proxies: dict | None = None


def plan_processes(directory: str, topology: ClusterTopology, previous: list[ProcessSpec],
                   previous_proxies: dict | None = None) -> ClusterPlan:
    """Every process's spec, with node configs written: the proxy server (proxied), ZooKeeper and
    controllers (controller mode), then nodes. ``previous``: the specs the directory last ran,
    ``previous_proxies`` its proxies (their ports are reused)."""
    ports = assign_ports(topology, {spec.name: NodePorts(*(split_address(a)[1] for a in (
        spec.client_address, spec.ha_address, spec.metrics_address))) for spec in previous if spec.kind == "node"})
    taken = {port for node_ports in ports.values() for port in node_ports.as_list()}
    processes: list[ProcessSpec] = []
    zookeeper = None
    if topology.controller.enabled:
        zookeeper = _zookeeper_spec(directory, topology, previous, taken)
        taken.add(split_address(zookeeper.client_address)[1])
    controllers = [f"controller-{index}" for index in range(1, topology.controller.controllers + 1)] \
        if zookeeper else []
    links: tuple[ProxyLink, ...] = ()
    proxies = None
    if topology.proxied:
        api, toxiproxy = _proxy_server(directory, previous, taken)
        if toxiproxy is not None:
            processes.append(toxiproxy)
            taken.add(split_address(toxiproxy.client_address)[1])
        nodes = [(node.node_id, node.group, _address(topology, ports[node.node_id].client_port),
                  _address(topology, ports[node.node_id].ha_port)) for node in topology.nodes]
        earlier = {item["name"]: item["listen"] for item in (previous_proxies or {}).get("links", [])
                   if item.get("listen")}
        links = with_listen_addresses(plan_links(nodes, zookeeper and zookeeper.client_address, controllers),
                                      topology.host, earlier, taken)
        proxies = {"api": api, "external": toxiproxy is None, "links": [link.to_json() for link in links]}
    if zookeeper is not None:
        processes.append(zookeeper)
        for index, name in enumerate(controllers, 1):
            dialed = node_routes(name, links, {})[0] or zookeeper.client_address
            processes.append(_controller_spec(directory, topology, index, dialed, zookeeper.client_address))
    processes += _write_node_configs(directory, topology, ports, zookeeper and zookeeper.client_address, links)
    return ClusterPlan(processes, proxies)


def _address(topology: ClusterTopology, port: int) -> str:
    return f"{topology.host}:{port}"


def _proxy_server(directory: str, previous: list[ProcessSpec], taken: set[int]) -> tuple[str, ProcessSpec | None]:
    """(the Toxiproxy API's URL, the server's spec): TOXIPROXY_URL's Toxiproxy (no process of
    ours), else `hastore chaos toxiproxy serve` on the port it had before while free, or a free one."""
    url = os.environ.get(TOXIPROXY_URL_ENV)
    if url:
        return ToxiproxyAPI(url).url, None
    last = next((spec for spec in previous if spec.kind == TOXIPROXY), None)
    port = split_address(last.client_address)[1] if last else None
    if port is None or port in taken or not port_is_free("127.0.0.1", port):
        port = free_ports("127.0.0.1", 1, exclude=taken)[0]
    spec = toxiproxy_spec(directory, port, hastore_argv())
    return f"http://{spec.client_address}", spec


def hastore_argv() -> tuple[str, ...]:
    """How to run the hastore CLI: the script beside this interpreter, else ``python -m node.cli``."""
    script = shutil.which("hastore", path=os.path.dirname(sys.executable))
    return (script,) if script else (sys.executable, "-P", "-m", "node.cli")


def _zookeeper_spec(directory: str, topology: ClusterTopology, previous: list[ProcessSpec],
                    taken: set[int]) -> ProcessSpec:
    settings = topology.controller
    base_dir = os.path.join(directory, ZOOKEEPER)
    last = next((spec for spec in previous if spec.kind == "zookeeper"), None)
    if settings.zookeeper_port:
        port = settings.zookeeper_port
        if not port_is_free("127.0.0.1", port):
            raise ClusterError(f"ZooKeeper's port {port} on 127.0.0.1 is in use; free it or set "
                               f"controller.zookeeper.port to another port (0: a free one)")
    elif (last and split_address(last.client_address)[1] not in taken
          and port_is_free("127.0.0.1", split_address(last.client_address)[1])):
        port = split_address(last.client_address)[1]
    else:
        port = free_ports("127.0.0.1", 1, exclude=taken)[0]
    if port in taken:
        raise ClusterError(f"ZooKeeper's port {port} is also given to a node; choose other ports")
    try:
        argv = ZooKeeperServer(base_dir, port, settings.zookeeper_tick_ms).launch_command(port)
    except ZooKeeperServerError as error:
        raise ClusterError(f"controller mode needs ZooKeeper: {error}; or set `controller: {{mode: static}}` "
                           f"in cluster.yaml") from None
    return ProcessSpec(name=ZOOKEEPER, kind="zookeeper", phase=0, argv=tuple(argv),
                       config_path=os.path.join(base_dir, "conf", "zoo.cfg"),
                       log_path=os.path.join(base_dir, "zookeeper.log"), data_path=os.path.join(base_dir, "data"),
                       client_address=f"127.0.0.1:{port}")


def _controller_spec(directory: str, topology: ClusterTopology, index: int, zk_hosts: str,
                     zk_address: str) -> ProcessSpec:
    """Controller ``index``, dialing ZooKeeper at ``zk_hosts`` (its proxy in a proxied cluster;
    ``zk_address`` is ZooKeeper itself, where the readiness probe looks)."""
    settings = topology.controller
    name = f"controller-{index}"
    base_dir = os.path.join(directory, name)
    os.makedirs(base_dir, exist_ok=True)
    argv = (*hastore_argv(), "controller", "start", "--zk", zk_hosts, "--cluster", topology.cluster,
            "--session-timeout-ms", str(settings.session_timeout_ms), "--id", name,
            *(("--enable-elect-unclean-master",) if settings.enable_elect_unclean_master else ()))
    return ProcessSpec(name=name, kind="controller", phase=1, argv=argv, config_path=base_dir,
                       log_path=os.path.join(base_dir, "controller.log"), data_path=base_dir, zk_address=zk_address)


def _write_node_configs(directory: str, topology: ClusterTopology, ports: dict[str, NodePorts],
                        zk_hosts: str | None, links: tuple[ProxyLink, ...]) -> list[ProcessSpec]:
    """Write each node's node.yaml (its own proxies in ``links`` when proxied, and its client
    proxy as the client address it advertises); their specs."""
    ha_of = {node.node_id: _address(topology, ports[node.node_id].ha_port) for node in topology.nodes}
    advertised = client_proxies(links)
    specs = []
    for node in topology.nodes:
        node_dir = os.path.join(directory, node.node_id)
        os.makedirs(node_dir, exist_ok=True)
        config_path = os.path.join(node_dir, "node.yaml")
        store_path = os.path.join(node_dir, "store")
        zk_proxy, peers = node_routes(node.node_id, links, ha_of)
        mapping = topology.node_config(node, ports, store_path, zk_hosts=zk_proxy or zk_hosts, peer_ha_addresses=peers,
                                       advertised=advertised)
        write_atomically(config_path, "# written by `hastore cluster up`; rewritten at every up\n"
                         + yaml.safe_dump(mapping, sort_keys=False), private=topology.secret is not None)
        phase = 2 if zk_hosts is not None else (0 if node.role == "master" else 1)
        specs.append(ProcessSpec(
            name=node.node_id, kind="node", phase=phase,
            argv=(*hastore_argv(), "node", "start", "--config", config_path), config_path=config_path,
            log_path=os.path.join(node_dir, "node.log"), data_path=store_path, group=node.group,
            role=node.role, client_address=mapping["client_address"], ha_address=mapping["ha_address"],
            metrics_address=mapping["metrics_address"]))
    return specs
