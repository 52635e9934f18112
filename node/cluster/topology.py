"""The topology of a local cluster: groups, nodes, roles, ports, read from ``cluster.yaml``.

Every key has a default, so an empty (or absent) file is one group ``g1`` of three nodes,
the first a master and the others its slaves, with sync replication on free loopback ports::

    cluster: hastore              # cluster name given to every node
    host: 127.0.0.1               # IPv4 loopback only: a local cluster never listens elsewhere
    base_port: 0                  # 0: free ports, picked once and written into each node.yaml;
                                  # N: node i (in file order) gets N+3i (client), N+3i+1 (HA), N+3i+2 (metrics)
    nodes_per_group: 3            # for groups that do not say `nodes`
    replication: sync             # sync | async, every group unless it says otherwise
    flush: async                  # sync | async
    min_in_sync_replicas: 1       # sync puts: acks needed from the sync-state set, master included
    all_ack_in_sync_state_set: true   # sync puts wait for every member of the sync-state set;
                                  # default true in controller mode (false in static mode), so
                                  # that any member the controller elects holds every acked write
    secret: null                  # cluster secret (HMAC challenge for clients and slaves); better:
    secret_file: null             # a file holding it (mode 0600; relative to cluster.yaml), named
                                  # in each node.yaml instead of the secret. With neither, `up`
                                  # takes HASTORE_SECRET from the environment (cluster_secret.py)
    proxied: false                # true: every link through a Toxiproxy proxy of its own (proxies.py;
                                  # `hastore cluster up --proxied`)
    startup_timeout_s: 30         # a node must answer `status` within this, or `up` fails
    shutdown_timeout_s: 10        # SIGTERM grace before SIGKILL
    store: {...}                  # StoreConfig keys over LOCAL_STORE_DEFAULTS (small segments)
    groups:                       # default {g1: {}}
      g1:
        nodes: 3                  # a count (ids {group}-n1..) or a list of node ids
        master: g1-n1             # default: the first node
        replication: sync         # group overrides of the cluster-wide keys
        flush: async
        min_in_sync_replicas: 1
        all_ack_in_sync_state_set: true
        store: {...}
    nodes:                        # per-node overrides, by node id
      g1-n2:
        client_port: 20001        # fixed ports for this node (else from base_port / free)
        ha_port: 20002
        metrics_port: 20003
        flush: sync               # any other NodeConfig key the cluster does not own
        store: {...}
    controller:                   # who decides each group's master
      mode: controller            # controller: ZooKeeper + controllers elect masters (failover);
                                  # static: fixed roles from `groups.*.master`, no ZooKeeper
      zookeeper: {tick_ms: 250, port: 0}   # a standalone ZooKeeper; port 0: a free port
      controllers: 2              # `hastore controller start` processes (one active, the rest standby)
      session_timeout_ms: 2000    # ZooKeeper session of nodes and controllers: a dead master is
                                  # noticed after about this long (must lie in [2, 20] x tick_ms)
      enable_elect_unclean_master: false   # true: elect outside the sync-state set (may lose acks)

In controller mode a group's ``master`` (default: its first node) is only a preference: it
gets priority 0 (lower wins ties) and the others 1, 2, ... in file order; every node
starts as a fenced slave and takes its role from the controller. The short default
session timeout (2 s, with a 250 ms tick) suits a local cluster and failover drills; a
production ZooKeeper deployment would use several seconds.

Unknown keys and bad values are refused with the key's path named. Each node's final
config is checked with NodeConfig's own rules at load, so a cluster never half-starts
because of a typo. The process kinds the topology yields (``zookeeper``, ``controller``,
``node``) are described by process specs in cluster_supervisor.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
from dataclasses import dataclass, field

from ..errors import NodeConfigError
from ..server.config import config_from_mapping, read_secret_file, read_yaml
from .errors import ClusterConfigError, ClusterError
from .ports import PORTS_PER_NODE, NodePorts, assign_ports, free_ports, port_is_free

__all__ = ["ClusterError", "ClusterConfigError", "ClusterTopology", "ControllerSpec", "GroupSpec", "NodeSpec",
           "NodePorts", "LOCAL_STORE_DEFAULTS", "assign_ports", "default_topology", "free_ports", "load_topology",
           "port_is_free", "topology_from_mapping"]

# A local demo should not reserve GiBs: 64 MiB segments, no next-segment preallocation,
# smaller consume queue files (1.2 MB) and sparse index files of ~8 MB. A full disk refuses
# writes at 95% instead of deleting the oldest segments at the store's 75%: a developer's disk
# is often past 75% already, and a local cluster deleting segments under a drill or a chaos
# run would be reported as lost messages (a 200-cycle soak lost its first segment on every
# node that way while benches filled this machine's disk past 95%).
LOCAL_STORE_DEFAULTS = {"commitlog_segment_bytes": 64 * 1024 * 1024, "preallocate_next_segment": False,
                        "consume_queue_entries_per_file": 60_000, "index_hash_slots": 100_000,
                        "index_max_entries": 400_000, "disk_max_used_ratio": 0.95,
                        "disk_full_policy": "refuse_writes"}

_TOP_KEYS = ("cluster", "host", "base_port", "nodes_per_group", "replication", "flush", "min_in_sync_replicas",
             "all_ack_in_sync_state_set", "secret", "secret_file", "proxied",
             "startup_timeout_s", "shutdown_timeout_s", "store", "groups", "nodes", "controller")
_GROUP_KEYS = ("nodes", "master", "replication", "flush", "min_in_sync_replicas", "all_ack_in_sync_state_set",
               "store")
_SYNC_KEYS = ("min_in_sync_replicas", "all_ack_in_sync_state_set")
_PORT_KEYS = ("client_port", "ha_port", "metrics_port")
# NodeConfig keys the cluster sets itself for every node; an override may not change them.
_OWNED_NODE_KEYS = ("node_id", "cluster", "group", "store_path", "role", "client_address", "ha_address",
                    "metrics_address", "master_ha_address", "master_client_address", "secret", "secret_file",
                    "zk_hosts", "priority", "zk_session_timeout_ms", "peer_ha_addresses",
                    "advertised_client_address", "advertised_ha_address")
# NodeConfig keys of controller mode; the cluster builds and checks them itself.
_CONTROLLER_NODE_KEYS = ("zk_hosts", "priority", "zk_session_timeout_ms")
_CONTROLLER_KEYS = ("mode", "zookeeper", "controllers", "session_timeout_ms", "enable_elect_unclean_master")
_ZOOKEEPER_KEYS = ("tick_ms", "port")
CONTROLLERS_MAX = 5
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
NODES_PER_GROUP_MAX = 16


@dataclass(frozen=True, slots=True)
class ControllerSpec:
    """How masters are chosen: ``static`` roles, or a ZooKeeper and controllers (``controller``)."""

    mode: str = "controller"              # controller | static
    zookeeper_tick_ms: int = 250
    zookeeper_port: int = 0               # 0: a free port, kept across `up`s of a directory while free
    controllers: int = 2
    session_timeout_ms: int = 2000
    enable_elect_unclean_master: bool = False

    @property
    def enabled(self) -> bool:
        return self.mode == "controller"


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One node of the topology: its group, static role and the overrides of its config."""

    node_id: str
    group: str
    role: str                     # master | slave
    fixed_ports: NodePorts | None  # from `nodes.<id>.*_port` or base_port; None: free ports
    config: dict                  # NodeConfig keys the cluster does not own (replication, flush, store, ...)


@dataclass(frozen=True, slots=True)
class GroupSpec:
    """A master and its slaves."""

    name: str
    nodes: tuple[NodeSpec, ...]

    @property
    def master(self) -> NodeSpec:
        return next(node for node in self.nodes if node.role == "master")


@dataclass(frozen=True, slots=True)
class ClusterTopology:
    """The whole local cluster as cluster.yaml describes it, every default filled in."""

    cluster: str = "hastore"
    host: str = "127.0.0.1"
    base_port: int = 0
    secret: str | None = field(default=None, repr=False)   # never in a repr, a log line or a status
    secret_file: str | None = None        # where the secret comes from when not the YAML (mode 0600)
    startup_timeout_s: float = 30.0
    shutdown_timeout_s: float = 10.0
    groups: tuple[GroupSpec, ...] = ()
    source: dict = field(default_factory=dict, repr=False)  # the mapping it was read from (in cluster.json)
    controller: ControllerSpec = ControllerSpec()
    proxied: bool = False                 # every link through a Toxiproxy proxy of its own (proxies.py)

    @property
    def nodes(self) -> list[NodeSpec]:
        return [node for group in self.groups for node in group.nodes]

    def node(self, node_id: str) -> NodeSpec:
        for node in self.nodes:
            if node.node_id == node_id:
                return node
        raise ClusterError(f"no node {node_id!r} in the topology (nodes: {', '.join(n.node_id for n in self.nodes)})")

    def node_config(self, node: NodeSpec, ports: dict[str, NodePorts], store_path: str,
                    zk_hosts: str | None = None, peer_ha_addresses: dict | None = None,
                    advertised: dict | None = None) -> dict:
        """The YAML mapping of ``node``'s config, with every node's ports resolved. In controller
        mode it names ZooKeeper (``zk_hosts``, required then) instead of a static role. A
        proxied cluster gives the node's own ZooKeeper proxy as ``zk_hosts``, the proxy of
        each slave -> master pair in ``peer_ha_addresses`` and, in ``advertised`` (node id ->
        its client proxy), the address each node tells clients (``advertised_client_address``;
        a static slave's ``master_client_address``), so that no redirect bypasses a proxy. The
        secret is named by its file when it has one, so that node.yaml does not hold it."""
        advertised = advertised or {}
        group = next(g for g in self.groups if g.name == node.group)
        own = ports[node.node_id]
        mapping = {"node_id": node.node_id, "cluster": self.cluster, "group": node.group, "store_path": store_path,
                   "client_address": self._address(own.client_port), "ha_address": self._address(own.ha_port),
                   "metrics_address": self._address(own.metrics_port)}
        if self.controller.enabled:
            if zk_hosts is None:
                raise ClusterError("controller mode: the node config needs ZooKeeper's address (zk_hosts)")
            mapping.update(zk_hosts=zk_hosts, priority=self.priority(node),
                           zk_session_timeout_ms=self.controller.session_timeout_ms)
        else:
            mapping["role"] = node.role
        if not self.controller.enabled and node.role == "slave":
            master = ports[group.master.node_id]
            mapping["master_ha_address"] = self._address(master.ha_port)
            mapping["master_client_address"] = advertised.get(group.master.node_id,
                                                              self._address(master.client_port))
        if node.node_id in advertised:
            mapping["advertised_client_address"] = advertised[node.node_id]
        if self.secret_file is not None:
            mapping["secret_file"] = self.secret_file
        elif self.secret is not None:
            mapping["secret"] = self.secret
        if peer_ha_addresses:
            mapping["peer_ha_addresses"] = dict(peer_ha_addresses)
        mapping.update(node.config)
        return mapping

    def priority(self, node: NodeSpec) -> int:
        """Controller mode: 0 for the group's preferred master, then 1, 2, ... in file order."""
        group = next(g for g in self.groups if g.name == node.group)
        others = [n.node_id for n in group.nodes if n.role != "master"]
        return 0 if node.role == "master" else 1 + others.index(node.node_id)

    def _address(self, port: int) -> str:
        return f"{self.host}:{port}"


def default_topology() -> ClusterTopology:
    """One group g1: g1-n1 master, g1-n2 and g1-n3 slaves, sync replication, free ports."""
    return topology_from_mapping({})


def load_topology(path: str) -> ClusterTopology:
    """Read and check a cluster.yaml (a relative ``secret_file`` is taken from its directory)."""
    mapping = read_yaml(path, "cluster config", ClusterConfigError)
    if isinstance(mapping, dict) and isinstance(mapping.get("secret_file"), str):
        where = os.path.dirname(os.path.abspath(path))
        mapping = {**mapping, "secret_file": os.path.join(where, os.path.expanduser(mapping["secret_file"]))}
    try:
        return topology_from_mapping(mapping)
    except ClusterConfigError as error:
        raise ClusterConfigError(f"{path}: {error}") from None


def topology_from_mapping(mapping: object) -> ClusterTopology:
    """Build a ClusterTopology from a parsed cluster.yaml, refusing unknown keys and bad values."""
    mapping = _mapping(mapping, "the cluster config")
    _refuse_unknown(mapping, _TOP_KEYS, "")
    cluster = _name(mapping.get("cluster", "hastore"), "cluster")
    host = _loopback_host(mapping.get("host", "127.0.0.1"))
    base_port = _integer(mapping.get("base_port", 0), "base_port", 0, 65535)
    per_group = _integer(mapping.get("nodes_per_group", 3), "nodes_per_group", 1, NODES_PER_GROUP_MAX)
    secret, secret_file = _secret(mapping)
    proxied = _boolean(mapping.get("proxied", False), "proxied")
    startup = _number(mapping.get("startup_timeout_s", 30), "startup_timeout_s", 1, 600)
    shutdown = _number(mapping.get("shutdown_timeout_s", 10), "shutdown_timeout_s", 0.1, 600)
    controller = _controller(mapping.get("controller"))
    cluster_defaults = {"replication": _choice(mapping.get("replication", "sync"), "replication"),
                        "flush": _choice(mapping.get("flush", "async"), "flush"),
                        "min_in_sync_replicas": _integer(mapping.get("min_in_sync_replicas", 1),
                                                         "min_in_sync_replicas", 1, NODES_PER_GROUP_MAX),
                        "all_ack_in_sync_state_set": _boolean(mapping.get("all_ack_in_sync_state_set",
                                                                          controller.enabled),
                                                              "all_ack_in_sync_state_set"),
                        "store": {**LOCAL_STORE_DEFAULTS, **_mapping(mapping.get("store"), "store")}}
    groups_mapping = _mapping(mapping.get("groups", {"g1": {}}), "groups")
    if not groups_mapping:
        raise ClusterConfigError("groups: at least one group is needed")
    overrides = _mapping(mapping.get("nodes"), "nodes")
    groups = tuple(_group(_name(name, "groups"), spec, per_group, cluster_defaults, overrides)
                   for name, spec in groups_mapping.items())
    known_ids = [node.node_id for group in groups for node in group.nodes]
    duplicates = sorted({node_id for node_id in known_ids if known_ids.count(node_id) > 1})
    if duplicates:
        raise ClusterConfigError(f"groups: node ids must be unique across groups; repeated: {', '.join(duplicates)}")
    for node_id in overrides:
        if node_id not in known_ids:
            raise ClusterConfigError(f"nodes.{node_id}: no such node (nodes: {', '.join(known_ids)})")
    if secret_file is not None:
        mapping = {**mapping, "secret_file": secret_file}   # absolute: cluster.json is read from anywhere
    topology = ClusterTopology(cluster=cluster, host=host, base_port=base_port, secret=secret,
                               secret_file=secret_file, startup_timeout_s=startup, shutdown_timeout_s=shutdown,
                               groups=groups, source=dict(mapping), controller=controller, proxied=proxied)
    topology = _with_base_ports(topology)
    _check_node_configs(topology)
    return topology


def _secret(mapping: dict) -> tuple[str | None, str | None]:
    """(the secret, the file it was read from): ``secret``, or ``secret_file`` (mode 0600)."""
    secret, path = mapping.get("secret"), mapping.get("secret_file")
    if secret is not None and path is not None:
        raise ClusterConfigError("secret_file: give secret or secret_file, not both")
    if secret is not None and (not isinstance(secret, str) or not secret):
        raise ClusterConfigError("secret: must be a non-empty string when set")
    if path is None:
        return secret, None
    if not isinstance(path, str) or not path.strip():
        raise ClusterConfigError(f"secret_file: must be a file path, not {path!r}")
    path = os.path.abspath(os.path.expanduser(path))
    try:
        return read_secret_file(path), path
    except NodeConfigError as error:
        raise ClusterConfigError(str(error)) from None


def _controller(value: object) -> ControllerSpec:
    spec = _mapping(value, "controller")
    _refuse_unknown(spec, _CONTROLLER_KEYS, "controller.")
    mode = spec.get("mode", "controller")
    if mode not in ("controller", "static"):
        raise ClusterConfigError(f"controller.mode: must be 'controller' or 'static', not {mode!r}")
    zookeeper = _mapping(spec.get("zookeeper"), "controller.zookeeper")
    _refuse_unknown(zookeeper, _ZOOKEEPER_KEYS, "controller.zookeeper.")
    tick_ms = _integer(zookeeper.get("tick_ms", 250), "controller.zookeeper.tick_ms", 50, 10_000)
    port = _integer(zookeeper.get("port", 0), "controller.zookeeper.port", 0, 65535)
    controllers = _integer(spec.get("controllers", 2), "controller.controllers", 1, CONTROLLERS_MAX)
    # ZooKeeper grants session timeouts in [2, 20] ticks only: refuse what it would silently change.
    session_ms = _integer(spec.get("session_timeout_ms", 2000), "controller.session_timeout_ms",
                          2 * tick_ms, 20 * tick_ms)
    unclean = _boolean(spec.get("enable_elect_unclean_master", False), "controller.enable_elect_unclean_master")
    return ControllerSpec(mode, tick_ms, port, controllers, session_ms, unclean)


def _group(name: str, spec: object, per_group: int, defaults: dict, overrides: dict) -> GroupSpec:
    spec = _mapping(spec, f"groups.{name}")
    _refuse_unknown(spec, _GROUP_KEYS, f"groups.{name}.")
    nodes = spec.get("nodes", per_group)
    if isinstance(nodes, int) and not isinstance(nodes, bool):
        _integer(nodes, f"groups.{name}.nodes", 1, NODES_PER_GROUP_MAX)
        node_ids = [f"{name}-n{i}" for i in range(1, nodes + 1)]
    elif isinstance(nodes, list) and nodes:
        node_ids = [_name(str(node_id) if isinstance(node_id, int) else node_id, f"groups.{name}.nodes")
                    for node_id in nodes]
        if len(node_ids) > NODES_PER_GROUP_MAX:
            raise ClusterConfigError(f"groups.{name}.nodes: at most {NODES_PER_GROUP_MAX} nodes per group")
    else:
        raise ClusterConfigError(f"groups.{name}.nodes: must be a node count or a non-empty list of node ids, "
                                 f"not {nodes!r}")
    master = spec.get("master", node_ids[0])
    if master not in node_ids:
        raise ClusterConfigError(f"groups.{name}.master: {master!r} is not one of the group's nodes "
                                 f"({', '.join(node_ids)})")
    group_config = {"replication": _choice(spec.get("replication", defaults["replication"]),
                                           f"groups.{name}.replication"),
                    "flush": _choice(spec.get("flush", defaults["flush"]), f"groups.{name}.flush"),
                    "min_in_sync_replicas": _integer(spec.get("min_in_sync_replicas", defaults["min_in_sync_replicas"]),
                                                     f"groups.{name}.min_in_sync_replicas", 1, NODES_PER_GROUP_MAX),
                    "all_ack_in_sync_state_set": _boolean(spec.get("all_ack_in_sync_state_set",
                                                                   defaults["all_ack_in_sync_state_set"]),
                                                          f"groups.{name}.all_ack_in_sync_state_set"),
                    "store": {**defaults["store"], **_mapping(spec.get("store"), f"groups.{name}.store")}}
    return GroupSpec(name, tuple(_node(node_id, name, "master" if node_id == master else "slave", group_config,
                                       overrides.get(node_id)) for node_id in node_ids))


def _node(node_id: str, group: str, role: str, group_config: dict, override: object) -> NodeSpec:
    override = dict(_mapping(override, f"nodes.{node_id}"))
    for key in override:
        if key in _OWNED_NODE_KEYS:
            raise ClusterConfigError(f"nodes.{node_id}.{key}: set by the cluster, not per node "
                                     f"(the cluster owns {', '.join(_OWNED_NODE_KEYS)})")
    ports = [override.pop(key, None) for key in _PORT_KEYS]
    fixed = None
    if any(port is not None for port in ports):
        if any(port is None for port in ports):
            raise ClusterConfigError(f"nodes.{node_id}: give all of {', '.join(_PORT_KEYS)} or none")
        fixed = NodePorts(*(_integer(port, f"nodes.{node_id}.{key}", 1, 65535) for port, key in zip(ports, _PORT_KEYS)))
    store = {**group_config["store"], **_mapping(override.pop("store", None), f"nodes.{node_id}.store")}
    return NodeSpec(node_id, group, role, fixed, {**group_config, **override, "store": store})


def _with_base_ports(topology: ClusterTopology) -> ClusterTopology:
    """Give nodes without fixed ports base_port + 3i.. when base_port is set."""
    if not topology.base_port:
        return topology
    groups = []
    index = 0
    for group in topology.groups:
        nodes = []
        for node in group.nodes:
            first = topology.base_port + PORTS_PER_NODE * index
            index += 1
            if first + PORTS_PER_NODE - 1 > 65535:
                raise ClusterConfigError(f"base_port: {topology.base_port} leaves no room for node {node.node_id} "
                                         f"(ports up to 65535)")
            fixed = node.fixed_ports or NodePorts(first, first + 1, first + 2)
            nodes.append(NodeSpec(node.node_id, node.group, node.role, fixed, node.config))
        groups.append(GroupSpec(group.name, tuple(nodes)))
    return dataclasses.replace(topology, groups=tuple(groups))


def _check_node_configs(topology: ClusterTopology) -> None:
    """Every node's final config must pass NodeConfig's own checks (placeholder ports stand in for unassigned ones)."""
    placeholder = {node.node_id: NodePorts(1, 2, 3) for node in topology.nodes}
    for node in topology.nodes:
        mapping = topology.node_config(node, placeholder, "/nonexistent/store", zk_hosts="127.0.0.1:1")
        # the controller-mode keys are the cluster's own, built and range-checked above
        mapping = {key: value for key, value in mapping.items() if key not in _CONTROLLER_NODE_KEYS}
        try:
            config_from_mapping(mapping)
        except NodeConfigError as error:
            raise ClusterConfigError(f"node {node.node_id} (group {node.group}): {error}") from None
    ports = [(port, node.node_id) for node in topology.nodes if node.fixed_ports
             for port in node.fixed_ports.as_list()]
    seen: dict[int, str] = {}
    for port, node_id in ports:
        if port in seen:
            raise ClusterConfigError(f"port {port} is given to both {seen[port]} and {node_id}")
        seen[port] = node_id


# --- value checks --------------------------------------------------------------------------
def _mapping(value: object, path: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ClusterConfigError(f"{path}: must be a mapping of key: value, not {type(value).__name__} {value!r}")
    return value


def _refuse_unknown(mapping: dict, known: tuple[str, ...], prefix: str) -> None:
    for key in mapping:
        if key not in known:
            raise ClusterConfigError(f"{prefix}{key}: unknown key (known: {', '.join(sorted(known))})")


def _name(value: object, path: str) -> str:
    if not isinstance(value, str) or not _NAME.match(value):
        raise ClusterConfigError(f"{path}: {value!r} is not a name of letters, digits, '_', '.', '-' "
                                 f"(at most 64, starting with a letter or digit)")
    return value


def _choice(value: object, path: str) -> str:
    if value not in ("sync", "async"):
        raise ClusterConfigError(f"{path}: must be 'sync' or 'async', not {value!r}")
    return value


def _boolean(value: object, path: str) -> bool:
    if not isinstance(value, bool):
        raise ClusterConfigError(f"{path}: must be true or false, not {value!r}")
    return value


def _integer(value: object, path: str, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ClusterConfigError(f"{path}: must be an integer between {low} and {high}, not {value!r}")
    return value


def _number(value: object, path: str, low: float, high: float) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not low <= value <= high:
        raise ClusterConfigError(f"{path}: must be a number between {low} and {high}, not {value!r}")
    return float(value)


def _loopback_host(value: object) -> str:
    try:
        if isinstance(value, str) and ipaddress.IPv4Address(value).is_loopback:
            return value
    except ValueError:
        pass
    raise ClusterConfigError(f"host: a local cluster listens on an IPv4 loopback address only "
                             f"(127.0.0.0/8, e.g. 127.0.0.1), not {value!r}")
