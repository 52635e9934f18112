"""The Spark session the jobs and tests use: the venv's Python on the workers, loopback only,
no web UI, Python filter pushdown on, and the pipeline's data sources (commitlog, hastore) registered.

    spark = pipeline.session.start_session("local[*]")      # or "spark://127.0.0.1:7077"
"""

from __future__ import annotations

import os
import sys

DEFAULT_MASTER = "local[*]"
# Small jobs: a few shuffle partitions instead of Spark's 200 keep local runs quick.
SHUFFLE_PARTITIONS = 8


def prepare_environment() -> None:
    """Environment Spark reads at start: the workers run this interpreter, Spark binds loopback."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def start_session(master: str = DEFAULT_MASTER, app_name: str = "hastore-pipeline", *,
                  extra_conf: dict[str, str] | None = None):
    """A SparkSession on ``master`` with the ``commitlog`` source registered
    (an existing session of this process is reused, with the sources registered again)."""
    prepare_environment()
    from pyspark.sql import SparkSession
    builder = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.sql.shuffle.partitions", str(SHUFFLE_PARTITIONS))
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.python.filterPushdown.enabled", "true")
               .config("spark.python.worker.reuse", "true"))
    for key, value in (extra_conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register_sources(spark)
    return spark


def register_sources(spark) -> None:
    """Register the pipeline's data sources with ``spark``: ``commitlog`` (batch reads of store
    directories) and ``hastore`` (a live group: streaming reads, batch and streaming writes)."""
    from .commitlog_source import CommitLogDataSource
    from .stream_source import HastoreStreamDataSource
    spark.dataSource.register(CommitLogDataSource)
    spark.dataSource.register(HastoreStreamDataSource)
