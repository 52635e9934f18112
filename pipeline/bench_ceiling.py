"""The ceiling of a Python data source, for ``hastore bench pipeline``: ``hastore_ready_rows``
hands Spark the rows of the bench's query (a ``topic`` column, the bench's topics in turn)
from Arrow batches it built once, reading nothing and computing nothing.

Counting its rows by topic costs what PySpark's Python Data Source API itself costs: the
planning worker's round trip, a Python worker per task, each batch sent from Python and
turned into rows by the JVM. No Python source, ``commitlog`` included, can be faster, so
its ratio to Parquet bounds theirs on the same machine in the same run.
"""

from __future__ import annotations

import os

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

BATCH_ROWS = 16_384     # rows per Arrow batch, about what the commitlog reader yields


class ReadyRowsSource(DataSource):
    """Options: ``rows`` (total), ``topics`` (comma-separated, taken in turn), ``partitions``
    (default: the planning machine's CPU count, as ``commitlog``'s)."""

    @classmethod
    def name(cls) -> str:
        return "hastore_ready_rows"

    def schema(self) -> str:
        return "topic STRING"

    def reader(self, schema) -> "ReadyRowsReader":
        rows = int(self.options["rows"])
        partitions = int(self.options.get("partitions") or os.cpu_count() or 1)
        topics = tuple(str(self.options["topics"]).split(","))
        return ReadyRowsReader(rows, partitions, topics)


class ReadyRowsReader(DataSourceReader):
    def __init__(self, rows: int, partitions: int, topics: tuple[str, ...]) -> None:
        self.rows, self.count, self.topics = rows, max(1, partitions), topics

    def partitions(self):
        share, extra = divmod(self.rows, self.count)
        return [InputPartition(share + (index < extra)) for index in range(self.count)]

    def read(self, partition):
        import pyarrow as pa
        rows = partition.value
        cycle = list(self.topics) * (BATCH_ROWS // len(self.topics) + 1)
        batch = pa.RecordBatch.from_arrays([pa.array(cycle[:BATCH_ROWS], pa.string())], ["topic"])
        for _ in range(rows // BATCH_ROWS):
            yield batch
        if rows % BATCH_ROWS:
            yield batch.slice(0, rows % BATCH_ROWS)
