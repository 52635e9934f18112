"""``hastore demo``: a storage-engine round trip a newcomer can follow.

Writes messages across topics and queues, stops *without* a clean shutdown (as a killed
process would), recovers, and reads everything back by queue offset, by key and by time,
then checks the directory with the offline verifier.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time

import click

from . import offline
from .config import StoreConfig
from .message import Message
from .message_store import MessageStore

TOPICS = ("orders", "payments", "audit")
QUEUES = 4


def _say(text: str = "") -> None:
    click.echo(text)


@click.command("demo")
@click.option("--dir", "directory", default=None,
              help="Store directory to use (default: a fresh temporary one, removed afterwards).")
@click.option("--messages", "count", default=3000, show_default=True, help="Messages to write.")
@click.option("--keep", is_flag=True, help="Keep the store directory afterwards.")
def demo_command(directory: str | None, count: int, keep: bool) -> None:
    """Write, crash, recover and read back a store: the storage engine in one minute."""
    if count < 10 or count > 1_000_000:
        raise click.BadParameter("--messages must be between 10 and 1,000,000")
    root = directory or tempfile.mkdtemp(prefix="hastore-demo-")
    remove = directory is None and not keep
    config = StoreConfig(store_path=root, commitlog_segment_bytes=256 * 1024, consume_queue_entries_per_file=1000,
                         index_hash_slots=4096, index_max_entries=16384, flush="async")
    try:
        _run(config, count)
    finally:
        if remove:
            shutil.rmtree(root, ignore_errors=True)
        else:
            _say(f"\nstore kept at {root}  (try: hastore store inspect {root})")


def _run(config: StoreConfig, count: int) -> None:
    _say(f"1. start a store in {config.store_path} (256 KiB segments so it rolls a few times)")
    store = MessageStore(config)
    store.start()
    _say(f"   {count} messages over topics {', '.join(TOPICS)} x {QUEUES} queues, keys order-<n>, batches of 50")
    sent: dict[int, tuple[str, int, int]] = {}
    middle_time = 0
    for start in range(0, count, 50):
        batch = [Message(topic=TOPICS[n % len(TOPICS)], queue_id=n % QUEUES, body=f"payload {n}".encode() * 8,
                         keys=[f"order-{n}"], tags="even" if n % 2 == 0 else "odd",
                         properties={"UNIQ_KEY": f"{n:032X}"})
                 for n in range(start, min(count, start + 50))]
        for n, result in zip(range(start, start + len(batch)), store.put_batch(batch)):
            assert result.status.ok, result
            sent[n] = (TOPICS[n % len(TOPICS)], n % QUEUES, result.queue_offset)
        if start <= count // 2 < start + 50:
            time.sleep(0.05)
            middle_time = int(time.time() * 1000)
            time.sleep(0.05)
    stats = store.statistics()
    _say(f"   wrote {stats.max_physical_offset} bytes in {stats.segments} segment(s)")
    store.wait_flushed(store.commit_log.max_offset)
    store.wait_dispatched()
    _say("\n2. stop WITHOUT a clean shutdown: the abort file stays, as after kill -9")
    store.halt()
    _say(f"   abort file present: {os.path.exists(os.path.join(config.store_path, 'abort'))}")

    _say("\n3. start again: recovery runs")
    store = MessageStore(config)
    report = store.start()
    _say(f"   {'abnormal' if report.abnormal else 'normal'} recovery in {report.duration_ms:.1f} ms: scanned from "
         f"offset {report.scan_start_offset} to {report.end_offset} ({report.stop_reason}), "
         f"re-dispatched {report.redispatched_messages} message(s), checkpoint "
         f"{'used' if report.checkpoint_valid else 'not usable'}")
    try:
        _read_back(store, sent, count, middle_time)
    finally:
        store.shutdown()
    _say("\n5. clean shutdown, then the offline verifier (hastore store verify):")
    problems, summary = offline.verify(config.store_path)
    _say(f"   {summary['messages']} messages, {summary['consume_queue_entries']} consume queue entries, "
         f"{summary['index_keys_checked']} index keys: {'sound' if not problems else problems[:3]}")
    if problems:
        raise click.ClickException("the verifier found problems")


def _read_back(store: MessageStore, sent: dict, count: int, middle_time: int) -> None:
    _say("\n4. read back")
    found = 0
    for topic in TOPICS:
        for queue_id in range(QUEUES):
            offset = store.min_offset(topic, queue_id)
            while True:
                messages = store.get(topic, queue_id, offset, 256)
                if not messages:
                    break
                found += len(messages)
                offset = messages[-1].queue_offset + 1
    _say(f"   by queue offset: {found} of {count} messages across {len(TOPICS) * QUEUES} queues")
    if found != count:
        raise click.ClickException(f"read back {found} messages, wrote {count}")
    first = store.get("orders", 1, 0, 1)[0]
    _say(f"   orders/1 offset 0: body {first.body[:16]!r}... keys {first.keys} tags {first.tags} "
         f"physical offset {first.physical_offset} id {first.message_id}")
    probe = count // 3
    topic = sent[probe][0]
    hits = store.query_by_key(topic, f"order-{probe}")
    _say(f"   by key order-{probe} in {topic}: {[(m.queue_id, m.queue_offset) for m in hits]} "
         f"(expected queue {sent[probe][1]} offset {sent[probe][2]})")
    if [(m.queue_id, m.queue_offset) for m in hits] != [sent[probe][1:]]:
        raise click.ClickException("key lookup returned the wrong message")
    by_id = store.get_by_message_id(hits[0].message_id)
    _say(f"   by message id {by_id.message_id}: keys {by_id.keys}")
    offset = store.offset_by_time("payments", 2, middle_time)
    message = store.get("payments", 2, offset, 1)
    before = store.get("payments", 2, offset - 1, 1) if offset > 0 else []
    _say(f"   by time: first payments/2 message stored at or after the midpoint is offset {offset}"
         + (f" (stored {message[0].store_timestamp - middle_time:+d} ms from it)" if message else ""))
    if message and message[0].store_timestamp < middle_time or before and before[0].store_timestamp >= middle_time:
        raise click.ClickException("time search returned the wrong offset")
