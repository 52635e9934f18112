"""``spark.read.format("commitlog")``: CommitLog segments of store directories as a DataFrame,
on PySpark's Python Data Source API.

    spark.dataSource.register(CommitLogDataSource)       # pipeline.session does it
    df = spark.read.format("commitlog").load("/data/g1-n1,/data/g1-n2")
    df = spark.read.format("commitlog").option("paths", "/data/g1-n1").option("includeBody", "false").load()

Options (all optional but the paths):

=====================  =========================================================================
paths / load(...)      store or node directories, comma-separated (see pipeline.stores)
includeBody            true (default) | false: leave the ``body`` column out
verifyCrc              true (default) | false: skip CRC checks (``crc_ok`` then only says the
                       record's lengths hold); faster, for trusted copies
mode                   PERMISSIVE (default): corrupt records and tails become rows with
                       ``crc_ok = false`` | FAILFAST: the first one fails the job
maxBytesPerPartition   a segment larger than this is cut into slices of this size (128 MiB); each
                       slice's reader finds its first record itself
numPartitions          slices are packed, in log order, into this many partitions of about
                       equal bytes of data (the newest segment's unwritten tail weighs
                       nothing) (default: the planning machine's CPU count, the cores
                       of ``local[*]``); each is a task, a fixed cost
topics                 comma-separated topics to keep
startOffset/endOffset  physical offsets, ``[start, end)``
startTime/endTime      store time, inclusive: epoch milliseconds or ISO-8601 (UTC unless an
                       offset is given)
=====================  =========================================================================

Filters in the query (``topic = / IN``, comparisons on ``physical_offset`` and
``store_timestamp``) reach the reader too through ``pushFilters`` when the session sets
``spark.sql.python.filterPushdown.enabled`` (pipeline.session does); either way, segments
wholly outside an offset or time range are never scanned. Spark still re-checks every
filter it pushed, so a query's answer never depends on the pruning.

A schema given with ``.schema("topic STRING, size INT")`` (a subset of the columns, any order)
makes the reader build only those columns.
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass, replace

from pyspark.sql.datasource import (DataSource, DataSourceReader, EqualTo, GreaterThan, GreaterThanOrEqual, In,
                                    InputPartition, LessThan, LessThanOrEqual)

from .arrow_decode import COLUMN_NAMES, spark_ddl
from .errors import OptionError
from .segments import (MAX_BYTES_PER_PARTITION_DEFAULT, MAX_BYTES_PER_PARTITION_MIN, Bounds, data_end_estimate,
                       pack_slices, plan_slices, slice_weight)
from .stores import resolve_stores, split_paths

MODES = ("PERMISSIVE", "FAILFAST")


@dataclass(frozen=True, slots=True)
class ReadSettings:
    """The options of one read, parsed and checked."""

    paths: tuple[str, ...]
    include_body: bool = True
    verify_crc: bool = True
    mode: str = "PERMISSIVE"
    max_bytes_per_partition: int = MAX_BYTES_PER_PARTITION_DEFAULT
    partitions: int | None = None
    bounds: Bounds = Bounds()


def _boolean(options, name: str, default: bool) -> bool:
    value = str(options.get(name, default)).strip().lower()
    if value not in ("true", "false"):
        raise OptionError(f"option {name} must be true or false, not {options.get(name)!r}")
    return value == "true"


def _integer(options, name: str) -> int | None:
    if options.get(name) in (None, ""):
        return None
    try:
        return int(options[name])
    except ValueError:
        raise OptionError(f"option {name} must be an integer, not {options[name]!r}") from None


def parse_time_ms(text: str, name: str = "time") -> int:
    """Epoch milliseconds from ``text``: an integer (ms) or ISO-8601 (UTC unless it says otherwise)."""
    text = str(text).strip()
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        raise OptionError(f"option {name} must be epoch milliseconds or ISO-8601, not {text!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.timezone.utc)
    return int(moment.timestamp() * 1000)


def read_settings(options) -> ReadSettings:
    """ReadSettings from data source options (``path`` from load(), or ``paths``)."""
    paths = split_paths(str(options.get("paths") or options.get("path") or ""))
    if not paths:
        raise OptionError('commitlog needs store directories: .load("DIR1,DIR2") or .option("paths", "DIR1,DIR2")')
    mode = str(options.get("mode", "PERMISSIVE")).upper()
    if mode not in MODES:
        raise OptionError(f"option mode must be one of {', '.join(MODES)}, not {options.get('mode')!r}")
    max_bytes = _integer(options, "maxBytesPerPartition") or MAX_BYTES_PER_PARTITION_DEFAULT
    if max_bytes < MAX_BYTES_PER_PARTITION_MIN:
        raise OptionError(f"option maxBytesPerPartition must be at least {MAX_BYTES_PER_PARTITION_MIN}")
    partitions = _integer(options, "numPartitions")
    if partitions is not None and partitions < 1:
        raise OptionError("option numPartitions must be at least 1")
    topics = options.get("topics")
    bounds = Bounds(
        offset_min=_integer(options, "startOffset"), offset_end=_integer(options, "endOffset"),
        time_min_ms=parse_time_ms(options["startTime"], "startTime") if options.get("startTime") else None,
        time_max_ms=parse_time_ms(options["endTime"], "endTime") if options.get("endTime") else None,
        topics=frozenset(split_paths(str(topics))) if topics else None)
    return ReadSettings(tuple(paths), _boolean(options, "includeBody", True), _boolean(options, "verifyCrc", True),
                        mode, max_bytes, partitions=partitions, bounds=bounds)


def narrow(bounds: Bounds, filter_) -> Bounds | None:
    """``bounds`` narrowed by one pushed filter, or None when the filter is not one the reader
    uses (topic equality or IN, comparisons on physical_offset and store_timestamp)."""
    column, value = getattr(filter_, "attribute", None), getattr(filter_, "value", None)
    if value is None:
        return None
    if column == ("topic",) and isinstance(filter_, (EqualTo, In)):
        values = (value,) if isinstance(filter_, EqualTo) else tuple(value)
        wanted = frozenset(str(value) for value in values if value is not None)
        return replace(bounds, topics=wanted if bounds.topics is None else bounds.topics & wanted)
    if column == ("physical_offset",) and isinstance(value, int) and not isinstance(value, bool):
        return _narrow_range(bounds, filter_, "offset_min", "offset_end", value, value + 1)
    if column == ("store_timestamp",) and isinstance(value, dt.datetime):
        # a naive datetime is local time (how PySpark hands timestamps over): .timestamp() reads it so
        microseconds = round(value.timestamp() * 1_000_000)
        floor_ms, ceil_ms = microseconds // 1000, -(-microseconds // 1000)
        if isinstance(filter_, EqualTo):
            return replace(bounds, time_min_ms=_max(bounds.time_min_ms, floor_ms),
                           time_max_ms=_min(bounds.time_max_ms, ceil_ms))
        if isinstance(filter_, (GreaterThan, GreaterThanOrEqual)):
            return replace(bounds, time_min_ms=_max(bounds.time_min_ms, floor_ms))
        if isinstance(filter_, (LessThan, LessThanOrEqual)):
            return replace(bounds, time_max_ms=_min(bounds.time_max_ms, ceil_ms))
    return None


def _narrow_range(bounds: Bounds, filter_, low: str, high: str, value: int, after: int) -> Bounds | None:
    if isinstance(filter_, EqualTo):
        return replace(bounds, **{low: _max(getattr(bounds, low), value), high: _min(getattr(bounds, high), after)})
    if isinstance(filter_, GreaterThan):
        return replace(bounds, **{low: _max(getattr(bounds, low), after)})
    if isinstance(filter_, GreaterThanOrEqual):
        return replace(bounds, **{low: _max(getattr(bounds, low), value)})
    if isinstance(filter_, LessThan):
        return replace(bounds, **{high: _min(getattr(bounds, high), value)})
    if isinstance(filter_, LessThanOrEqual):
        return replace(bounds, **{high: _min(getattr(bounds, high), after)})
    return None


def _max(current: int | None, value: int) -> int:
    return value if current is None else max(current, value)


def _min(current: int | None, value: int) -> int:
    return value if current is None else min(current, value)


class CommitLogDataSource(DataSource):
    """The ``commitlog`` batch data source (see the module docstring for options)."""

    @classmethod
    def name(cls) -> str:
        return "commitlog"

    def schema(self) -> str:
        settings = read_settings(self.options)
        return spark_ddl(tuple(c for c in COLUMN_NAMES if settings.include_body or c != "body"))

    def reader(self, schema) -> "CommitLogReader":
        columns = tuple(field.name for field in schema.fields)
        unknown = [name for name in columns if name not in COLUMN_NAMES]
        if unknown:
            raise OptionError(f"commitlog has no column {', '.join(unknown)}; its columns: {', '.join(COLUMN_NAMES)}")
        return CommitLogReader(read_settings(self.options), columns)


class CommitLogReader(DataSourceReader):
    """Plans slices on the driver and decodes them on the executors."""

    def __init__(self, settings: ReadSettings, columns: tuple[str, ...]) -> None:
        self.settings = settings
        self.columns = columns

    def pushFilters(self, filters):
        """Narrow the read by the filters it understands; every filter goes back to Spark, which
        checks it again (the reader's pruning is an optimisation, never the answer)."""
        bounds = self.settings.bounds
        for filter_ in filters:
            bounds = narrow(bounds, filter_) or bounds
            yield filter_
        self.settings = replace(self.settings, bounds=bounds)

    def partitions(self):
        stores = resolve_stores(self.settings.paths)
        slices = plan_slices(stores, self.settings.bounds, self.settings.max_bytes_per_partition)
        newest = {}         # the newest segment of each store: its unwritten tail is no work
        for piece in slices:
            newest[piece.store] = piece.segment.path
        data_ends = {path: data_end_estimate(path) for path in set(newest.values())}
        groups = pack_slices(slices, self.settings.partitions or os.cpu_count() or 1,
                             lambda piece: slice_weight(piece, data_ends))
        return [InputPartition(group) for group in groups] or [InputPartition(())]

    def read(self, partition):
        from .slice_reader import read_slice
        for piece in partition.value:
            yield from read_slice(piece, self.settings, self.columns)
