"""``df.write.format("hastore")`` and ``df.writeStream.format("hastore")``: rows become
produced messages of a live group, sent to its master with the client library.

    df.select("body", "keys").write.format("hastore").option("zk", zk).option("group", "g1") \\
        .option("topic", "orders").mode("append").save()

Columns: ``body`` (binary or string) is required; ``keys`` (array<string>), ``tags``
(string), ``properties`` (map<string, string>), ``queue_id`` (int) and ``topic`` (string, a
row's own topic over the ``topic`` option) are optional; other columns are left out, so the
stream source's rows can be written back as they are.

Options: the cluster's (bootstrap | zk, cluster, group, secret, requestTimeoutMs,
failoverTimeoutMs; pipeline.cluster_access), ``topic``, and ``batchSize`` (messages per send,
default 256). With ``zk`` and no ``group`` a topic's batches go to the groups of its route in
ZooKeeper in turn (the node picks the queue inside the group; a ``queue_id`` column is then
refused); a group failing over holds only its own batch, until its new master or
failoverTimeoutMs.

Success is the node's acknowledgement: with sync replication a message is PUT_OK only once
the in-sync replicas hold it. Any other status (FLUSH_SLAVE_TIMEOUT, ...) fails the task, and
so does an unknown outcome (the request left, no reply came): Spark then retries the task,
so delivery is at least once, never silently less. A send the node surely did not take
(NOT_MASTER, busy, no connection) is sent again to the master found again, bounded by
failoverTimeoutMs.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from typing import Iterator

from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage

from .cluster_access import ClusterTarget, MasterUnavailableError, find_master_once, positive_int, retrying, \
    target_from_options
from .errors import OptionError, SinkError

log = logging.getLogger(__name__)

BATCH_SIZE_DEFAULT = 256
BATCH_BYTES_MAX = 1024 * 1024
SINK_TYPES = {"body": ("binary", "string"), "keys": ("array<string>",), "tags": ("string",),
              "properties": ("map<string,string>",), "queue_id": ("int", "smallint", "tinyint"),
              "topic": ("string",)}
REFUSED_BEFORE_WRITE = ("NOT_MASTER", "SYSTEM_BUSY", "SERVICE_NOT_AVAILABLE")


@dataclass(frozen=True, slots=True)
class SinkSettings:
    """The sink's options and the columns it reads."""

    target: ClusterTarget
    topic: str | None
    columns: tuple[str, ...]
    batch_size: int = BATCH_SIZE_DEFAULT


def sink_settings(options, schema) -> SinkSettings:
    """SinkSettings from the options and the DataFrame's schema (its columns' types checked)."""
    present = {field.name: field.dataType.simpleString() for field in schema.fields}
    if "body" not in present:
        raise OptionError(f"the hastore sink needs a body column (binary or string); the DataFrame has "
                          f"{', '.join(present) or 'no columns'}")
    for name, allowed in SINK_TYPES.items():
        if name in present and present[name] not in allowed:
            raise OptionError(f"the hastore sink's column {name} must be {' or '.join(allowed)}, not {present[name]}")
    topic = str(options.get("topic") or "").strip() or None
    if topic is None and "topic" not in present:
        raise OptionError('the hastore sink needs option topic (or a topic column): .option("topic", "orders")')
    target = target_from_options(options)
    if target.routed and "queue_id" in present:
        raise OptionError("the hastore sink routes each topic over its groups (zk without group): a queue_id column "
                          "does not say which group's queue; drop it, or name the group with option group")
    return SinkSettings(target, topic, tuple(n for n in SINK_TYPES if n in present),
                        positive_int(options, "batchSize", BATCH_SIZE_DEFAULT, 1, 4096))


@dataclass
class SinkCommit(WriterCommitMessage):
    """What one task sent: messages acknowledged, per topic."""

    acked: int
    topics: dict


def _outgoing(batch, settings: SinkSettings):
    """(topic, OutgoingMessage) of every row of an Arrow batch."""
    from node.client import OutgoingMessage
    columns = {name: batch.column(name).to_pylist() for name in settings.columns}
    count = batch.num_rows
    empty = [None] * count
    bodies, keys, tags = columns["body"], columns.get("keys", empty), columns.get("tags", empty)
    properties, queues, topics = columns.get("properties", empty), columns.get("queue_id", empty), \
        columns.get("topic", empty)
    for index in range(count):
        body = bodies[index]
        if body is None:
            raise SinkError(f"row {index} of a batch has a null body; the hastore sink sends only rows with a body")
        if isinstance(body, str):
            body = body.encode("utf-8")
        topic = topics[index] or settings.topic
        if not topic:
            raise SinkError(f"row {index} has no topic (null topic column and no topic option)")
        yield topic, OutgoingMessage(body, tuple(k for k in (keys[index] or ()) if k), tags[index] or None,
                                     dict(properties[index] or ()), queues[index])


class _Sender:
    """One task's producers (one per group): batches per topic, each sent to the master of its
    group, each outcome checked. A routed topic's batches go to the groups of its route in
    turn, starting at a different group in each task."""

    def __init__(self, settings: SinkSettings) -> None:
        self.settings = settings
        self.producers: dict = {}
        self.acked: dict[str, int] = {}
        self.turns: dict[str, int] = {}

    def _group_for(self, topic: str) -> str | None:
        if not self.settings.target.routed:
            return None
        from .cluster_access import topic_routes
        groups = sorted(g for g, ids in retrying(self.settings.target,
                                                 lambda: topic_routes(self.settings.target, [topic]),
                                                 (MasterUnavailableError,), f"reading the route of {topic}")[topic].items()
                        if ids)
        if topic not in self.turns:
            self.turns[topic] = random.randrange(len(groups))      # tasks spread their first batches
        turn = self.turns[topic]
        self.turns[topic] = turn + 1
        return groups[turn % len(groups)]

    def _open(self, group: str | None):
        from node.client import SyncProducer
        if self.producers.get(group) is None:
            target = self.settings.target if group is None else self.settings.target.for_group(group)
            address = find_master_once(target)
            self.producers[group] = SyncProducer(address, secret=target.secret, timeout_ms=target.request_timeout_ms)
        return self.producers[group]

    def close(self, group: str | None = None, *, every: bool = True) -> None:
        for name in list(self.producers) if every else [group]:
            producer = self.producers.pop(name, None)
            if producer is not None:
                try:
                    producer.close()
                except Exception as error:   # a producer whose master died: nothing left to release
                    log.debug("closing the producer: %s", error)

    def send(self, topic: str, messages: list) -> None:
        from node.errors import (AuthError, ConnectionLostError, NotMasterError, RequestError, RequestTimeoutError,
                                 UnknownOutcomeError, UnsentError)

        group = self._group_for(topic)
        target = self.settings.target if group is None else self.settings.target.for_group(group)

        def attempt():
            try:
                return self._open(group).send_batch(topic, messages)
            except (UnknownOutcomeError, RequestTimeoutError) as error:
                raise SinkError(f"hastore sink: {len(messages)} messages to {topic} have an unknown outcome "
                                f"({error}); the task fails so that Spark retries it (they may be stored twice)") \
                    from error
            except AuthError:
                raise
            except RequestError as error:
                if error.code in REFUSED_BEFORE_WRITE:
                    raise _Refused(error) from error
                raise SinkError(f"hastore sink: {topic} refused {len(messages)} messages: {error}") from error

        def drop(error: BaseException) -> None:
            log.info("hastore sink: send to %s not taken (%s); finding the master of %s again", topic, error,
                     target.describe())
            self.close(group, every=False)
        results = retrying(target, attempt,
                           (_Refused, NotMasterError, UnsentError, ConnectionLostError, MasterUnavailableError,
                            OSError), f"sending to {topic}", on_retry=drop)
        failed = [result for result in results if not result.ok]
        if failed:
            statuses = sorted({result.status for result in failed})
            raise SinkError(f"hastore sink: {len(failed)} of {len(messages)} messages to {topic} were not "
                            f"acknowledged ({', '.join(statuses)}: {failed[0].reason or 'no reason given'}); "
                            f"the task fails so that Spark retries it")
        self.acked[topic] = self.acked.get(topic, 0) + len(results)


class _Refused(Exception):
    """A send the node refused before writing anything: safe to send again."""


def write_batches(settings: SinkSettings, batches: Iterator) -> SinkCommit:
    """Send every row of ``batches``; SinkError on the first message not acknowledged."""
    sender = _Sender(settings)
    pending: dict[str, list] = {}
    pending_bytes: dict[str, int] = {}
    try:
        for batch in batches:
            for topic, message in _outgoing(batch, settings):
                group = pending.setdefault(topic, [])
                group.append(message)
                pending_bytes[topic] = pending_bytes.get(topic, 0) + message.size_bytes
                if len(group) >= settings.batch_size or pending_bytes[topic] >= BATCH_BYTES_MAX:
                    sender.send(topic, group)
                    pending[topic], pending_bytes[topic] = [], 0
        for topic, group in pending.items():
            if group:
                sender.send(topic, group)
    finally:
        sender.close()
    return SinkCommit(sum(sender.acked.values()), dict(sender.acked))


class HastoreWriter(DataSourceArrowWriter):
    """Batch writes: each task sends its rows; every message acknowledged or the task fails."""

    def __init__(self, settings: SinkSettings) -> None:
        self.settings = settings

    def write(self, iterator) -> SinkCommit:
        return write_batches(self.settings, iterator)

    def commit(self, messages) -> None:
        acked = sum(m.acked for m in messages if m is not None)
        log.info("hastore sink: %d messages acknowledged", acked)

    def abort(self, messages) -> None:
        acked = sum(m.acked for m in messages if m is not None)
        log.warning("hastore sink: the write failed; %d messages already acknowledged stay stored", acked)


class HastoreStreamWriter(DataSourceStreamArrowWriter):
    """Streaming writes: each micro-batch's tasks send their rows (at least once)."""

    def __init__(self, settings: SinkSettings) -> None:
        self.settings = settings

    def write(self, iterator) -> SinkCommit:
        return write_batches(self.settings, iterator)

    def commit(self, messages, batchId) -> None:
        log.info("hastore sink: micro-batch %d: %d messages acknowledged", batchId,
                 sum(m.acked for m in messages if m is not None))

    def abort(self, messages, batchId) -> None:
        log.warning("hastore sink: micro-batch %d failed; %d messages already acknowledged stay stored", batchId,
                    sum(m.acked for m in messages if m is not None))
