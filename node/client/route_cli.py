"""``hastore topic create|list`` and the route lookups of ``produce``/``consume``.

With ``--zk HOSTS`` (or ``--dir DIR``, a local cluster's ZooKeeper) a topic is routed: its
queues are spread over groups and the route is kept in ZooKeeper at
``/hastore/{cluster}/topics/{topic}`` (controller/routes.py)::

    hastore topic create orders --queues 8 --groups g1,g2 --zk 127.0.0.1:2181
    hastore topic list --dir /tmp/c

``create`` first creates the topic on each group's master with as many queues as the route
gives the group (config changes replicate like messages), then writes the route, so a
route never names a queue that its group lacks. Running it again with more queues or more
groups grows the route; it never shrinks. With ``--bootstrap`` alone it creates the topic
on one node, as before routes existed.

kazoo and the controller package are imported only by the commands that use ZooKeeper.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import click
import trio

from ..errors import NodeError, RouteError
from . import open_admin
from .routing import ZooKeeperDirectory


@dataclass(frozen=True, slots=True)
class RouteSource:
    """Where routes are read: a ZooKeeper and a cluster name (from --zk, or a local cluster's --dir)."""

    zk_hosts: str
    cluster: str
    secret: str | None = None

    @classmethod
    def from_options(cls, zk_hosts: str | None, zk_cluster: str, cluster_dir: str | None) -> "RouteSource":
        if zk_hosts and cluster_dir:
            raise click.UsageError("give --zk or --dir, not both")
        if zk_hosts:
            return cls(zk_hosts, zk_cluster)
        from ..cluster import ClusterError, LocalCluster   # only --dir needs the local cluster
        try:
            return cls.of_local_cluster(LocalCluster(cluster_dir))
        except ClusterError as error:
            raise click.ClickException(f"{error}: routes live in ZooKeeper; start the cluster in controller mode "
                                       f"(`hastore cluster up --dir {cluster_dir}`)") from None

    @classmethod
    def of_local_cluster(cls, local) -> "RouteSource":
        """The ZooKeeper, cluster name and secret of a LocalCluster (ClusterError in static mode)."""
        return cls(local.zk_hosts, local.topology.cluster, local.topology.secret)

    def call(self, function, *args):
        """``function(client, cluster, *args)`` on a fresh ZooKeeper session; the controller's
        errors (ZooKeeper down, a route refused) become RouteError."""
        from controller import ControllerError
        from controller.znodes import make_client, start_client
        try:
            client = make_client(self.zk_hosts)
            start_client(client, 5.0, "hastore topic")
        except ControllerError as error:
            raise RouteError(f"{error}; is ZooKeeper running at {self.zk_hosts}?") from None
        try:
            return function(client, self.cluster, *args)
        except ControllerError as error:
            raise RouteError(str(error)) from None
        finally:
            client.stop()
            client.close()

    def route_of(self, topic: str):
        """The topic's route (controller.routes.TopicRoute), or None when it has none."""
        from controller.routes import read_route
        return self.call(read_route, topic)

    def directory(self) -> ZooKeeperDirectory:
        return ZooKeeperDirectory(self.zk_hosts, self.cluster)


def routed_source(topic: str, zk_hosts: str | None, zk_cluster: str, cluster_dir: str | None) -> RouteSource | None:
    """The route source when ``topic`` has a route in the cluster named by --zk/--dir, else None
    (the command then talks to one group's master, as before routes existed). A local cluster
    with static roles has no ZooKeeper, hence no routes."""
    if not (zk_hosts or cluster_dir):
        return None
    if cluster_dir and not zk_hosts:
        from ..cluster import LocalCluster   # only --dir needs the local cluster
        local = LocalCluster(cluster_dir)
        if not local.topology.controller.enabled or not local.nodes():
            return None   # static roles (no ZooKeeper, so no routes) or no cluster: the one-group path says what to do
    source = RouteSource.from_options(zk_hosts, zk_cluster, cluster_dir)
    try:
        return source if source.route_of(topic) is not None else None
    except RouteError as error:
        raise click.ClickException(str(error)) from None


# --- commands ----------------------------------------------------------------------------------
def _where(command):
    for option in (
            click.option("--secret", envvar="HASTORE_SECRET", default=None,
                         help="Cluster secret for the HMAC challenge (env HASTORE_SECRET)."),
            click.option("--zk-cluster", "zk_cluster", default="hastore", show_default=True,
                         help="With --zk: the cluster name the controller runs under."),
            click.option("--zk", "zk_hosts", default=None, metavar="HOSTS",
                         help="ZooKeeper of a controller-mode cluster: the topic is routed over its groups."),
            click.option("--dir", "cluster_dir", default=None, metavar="DIR", envvar="HASTORE_CLUSTER_DIR",
                         type=click.Path(file_okay=False),
                         help="The local cluster in DIR (its ZooKeeper and secret; env HASTORE_CLUSTER_DIR)."),
            click.option("--bootstrap", default=None, metavar="HOST:PORT",
                         help="Without --zk/--dir: one node's client address (no route; the topic on that "
                              "node's group only)."),
            click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")):
        command = option(command)
    return command


def _source_or_none(zk_hosts, zk_cluster, cluster_dir, bootstrap) -> RouteSource | None:
    if bootstrap and (zk_hosts or cluster_dir):
        raise click.UsageError("give --bootstrap (one node) or --zk/--dir (routes over groups), not both")
    if zk_hosts or cluster_dir:
        return RouteSource.from_options(zk_hosts, zk_cluster, cluster_dir)
    return None


@click.group("topic")
def topic_group() -> None:
    """Create and list topics (routed over groups with --zk or --dir)."""


@topic_group.command("create")
@click.argument("name", required=False, metavar="[TOPIC]")
@click.option("--topic", "topic_option", default=None, help="The topic (same as the TOPIC argument).")
@click.option("--queues", "queue_count", default=4, show_default=True, type=click.IntRange(1, 1024),
              help="Queues of the topic in all (spread over the groups with --zk/--dir).")
@click.option("--groups", default=None, metavar="G1,G2",
              help="With --zk/--dir: the groups to spread over (default: every group of the cluster).")
@_where
def topic_create(name, topic_option, queue_count, groups, zk_hosts, zk_cluster, cluster_dir, bootstrap, secret,
                 as_json) -> None:
    """Create TOPIC with --queues queues, spread over the groups (--zk/--dir), or on one node (--bootstrap).

    \b
    hastore topic create orders --queues 8 --zk 127.0.0.1:2181          over every group
    hastore topic create orders --queues 8 --groups g1,g2 --dir /tmp/c  over g1 and g2
    hastore topic create orders --queues 4 --bootstrap 127.0.0.1:10911  one node's group
    """
    topic = name or topic_option
    if not topic or (name and topic_option and name != topic_option):
        raise click.UsageError("name the topic once: `hastore topic create TOPIC` (or --topic TOPIC)")
    source = _source_or_none(zk_hosts, zk_cluster, cluster_dir, bootstrap)
    if source is None:
        reply = _run_client(_create_on, bootstrap or "127.0.0.1:10911", secret, topic, queue_count)
        click.echo(json.dumps({"topic": reply["topic"], "queue_count": reply["queue_count"]}) if as_json
                   else f"topic {reply['topic']} has {reply['queue_count']} queues")
        return
    wanted = [group.strip() for group in groups.split(",") if group.strip()] if groups else None
    try:
        route, masters = create_routed_topic(source, topic, queue_count, wanted, secret or source.secret)
    except NodeError as error:
        raise click.ClickException(str(error)) from None
    if as_json:
        click.echo(json.dumps({**route.to_json(), "queue_count": route.queue_count, "masters": masters}))
        return
    click.echo(f"topic {topic}: {route.queue_count} queues over {len(route.groups)} groups")
    for group, ids in route.queues:
        click.echo(f"  {group:<10} queues {_ids(ids):<10} (created on master {masters[group]})")


def create_routed_topic(source: RouteSource, topic: str, queue_count: int, groups: list[str] | None = None,
                        secret: str | None = None):
    """Spread ``topic``'s queues over ``groups`` (None: every group): plan the route, create the
    topic on each group's master with its share, then write the route. Returns the route
    (controller.routes.TopicRoute) and {group: "node_id address"} of the masters used.
    RouteError (or the node's own error) when it cannot; nothing is routed then."""
    return source.call(_create_routed, topic, queue_count, groups, secret)


def _create_routed(client, cluster: str, topic: str, queue_count: int, groups, secret):
    from controller.routes import plan_route, write_route
    from controller.znodes import find_master_with_client
    route, _old, version = plan_route(client, cluster, topic, queue_count, groups)
    masters = {}
    for group, ids in route.queues:
        master = find_master_with_client(client, cluster, group)
        try:
            reply = trio.run(_create_on, master.client_address, secret, topic, len(ids))
        except NodeError as error:
            raise RouteError(f"creating {topic} on group {group}'s master {master.node_id} failed: {error}; "
                             f"nothing was routed, run the command again") from None
        if reply["queue_count"] < len(ids):
            raise RouteError(f"group {group} holds {reply['queue_count']} queues of {topic}, the route "
                                       f"needs {len(ids)}")
        masters[group] = f"{master.node_id} {master.client_address}"
    write_route(client, cluster, route, version)
    return route, masters


async def _create_on(address: str, secret: str | None, topic: str, queue_count: int) -> dict:
    async with open_admin(address, secret=secret) as admin:
        return await admin.create_topic(topic, queue_count)


@topic_group.command("list")
@click.option("--include-system", is_flag=True, help="With --bootstrap: also list %SYS% topics.")
@_where
def topic_list(include_system, zk_hosts, zk_cluster, cluster_dir, bootstrap, secret, as_json) -> None:
    """The routed topics and their queues per group (--zk/--dir), or one node's topics (--bootstrap)."""
    source = _source_or_none(zk_hosts, zk_cluster, cluster_dir, bootstrap)
    if source is None:
        async def main():
            async with open_admin(bootstrap or "127.0.0.1:10911", secret=secret) as admin:
                return await admin.list_topics(include_system)
        topics = _run_client(main)
        if as_json:
            click.echo(json.dumps(topics))
            return
        for name, config in sorted(topics.items()):
            click.echo(f"{name}\tqueues={config['queue_count']}\tperm={config['perm']}")
        return
    from controller.routes import list_routes
    try:
        routes = source.call(list_routes)
    except NodeError as error:
        raise click.ClickException(str(error)) from None
    if as_json:
        click.echo(json.dumps([{**route.to_json(), "queue_count": route.queue_count} for route in routes]))
        return
    if not routes:
        click.echo(f"no routed topic in cluster {source.cluster}; create one with `hastore topic create T --queues N`",
                   err=True)
    for route in routes:
        spread = "  ".join(f"{group}:{_ids(ids)}" for group, ids in route.queues)
        click.echo(f"{route.topic}\tqueues={route.queue_count}\t{spread}")


def _run_client(async_fn, *args):
    """Run a client coroutine; a node's refusal becomes a one-line message and exit status 1."""
    try:
        return trio.run(async_fn, *args)
    except NodeError as error:
        raise click.ClickException(str(error)) from None


def _ids(ids) -> str:
    """Queue ids as ranges: 0-3, or 0,2 when not contiguous."""
    ids = list(ids)
    if ids and ids == list(range(ids[0], ids[-1] + 1)) and len(ids) > 1:
        return f"{ids[0]}-{ids[-1]}"
    return ",".join(map(str, ids))
