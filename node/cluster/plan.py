"""Which processes a topology runs, and how: a ``ProcessSpec`` per process, with each node's
config written on the way.

    phase 0  zookeeper    DIR/zookeeper/ (conf/zoo.cfg, data/, zookeeper.log)
    phase 1  controller   DIR/controller-N/ (controller.log; `hastore controller start`)
    phase 2  node         DIR/<node>/ (node.yaml, node.log, store/)

In static mode (``controller: {mode: static}``) only nodes run: masters in phase 0, slaves
in phase 1. Ports a previous ``up`` in the same directory used are kept while they are free,
so addresses stay stable across restarts.
"""

from __future__ import annotations

import os
import shutil
import sys

import yaml
from controller import ZooKeeperServer
from controller.errors import ZooKeeperServerError

from ..wire.address import split_address
from .state import ProcessSpec, write_atomically
from .topology import ClusterError, ClusterTopology, NodePorts, assign_ports, free_ports, port_is_free

ZOOKEEPER = "zookeeper"


def plan_processes(directory: str, topology: ClusterTopology, previous: list[ProcessSpec]) -> list[ProcessSpec]:
    """Every process's spec, with node configs written: ZooKeeper and controllers (controller
    mode), then nodes. ``previous``: the specs the directory last ran (their ports are reused)."""
    if not topology.controller.enabled:
        return _write_node_configs(directory, topology, previous, None, node_phase=None)
    zookeeper = _zookeeper_spec(directory, topology, previous)
    controllers = [_controller_spec(directory, topology, index, zookeeper.client_address)
                   for index in range(1, topology.controller.controllers + 1)]
    return [zookeeper, *controllers,
            *_write_node_configs(directory, topology, previous, zookeeper.client_address, node_phase=2)]


def hastore_argv() -> tuple[str, ...]:
    """How to run the hastore CLI: the script beside this interpreter, else ``python -m node.cli``."""
    script = shutil.which("hastore", path=os.path.dirname(sys.executable))
    return (script,) if script else (sys.executable, "-m", "node.cli")


def _zookeeper_spec(directory: str, topology: ClusterTopology, previous: list[ProcessSpec]) -> ProcessSpec:
    settings = topology.controller
    base_dir = os.path.join(directory, ZOOKEEPER)
    last = next((spec for spec in previous if spec.kind == "zookeeper"), None)
    if settings.zookeeper_port:
        port = settings.zookeeper_port
        if not port_is_free("127.0.0.1", port):
            raise ClusterError(f"ZooKeeper's port {port} on 127.0.0.1 is in use; free it or set "
                               f"controller.zookeeper.port to another port (0: a free one)")
    elif last and port_is_free("127.0.0.1", split_address(last.client_address)[1]):
        port = split_address(last.client_address)[1]
    else:
        taken = {p for spec in previous if spec.kind == "node"
                 for p in (split_address(a)[1] for a in (spec.client_address, spec.ha_address,
                                                        spec.metrics_address))}
        port = free_ports("127.0.0.1", 1, exclude=taken)[0]
    try:
        argv = ZooKeeperServer(base_dir, port, settings.zookeeper_tick_ms).launch_command(port)
    except ZooKeeperServerError as error:
        raise ClusterError(f"controller mode needs ZooKeeper: {error}; or set `controller: {{mode: static}}` "
                           f"in cluster.yaml") from None
    return ProcessSpec(name=ZOOKEEPER, kind="zookeeper", phase=0, argv=tuple(argv),
                       config_path=os.path.join(base_dir, "conf", "zoo.cfg"),
                       log_path=os.path.join(base_dir, "zookeeper.log"), data_path=os.path.join(base_dir, "data"),
                       client_address=f"127.0.0.1:{port}")


def _controller_spec(directory: str, topology: ClusterTopology, index: int, zk_hosts: str) -> ProcessSpec:
    settings = topology.controller
    name = f"controller-{index}"
    base_dir = os.path.join(directory, name)
    os.makedirs(base_dir, exist_ok=True)
    argv = (*hastore_argv(), "controller", "start", "--zk", zk_hosts, "--cluster", topology.cluster,
            "--session-timeout-ms", str(settings.session_timeout_ms), "--id", name,
            *(("--enable-elect-unclean-master",) if settings.enable_elect_unclean_master else ()))
    return ProcessSpec(name=name, kind="controller", phase=1, argv=argv, config_path=base_dir,
                       log_path=os.path.join(base_dir, "controller.log"), data_path=base_dir)


def _write_node_configs(directory: str, topology: ClusterTopology, previous: list[ProcessSpec],
                        zk_hosts: str | None, node_phase: int | None) -> list[ProcessSpec]:
    ports_before = {spec.name: NodePorts(*(split_address(a)[1] for a in
                                           (spec.client_address, spec.ha_address, spec.metrics_address)))
                    for spec in previous if spec.kind == "node"}
    ports = assign_ports(topology, ports_before)
    if zk_hosts is not None and split_address(zk_hosts)[1] in {p for n in ports.values() for p in n.as_list()}:
        raise ClusterError(f"ZooKeeper's port {zk_hosts} is also given to a node; choose other ports")
    specs = []
    for node in topology.nodes:
        node_dir = os.path.join(directory, node.node_id)
        os.makedirs(node_dir, exist_ok=True)
        config_path = os.path.join(node_dir, "node.yaml")
        store_path = os.path.join(node_dir, "store")
        mapping = topology.node_config(node, ports, store_path, zk_hosts=zk_hosts)
        write_atomically(config_path, "# written by `hastore cluster up`; rewritten at every up\n"
                         + yaml.safe_dump(mapping, sort_keys=False), private=topology.secret is not None)
        phase = node_phase if node_phase is not None else (0 if node.role == "master" else 1)
        specs.append(ProcessSpec(
            name=node.node_id, kind="node", phase=phase,
            argv=(*hastore_argv(), "node", "start", "--config", config_path), config_path=config_path,
            log_path=os.path.join(node_dir, "node.log"), data_path=store_path, group=node.group,
            role=node.role, client_address=mapping["client_address"], ha_address=mapping["ha_address"],
            metrics_address=mapping["metrics_address"]))
    return specs
