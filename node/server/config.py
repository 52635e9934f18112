"""NodeConfig: every setting of a node, read from YAML, each with a default.

The keys, their defaults and what they mean are the fields of NodeConfig and the comments
beside them: ``config_reference()`` lists them (``hastore node start --help``, README) and
``config_example()`` writes them as a commented node.yaml (``hastore node config-example``),
both generated from this module's source, so neither can drift from it. Unknown keys and
bad values are refused at load with the key named, so a typo never silently falls back to
a default.
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

# hosts that mean "every interface" when listening: nobody can dial them
_WILDCARD_HOSTS = ("0.0.0.0", "::", "")
# StoreConfig fields the node sets itself from its own keys.
_STORE_FIELDS_OWNED_BY_NODE = ("store_path", "flush", "store_host")
# the node runs its store's dispatch in its trio loop (dispatch_loop.py), whatever a file says
_STORE_FIELDS_FIXED_BY_NODE = ("dispatcher_thread",)


@dataclass(frozen=True, slots=True)
class NodeConfig:
    """Settings of one node. Frozen; ``replace`` builds a changed copy."""

    node_id: str = "n1"                        # names the node in status, metrics and the controller
    cluster: str = "hastore"                   # the cluster's name (controller mode: its ZooKeeper path)
    group: str = "g1"                          # a master and its slaves form a group
    store_path: str = "~/hastore/store"        # the store's directory (created if missing)
    client_address: str = "127.0.0.1:10911"    # clients connect here; port 0 picks a free port (tests)
    ha_address: str = "127.0.0.1:10912"        # slaves stream from here
    metrics_address: str = "127.0.0.1:10913"   # Prometheus text at /metrics
    role: str = "master"                       # master | slave (the static role, without a controller)
    master_ha_address: str | None = None       # a static slave's master (host:port)
    master_client_address: str | None = None   # told to clients in NOT_MASTER replies
    # Where others are told to reach this node, when not where it listens (a proxy, NAT, a
    # container's published port), like Kafka's advertised.listeners: NOT_MASTER replies, its
    # ZooKeeper records (master record, live nodes), the replication handshake, status.
    advertised_client_address: str | None = None   # default: client_address as bound
    # Slaves dial it (through their peer_ha_addresses, which key on it).
    advertised_ha_address: str | None = None       # default: ha_address as bound
    replication: str = "async"                 # sync | async
    flush: str = "async"                       # sync | async
    # When set, clients and slaves pass an HMAC challenge. Keep it out of the YAML with
    # secret_file or the HASTORE_SECRET environment variable (read by `hastore node start`).
    secret: str | None = field(default=None, repr=False)   # never in a repr, a log line or a status reply
    secret_file: str | None = None             # a file holding the secret (mode 0600), instead of secret
    # Client-facing bounds.
    connections_max: int = 1024                # at the limit the oldest idle or unauthenticated go first
    in_flight_requests_max: int = 256          # per connection
    long_polling_timeout_ms_max: int = 30_000  # a client may ask for less, never more
    auth_timeout_ms: int = 5_000               # a connection must authenticate within this
    idle_timeout_ms: int = 600_000             # a connection with no request and no reply for this long closes
    # Memory for clients (node/server/client_limits.py). A connection whose replies wait
    # past this many bytes (its client does not read) is read no further until they leave.
    connection_reply_bytes_max: int = 16 * 1024 * 1024
    # Every connection's waiting replies and partial requests together; past it the
    # connection holding the most is closed.
    client_buffer_bytes_max: int = 256 * 1024 * 1024
    unauthenticated_frame_bytes_max: int = 64 * 1024   # the largest frame read before authentication
    # After a request, a connection's reader polls its socket this long before the loop
    # sleeps in epoll, while nothing else needs the loop, and a loop busy with I/O polls its
    # own waits as long (node/server/busy_poll.py); 0: never.
    busy_poll_us: int = 200
    auto_create_topics: bool = True            # a send to an unknown topic creates it
    default_queue_count: int = 4               # queues of a topic created without a count
    # How often the checkpointed config files are rewritten from memory.
    config_persist_interval_ms: int = 5_000
    # Replication (see replication/). A sync put waits for min_in_sync_replicas members of
    # the sync-state set (the master counts) or, with all_ack_in_sync_state_set, for all of them.
    min_in_sync_replicas: int = 1
    all_ack_in_sync_state_set: bool = False    # sync puts: wait for every member of the sync-state set
    slave_timeout_ms: int = 3_000              # a sync put fails FLUSH_SLAVE_TIMEOUT after this
    ha_max_time_slave_not_catchup_ms: int = 15_000   # behind this long: out of the sync-state set
    ha_heartbeat_interval_ms: int = 1_000      # master heartbeats and slave acks when idle
    ha_connection_timeout_ms: int = 10_000     # silence on an HA connection for this long: drop it (a slave without ha_follow_thread: after 90-100 % of it)
    ha_chunk_bytes_max: int = 4 * 1024 * 1024  # bytes per streamed frame
    ha_reconnect_backoff_max_ms: int = 5_000   # a slave's longest pause between reconnects
    # A slave reads, checks, appends and acks its master's frames on a thread of its own over
    # a blocking socket (replication/follow_thread.py), and indexes them there once the
    # stream is quiet for a moment (in pieces between frames when it keeps flowing); false:
    # on tasks of the event loop.
    ha_follow_thread: bool = True
    # Controller mode (node/server/controller_mode.py): set zk_hosts ('host:port[,...]') to take
    # the role from ZooKeeper; role and master_ha_address are then ignored.
    zk_hosts: str | None = None
    priority: int = 0                          # controller mode: lower wins an election tie
    zk_session_timeout_ms: int = 6_000         # controller mode: the ZooKeeper session's timeout
    zk_refresh_interval_ms: int = 1_000        # controller mode: how often the agent reports its offsets
    # A slave dials peer_ha_addresses[H] instead of its master's HA address H, when listed (a
    # proxied cluster routes each slave -> master HA link through a proxy of its own).
    peer_ha_addresses: dict = field(default_factory=dict)
    # Lag history (node/server/lag_sampler.py): besides the bounded history in memory, served by
    # LAG_HISTORY, a master appends its samples to this file as JSON lines, which outlive the node.
    lag_history_path: str | None = None
    # StoreConfig fields (store/config.py) but store_path, flush, store_host and
    # dispatcher_thread, e.g. {commitlog_segment_bytes: 1073741824}.
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
        problems += self._advertised_problems()
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
        if self.secret_file is not None:
            if not self.secret_file.strip():
                problems.append("secret_file: must be a file path when set")
            else:
                try:
                    object.__setattr__(self, "secret", read_secret_file(self.secret_file))
                except NodeConfigError as error:
                    problems.append(str(error))
        bounds = {"connections_max": (1, 100_000), "in_flight_requests_max": (1, 65_536),
                  "long_polling_timeout_ms_max": (0, 3_600_000), "auth_timeout_ms": (1, 600_000),
                  "idle_timeout_ms": (100, 86_400_000),
                  "connection_reply_bytes_max": (64 * 1024, 1 << 30),
                  "client_buffer_bytes_max": (1 << 20, 1 << 40),
                  "unauthenticated_frame_bytes_max": (1024, 16 * 1024 * 1024),
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

    def _advertised_problems(self) -> list[str]:
        problems = []
        for name in ("advertised_client_address", "advertised_ha_address"):
            value = getattr(self, name)
            if value is None:
                continue
            if address_problem(value):
                problems.append(f"{name}: {address_problem(value)}")
                continue
            host, _, port = value.rpartition(":")
            if int(port) == 0:
                problems.append(f"{name}: {value!r} has port 0; give the port others dial")
            if host.strip("[]") in _WILDCARD_HOSTS:
                problems.append(f"{name}: {value!r} is a listen-on-every-interface host, not one others "
                                f"can dial; give this node's host name or IP")
        if not problems and (self.advertised_client_address or self.advertised_ha_address):
            client, ha = self.advertised_addresses(self.client_address, self.ha_address)
            if client == ha:
                problems.append(f"advertised_client_address, advertised_ha_address: {client} would be advertised "
                                f"for both; clients and slaves need different ports")
        return problems

    def advertised_addresses(self, bound_client: str, bound_ha: str) -> tuple[str, str]:
        """(client, HA) addresses this node tells others, given where it listens."""
        return self.advertised_client_address or bound_client, self.advertised_ha_address or bound_ha

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


SECRET_ENV = "HASTORE_SECRET"


def read_secret_file(path: str) -> str:
    """The secret held in ``path`` (its first line). Refused when other users may read it."""
    path = os.path.expanduser(path)
    try:
        mode = os.stat(path).st_mode
        with open(path, encoding="utf-8") as handle:
            secret = handle.readline().rstrip("\r\n")
    except OSError as error:
        raise NodeConfigError(f"secret_file: cannot read {path}: {error.strerror}") from None
    if mode & 0o077:
        raise NodeConfigError(f"secret_file: {path} may be read by other users (mode {mode & 0o777:04o}); "
                              f"run `chmod 600 {path}`")
    if not secret:
        raise NodeConfigError(f"secret_file: {path} is empty")
    return secret


def with_secret_from_environment(config: NodeConfig, environ: typing.Mapping[str, str]) -> NodeConfig:
    """``config`` with the secret of ``HASTORE_SECRET`` when the YAML names none (neither
    ``secret`` nor ``secret_file``), so the secret need not be written in the YAML at all."""
    value = environ.get(SECRET_ENV)
    if config.secret is not None or not value:
        return config
    return config.replace(secret=value)


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
    if mapping.get("secret") is not None and mapping.get("secret_file") is not None:
        raise NodeConfigError("secret_file: give secret or secret_file, not both")
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


# --- the keys, documented from this module's source ------------------------------------------
@dataclass(frozen=True, slots=True)
class ConfigKey:
    """One node.yaml key: its name, its default as YAML, and the comments beside its field."""

    name: str
    default: str
    notes: tuple[str, ...]        # comment lines above the field (a group's heading or a paragraph)
    note: str                     # the comment at the end of the field's line


def config_keys() -> list[ConfigKey]:
    """Every NodeConfig field as a node.yaml key, read from this module's source."""
    import inspect
    source = inspect.getsource(NodeConfig).splitlines()
    fields = {f.name: f for f in dataclasses.fields(NodeConfig)}
    keys, notes = [], []
    for line in source:
        stripped = line.strip()
        if stripped.startswith("#"):
            notes.append(stripped.lstrip("#").strip())
            continue
        name = stripped.split(":", 1)[0]
        if name not in fields or not line.startswith("    ") or line.startswith("     "):
            if not stripped:
                notes = []
            continue
        _, _, comment = stripped.partition("  # ")
        keys.append(ConfigKey(name, _yaml_value(_default_of(fields[name])), tuple(notes), comment.strip()))
        notes = []
    return keys


def _default_of(f: dataclasses.Field) -> object:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def _yaml_value(value: object) -> str:
    return yaml.safe_dump(value, default_flow_style=True, width=10**6).strip().removesuffix("\n...").strip()


def config_reference() -> str:
    """One line per node.yaml key: ``name: default  comment`` (help text and README)."""
    keys = config_keys()
    width = max(len(f"{key.name}: {key.default}") for key in keys)
    lines = []
    for key in keys:
        text = " ".join(filter(None, (*key.notes, key.note)))
        lines.append((f"{key.name}: {key.default}".ljust(width) + (f"  # {text}" if text else "")).rstrip())
    return "\n".join(lines)


def config_example() -> str:
    """A node.yaml with every key at its default, each with its comments (``hastore node config-example``)."""
    lines = ["# hastore node.yaml: every key with its default. Remove what you do not change.",
             "# `hastore node start --config node.yaml`; unknown keys are refused.", ""]
    for key in config_keys():
        if key.notes:
            lines.extend(f"# {note}" for note in key.notes)
        lines.append(f"{key.name}: {key.default}" + (f"    # {key.note}" if key.note else ""))
    return "\n".join(lines) + "\n"
