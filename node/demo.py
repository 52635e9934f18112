"""``hastore demo``: a node's life in one minute, told step by step.

Starts a real node process (``hastore node start --config FILE`` on loopback), produces
messages across topics with keys and tags, consumes them back as a group and commits the
group's offsets, looks messages up by key and by time, prints the node's status, then
stops the node with SIGTERM and checks that it shut down cleanly (exit 0, no abort file).
"""

from __future__ import annotations

import shutil
import tempfile
import time

import click
import trio

from .client import OutgoingMessage, open_admin, open_consumer, open_producer
from .errors import NodeError
from .cluster.process import NodeProcess

TOPICS = {"orders": 4, "payments": 2}
TAGS = ("new", "paid", "shipped")
GROUP = "demo-billing"
STEP_DEADLINE_S = 60


def _say(text: str = "") -> None:
    click.echo(text)


def _step(number: int, text: str) -> None:
    _say(f"\n[{number}] {text}")


async def _produce(address: str, count: int) -> tuple[dict[str, list], int]:
    """Send ``count`` messages per topic; returns each topic's SendResults in order and a
    time (ms) between the last orders message and the first payments message."""
    sent: dict[str, list] = {}
    between_ms = 0
    async with open_admin(address) as admin:
        for topic, queue_count in TOPICS.items():
            await admin.create_topic(topic, queue_count=queue_count)
            _say(f"    created topic {topic!r} with {queue_count} queues")
    async with open_producer(address, batch_count_max=32, linger_ms=2) as producer:
        for topic in TOPICS:
            if sent:
                await trio.sleep(0.005)
                between_ms = int(time.time() * 1000)
                await trio.sleep(0.005)
            messages = [OutgoingMessage(f"{topic} #{i}".encode(), keys=[f"{topic[:-1]}-{i}"], tags=TAGS[i % 3])
                        for i in range(count)]
            results = []
            for first in range(0, count, 32):
                results += await producer.send_batch(topic, messages[first:first + 32])
            bad = [r for r in results if not r.ok]
            if bad:
                raise NodeError(f"{len(bad)} sends to {topic} failed, first: {bad[0]}")
            sent[topic] = results
            queues = sorted({r.queue_id for r in results})
            _say(f"    {topic}: {count} messages acknowledged (PUT_OK) in batches of 32, spread over queues "
                 f"{queues}; first id {results[0].message_id}")
    return sent, between_ms


async def _consume(address: str, topic: str, expected: int) -> None:
    """Read every message of ``topic`` as GROUP, commit, and show the committed offsets."""
    received = []
    with trio.fail_after(STEP_DEADLINE_S):
        async with open_consumer(address, topic, GROUP, from_beginning=True, long_poll_ms=1000) as consumer:
            while len(received) < expected:
                received.append(await consumer.receive())
            committed = await consumer.commit()
    per_queue = {}
    for message in received:
        per_queue[message.queue_id] = per_queue.get(message.queue_id, 0) + 1
    first = received[0]
    _say(f"    {topic}: received {len(received)} messages as group {GROUP!r} (per queue {dict(sorted(per_queue.items()))})")
    _say(f"      e.g. queue {first.queue_id} offset {first.queue_offset}: {first.body!r} keys={first.keys} "
         f"tags={first.tags}")
    _say(f"    committed offsets (queue -> next offset to read): {dict(sorted(committed.items()))}")
    async with open_admin(address) as admin:
        stored = await admin.query_offsets(GROUP, topic)
    if stored != committed:
        raise NodeError(f"the node holds offsets {stored}, not the committed {committed}")
    _say(f"    the node holds the same offsets for {GROUP!r}: a restarted consumer resumes there")


async def _query(address: str, sent: dict[str, list], before_ms: int, between_ms: int) -> None:
    async with open_admin(address) as admin:
        found = await admin.query_by_key("orders", "order-7")
        if [m.body for m in found] != [b"orders #7"]:
            raise NodeError(f"query by key order-7 found {[m.body for m in found]}")
        _say(f"    by key 'order-7' (IndexFile lookup): {found[0].body!r} at queue {found[0].queue_id} "
             f"offset {found[0].queue_offset}")
        by_uniq = await admin.query_by_key("payments", sent["payments"][3].uniq_key)
        _say(f"    by UNIQ_KEY {sent['payments'][3].uniq_key[:12]}...: {[m.body for m in by_uniq]}")
        by_id = await admin.query_by_id(sent["orders"][5].message_id)
        _say(f"    by message id {by_id.message_id}: {by_id.body!r}")
        found_offsets = []
        for label, timestamp_ms in (("before the first send", before_ms),
                                    ("after the last orders message", between_ms)):
            offsets = [await admin.query_by_time("orders", queue_id, timestamp_ms)
                       for queue_id in range(TOPICS["orders"])]
            found_offsets.append(offsets)
            _say(f"    by time ({label}, {timestamp_ms} ms): first orders offset stored at or after it, "
                 f"per queue: {offsets}")
        ends = [(await admin.queue_offsets("orders", q))[1] for q in range(TOPICS["orders"])]
        if found_offsets != [[0] * len(ends), ends]:
            raise NodeError(f"lookups by time found {found_offsets}: expected offset 0 before the first send "
                            f"and each queue's end ({ends}) after the last")
        _say(f"    (the queues end at {ends}: nothing of orders was stored after that time)")


async def _status(address: str) -> None:
    async with open_admin(address) as admin:
        status = await admin.status()
    store = status["store"]
    _say(f"    node {status['node_id']} is {status['role']} (epoch {status['epoch']}), "
         f"client address {status['client_address']}")
    _say(f"    commit log [{store['min_physical_offset']}, {store['max_physical_offset']}) bytes, "
         f"flushed to {store['flushed_offset']}, dispatched to {store['dispatched_offset']}")
    _say(f"    messages put {store['put_messages']} (with the node's own %SYS%CONFIG records of topics and "
         f"offsets), topics {status['topics']}")


@click.command("demo")
@click.option("--dir", "directory", default=None,
              help="Directory for the node's config, log and store (default: a fresh temporary one).")
@click.option("--messages", "count", default=100, show_default=True, type=click.IntRange(10, 10_000),
              help="Messages per topic.")
@click.option("--keep", is_flag=True, help="Keep the directory afterwards.")
def demo_command(directory: str | None, count: int, keep: bool) -> None:
    """Start a node, produce, consume, query by key and by time, show status, stop it cleanly."""
    root = directory or tempfile.mkdtemp(prefix="hastore-node-demo-")
    remove = directory is None and not keep
    try:
        _run(root, count)
    except NodeError as error:
        raise click.ClickException(str(error)) from None
    finally:
        if remove:
            shutil.rmtree(root, ignore_errors=True)
    if not remove:
        _say(f"\nthe node's directory is kept in {root}")


def _run(root: str, count: int) -> None:
    _say("hastore demo: a node process, a producer, a consumer group and an admin, all on loopback.")
    _step(1, "start a node: `hastore node start --config node.yaml` as its own process")
    node = NodeProcess.start(root, {"node_id": "demo", "flush": "async"})
    try:
        address = node.client_address
        _say(f"    pid {node.pid} serves clients on {address}; store in {node.store_path}")
        _say(f"    config {node.config_path}, log {node.stderr_path}")
        _step(2, f"produce {count} messages to each of {', '.join(TOPICS)} (keys, tags, batches)")
        before_ms = int(time.time() * 1000) - 1
        sent, between_ms = trio.run(_produce, address, count)
        _step(3, f"consume both topics as group {GROUP!r} from the beginning and commit")
        for topic in TOPICS:
            trio.run(_consume, address, topic, count)
        _step(4, "look messages up by key, by message id and by time")
        trio.run(_query, address, sent, before_ms, between_ms)
        _step(5, "node status")
        trio.run(_status, address)
    finally:
        _step(6, "stop the node with SIGTERM")
        status = node.stop()
    if not node.stopped_cleanly():
        raise NodeError(f"the node exited with status {status} or left an abort file behind:\n{node.stderr_tail()}")
    _say(f"    exit status {status}, no abort file in the store: it shut down cleanly "
         f"(a restart needs no recovery scan)")
    _say("\ndone.")
