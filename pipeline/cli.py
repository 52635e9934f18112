"""``hastore pipeline``: Spark jobs over store directories and test histories.

    hastore pipeline export DIR... --out PATH        CommitLog -> Parquet (topic/date partitions)
    hastore pipeline stats DIR...                    traffic per topic, queue and minute; top keys
    hastore pipeline audit DIR DIR...                replica divergence in a group (exit 1 on any)
    hastore pipeline check DIR... --history FILE     a chaos history against the stored messages
    hastore pipeline lag FILE... --out DIR           lag samples -> p50/p99 per slave, CSV + PNG

Every job runs on ``--master`` (default ``local[*]``; ``spark://HOST:PORT`` for a standalone
cluster) and prints JSON with ``--json``. Bad input (a missing directory, a directory that is
not a store, a malformed history) exits 2 with the reason, before Spark starts where it can.
"""

from __future__ import annotations

import functools
import json
import sys

import click

from .errors import PipelineError
from .session import DEFAULT_MASTER

EXIT_DIVERGENCE = 1
EXIT_BAD_INPUT = 2


def _job(function):
    """Common options (--master, --json) and error handling for a job command."""
    @click.option("--master", default=DEFAULT_MASTER, show_default=True,
                  help="Spark master: local[*], local[N] or spark://HOST:PORT.")
    @click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object.")
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        from node.client.progress import progress_bar   # a spinner on a terminal, nothing when piped
        try:
            with progress_bar(f"pipeline {function.__name__.removesuffix('_command')} (Spark)"):
                return function(*args, **kwargs)
        except PipelineError as error:
            click.echo(f"Error: {error}", err=True)
            sys.exit(EXIT_BAD_INPUT)
    return wrapper


def _stores(paths):
    from .stores import resolve_stores
    return resolve_stores(list(paths))


def _spark(master: str):
    from .session import start_session
    return start_session(master)


def _emit(result: dict, as_json: bool, lines) -> None:
    if as_json:
        click.echo(json.dumps(result, default=str))
    else:
        for line in lines(result):
            click.echo(line)


@click.group("pipeline")
def pipeline_group() -> None:
    """Spark jobs over store directories: export, stats, audit, check, lag.

    DIR is a node directory of `hastore cluster up` (it holds node.yaml and store/) or a
    store directory (it holds commitlog/). Node and group come from node.yaml when there is
    one, else from the directory's name."""


@pipeline_group.command("export")
@click.argument("dirs", nargs=-1, required=True, metavar="DIR...")
@click.option("--out", required=True, help="Parquet output directory (partitioned by topic and date).")
@click.option("--overwrite", is_flag=True, help="Replace --out if it exists (default: refuse).")
@click.option("--no-body", is_flag=True, help="Leave message bodies out of the export.")
@_job
def export_command(dirs, out, overwrite, no_body, master, as_json) -> None:
    """Export CommitLog records to Parquet, partitioned by topic and store date (UTC).

    Example: hastore pipeline export /tmp/c/g1-n1 --out /tmp/export"""
    from .jobs import export
    stores = _stores(dirs)
    result = export(_spark(master), stores, out, overwrite=overwrite, include_body=not no_body)
    _emit(result, as_json, lambda r: [f"{r['rows']} rows written to {r['out']}"] +
          [f"  {topic}: {count}" for topic, count in sorted(r["rows_per_topic"].items())])


@pipeline_group.command("stats")
@click.argument("dirs", nargs=-1, required=True, metavar="DIR...")
@click.option("--top-keys", default=10, show_default=True, type=click.IntRange(1, 1000), help="How many keys to list.")
@_job
def stats_command(dirs, top_keys, master, as_json) -> None:
    """Messages and bytes per topic, queue and minute; the top keys; body size percentiles.
    Replicas of one group (same group in node.yaml) count once.

    Example: hastore pipeline stats /tmp/c/g1-n1 --json"""
    from .jobs import stats
    stores = _stores(dirs)
    result = stats(_spark(master), stores, top_keys=top_keys)

    def lines(r):
        yield f"{r['messages']} messages, {r['bytes']} bytes, {r['crc_failures']} CRC failures"
        yield f"body bytes p50 {r['body_bytes']['p50']} p90 {r['body_bytes']['p90']} p99 {r['body_bytes']['p99']} " \
              f"max {r['body_bytes']['max']}"
        for row in r["topics"]:
            yield f"  topic {row['topic']}: {row['messages']} messages, {row['bytes']} bytes"
        for row in r["queues"]:
            yield f"    {row['topic']}/{row['queue_id']}: {row['messages']}"
        yield "top keys: " + ", ".join(f"{row['key']} ({row['messages']})" for row in r["top_keys"])
    _emit(result, as_json, lines)


@pipeline_group.command("audit")
@click.argument("dirs", nargs=-1, required=True, metavar="DIR DIR...")
@_job
def audit_command(dirs, master, as_json) -> None:
    """Compare the CommitLogs of the nodes of one group record by record, up to their common
    end; exit 1 if any offset differs (fields, body, a failed CRC, a record on some nodes only).

    Example: hastore pipeline audit /tmp/c/g1-n1 /tmp/c/g1-n2 /tmp/c/g1-n3"""
    from .jobs import audit
    stores = _stores(dirs)
    result = audit(_spark(master), stores)

    def lines(r):
        yield f"group {r['group'] or '(none)'}: {', '.join(r['nodes'])}; common end {r['common_end']}, " \
              f"{r['records_compared']} records compared"
        yield "no divergence" if r["ok"] else f"DIVERGENCE at {r['divergent_offsets']} offsets"
        for item in r["divergent"]:
            yield f"  offset {item['physical_offset']}: {item['copies']} missing on {item['missing_on']}"
        for node, beyond in sorted(r["only_on_some_nodes_past_common_end"].items()):
            yield f"  {node}: {beyond['messages']} messages past the common end (from {beyond['first_offset']})"
    _emit(result, as_json, lines)
    if not result["ok"]:
        sys.exit(EXIT_DIVERGENCE)


@pipeline_group.command("check")
@click.argument("dirs", nargs=-1, required=True, metavar="DIR...")
@click.option("--history", "history_path", required=True, help="Chaos history (JSON lines).")
@click.option("--topic", default=None, help="The workload's topic (default: every non-system topic).")
@_job
def check_command(dirs, history_path, topic, master, as_json) -> None:
    """Check a chaos history against the stored messages: lost, duplicated and
    failed-but-present messages, as the chaos checker does; exit 1 if any.

    Example: hastore pipeline check /tmp/c/g1-n1 --history /tmp/c/chaos/history.jsonl --topic chaos"""
    from .history_jobs import check
    stores = _stores(dirs)
    result = check(_spark(master), stores, history_path, topic=topic)
    _emit(result, as_json, lambda r: [
        f"{'VALID' if r['valid'] else 'INVALID'}: {r['invoked']} invoked, {r['acked']} acked, {r['failed']} failed, "
        f"{r['unknown']} unknown, {r['pending']} pending",
        f"  lost {len(r['lost'])}, duplicated {len(r['duplicated'])}, failed but present {len(r['failed_present'])}, "
        f"unexpected {len(r['unexpected'])}; unknown present {r['unknown_present']}, absent {r['unknown_absent']}"])
    if not result["valid"]:
        sys.exit(EXIT_DIVERGENCE)


@pipeline_group.command("lag")
@click.argument("files", nargs=-1, required=True, metavar="FILE...")
@click.option("--out", "out_dir", required=True, help="Directory for lag.csv and lag.png.")
@click.option("--bucket-s", default=10.0, show_default=True, type=click.FloatRange(0.001, 86400),
              help="Width of a time bucket.")
@click.option("--interval-ms", default=1000, show_default=True, type=click.IntRange(1, 3_600_000),
              help="Spacing of samples that carry no time (hastore lag --json --watch lines).")
@_job
def lag_command(files, out_dir, bucket_s, interval_ms, master, as_json) -> None:
    """Replication lag samples (JSON lines: flat samples with time_s/slave/lag_bytes/lag_ms, or
    `hastore lag --json --watch` output) as p50/p99 per slave over time: a CSV and a PNG chart.

    Example: hastore pipeline lag lag.jsonl --out /tmp/lag"""
    from .history_jobs import lag
    result = lag(_spark(master), list(files), out_dir, bucket_s=bucket_s, interval_ms=interval_ms)
    _emit(result, as_json, lambda r: [f"wrote {r['csv']} and {r['png']} ({r['buckets']} buckets)"] +
          [f"  {slave}: bytes p50 {s['lag_bytes_p50']} p99 {s['lag_bytes_p99']}, ms p50 {s['lag_ms_p50']} "
           f"p99 {s['lag_ms_p99']}" for slave, s in sorted(r["slaves"].items())])
