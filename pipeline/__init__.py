"""The data pipeline on Spark (PySpark 4): the ``commitlog`` batch data source over store
directories, the ``hastore`` streaming source and sink over a live cluster, and the jobs of
``hastore pipeline`` (export, stats, audit, check, lag).

Runtime packages never import this one. It imports the pure codec (``store.codec``) and the
client library (``node.client``), never the storage engine. Modules: stores (directories,
segments), segments (partitions, pruning), arrow_decode (bytes to Arrow), slice_reader (one
partition), commitlog_source (the data source), session (the Spark session), jobs, cli, bench.
"""
