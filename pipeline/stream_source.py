"""``spark.readStream.format("hastore")``: the messages of a live group as a stream, on
PySpark's Python streaming data source API (DataSourceStreamReader), modelled on Kafka's.

    spark.readStream.format("hastore").option("zk", "127.0.0.1:2181").option("group", "g1") \\
        .option("topics", "orders,payments").option("startingOffsets", "earliest").load()

Options (besides bootstrap | zk, cluster, group, secret, requestTimeoutMs and
failoverTimeoutMs, see pipeline.cluster_access):

====================  =========================================================================
topics                comma-separated topics to read (required)
startingOffsets       earliest (default) | latest | JSON ``{"topic": {"0": 12, "1": -2}}`` per
                      queue (-2: earliest, -1: latest; a queue not named starts at earliest;
                      ``"g2/1"`` names a queue of a routed topic);
                      only for a new query: a restarted one resumes from its checkpoint
maxOffsetsPerTrigger  at most this many messages per micro-batch, shared over the queues in
                      proportion to what each has waiting
maxPartitions         at most this many partitions (Spark tasks) per micro-batch; a task reads
                      its queue ranges one after another (default: one per queue with news)
rowsPerPartition      a micro-batch gets one partition per this many messages (default
                      20000), so a small one is a single task: each task is a fixed cost
failOnDataLoss        true (default): a micro-batch whose offsets retention removed (or that a
                      queue no longer holds) fails the query | false: skip them
readFrom              master (default) | any: with ``any`` a read that cannot reach the master
                      goes to another node of ``bootstrap`` (a slave serves only what it may)
====================  =========================================================================

With ``zk`` and no ``group`` every topic is read from all the groups its route in ZooKeeper
names (pipeline.cluster_access.topic_routes), each group's master found and followed on its
own; the ``group`` column says where a row came from.

Offsets are per queue, ``{"topic": {"queue id": next queue offset}}`` (``"group/queue id"``
for routed topics), so a micro-batch is the
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
from .stream_reads import (EARLIEST, LATEST, QueueRange, arrow_schema, open_reader_admin, pack_ranges,
                           probe_readable_end, read_queue_range, share_limit)

log = logging.getLogger(__name__)

ROWS_PER_PARTITION_DEFAULT = 20_000
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
    max_partitions: int | None = None
    rows_per_partition: int = ROWS_PER_PARTITION_DEFAULT


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
            group, _, queue_id = str(queue).rpartition("/")
            if not queue_id.isdigit() or isinstance(offset, bool) or not isinstance(offset, int) or offset < -2:
                raise OptionError(f"option startingOffsets: {topic}/{queue} must map a queue id (or group/queue "
                                  f"id, for routed topics) to an offset (>= 0, -2 earliest, -1 latest), not {offset!r}")
            parsed[topic][_key_of(queue)] = offset
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
                          boolean(options, "failOnDataLoss", True), read_from,
                          positive_int(options, "maxPartitions", None),
                          positive_int(options, "rowsPerPartition", ROWS_PER_PARTITION_DEFAULT))


def _key_text(key) -> str:
    """A queue's key in JSON: its id (one group), or ``group/id`` (routed topics)."""
    return f"{key[0]}/{key[1]}" if isinstance(key, tuple) else str(key)


def _key_of(text: str):
    group, _, queue = str(text).rpartition("/")
    return (group, int(queue)) if group else int(queue)


def offsets_to_json(offsets: dict) -> dict:
    """The checkpointed form: queue keys as strings (``"3"``, or ``"g2/3"`` for routed topics),
    sorted (Spark stores it as JSON)."""
    return {topic: {_key_text(q): offsets[topic][q] for q in sorted(offsets[topic])} for topic in sorted(offsets)}


def offsets_from_json(value: dict) -> dict:
    """The inverse of offsets_to_json."""
    return {topic: {_key_of(q): int(o) for q, o in queues.items()} for topic, queues in value.items()}


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
    """Plans micro-batches on the driver (one long-lived admin connection to each group's
    master) and reads their queue ranges on the executors.

    Offsets are keyed per queue: by queue id for one group, by ``"group/queue id"`` when the
    topics are routed across groups (``zk`` without ``group``)."""

    def __init__(self, settings: StreamSettings) -> None:
        self.settings = settings
        self._admins: dict = {}
        self._available_now: dict | None = None

    # --- the driver's connections --------------------------------------------------------
    def _target(self, group: str | None):
        return self.settings.target if group is None else self.settings.target.for_group(group)

    def _ask(self, what: str, call, group: str | None = None):
        """``call(admin)`` on the master of ``group`` (None: the one group), finding it again
        across a failover."""
        from node.errors import AuthError, NodeError

        from .cluster_access import MasterUnavailableError, retrying
        target = self._target(group)

        def attempt():
            if self._admins.get(group) is None:
                self._admins[group] = open_reader_admin(target, "master")
            return call(self._admins[group])

        def drop(error: BaseException) -> None:
            if isinstance(error, AuthError):
                raise error
            log.info("hastore source: %s failed (%s); finding the master of %s again", what, error, target.describe())
            self._close_admin(group)
        return retrying(target, attempt, (NodeError, OSError, MasterUnavailableError), what, on_retry=drop)

    def _close_admin(self, group: str | None) -> None:
        admin = self._admins.pop(group, None)
        if admin is not None:
            try:
                admin.close()
            except Exception as error:   # closing a dead connection: nothing left to do
                log.debug("closing the admin connection: %s", error)

    def _queues(self) -> dict:
        """``{group or None: [(topic, queue key, queue id), ...]}``: every queue to read."""
        target = self.settings.target
        if target.routed:
            from .cluster_access import MasterUnavailableError, retrying, topic_routes
            routes = retrying(target, lambda: topic_routes(target, self.settings.topics), MasterUnavailableError,
                              "reading the topics' routes")
            queues: dict = {}
            for topic in self.settings.topics:
                for group, ids in routes[topic].items():
                    queues.setdefault(group, []).extend((topic, (group, q), q) for q in ids)
            return queues

        def listed(admin):
            return admin.list_topics()
        topics = self._ask("listing topics", listed)
        return {None: [(topic, q, q) for topic in self.settings.topics if topic in topics
                       for q in range(int(topics[topic]["queue_count"]))]}

    def _each_queue(self, what: str, per_queue, queues: dict | None = None) -> dict:
        """``{(topic, key): per_queue(admin, topic, key, queue id)}`` over every queue, each
        group's queues asked of its master (a group failing over is retried as a whole)."""
        result = {}
        for group, items in (self._queues() if queues is None else queues).items():
            result.update(self._ask(what, lambda admin, items=items: {
                (topic, key): per_queue(admin, topic, key, queue_id) for topic, key, queue_id in items}, group))
        return result

    # --- the streaming API ---------------------------------------------------------------
    def initialOffset(self) -> dict:
        starting = self.settings.starting

        def first(admin, topic, key, queue_id):
            low, high = admin.queue_offsets(topic, queue_id)
            wanted = starting.get(topic, {}) if isinstance(starting, dict) else {}
            choice = wanted.get(key, LATEST if starting == "latest" else EARLIEST)
            if choice == EARLIEST:
                return low
            if choice == LATEST:
                return probe_readable_end(admin, topic, queue_id, low, high)
            return choice
        offsets: dict = {topic: {} for topic in self.settings.topics}
        for (topic, key), offset in self._each_queue("planning the initial offsets", first).items():
            offsets[topic][key] = offset
        return offsets_to_json(offsets)

    def getDefaultReadLimit(self):
        if self.settings.max_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.settings.max_per_trigger)

    def latestOffset(self, start: dict, limit) -> dict:
        begin = offsets_from_json(start or {})
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        queues = self._queues()
        bounds = self._each_queue("planning a micro-batch",
                                  lambda admin, topic, key, queue_id: admin.queue_offsets(topic, queue_id), queues)
        starts: dict = {}
        highs: dict = {}
        for (topic, key), (low, high) in bounds.items():
            first = begin.get(topic, {}).get(key, low)    # a new queue starts at earliest
            if high < first:
                self._lost(f"queue {topic}/{_key_text(key)} now ends at offset {high}, before offset {first} "
                           f"the query already read to (a master elected outside the sync-state set?)")
            starts[(topic, key)] = first
            highs[(topic, key)] = max(first, high)
        if self._available_now is not None:     # Trigger.AvailableNow: never past its target
            highs = {k: max(starts[k], min(high, self._available_now.get(k[0], {}).get(k[1], high)))
                     for k, high in highs.items()}
        ends = share_limit(starts, highs, max_rows)
        readable = self._each_queue("planning a micro-batch", lambda admin, topic, key, queue_id: probe_readable_end(
            admin, topic, queue_id, starts[(topic, key)], ends[(topic, key)]), queues)
        result: dict = {topic: dict(begin.get(topic, {})) for topic in self.settings.topics}
        for (topic, key), end in readable.items():
            result[topic][key] = end
        return offsets_to_json(result)

    def prepareForTriggerAvailableNow(self) -> None:
        """Trigger.AvailableNow: what each queue holds now is the target; later messages wait."""
        def end(admin, topic, key, queue_id):
            low, high = admin.queue_offsets(topic, queue_id)
            return probe_readable_end(admin, topic, queue_id, low, high)
        target: dict = {topic: {} for topic in self.settings.topics}
        for (topic, key), offset in self._each_queue("planning Trigger.AvailableNow", end).items():
            target[topic][key] = offset
        self._available_now = target

    def _lost(self, problem: str) -> None:
        if self.settings.fail_on_data_loss:
            raise StreamSourceError(f"hastore source: {problem}; set failOnDataLoss=false to go on without it")
        log.warning("hastore source: %s (failOnDataLoss=false: going on)", problem)

    def partitions(self, start: dict, end: dict):
        begin, finish = offsets_from_json(start or {}), offsets_from_json(end or {})
        ranges = []
        for topic in sorted(finish):
            for key in sorted(finish[topic]):
                stop = finish[topic][key]
                first = begin.get(topic, {}).get(key)
                if first is None:    # a queue that appeared in this micro-batch: from its start
                    first = 0
                if first < stop:
                    group, queue_id = key if isinstance(key, tuple) else (None, key)
                    ranges.append(QueueRange(topic, queue_id, first, stop, group))
        packed = pack_ranges(ranges, self.settings.max_partitions, self.settings.rows_per_partition)
        return [InputPartition(pieces) for pieces in packed]

    def read(self, partition):
        for piece in partition.value:
            yield from read_queue_range(self._target(piece.group), piece,
                                        fail_on_data_loss=self.settings.fail_on_data_loss,
                                        read_from=self.settings.read_from)

    def commit(self, end: dict) -> None:
        """Nothing to release: the offsets live in Spark's checkpoint, not in the cluster."""

    def stop(self) -> None:
        for group in list(self._admins):
            self._close_admin(group)


__all__ = ["HastoreStreamDataSource", "HastoreStreamReader", "StreamSettings", "stream_settings",
           "parse_starting_offsets", "offsets_to_json", "offsets_from_json", "arrow_schema"]
