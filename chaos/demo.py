"""``hastore demo``: the whole story of a replicated group on one machine, told step by step.

1. cluster up: a ZooKeeper, two controllers and two groups of three nodes (short session
   timeout); the controller elects a master in each group
2. one topic spread over both groups (its route in ZooKeeper, as `hastore topic create`):
   produce through a routing producer under sync replication (acks per group), consume
   every queue back from the group that holds it, offsets committed to each group
3. one failover drill round in g1: kill -9 its master, a new one is elected, nothing acked
   is lost, the old master rejoins as a slave and catches up; g2 keeps its master, and the
   topic takes sends on both groups again
4. the replication lag table of g1's new master
5. cluster down, every process stopped cleanly

Exits 0 only when every step worked. The single-node demo is ``hastore node-demo``.
"""

from __future__ import annotations

import shutil
import tempfile

import click
import trio

from node.client import (OutgoingMessage, ZooKeeperDirectory, open_admin, open_routed_consumer,
                         open_routed_producer)
from node.client.route_cli import RouteSource, create_routed_topic
from node.cluster import ClusterError, ClusterStartError, LocalCluster, topology_from_mapping
from node.errors import NodeError
from node.client.lag import render_table

from .cli import ROUND_HEADER, format_row, round_row, summary_lines
from .drill import DrillSettings, run_failover_drill
from .errors import ChaosError

TOPIC = "orders"
TOPIC_QUEUES = 8
GROUPS = ("g1", "g2")
CONSUMER_GROUP = "demo-billing"
STEP_DEADLINE_S = 60
# A local cluster with a short ZooKeeper session (1.5 s, tick 250 ms): failover in about 2 s.
DEMO_TOPOLOGY = {"cluster": "demo", "controller": {"session_timeout_ms": 1500, "zookeeper": {"tick_ms": 250}},
                 "store": {"commitlog_segment_bytes": 4 << 20, "consume_queue_entries_per_file": 16_384,
                           "index_hash_slots": 4096, "index_max_entries": 32_768},
                 "groups": {group: {"nodes": 3} for group in GROUPS}}


class DemoError(ChaosError):
    """A step of the demo did not do what it should."""


def _say(text: str = "") -> None:
    click.echo(text)


def _step(number: int, text: str) -> None:
    _say(f"\n[{number}] {text}")


@click.command("demo")
@click.option("--dir", "directory", default=None,
              help="Directory for the cluster (default: a fresh temporary one, removed afterwards).")
@click.option("--messages", "count", default=200, show_default=True, type=click.IntRange(10, 10_000),
              help="Messages to produce and consume.")
@click.option("--keep", is_flag=True, help="Keep the directory (logs, stores) afterwards.")
def demo_command(directory: str | None, count: int, keep: bool) -> None:
    """ZooKeeper, two controllers and two groups of three nodes: one topic spread over both
    groups, produce and consume across them, kill -9 g1's master, fail over without losing an
    acked message while g2 is untouched, show the lag table, stop everything."""
    root = directory or tempfile.mkdtemp(prefix="hastore-demo-")
    remove = directory is None and not keep
    try:
        _run(root, count)
    except ClusterStartError as error:
        for name, tail in error.log_tails.items():
            _say(f"--- last lines of {name}'s log ---\n{tail}")
        raise click.ClickException(str(error)) from None
    except (ClusterError, NodeError, ChaosError) as error:
        remove = False   # the message points at the logs: they stay
        raise click.ClickException(f"{error} (logs under {root})") from None
    finally:
        if remove:
            shutil.rmtree(root, ignore_errors=True)
    if not remove:
        _say(f"\nthe cluster's directory is kept in {root}")


def _run(root: str, count: int) -> None:
    _say("hastore demo: two replicated groups with automatic failover, one topic spread over both, "
         "all processes on loopback.")
    cluster = LocalCluster(root, topology_from_mapping(DEMO_TOPOLOGY))
    session_ms = cluster.topology.controller.session_timeout_ms
    try:
        _step(1, "cluster up: ZooKeeper, two controllers, two groups of three nodes (`hastore cluster up`)")
        for spec in cluster.up():
            where = spec.client_address or spec.log_path
            _say(f"    {spec.name:<13} {spec.kind:<10} {where}  pid {cluster.pid(spec.name)}")
        _say(f"    nodes start as fenced slaves; the active controller elects a master. ZooKeeper session "
             f"timeout: {session_ms} ms (a dead master is noticed after about that long)")
        masters = {group: cluster.current_master(group) for group in GROUPS}
        for group, record in masters.items():
            _say(f"    master of {group}: {record.node_id} (epoch {record.epoch}) at {record.client_address}")
        master = masters["g1"]

        _step(2, f"topic {TOPIC!r}: {TOPIC_QUEUES} queues spread over {' and '.join(GROUPS)} (`hastore topic create "
                 f"{TOPIC} --queues {TOPIC_QUEUES} --dir DIR`); produce {count} messages, consume them as "
                 f"{CONSUMER_GROUP!r}")
        source = RouteSource.of_local_cluster(cluster)
        route, _ = create_routed_topic(source, TOPIC, TOPIC_QUEUES, list(GROUPS), cluster.topology.secret)
        _say(f"    route in ZooKeeper at /hastore/{source.cluster}/topics/{TOPIC}: "
             + ", ".join(f"{group} queues {list(ids)}" for group, ids in route.queues))
        trio.run(_produce_and_consume, source, count)

        _step(3, f"failover drill, one round: kill -9 {master.node_id} while a producer sends")
        _say(format_row(ROUND_HEADER))
        report = run_failover_drill(cluster, 1, DrillSettings(),
                                    on_round=lambda record: _say(format_row(round_row(record))))
        for line in summary_lines(report):
            _say(f"    {line}")
        if not report.ok:
            raise DemoError("the failover drill round did not pass (see above)")
        new_master = cluster.current_master("g1")
        _say(f"    {master.node_id} is back as a slave; {new_master.node_id} is master in epoch {new_master.epoch}")
        g2_now = cluster.current_master("g2")
        if (g2_now.node_id, g2_now.epoch) != (masters["g2"].node_id, masters["g2"].epoch):
            raise DemoError(f"g2's master changed during g1's failover: {masters['g2'].node_id} epoch "
                            f"{masters['g2'].epoch} -> {g2_now.node_id} epoch {g2_now.epoch}")
        _say(f"    g2 was left alone: {g2_now.node_id} is still its master in epoch {g2_now.epoch}")
        acked = trio.run(_produce, source, "after the failover", 64)
        _say(f"    after the failover the topic takes sends on both groups again: acks per group {acked}")

        _step(4, f"replication lag as {new_master.node_id} sees it (`hastore lag`)")
        status = trio.run(_status, new_master.client_address, cluster.topology.secret)
        for line in render_table(status, None):
            _say(f"    {line}")
    finally:
        _step(5, "cluster down: nodes, then controllers, then ZooKeeper")
        reports = cluster.down()
        for report in reports:
            _say(f"    {report.name:<13} {report.outcome} ({report.seconds:g} s)")
    unclean = [report.name for report in reports if report.outcome != "clean"]
    if unclean:
        raise DemoError(f"not every process stopped cleanly: {', '.join(unclean)}")
    _say("\ndone: every step worked.")


async def _produce(source: RouteSource, label: str, count: int) -> dict[str, int]:
    """Send ``count`` messages through a routing producer (batches of 32); acks per group."""
    with trio.fail_after(STEP_DEADLINE_S):
        async with open_routed_producer(source.directory(), secret=source.secret, batch_count_max=32) as producer:
            messages = [OutgoingMessage(f"order #{i} ({label})".encode(), keys=[f"order-{i}"]) for i in range(count)]
            results = []
            for first in range(0, count, 32):
                results += await producer.send_batch(TOPIC, messages[first:first + 32])
            acked = producer.statistics().acked_by_group
    bad = [result for result in results if not result.ok]
    if bad:
        raise DemoError(f"{len(bad)} of {count} sends were not acknowledged; first: {bad[0]}")
    if set(acked) != set(GROUPS):
        raise DemoError(f"the sends did not reach every group of the topic: acks per group {acked}")
    return dict(sorted(acked.items()))


async def _produce_and_consume(source: RouteSource, count: int) -> None:
    acked = await _produce(source, "first run", count)
    _say(f"    {count} messages acknowledged (PUT_OK) across the groups, per group {acked}: each one is on every "
         f"member of its group's sync-state set")
    received = []
    with trio.fail_after(STEP_DEADLINE_S):
        async with open_routed_consumer(ZooKeeperDirectory(source.zk_hosts, source.cluster), TOPIC, CONSUMER_GROUP,
                                        secret=source.secret, from_beginning=True, long_poll_ms=1000) as consumer:
            while len(received) < count:
                received.append(await consumer.receive())
            committed = await consumer.commit()
    expected = sorted(f"order #{i} (first run)".encode() for i in range(count))
    if sorted(m.body for m in received) != expected:
        raise DemoError("the consumer did not receive exactly the messages produced")
    per_group: dict[str, dict[int, int]] = {}
    for queue, offset in sorted(committed.items()):
        per_group.setdefault(queue.group, {})[queue.queue_id] = offset
    _say(f"    consumed all {count} back from both groups; offsets committed to each group per queue: {per_group}")


async def _status(address: str, secret: str | None) -> dict:
    with trio.fail_after(STEP_DEADLINE_S):
        async with open_admin(address, secret=secret) as admin:
            return await admin.status()
