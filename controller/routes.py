"""Topic routes: which group holds which queues of a topic, kept in ZooKeeper.

    /hastore/{cluster}/topics/{topic}   persistent
        {"topic": "orders", "queues": [["g1", [0, 1, 2, 3]], ["g2", [0, 1, 2, 3]]], "updated_ms": ...}

Like RocketMQ's topic route data (one QueueData per broker), every group numbers the queues
it holds from 0 in its own store, and a message queue is the pair (group, queue id). A group
is created with exactly as many queues as its route gives it, so a client that talks to the
group directly (no routing) writes only into queues the route names, and a routed consumer
misses nothing. A topic of 8 queues over g1 and g2 is g1: 0..3 and g2: 0..3.

Spreading is pure (``spread``, ``extend``): queues are dealt to the groups in turn, so
groups differ by at most one queue. A route only grows: ``extend`` keeps every (group,
queue) of the old route and deals the new queues to the groups holding fewest, so that no
queue with messages in it ever drops out of the route. Shrinking is refused (RouteError).

The ZooKeeper calls (``read_route``, ``write_route``, ``list_routes``, ``list_groups``) take
a started KazooClient and a deadline, like the rest of znodes.py; ``write_route`` is
version-guarded, so two operators extending the same topic cannot both win on stale reads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError

from . import layout
from .errors import RouteError, ZnodeValueError
from .znodes import DEFAULT_TIMEOUT_S, children_or_empty, ensure_path, get_or_none, wait

QUEUES_PER_TOPIC_MAX = 1024       # the node's own limit on a topic's queue count
GROUPS_PER_ROUTE_MAX = 256


@dataclass(frozen=True, slots=True)
class TopicRoute:
    """A topic's queues per group: ``queues`` is ((group, (queue ids, ascending)), ...) in
    the order the groups were given."""

    topic: str
    queues: tuple[tuple[str, tuple[int, ...]], ...]

    @property
    def groups(self) -> tuple[str, ...]:
        return tuple(group for group, _ in self.queues)

    @property
    def queue_count(self) -> int:
        return sum(len(ids) for _, ids in self.queues)

    def queue_ids(self, group: str) -> tuple[int, ...]:
        """The queue ids ``group`` holds (empty when the route does not name it)."""
        return dict(self.queues).get(group, ())

    def as_mapping(self) -> dict[str, tuple[int, ...]]:
        """group -> queue ids: the plain form the client library takes (it imports no controller)."""
        return {group: ids for group, ids in self.queues}

    def to_json(self) -> dict:
        return {"topic": self.topic, "queues": [[group, list(ids)] for group, ids in self.queues]}


def _checked(route: TopicRoute) -> TopicRoute:
    groups = route.groups
    if not groups:
        raise RouteError(f"topic {route.topic}: a route needs at least one group")
    if len(set(groups)) != len(groups):
        raise RouteError(f"topic {route.topic}: a group appears twice in the route {groups}")
    if len(groups) > GROUPS_PER_ROUTE_MAX or route.queue_count > QUEUES_PER_TOPIC_MAX:
        raise RouteError(f"topic {route.topic}: at most {QUEUES_PER_TOPIC_MAX} queues over at most "
                         f"{GROUPS_PER_ROUTE_MAX} groups")
    for group, ids in route.queues:
        if not group or "/" in group or any(ord(c) < 32 for c in group):
            raise RouteError(f"topic {route.topic}: bad group name {group!r}")
        if list(ids) != list(range(len(ids))) or not ids:
            raise RouteError(f"topic {route.topic}: group {group} must hold queues 0..n-1, not {list(ids)}")
    return route


def spread(topic: str, queue_count: int, groups: list[str] | tuple[str, ...]) -> TopicRoute:
    """``queue_count`` queues dealt over ``groups`` in turn: the first ``queue_count % n``
    groups hold one more. Groups left with none (fewer queues than groups) are not in the route."""
    if not 1 <= queue_count <= QUEUES_PER_TOPIC_MAX:
        raise RouteError(f"topic {topic}: the queue count must be in [1, {QUEUES_PER_TOPIC_MAX}], not {queue_count}")
    if not groups:
        raise RouteError(f"topic {topic}: no group to spread its queues over; start a group or name one "
                         f"with --groups")
    count, extra = divmod(queue_count, len(groups))
    queues = tuple((group, tuple(range(count + (index < extra)))) for index, group in enumerate(groups)
                   if count + (index < extra))
    return _checked(TopicRoute(topic, queues))


def extend(old: TopicRoute, queue_count: int, groups: list[str] | tuple[str, ...]) -> TopicRoute:
    """``old`` grown to ``queue_count`` queues over ``groups`` (added after the old route's
    groups): every (group, queue) of ``old`` is kept, each new queue goes to the group that
    holds fewest (the earliest on a tie). RouteError when it would shrink or drop a group."""
    dropped = [group for group in old.groups if group not in groups]
    if dropped:
        raise RouteError(f"topic {old.topic}: groups {', '.join(dropped)} hold queues of it; a route never "
                         f"drops a group (their messages would no longer be read); name them in --groups")
    if queue_count < old.queue_count:
        raise RouteError(f"topic {old.topic} has {old.queue_count} queues; a route never shrinks (messages in "
                         f"the dropped queues would no longer be read): give --queues {old.queue_count} or more")
    order = [*old.groups, *(group for group in groups if group not in old.groups)]
    counts = {group: len(old.queue_ids(group)) for group in order}
    for _ in range(queue_count - old.queue_count):
        fewest = min(order, key=lambda group: (counts[group], order.index(group)))
        counts[fewest] += 1
    return _checked(TopicRoute(old.topic, tuple((group, tuple(range(counts[group]))) for group in order
                                                if counts[group])))


def encode(route: TopicRoute) -> bytes:
    """The route as the compact JSON its znode holds (readable with ``zkCli.sh get``)."""
    value = {**route.to_json(), "updated_ms": layout.now_ms()}
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def decode(data: bytes, path: str) -> TopicRoute:
    """A route read from ``path``; ZnodeValueError if it is not the documented object."""
    try:
        value = json.loads(data.decode())
        topic, queues = value["topic"], value["queues"]
        pairs = tuple((str(group), tuple(int(i) for i in ids)) for group, ids in queues)
    except (UnicodeDecodeError, ValueError, KeyError, TypeError) as error:
        raise ZnodeValueError(f"{path} does not hold a topic route {{topic, queues: [[group, [ids]], ...]}} "
                              f"({type(error).__name__}: {error}); fix or delete it with zkCli.sh") from error
    try:
        return _checked(TopicRoute(str(topic), pairs))
    except (RouteError, ValueError) as error:
        raise ZnodeValueError(f"{path}: {error}") from error


# --- ZooKeeper ---------------------------------------------------------------------------------
def read_route(client: KazooClient, cluster: str, topic: str,
               timeout_s: float = DEFAULT_TIMEOUT_S) -> TopicRoute | None:
    """The topic's route, or None when it has none (a topic of one group, made without routes)."""
    route, _ = _read_versioned(client, cluster, topic, timeout_s)
    return route


def _read_versioned(client: KazooClient, cluster: str, topic: str, timeout_s: float):
    path = layout.topic_path(cluster, topic)
    data, stat = get_or_none(client, path, timeout_s)
    if data is None:
        return None, None
    return decode(data, path), stat.version


def list_routes(client: KazooClient, cluster: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> list[TopicRoute]:
    """Every topic route of the cluster, by topic name."""
    routes = []
    for topic in children_or_empty(client, layout.topics_path(cluster), timeout_s):
        route = read_route(client, cluster, topic, timeout_s)
        if route is not None:
            routes.append(route)
    return routes


def list_groups(client: KazooClient, cluster: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> list[str]:
    """The groups that ever registered a node in the cluster, by name."""
    return children_or_empty(client, layout.groups_path(cluster), timeout_s)


def plan_route(client: KazooClient, cluster: str, topic: str, queue_count: int, groups: list[str] | None,
               timeout_s: float = DEFAULT_TIMEOUT_S) -> tuple[TopicRoute, TopicRoute | None, int | None]:
    """The route ``topic create`` should write: (new route, old route or None, old znode version).

    ``groups`` None: every group of the cluster (the old route's first, in their order).
    Groups must be known to ZooKeeper (a node of theirs registered once)."""
    old, version = _read_versioned(client, cluster, topic, timeout_s)
    known = list_groups(client, cluster, timeout_s)
    if groups is None:
        groups = [*(old.groups if old else ()), *[g for g in known if old is None or g not in old.groups]]
    unknown = [group for group in groups if group not in known]
    if unknown:
        raise RouteError(f"no group {', '.join(unknown)} in cluster {cluster} (groups: {', '.join(known) or 'none'}); "
                         f"start its nodes first or fix --groups")
    new = extend(old, queue_count, groups) if old is not None else spread(topic, queue_count, groups)
    return new, old, version


def write_route(client: KazooClient, cluster: str, route: TopicRoute, version: int | None,
                timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """Create the route znode (``version`` None) or set it at ``version``; RouteError if another
    writer changed it since it was read (read it again and retry)."""
    path = layout.topic_path(cluster, route.topic)
    ensure_path(client, layout.topics_path(cluster), timeout_s)
    try:
        if version is None:
            wait(client.create_async(path, encode(route)), timeout_s, f"create {path}")
        else:
            wait(client.set_async(path, encode(route), version), timeout_s, f"set {path}")
    except (BadVersionError, NodeExistsError) as error:
        raise RouteError(f"the route of topic {route.topic} changed while it was being written "
                         f"({type(error).__name__}); run the command again") from None
