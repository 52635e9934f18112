"""``hastore demo``: the whole story of a replicated group on one machine, told step by step.

1. cluster up: a ZooKeeper, two controllers and three nodes (short session timeout)
2. the controller elects a master; produce to it under sync replication, consume back
3. one failover drill round: kill -9 the master, a new one is elected, nothing acked is lost,
   the old master rejoins as a slave and catches up
4. the replication lag table of the new master
5. cluster down, every process stopped cleanly

Exits 0 only when every step worked. The single-node demo is ``hastore node-demo``.
"""

from __future__ import annotations

import shutil
import tempfile

import click
import trio

from node.client import OutgoingMessage, open_admin, open_consumer, open_producer
from node.cluster import ClusterError, ClusterStartError, LocalCluster, topology_from_mapping
from node.errors import NodeError
from node.client.lag import render_table

from .cli import ROUND_HEADER, format_row, round_row, summary_lines
from .drill import DrillSettings, run_failover_drill
from .errors import ChaosError

TOPIC = "orders"
CONSUMER_GROUP = "demo-billing"
STEP_DEADLINE_S = 60
# A local cluster with a short ZooKeeper session (1.5 s, tick 250 ms): failover in about 2 s.
DEMO_TOPOLOGY = {"cluster": "demo", "controller": {"session_timeout_ms": 1500, "zookeeper": {"tick_ms": 250}},
                 "store": {"commitlog_segment_bytes": 4 << 20, "consume_queue_entries_per_file": 16_384,
                           "index_hash_slots": 4096, "index_max_entries": 32_768}}


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
    """ZooKeeper, two controllers and three nodes: produce, consume, kill -9 the master, fail
    over without losing an acked message, show the lag table, stop everything."""
    root = directory or tempfile.mkdtemp(prefix="hastore-demo-")
    remove = directory is None and not keep
    try:
        _run(root, count)
    except ClusterStartError as error:
        for name, tail in error.log_tails.items():
            _say(f"--- last lines of {name}'s log ---\n{tail}")
        raise click.ClickException(str(error)) from None
    except (ClusterError, NodeError, ChaosError) as error:
        raise click.ClickException(f"{error} (logs under {root})") from None
    finally:
        if remove:
            shutil.rmtree(root, ignore_errors=True)
    if not remove:
        _say(f"\nthe cluster's directory is kept in {root}")


def _run(root: str, count: int) -> None:
    _say("hastore demo: a replicated group with automatic failover, all processes on loopback.")
    cluster = LocalCluster(root, topology_from_mapping(DEMO_TOPOLOGY))
    session_ms = cluster.topology.controller.session_timeout_ms
    try:
        _step(1, "cluster up: ZooKeeper, two controllers, three nodes (`hastore cluster up`)")
        for spec in cluster.up():
            where = spec.client_address or spec.log_path
            _say(f"    {spec.name:<13} {spec.kind:<10} {where}  pid {cluster.pid(spec.name)}")
        _say(f"    nodes start as fenced slaves; the active controller elects a master. ZooKeeper session "
             f"timeout: {session_ms} ms (a dead master is noticed after about that long)")
        master = cluster.current_master("g1")
        _say(f"    master of g1: {master.node_id} (epoch {master.epoch}) at {master.client_address}")

        _step(2, f"produce {count} messages to {TOPIC!r} under sync replication, then consume them as "
                 f"{CONSUMER_GROUP!r}")
        trio.run(_produce_and_consume, master.client_address, count, cluster.topology.secret)

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


async def _produce_and_consume(address: str, count: int, secret: str | None) -> None:
    with trio.fail_after(STEP_DEADLINE_S):
        async with open_admin(address, secret=secret) as admin:
            await admin.create_topic(TOPIC, queue_count=4)
        async with open_producer(address, secret=secret, batch_count_max=32, linger_ms=2) as producer:
            messages = [OutgoingMessage(f"order #{i}".encode(), keys=[f"order-{i}"]) for i in range(count)]
            results = []
            for first in range(0, count, 32):
                results += await producer.send_batch(TOPIC, messages[first:first + 32])
        bad = [result for result in results if not result.ok]
        if bad:
            raise DemoError(f"{len(bad)} of {count} sends were not acknowledged; first: {bad[0]}")
        _say(f"    {count} messages acknowledged (PUT_OK): each one is on every member of the sync-state set")
        received = []
        async with open_consumer(address, TOPIC, CONSUMER_GROUP, secret=secret, from_beginning=True,
                                 long_poll_ms=1000) as consumer:
            while len(received) < count:
                received.append(await consumer.receive())
            committed = await consumer.commit()
    if sorted(m.body for m in received) != sorted(m.body for m in messages):
        raise DemoError("the consumer did not receive exactly the messages produced")
    _say(f"    consumed all {count} back; committed offsets per queue: {dict(sorted(committed.items()))}")


async def _status(address: str, secret: str | None) -> dict:
    with trio.fail_after(STEP_DEADLINE_S):
        async with open_admin(address, secret=secret) as admin:
            return await admin.status()
