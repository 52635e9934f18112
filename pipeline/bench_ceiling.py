"""The ceiling of a Python data source, for ``hastore bench pipeline``: ``hastore_ready_rows``
hands Spark the rows of the bench's query (a ``topic`` column, the bench's topics in turn)
from Arrow batches it built once, reading nothing and computing nothing. Given ``batchFile``
(an Arrow IPC file) and ``schema`` (its columns as Spark DDL) it hands that file's batch over
and over instead: the bench gives it real rows of every ``commitlog`` column but the body, the
ceiling of a read that builds them all.

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
    (default: the planning machine's CPU count, as ``commitlog``'s); or, instead of ``topics``,
    ``batchFile`` and ``schema``: the rows are that file's first batch, over and over."""

    @classmethod
    def name(cls) -> str:
        return "hastore_ready_rows"

    def schema(self) -> str:
        return self.options.get("schema") or "topic STRING"

    def reader(self, schema) -> "ReadyRowsReader":
        rows = int(self.options["rows"])
        partitions = int(self.options.get("partitions") or os.cpu_count() or 1)
        batch_file = self.options.get("batchFile")
        topics = () if batch_file else tuple(str(self.options["topics"]).split(","))
        return ReadyRowsReader(rows, partitions, topics, batch_file)


class ReadyRowsReader(DataSourceReader):
    def __init__(self, rows: int, partitions: int, topics: tuple[str, ...], batch_file: str | None = None) -> None:
        self.rows, self.count, self.topics, self.batch_file = rows, max(1, partitions), topics, batch_file

    def partitions(self):
        share, extra = divmod(self.rows, self.count)
        return [InputPartition(share + (index < extra)) for index in range(self.count)]

    def _batch(self):
        import pyarrow as pa
        if self.batch_file:
            import pyarrow.ipc
            return pyarrow.ipc.open_file(self.batch_file).get_batch(0)
        cycle = list(self.topics) * (BATCH_ROWS // len(self.topics) + 1)
        return pa.RecordBatch.from_arrays([pa.array(cycle[:BATCH_ROWS], pa.string())], ["topic"])

    def read(self, partition):
        rows = partition.value
        batch = self._batch()
        for _ in range(rows // batch.num_rows):
            yield batch
        if rows % batch.num_rows:
            yield batch.slice(0, rows % batch.num_rows)


def write_batch_file(table, path: str) -> None:
    """``table``'s first BATCH_ROWS rows as one batch in an Arrow IPC file (for ``batchFile``)."""
    import pyarrow.ipc
    batch = table.slice(0, BATCH_ROWS).combine_chunks().to_batches()[0]
    with pyarrow.ipc.new_file(path, batch.schema) as writer:
        writer.write_batch(batch)
