"""The client commands of ``hastore``: produce, consume, query, topic, status.

Registered in pyproject.toml under ``hastore.commands``. Every client command takes
``--bootstrap HOST:PORT``, ``--zk HOSTS`` (ZooKeeper names the master) or ``--dir DIR``
(the local cluster in DIR), and ``--secret`` (or HASTORE_SECRET); ``--json`` prints
machine-readable results on stdout, progress goes to stderr (on a terminal only).
"""

from __future__ import annotations

import functools
import inspect
import json
import sys
import time
from datetime import datetime

import click
import trio

from store.errors import exception_leaves

from . import OutgoingMessage, open_admin, open_consumer, open_producer, open_routed_consumer, open_routed_producer
from .route_cli import routed_source
from ..errors import NodeError, UnknownOutcomeError
from ..wire.address import address_problem


def bootstrap_option(command):
    """Where the node is: ``--bootstrap HOST:PORT``, ``--zk HOSTS`` (ZooKeeper names the group's
    master) or ``--dir DIR`` (the local cluster in DIR: its master and its secret)."""
    @functools.wraps(command)
    def with_bootstrap(*args, zk_hosts, zk_cluster, zk_group, cluster_dir, **kwargs):
        if zk_hosts and cluster_dir:
            raise click.UsageError("give --zk or --dir, not both")
        if "route_source" in inspect.signature(command).parameters:   # produce/consume: a routed topic?
            kwargs["route_source"] = routed_source(kwargs["topic"], zk_hosts, zk_cluster, cluster_dir)
            if kwargs["route_source"] is not None:
                if "secret" in kwargs and kwargs["secret"] is None:
                    kwargs["secret"] = kwargs["route_source"].secret
                return command(*args, **kwargs)
        if zk_hosts:
            kwargs["bootstrap"] = _master_from_zookeeper(zk_hosts, zk_cluster, zk_group)
        elif cluster_dir:
            kwargs["bootstrap"], cluster_secret = _master_from_local_cluster(cluster_dir, zk_group)
            if "secret" in kwargs and kwargs["secret"] is None:
                kwargs["secret"] = cluster_secret
        return command(*args, **kwargs)
    for option in (
            click.option("--zk-group", "zk_group", default="g1", show_default=True,
                         help="With --zk or --dir: the group whose master to use."),
            click.option("--zk-cluster", "zk_cluster", default="hastore", show_default=True,
                         help="With --zk: the cluster name the controller runs under."),
            click.option("--zk", "zk_hosts", default=None, metavar="HOSTS",
                         help="Find the master through ZooKeeper (controller mode) instead of --bootstrap."),
            click.option("--dir", "cluster_dir", default=None, metavar="DIR", envvar="HASTORE_CLUSTER_DIR",
                         type=click.Path(file_okay=False),
                         help="Use the local cluster in DIR (`hastore cluster up --dir DIR`): its master and "
                              "its secret, no address to look up (env HASTORE_CLUSTER_DIR)."),
            click.option("--bootstrap", default="127.0.0.1:10911", show_default=True, metavar="HOST:PORT",
                         callback=_check_address,
                         help="Client address of a node (any node: reads are served there, writes follow "
                              "NOT_MASTER to the master).")):
        with_bootstrap = option(with_bootstrap)
    return with_bootstrap


def _check_address(ctx, param, value: str | None) -> str | None:
    """A --bootstrap that is not host:port is a usage error, named before anything connects."""
    problem = address_problem(value) if value is not None else None
    if problem is not None:
        raise click.BadParameter(f"the address {problem} (e.g. 127.0.0.1:10911)")
    return value


def _master_from_zookeeper(zk_hosts: str, cluster: str, group: str) -> str:
    from controller import ControllerError, find_master  # only commands run with --zk need kazoo
    try:
        return find_master(zk_hosts, cluster, group).client_address
    except ControllerError as error:
        raise click.ClickException(f"no master of group {group} in cluster {cluster} via ZooKeeper {zk_hosts}: "
                                   f"{error}; check the cluster with `hastore controller status --zk {zk_hosts}`"
                                   ) from None


def _master_from_local_cluster(directory: str, group: str) -> tuple[str, str | None]:
    """The client address ``group``'s master advertises in the local cluster in ``directory``
    (its client proxy when the cluster is proxied), and the cluster's secret."""
    from controller.errors import ControllerError  # only --dir needs the local cluster (and kazoo)
    from ..cluster import ClusterError, LocalCluster
    cluster = LocalCluster(directory)
    if not cluster.nodes():
        raise click.ClickException(f"no local cluster recorded in {directory}: start one with "
                                   f"`hastore cluster up --dir {directory}`")
    if not cluster.nodes(group):
        groups = sorted({spec.group for spec in cluster.nodes()})
        raise click.ClickException(f"the cluster in {directory} has no group {group!r}: use --zk-group with one "
                                   f"of {', '.join(groups)}")
    try:
        return cluster.advertised_client_address(cluster.master(group).name), cluster.topology.secret
    except (ClusterError, ControllerError) as error:
        raise click.ClickException(f"group {group} of the cluster in {directory} has no master now ({error}); "
                                   f"see `hastore cluster status --dir {directory}`") from None


secret_option = click.option("--secret", envvar="HASTORE_SECRET", default=None,
                             help="Cluster secret for the HMAC challenge (env HASTORE_SECRET).")
json_option = click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")


def _run(async_fn, *args):
    """Run a client coroutine; node errors become a one-line message and exit status 1."""
    try:
        return trio.run(async_fn, *args)
    except NodeError as error:
        raise click.ClickException(str(error)) from None
    except BaseExceptionGroup as group:
        matched, rest = group.split(NodeError)
        if matched is None or rest is not None:
            raise
        raise click.ClickException("; ".join(sorted({str(e) for e in exception_leaves(matched)}))) from None


def _progress(text: str) -> None:
    click.echo(f"\r{text}", nl=False, err=True)


# --- produce -------------------------------------------------------------------------------
SEND_LINES_MAX = 10_000_000   # lines read from stdin by one produce


def _parse_properties(pairs: tuple[str, ...]) -> dict[str, str]:
    properties = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="--property")
        properties[key] = value
    return properties


def _bodies_from_stdin():
    """Each line of stdin (without its newline) as a body, like kafka-console-producer."""
    for number, line in enumerate(sys.stdin.buffer):
        if number >= SEND_LINES_MAX:
            raise click.ClickException(f"more than {SEND_LINES_MAX} lines on stdin: split the input")
        yield line.rstrip(b"\r\n")


@click.command("produce")
@bootstrap_option
@click.argument("bodies", nargs=-1, metavar="[BODY]...")
@click.option("--topic", required=True, help="Topic to send to (created if the node auto-creates topics).")
@click.option("--key", "keys", multiple=True, help="A business key of every message (KEYS); repeat for several.")
@click.option("--tag", "--tags", "tags", default=None, help="The tag of every message (TAGS).")
@click.option("--property", "properties", multiple=True, metavar="KEY=VALUE",
              help="A user property of every message; repeat for several.")
@click.option("--count", default=None, type=click.IntRange(1, 100_000_000),
              help="Generated load: send COUNT messages of --size bytes instead of BODY or stdin.")
@click.option("--size", default=None, type=click.IntRange(0, 4 * 1024 * 1024),
              help="Generated load: body size in bytes (default 100).")
@click.option("--batch", default=1, show_default=True, type=click.IntRange(1, 4096),
              help="Messages per send request (one frame).")
@click.option("--in-flight", default=8, show_default=True, type=click.IntRange(1, 1024),
              help="Batches sent but not yet answered.")
@click.option("--key-prefix", default=None, help="Generated load: give message i the key PREFIX-i.")
@secret_option
@json_option
def produce_command(bootstrap, bodies, topic, keys, tags, properties, count, size, batch, in_flight, key_prefix,
                    secret, as_json, route_source=None) -> None:
    """Send messages to TOPIC and report the outcome.

    \b
    hastore produce --topic orders hello world          two messages, "hello" and "world"
    printf 'a\\nb\\n' | hastore produce --topic orders   one message per line of stdin
    hastore produce --topic orders --key order-1 --tag new --property region=eu '{"id": 1}'
    hastore produce --topic orders --count 100000 --size 1024 --batch 64   generated load

    Unknown outcomes (the connection died after a request left) are counted apart and
    never retried, so they are never silently duplicated. Exit status 1 when any message
    failed or has an unknown outcome. With --zk/--dir, a topic routed over groups (`hastore
    topic create T --zk ...`) is sent to queues across all its groups.
    """
    user_properties = _parse_properties(properties)
    generated = count is not None or size is not None or key_prefix is not None
    if generated and bodies:
        raise click.UsageError("give BODY arguments or --count/--size (generated load), not both")
    if generated:
        count = count or 1
        body = b"x" * (100 if size is None else size)

        def messages_of(first: int, last: int) -> list[OutgoingMessage]:
            return [OutgoingMessage(body, keys=[f"{key_prefix}-{i}"] if key_prefix else keys, tags=tags,
                                    properties=dict(user_properties)) for i in range(first, last)]
        total = count
    else:
        payloads = [b.encode("utf-8") for b in bodies] if bodies else list(_bodies_from_stdin())
        if not payloads:
            raise click.UsageError("nothing to send: give BODY arguments, lines on stdin, or --count")

        def messages_of(first: int, last: int) -> list[OutgoingMessage]:
            return [OutgoingMessage(payload, keys=keys, tags=tags, properties=dict(user_properties))
                    for payload in payloads[first:last]]
        total = len(payloads)
    outcome = _run(_produce, bootstrap, secret, topic, total, messages_of, batch, in_flight, as_json, route_source)
    if as_json:
        click.echo(json.dumps(outcome))
    else:
        reason = f"; {outcome['error']}" if outcome.get("error") else ""
        if outcome.get("unknown_reason"):
            reason += f"; unknown: {outcome['unknown_reason']}"
        click.echo(f"\rsent {outcome['count']}: {outcome['ok']} ok, {outcome['failed']} failed, "
                   f"{outcome['unknown']} unknown outcome in {outcome['seconds']} s "
                   f"({outcome['msgs_per_s']} msgs/s) {outcome['statuses']}{reason}"
                   + (f" acked per group {outcome['acked_by_group']}" if "acked_by_group" in outcome else ""))
    if outcome["failed"] or outcome["unknown"]:
        sys.exit(1)


async def _produce(bootstrap, secret, topic, count, messages_of, batch, in_flight, as_json, route_source=None) -> dict:
    """Send messages [0, count) in batches of ``batch``, ``in_flight`` at a time; the outcome."""
    started = time.perf_counter()
    outcome = {"ok": 0, "failed": 0, "unknown": 0, "statuses": {}, "first_message_id": None,
               "last_message_id": None}

    def count_status(status: str, number: int) -> None:
        outcome["statuses"][status] = outcome["statuses"].get(status, 0) + number

    opened = (open_routed_producer(route_source.directory(), secret=secret, batch_count_max=batch,
                                   in_flight_max=in_flight) if route_source is not None else
              open_producer(bootstrap, secret=secret, batch_count_max=batch, in_flight_max=in_flight))
    async with opened as producer:
        async def send_range(first: int, last: int) -> None:
            try:
                results = await producer.send_batch(topic, messages_of(first, last))
            except UnknownOutcomeError as error:
                outcome["unknown"] += last - first
                outcome["unknown_reason"] = str(error)
                return
            except NodeError as error:
                outcome["failed"] += last - first
                count_status(getattr(error, "code", type(error).__name__), last - first)
                outcome["error"] = str(error)
                return
            for result in results:
                count_status(result.status, 1)
                if result.ok:
                    outcome["ok"] += 1
                    outcome["first_message_id"] = outcome["first_message_id"] or result.message_id
                    outcome["last_message_id"] = result.message_id
                else:
                    outcome["failed"] += 1
                    if result.reason:
                        outcome["error"] = f"{result.status}: {result.reason}"

        in_flight_slots = trio.Semaphore(in_flight)  # bounds the batches started, not only sent

        async def limited(first, last):
            try:
                await send_range(first, last)
            finally:
                in_flight_slots.release()

        last_report = 0.0
        async with trio.open_nursery() as nursery:
            for first in range(0, count, batch):
                await in_flight_slots.acquire()
                nursery.start_soon(limited, first, min(first + batch, count))
                if not as_json and sys.stderr.isatty() and time.perf_counter() - last_report > 0.5:
                    last_report = time.perf_counter()
                    done = outcome["ok"] + outcome["failed"] + outcome["unknown"]
                    _progress(f"sent {done}/{count}")
        if route_source is not None:
            outcome["acked_by_group"] = producer.statistics().acked_by_group
    elapsed = time.perf_counter() - started
    outcome.update(count=count, seconds=round(elapsed, 3), msgs_per_s=round(count / elapsed, 1))
    return outcome


# --- consume -------------------------------------------------------------------------------
@click.command("consume")
@bootstrap_option
@click.option("--topic", required=True, help="Topic to read.")
@click.option("--group", required=True, help="Consumer group whose offsets are used and committed.")
@click.option("--from-beginning", is_flag=True,
              help="Start queues without a committed offset at their first message (default: at the end).")
@click.option("--count", default=None, type=click.IntRange(1, 100_000_000),
              help="Stop after this many messages (default: run until interrupted or --idle-ms passes).")
@click.option("--idle-ms", default=None, type=click.IntRange(1, 86_400_000),
              help="Stop when no message arrives for this long.")
@click.option("--no-commit", is_flag=True, help="Do not commit the group's offsets.")
@secret_option
@json_option
def consume_command(bootstrap, topic, group, from_beginning, count, idle_ms, no_commit, secret, as_json,
                    route_source=None) -> None:
    """Read messages of TOPIC as consumer GROUP, committing the group's offsets as it goes.

    Prints each message's body on a line of its own (bytes as they are); with --json, one
    JSON object per message with its queue, offsets, id, keys, tags and times (body as UTF-8
    text). The count goes to stderr. With --zk/--dir, a routed topic is read from every
    group that holds a queue of it, offsets committed to each (--json then names the group).
    """
    async def main():
        received = 0
        options = dict(secret=secret, from_beginning=from_beginning, long_poll_ms=min(idle_ms or 5000, 5000))
        async with (open_routed_consumer(route_source.directory(), topic, group, **options)
                    if route_source is not None else open_consumer(bootstrap, topic, group, **options)) as consumer:
            last_commit = time.monotonic()
            while count is None or received < count:
                with trio.move_on_after((idle_ms or 10**9) / 1000):
                    message = await consumer.receive()
                    received += 1
                    if as_json:
                        click.echo(json.dumps(message.to_json()))
                    else:
                        _write_body(message.body)
                    if not no_commit and time.monotonic() - last_commit > 1:
                        await consumer.commit()
                        last_commit = time.monotonic()
                    continue
                break  # idle
            if not no_commit:
                await consumer.commit()
        return received

    received = _run(main)
    click.echo(f"consumed {received} messages", err=True)


def _write_body(body: bytes) -> None:
    out = sys.stdout.buffer
    out.write(body if body.endswith(b"\n") else body + b"\n")
    out.flush()


# --- query ---------------------------------------------------------------------------------
@click.group("query")
def query_group() -> None:
    """Look messages up by key, by time or by message id."""


def _print_messages(messages, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps([m.to_json() for m in messages]))
        return
    for m in messages:
        click.echo(f"{m.topic} {m.queue_id}:{m.queue_offset} id={m.message_id} keys={','.join(m.keys)} "
                   f"stored={datetime.fromtimestamp(m.store_timestamp / 1000).isoformat()} {m.body[:80]!r}")
    if not messages:
        click.echo("no message found", err=True)


@query_group.command("key")
@bootstrap_option
@click.option("--topic", required=True)
@click.option("--key", required=True, help="A business key (KEYS) or a message's UNIQ_KEY.")
@click.option("--max", "max_count", default=32, show_default=True, type=click.IntRange(1, 64))
@secret_option
@json_option
def query_key(bootstrap, topic, key, max_count, secret, as_json) -> None:
    """Messages of TOPIC with KEY (IndexFile lookup)."""
    async def main():
        async with open_admin(bootstrap, secret=secret) as admin:
            return await admin.query_by_key(topic, key, max_count=max_count)
    _print_messages(_run(main), as_json)


@query_group.command("time")
@bootstrap_option
@click.option("--topic", required=True)
@click.option("--queue", "queue_id", default=0, show_default=True, type=click.IntRange(0, 2**31 - 1))
@click.option("--timestamp-ms", required=True, type=click.IntRange(0), help="Milliseconds since the epoch.")
@secret_option
@json_option
def query_time(bootstrap, topic, queue_id, timestamp_ms, secret, as_json) -> None:
    """The queue offset of the first message stored at or after TIMESTAMP_MS."""
    async def main():
        async with open_admin(bootstrap, secret=secret) as admin:
            return await admin.query_by_time(topic, queue_id, timestamp_ms)
    offset = _run(main)
    click.echo(json.dumps({"topic": topic, "queue_id": queue_id, "offset": offset}) if as_json else str(offset))


@query_group.command("id")
@bootstrap_option
@click.option("--id", "message_id", required=True, help="Offset message id (32 hex digits).")
@secret_option
@json_option
def query_id(bootstrap, message_id, secret, as_json) -> None:
    """The message with an offset message id."""
    async def main():
        async with open_admin(bootstrap, secret=secret) as admin:
            return await admin.query_by_id(message_id)
    _print_messages([_run(main)], as_json)


# --- topic ---------------------------------------------------------------------------------
from .route_cli import topic_group  # noqa: E402,F401  (topic create|list, routed over groups: route_cli.py)


# --- status --------------------------------------------------------------------------------
@click.command("status")
@bootstrap_option
@secret_option
@json_option
def status_command(bootstrap, secret, as_json) -> None:
    """A node's role, epoch, offsets and store statistics, and its client connections: open
    of the limit, refused busy, shed (idle or unauthenticated), idle and auth timeouts, reply
    bytes queued, backpressure pauses, closed for memory."""
    async def main():
        async with open_admin(bootstrap, secret=secret) as admin:
            return await admin.status()
    status = _run(main)
    if as_json:
        click.echo(json.dumps(status))
        return
    store = status["store"]
    click.echo(f"node {status['node_id']} ({status['cluster']}/{status['group']}) {status['role']} "
               f"epoch {status['epoch']}\n"
               f"  commit log [{store['min_physical_offset']}, {store['max_physical_offset']}) flushed "
               f"{store['flushed_offset']} dispatched {store['dispatched_offset']} (lag {store['dispatch_lag_bytes']} B)\n"
               f"  messages put {store['put_messages']}, topics {status['topics']}, "
               f"connections {status.get('connections')}")
    clients = status.get("clients")
    if clients:
        click.echo(_clients_line(clients))
    polling = status.get("busy_poll")
    if polling:
        click.echo(f"  busy polling: {polling['window_us']} us window, {polling['reads']} requests read by "
                   f"polling, {polling['seconds']:.3f} s spent polling; the loop's waits: "
                   f"{polling.get('loop_polls', 0)} polled, {polling.get('loop_polls_woken', 0)} ended by I/O, "
                   f"{polling.get('loop_seconds', 0):.3f} s; {polling.get('ready_taken', 0)} polls kept on by "
                   f"I/O taken at once (a master's acks)" if polling["window_us"] else "  busy polling: off")


def _clients_line(clients: dict) -> str:
    """The status text's line on client connections: how many of the limit, which the node
    closed or refused and why, the bytes it holds for them (node/server/client_limits.py)."""
    return (f"  clients: {clients['open']} of {clients['limit']} connections; refused busy {clients['refused_busy']}, "
            f"shed idle {clients['shed_idle']}, shed unauthenticated {clients['shed_unauthenticated']}, "
            f"idle timeouts {clients['idle_timeouts']}, auth timeouts {clients['auth_timeouts']}; "
            f"replies queued and partial requests {clients['held_bytes']} B (peak {clients['peak_held_bytes']} B), "
            f"backpressure pauses {clients['backpressure_pauses']}, closed for memory {clients['closed_for_memory']}")
