"""``spark.readStream.format("hastore")``: the messages of a live group as a stream, on
PySpark's Python streaming data source API (DataSourceStreamReader), modelled on Kafka's.

    spark.readStream.format("hastore").option("zk", "127.0.0.1:2181").option("group", "g1") \\
        .option("topics", "orders,payments").option("startingOffsets", "earliest").load()

Options (besides bootstrap | zk, cluster, group, secret, requestTimeoutMs and
failoverTimeoutMs, see pipeline.cluster_access):

====================  =========================================================================
topics                comma-separated topics to read (required)
startingOffsets       earliest (default) | latest | JSON ``{"topic": {"0": 12, "1": -2}}`` per
                      queue (-2: earliest, -1: latest; a queue not named starts at earliest);
                      only for a new query: a restarted one resumes from its checkpoint
maxOffsetsPerTrigger  at most this many messages per micro-batch, shared over the queues in
                      proportion to what each has waiting
failOnDataLoss        true (default): a micro-batch whose offsets retention removed (or that a
                      queue no longer holds) fails the query | false: skip them
readFrom              master (default) | any: with ``any`` a read that cannot reach the master
                      goes to another node of ``bootstrap`` (a slave serves only what it may)
====================  =========================================================================

Offsets are per queue, ``{"topic": {"queue id": next queue offset}}``, so a micro-batch is the
same messages whenever it is read again: after a restart from a Spark checkpoint it is
replayed exactly. The driver plans each micro-batch only up to what can be read now: under a
controller, masters serve only below the confirm offset (what every in-sync replica holds),
so the end of each queue is probed and never promises a message a failover could take back.
Executors read each queue's range with pulls from the master; on a lost connection, a
NOT_MASTER or SERVICE_NOT_AVAILABLE reply they find the master again (ZooKeeper's record, or
by asking the nodes) and go on from the same offset, bounded by failoverTimeoutMs.

Columns: group, topic, queue_id, queue_offset, physical_offset, message_id, keys, tags,
uniq_key, properties, body, born_timestamp, store_timestamp, born_host, store_host, flag.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, SupportsTriggerAvailableNow

from .cluster_access import ClusterTarget, boolean, positive_int, target_from_options
from .errors import OptionError, StreamSourceError
from .stream_reads import (EARLIEST, LATEST, QueueRange, arrow_schema, open_reader_admin, probe_readable_end,
                           read_queue_range, share_limit)

log = logging.getLogger(__name__)

STREAM_DDL = ("`group` STRING, topic STRING, queue_id INT, queue_offset BIGINT, physical_offset BIGINT, "
              "message_id STRING, keys ARRAY<STRING>, tags STRING, uniq_key STRING, "
              "properties MAP<STRING, STRING>, body BINARY, born_timestamp TIMESTAMP, store_timestamp TIMESTAMP, "
              "born_host STRING, store_host STRING, flag INT")


@dataclass(frozen=True, slots=True)
class StreamSettings:
    """The stream source's options, parsed and checked."""

    target: ClusterTarget
    topics: tuple[str, ...]
    starting: str | dict[str, dict[int, int]]
    max_per_trigger: int | None
    fail_on_data_loss: bool
    read_from: str


def parse_starting_offsets(text: str) -> str | dict[str, dict[int, int]]:
    """``earliest``, ``latest`` or a JSON object ``{topic: {queue id: offset}}`` (-2 earliest, -1 latest)."""
    text = (text or "earliest").strip()
    if text.lower() in ("earliest", "latest"):
        return text.lower()
    try:
        raw = json.loads(text)
    except ValueError:
        raw = None
    if not isinstance(raw, dict) or not all(isinstance(v, dict) for v in raw.values()):
        raise OptionError('option startingOffsets must be earliest, latest or JSON like {"orders": {"0": 12, "1": -2}}, '
                          f'not {text!r}')
    parsed: dict[str, dict[int, int]] = {}
    for topic, queues in raw.items():
        parsed[topic] = {}
        for queue, offset in queues.items():
            if not str(queue).isdigit() or isinstance(offset, bool) or not isinstance(offset, int) or offset < -2:
                raise OptionError(f"option startingOffsets: {topic}/{queue} must map a queue id to an offset "
                                  f"(>= 0, -2 earliest, -1 latest), not {offset!r}")
            parsed[topic][int(queue)] = offset
    return parsed


def stream_settings(options) -> StreamSettings:
    """StreamSettings from the source's options."""
    topics = tuple(t.strip() for t in str(options.get("topics") or "").split(",") if t.strip())
    if not topics:
        raise OptionError('hastore needs option topics (comma-separated), e.g. .option("topics", "orders")')
    read_from = str(options.get("readFrom") or "master").lower()
    if read_from not in ("master", "any"):
        raise OptionError(f"option readFrom must be master or any, not {options.get('readFrom')!r}")
    return StreamSettings(target_from_options(options), topics,
                          parse_starting_offsets(str(options.get("startingOffsets") or "earliest")),
                          positive_int(options, "maxOffsetsPerTrigger", None),
                          boolean(options, "failOnDataLoss", True), read_from)


def offsets_to_json(offsets: dict[str, dict[int, int]]) -> dict:
    """The checkpointed form: queue ids as strings, sorted (Spark stores it as JSON)."""
    return {topic: {str(q): offsets[topic][q] for q in sorted(offsets[topic])} for topic in sorted(offsets)}


def offsets_from_json(value: dict) -> dict[str, dict[int, int]]:
    """The inverse of offsets_to_json."""
    return {topic: {int(q): int(o) for q, o in queues.items()} for topic, queues in value.items()}


class HastoreStreamDataSource(DataSource):
    """The ``hastore`` source (readStream) and sink (write, writeStream); see the module docstrings."""

    @classmethod
    def name(cls) -> str:
        return "hastore"

    def schema(self) -> str:
        return STREAM_DDL

    def streamReader(self, schema) -> "HastoreStreamReader":
        return HastoreStreamReader(stream_settings(self.options))

    def writer(self, schema, overwrite: bool):
        from .sink import HastoreWriter, sink_settings
        return HastoreWriter(sink_settings(self.options, schema))

    def streamWriter(self, schema, overwrite: bool):
        from .sink import HastoreStreamWriter, sink_settings
        return HastoreStreamWriter(sink_settings(self.options, schema))


class HastoreStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches on the driver (one long-lived admin connection to the master) and
    reads their queue ranges on the executors."""

    def __init__(self, settings: StreamSettings) -> None:
        self.settings = settings
        self._admin = None
        self._available_now: dict[str, dict[int, int]] | None = None

    # --- the driver's connection ---------------------------------------------------------
    def _ask(self, what: str, call):
        """``call(admin)`` on the master, finding it again across a failover."""
        from node.errors import AuthError, NodeError

        from .cluster_access import MasterUnavailableError, retrying

        def attempt():
            if self._admin is None:
                self._admin = open_reader_admin(self.settings.target, "master")
            return call(self._admin)

        def drop(error: BaseException) -> None:
            if isinstance(error, AuthError):
                raise error
            log.info("hastore source: %s failed (%s); finding the master again", what, error)
            self._close_admin()
        return retrying(self.settings.target, attempt, (NodeError, OSError, MasterUnavailableError), what,
                        on_retry=drop)

    def _close_admin(self) -> None:
        admin, self._admin = self._admin, None
        if admin is not None:
            try:
                admin.close()
            except Exception as error:   # closing a dead connection: nothing left to do
                log.debug("closing the admin connection: %s", error)

    def _queue_ids(self, admin) -> dict[str, list[int]]:
        listed = admin.list_topics()
        return {topic: list(range(int(listed[topic]["queue_count"]))) if topic in listed else []
                for topic in self.settings.topics}

    # --- the streaming API ---------------------------------------------------------------
    def initialOffset(self) -> dict:
        starting = self.settings.starting

        def plan(admin):
            offsets: dict[str, dict[int, int]] = {}
            for topic, queues in self._queue_ids(admin).items():
                wanted = starting.get(topic, {}) if isinstance(starting, dict) else {}
                offsets[topic] = {}
                for queue_id in queues:
                    low, high = admin.queue_offsets(topic, queue_id)
                    choice = wanted.get(queue_id, LATEST if starting == "latest" else EARLIEST)
                    if choice == EARLIEST:
                        offsets[topic][queue_id] = low
                    elif choice == LATEST:
                        offsets[topic][queue_id] = probe_readable_end(admin, topic, queue_id, low, high)
                    else:
                        offsets[topic][queue_id] = choice
            return offsets
        return offsets_to_json(self._ask("planning the initial offsets", plan))

    def getDefaultReadLimit(self):
        if self.settings.max_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.settings.max_per_trigger)

    def latestOffset(self, start: dict, limit) -> dict:
        begin = offsets_from_json(start or {})
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None

        def plan(admin):
            starts: dict[tuple[str, int], int] = {}
            highs: dict[tuple[str, int], int] = {}
            for topic, queues in self._queue_ids(admin).items():
                for queue_id in queues:
                    low, high = admin.queue_offsets(topic, queue_id)
                    first = begin.get(topic, {}).get(queue_id, low)    # a new queue starts at earliest
                    if high < first:
                        self._lost(f"queue {topic}/{queue_id} now ends at offset {high}, before offset {first} "
                                   f"the query already read to (a master elected outside the sync-state set?)")
                    starts[(topic, queue_id)] = first
                    highs[(topic, queue_id)] = max(first, high)
            if self._available_now is not None:     # Trigger.AvailableNow: never past its target
                highs = {key: max(starts[key], min(high, self._available_now.get(key[0], {}).get(key[1], high)))
                         for key, high in highs.items()}
            ends = share_limit(starts, highs, max_rows)
            result: dict[str, dict[int, int]] = {topic: dict(begin.get(topic, {})) for topic in self.settings.topics}
            for (topic, queue_id), end in ends.items():
                first = starts[(topic, queue_id)]
                result[topic][queue_id] = probe_readable_end(admin, topic, queue_id, first, end)
            return result
        return offsets_to_json(self._ask("planning a micro-batch", plan))

    def prepareForTriggerAvailableNow(self) -> None:
        """Trigger.AvailableNow: what each queue holds now is the target; later messages wait."""
        def plan(admin):
            target: dict[str, dict[int, int]] = {}
            for topic, queues in self._queue_ids(admin).items():
                target[topic] = {}
                for queue_id in queues:
                    low, high = admin.queue_offsets(topic, queue_id)
                    target[topic][queue_id] = probe_readable_end(admin, topic, queue_id, low, high)
            return target
        self._available_now = self._ask("planning Trigger.AvailableNow", plan)

    def _lost(self, problem: str) -> None:
        if self.settings.fail_on_data_loss:
            raise StreamSourceError(f"hastore source: {problem}; set failOnDataLoss=false to go on without it")
        log.warning("hastore source: %s (failOnDataLoss=false: going on)", problem)

    def partitions(self, start: dict, end: dict):
        begin, finish = offsets_from_json(start or {}), offsets_from_json(end or {})
        ranges = []
        for topic in sorted(finish):
            for queue_id in sorted(finish[topic]):
                stop = finish[topic][queue_id]
                first = begin.get(topic, {}).get(queue_id)
                if first is None:    # a queue that appeared in this micro-batch: from its start
                    first = 0
                if first < stop:
                    ranges.append(InputPartition(QueueRange(topic, queue_id, first, stop)))
        return ranges

    def read(self, partition):
        piece: QueueRange = partition.value
        yield from read_queue_range(self.settings.target, piece, fail_on_data_loss=self.settings.fail_on_data_loss,
                                    read_from=self.settings.read_from)

    def commit(self, end: dict) -> None:
        """Nothing to release: the offsets live in Spark's checkpoint, not in the cluster."""

    def stop(self) -> None:
        self._close_admin()


__all__ = ["HastoreStreamDataSource", "HastoreStreamReader", "StreamSettings", "stream_settings",
           "parse_starting_offsets", "offsets_to_json", "offsets_from_json", "arrow_schema"]
