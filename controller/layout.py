"""The ZooKeeper layout of a hastore cluster and the values its znodes hold.

    /hastore/{cluster}/controller/election            kazoo Election: one active controller
    /hastore/{cluster}/groups/{group}/nodes/{id}      ephemeral, one per live node  (NodeRecord)
    /hastore/{cluster}/groups/{group}/master          persistent                    (MasterRecord)
    /hastore/{cluster}/groups/{group}/sync_state_set  persistent                    (SyncStateSet)
    /hastore/{cluster}/groups/{group}/status          persistent, controller-written (GroupStatus)
    /hastore/{cluster}/topics/{topic}                 persistent, a topic's route  (routes.TopicRoute)

Values are UTF-8 JSON objects (compact, keys sorted), chosen over msgpack so that an
operator can read them with ``zkCli.sh get``. Readers ignore keys they do not know, so
fields can be added; a missing required key or a value that is not a JSON object raises
ZnodeValueError naming the path.

- NodeRecord: ``node_id, client_address, ha_address, max_offset, epoch, priority,
  updated_ms``. The session that owns it is the znode's ``ephemeralOwner`` (``session_id``
  on the decoded record), not part of the value.
- MasterRecord: ``node_id, epoch, session_id, client_address, ha_address, elected_ms,
  elected_by, unclean``. ``session_id`` is the ZooKeeper session of the node's registration
  at election time: the master is alive only while a node znode of that id is owned by that
  session, so a master that lost its session and re-registered is not master any more.
- SyncStateSet: ``members`` (sorted node ids), ``epoch`` (the master epoch that wrote it).
- GroupStatus: ``state`` ("master" | "no_master"), ``reason``, ``epoch``, ``controller``,
  ``updated_ms``: why the group has no master, for ``hastore controller status``.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, fields

from .errors import ZnodeValueError

ROOT = "/hastore"


def cluster_path(cluster: str) -> str:
    _check_name("cluster", cluster)
    return f"{ROOT}/{cluster}"


def election_path(cluster: str) -> str:
    return f"{cluster_path(cluster)}/controller/election"


def groups_path(cluster: str) -> str:
    return f"{cluster_path(cluster)}/groups"


def group_path(cluster: str, group: str) -> str:
    _check_name("group", group)
    return f"{groups_path(cluster)}/{group}"


def nodes_path(cluster: str, group: str) -> str:
    return f"{group_path(cluster, group)}/nodes"


def node_path(cluster: str, group: str, node_id: str) -> str:
    _check_name("node id", node_id)
    return f"{nodes_path(cluster, group)}/{node_id}"


def master_path(cluster: str, group: str) -> str:
    return f"{group_path(cluster, group)}/master"


def sync_state_set_path(cluster: str, group: str) -> str:
    return f"{group_path(cluster, group)}/sync_state_set"


def status_path(cluster: str, group: str) -> str:
    return f"{group_path(cluster, group)}/status"


def topics_path(cluster: str) -> str:
    return f"{cluster_path(cluster)}/topics"


def topic_path(cluster: str, topic: str) -> str:
    _check_name("topic", topic)
    return f"{topics_path(cluster)}/{topic}"


def _check_name(what: str, name: str) -> None:
    if not name or "/" in name or name in (".", "..") or any(ord(c) < 32 for c in name):
        raise ValueError(f"bad {what} {name!r}: it must be non-empty, without '/' or control characters")


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """What a live node reports about itself (ephemeral znode)."""

    node_id: str
    client_address: str
    ha_address: str
    max_offset: int
    epoch: int
    priority: int
    updated_ms: int = 0
    session_id: int | None = field(default=None, compare=False)   # from the znode stat, not stored


@dataclass(frozen=True, slots=True)
class MasterRecord:
    """The group's master: who, in which epoch, under which ZooKeeper session."""

    node_id: str
    epoch: int
    session_id: int
    client_address: str
    ha_address: str
    elected_ms: int
    elected_by: str = ""
    unclean: bool = False


@dataclass(frozen=True, slots=True)
class SyncStateSet:
    """The replicas that are caught up with the master, persisted for elections."""

    members: tuple[str, ...]
    epoch: int


@dataclass(frozen=True, slots=True)
class GroupStatus:
    """The controller's last word on a group: its master, or why there is none."""

    state: str
    reason: str
    epoch: int
    controller: str
    updated_ms: int


def encode(record) -> bytes:
    """A record as the compact, key-sorted JSON bytes stored in its znode."""
    value = asdict(record)
    if isinstance(record, NodeRecord):
        del value["session_id"]    # the znode's ephemeralOwner says it
    if isinstance(record, SyncStateSet):
        value["members"] = sorted(value["members"])
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def decode(cls, data: bytes, path: str, **extra):
    """Decode ``data`` read from ``path`` into ``cls``; ``extra`` sets fields not stored (session_id)."""
    try:
        value = json.loads(data.decode())
    except (UnicodeDecodeError, ValueError) as error:
        raise ZnodeValueError(f"{path} does not hold a JSON object ({error}); "
                              f"fix or delete it with zkCli.sh") from error
    if not isinstance(value, dict):
        raise ZnodeValueError(f"{path} holds {type(value).__name__}, not a JSON object")
    known = {f.name for f in fields(cls)}
    kwargs = {k: v for k, v in value.items() if k in known}
    kwargs.update(extra)
    if cls is SyncStateSet and "members" in kwargs:
        kwargs["members"] = tuple(sorted(kwargs["members"]))
    try:
        return cls(**kwargs)
    except TypeError as error:
        raise ZnodeValueError(f"{path} lacks a field of {cls.__name__}: {error}") from error
