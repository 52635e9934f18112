"""NodeConfig: every setting of a node, read from YAML, each with a default.

    node_id: n1                      # names the node in status, metrics and the controller
    cluster: hastore
    group: g1                        # a master and its slaves form a group
    store_path: ~/hastore/store
    client_address: 127.0.0.1:10911  # port 0 picks a free port (tests)
    ha_address: 127.0.0.1:10912
    metrics_address: 127.0.0.1:10913
    role: master                     # master | slave (static role, without a controller)
    master_ha_address: null          # a slave's master (host:port)
    master_client_address: null      # told to clients in NOT_MASTER replies
    replication: async               # sync | async
    min_in_sync_replicas: 1          # sync puts: acks needed in the sync-state set, master included
    all_ack_in_sync_state_set: false # sync puts: wait for every member of the sync-state set
    slave_timeout_ms: 3000           # sync puts fail FLUSH_SLAVE_TIMEOUT after this
    ha_max_time_slave_not_catchup_ms: 15000   # a slave behind this long leaves the sync-state set
    ha_heartbeat_interval_ms: 1000   ha_connection_timeout_ms: 10000   ha_chunk_bytes_max: 4194304
    zk_hosts: null                   # controller mode: ZooKeeper hosts; the role then comes from
                                     # the controller and role/master_ha_address are ignored
    priority: 0                      # controller mode: lower wins an election tie
    zk_session_timeout_ms: 6000      zk_refresh_interval_ms: 1000
    peer_ha_addresses: {}            # master HA address -> the address a slave dials instead (a proxy)
    flush: async                     # sync | async
    secret: null                     # when set, clients and slaves pass an HMAC challenge
    busy_poll_us: 200                # poll a connection this long after a request before the
                                     # loop sleeps (lower latency for CPU); 0: off
    lag_history_path: null           # a master appends a lag sample per slave per second here as
                                     # JSON lines (rotated to PATH.1 past 64 MiB); null: memory only
    store: {commitlog_segment_bytes: ..., ...}   # any StoreConfig field but store_path, flush, store_host
                                                 # (and dispatcher_thread: a node dispatches in its loop)

Unknown keys and bad values are refused at load with the key named, so a typo never
silently falls back to a default.
"""

from __future__ import annotations

import dataclasses
import os
import typing
from dataclasses import dataclass, field

import yaml

from store.config import StoreConfig
from store.errors import StoreConfigError

from ..errors import NodeConfigError
from ..wire.address import address_problem

# StoreConfig fields the node sets itself from its own keys.
_STORE_FIELDS_OWNED_BY_NODE = ("store_path", "flush", "store_host")
# the node runs its store's dispatch in its trio loop (dispatch_loop.py), whatever a file says
_STORE_FIELDS_FIXED_BY_NODE = ("dispatcher_thread",)


@dataclass(frozen=True, slots=True)
class NodeConfig:
    """Settings of one node. Frozen; ``replace`` builds a changed copy."""

    node_id: str = "n1"
    cluster: str = "hastore"
    group: str = "g1"
    store_path: str = "~/hastore/store"
    client_address: str = "127.0.0.1:10911"
    ha_address: str = "127.0.0.1:10912"
    metrics_address: str = "127.0.0.1:10913"
    role: str = "master"
    master_ha_address: str | None = None
    master_client_address: str | None = None
    replication: str = "async"
    flush: str = "async"
    secret: str | None = None
    # Client-facing bounds.
    connections_max: int = 1024
    in_flight_requests_max: int = 256          # per connection
    long_polling_timeout_ms_max: int = 30_000  # a client may ask for less, never more
    auth_timeout_ms: int = 5_000
    # After a request, a connection's reader polls its socket this long before the loop
    # sleeps in epoll, while nothing else needs the loop (node/server/busy_poll.py); 0: never.
    busy_poll_us: int = 200
    auto_create_topics: bool = True
    default_queue_count: int = 4
    # How often the checkpointed config files are rewritten from memory.
    config_persist_interval_ms: int = 5_000
    # Replication (see replication/). A sync put waits for min_in_sync_replicas members of
    # the sync-state set (the master counts) or, with all_ack_in_sync_state_set, for all of them.
    min_in_sync_replicas: int = 1
    all_ack_in_sync_state_set: bool = False
    slave_timeout_ms: int = 3_000              # a sync put fails FLUSH_SLAVE_TIMEOUT after this
    ha_max_time_slave_not_catchup_ms: int = 15_000   # behind this long: out of the sync-state set
    ha_heartbeat_interval_ms: int = 1_000      # master heartbeats and slave acks when idle
    ha_connection_timeout_ms: int = 10_000     # silence on an HA connection for this long: drop it
    ha_chunk_bytes_max: int = 4 * 1024 * 1024  # bytes per streamed frame
    ha_reconnect_backoff_max_ms: int = 5_000
    # Controller mode (see node/server/controller_mode.py): set zk_hosts to take the role from ZooKeeper.
    zk_hosts: str | None = None
    priority: int = 0
    zk_session_timeout_ms: int = 6_000
    zk_refresh_interval_ms: int = 1_000
    # A slave dials peer_ha_addresses[H] instead of its master's HA address H, when listed (a
    # proxied cluster routes each slave -> master HA link through a proxy of its own).
    peer_ha_addresses: dict = field(default_factory=dict)
    # Lag history (node/server/lag_sampler.py): besides the bounded history in memory, served by
    # LAG_HISTORY, a master appends its samples to this file as JSON lines, which outlive the node.
    lag_history_path: str | None = None
    store: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        problems = []
        for name in ("node_id", "cluster", "group", "store_path"):
            if not getattr(self, name):
                problems.append(f"{name}: must be a non-empty string")
        for name in ("client_address", "ha_address", "metrics_address"):
            problem = address_problem(getattr(self, name))
            if problem:
                problems.append(f"{name}: {problem}")
        for name in ("master_ha_address", "master_client_address"):
            value = getattr(self, name)
            if value is not None and address_problem(value):
                problems.append(f"{name}: {address_problem(value)}")
        for peer, dialed in self.peer_ha_addresses.items():
            if not isinstance(peer, str) or not isinstance(dialed, str) or address_problem(peer) \
                    or address_problem(dialed):
                problems.append(f"peer_ha_addresses: {peer!r}: {dialed!r} must map host:port to host:port")
        if self.role not in ("master", "slave"):
            problems.append(f"role: must be 'master' or 'slave', not {self.role!r}")
        if self.zk_hosts is not None and not self.zk_hosts.strip():
            problems.append("zk_hosts: must be 'host:port[,host:port...]' when set")
        if self.role == "slave" and not self.master_ha_address and self.zk_hosts is None:
            problems.append("master_ha_address: required when role is 'slave'")
        if self.replication not in ("sync", "async"):
            problems.append(f"replication: must be 'sync' or 'async', not {self.replication!r}")
        if self.flush not in ("sync", "async"):
            problems.append(f"flush: must be 'sync' or 'async', not {self.flush!r}")
        if self.secret is not None and not self.secret:
            problems.append("secret: must be non-empty when set")
        if self.lag_history_path is not None and not self.lag_history_path.strip():
            problems.append("lag_history_path: must be a file path when set")
        bounds = {"connections_max": (1, 100_000), "in_flight_requests_max": (1, 65_536),
                  "long_polling_timeout_ms_max": (0, 3_600_000), "auth_timeout_ms": (1, 600_000),
                  "busy_poll_us": (0, 10_000),
                  "default_queue_count": (1, 1024), "config_persist_interval_ms": (10, 3_600_000),
                  "min_in_sync_replicas": (1, 16), "slave_timeout_ms": (1, 600_000),
                  "ha_max_time_slave_not_catchup_ms": (10, 3_600_000), "ha_heartbeat_interval_ms": (10, 60_000),
                  "ha_connection_timeout_ms": (100, 600_000), "ha_chunk_bytes_max": (64 * 1024, 8 * 1024 * 1024),
                  "ha_reconnect_backoff_max_ms": (10, 600_000), "priority": (0, 1_000_000),
                  "zk_session_timeout_ms": (500, 600_000), "zk_refresh_interval_ms": (50, 60_000)}
        for name, (low, high) in bounds.items():
            if not low <= getattr(self, name) <= high:
                problems.append(f"{name}: must be between {low} and {high}, not {getattr(self, name)}")
        if self.ha_connection_timeout_ms < 2 * self.ha_heartbeat_interval_ms:
            problems.append("ha_connection_timeout_ms: must be at least twice ha_heartbeat_interval_ms, or an idle "
                            "but healthy HA connection would be dropped")
        for name in self.store:
            if name in _STORE_FIELDS_OWNED_BY_NODE:
                problems.append(f"store.{name}: set the node's own key instead")
            elif name in _STORE_FIELDS_FIXED_BY_NODE:
                problems.append(f"store.{name}: a node always dispatches in its event loop")
        if problems:
            raise NodeConfigError("; ".join(problems))
        try:
            self.store_config()
        except (StoreConfigError, TypeError) as error:
            raise NodeConfigError(f"store: {error}") from None

    def store_config(self, store_host: str | None = None) -> StoreConfig:
        """The StoreConfig this node runs its store with."""
        return StoreConfig(store_path=os.path.expanduser(self.store_path), flush=self.flush,
                           store_host=store_host or self.client_address, **self.store)

    def replace(self, **changes) -> "NodeConfig":
        return dataclasses.replace(self, **changes)


def _check_type(name: str, value: object, annotation: str) -> None:
    expected = {"str": (str,), "int": (int,), "bool": (bool,), "dict": (dict,),
                "str | None": (str, type(None))}[annotation]
    if isinstance(value, bool) and bool not in expected:
        raise NodeConfigError(f"{name}: must be {annotation}, not a boolean")
    if not isinstance(value, expected):
        raise NodeConfigError(f"{name}: must be {annotation}, not {type(value).__name__} {value!r}")


def _check_store_section(section: dict) -> None:
    hints = typing.get_type_hints(StoreConfig)
    known = {f.name for f in dataclasses.fields(StoreConfig)} - set(_STORE_FIELDS_OWNED_BY_NODE) \
        - set(_STORE_FIELDS_FIXED_BY_NODE)
    for name, value in section.items():
        if name not in known:
            raise NodeConfigError(f"store.{name}: unknown key (known: {', '.join(sorted(known))})")
        expected = hints[name]
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            continue
        if isinstance(value, bool) is not (expected is bool) or not isinstance(value, expected):
            raise NodeConfigError(f"store.{name}: must be {expected.__name__}, not {type(value).__name__} {value!r}")


def config_from_mapping(mapping: dict) -> NodeConfig:
    """Build a NodeConfig from a parsed YAML mapping, refusing unknown keys and wrong types."""
    if mapping is None:
        mapping = {}
    if not isinstance(mapping, dict):
        raise NodeConfigError("the config must be a YAML mapping of key: value")
    fields = {f.name: f for f in dataclasses.fields(NodeConfig)}
    for name, value in mapping.items():
        if name not in fields:
            raise NodeConfigError(f"{name}: unknown key (known: {', '.join(sorted(fields))})")
        if isinstance(value, int) and not isinstance(value, bool) and fields[name].type == "str":
            value = str(value)  # YAML reads `node_id: 1` as an int
            mapping = {**mapping, name: value}
        _check_type(name, value, fields[name].type)
    _check_store_section(mapping.get("store", {}))
    return NodeConfig(**mapping)


def load_config(path: str) -> NodeConfig:
    """Read and check a node's YAML config file."""
    return config_from_mapping(read_yaml(path, "config", NodeConfigError))


def read_yaml(path: str, what: str, error_type: type[Exception]):
    """The parsed YAML file at ``path``; ``error_type`` naming ``what`` it is if it cannot be
    read or parsed."""
    try:
        with open(path, encoding="utf-8") as handle:
            return yaml.safe_load(handle)
    except OSError as error:
        raise error_type(f"cannot read {what} {path}: {error.strerror}") from None
    except yaml.YAMLError as error:
        raise error_type(f"{what} {path} is not valid YAML: {error}") from None
