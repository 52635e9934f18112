"""``hastore drill failover``: kill -9 the master of a local cluster N times and report.

    hastore drill failover --dir DIR [--rounds N] [--json] [--send-interval-ms 5] [--up]
"""

from __future__ import annotations

import json

import click

from node.client.progress import progress_bar

from .command_cluster import command_cluster
from .drill import DrillReport, DrillSettings, RoundRecord, run_failover_drill
from .workload import WorkloadSettings

ROUND_HEADER = ("round", "killed", "new master", "epoch", "detect ms", "failover ms", "acked", "fail", "info",
                "lost", "dup", "rejoin ms", "ok")


@click.group("drill")
def drill_group() -> None:
    """Failure drills against a local cluster (`hastore cluster up`)."""


@drill_group.command("failover")
@click.option("--dir", "directory", required=True, envvar="HASTORE_CLUSTER_DIR", type=click.Path(file_okay=False),
              help="The cluster's directory (env HASTORE_CLUSTER_DIR).")
@click.option("--rounds", default=1, show_default=True, type=click.IntRange(1, 1000), help="Masters to kill.")
@click.option("--group", default="g1", show_default=True, help="The group whose master is killed.")
@click.option("--send-interval-ms", default=5.0, show_default=True, type=click.FloatRange(0, 10_000),
              help="Pause of the producer after each send's outcome.")
@click.option("--up", "start_cluster", is_flag=True,
              help="Start a cluster in DIR (default topology, or the one DIR last ran) if none runs, and stop it "
                   "after the drill.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (rounds, summary, verdict).")
def failover_command(directory, rounds, group, send_interval_ms, start_cluster, as_json) -> None:
    """Kill -9 the master while a producer sends under sync replication, N rounds.

    Per round: time until the controller names a new master (detect), time until the first
    acked write on it (failover), the acked/failed/unknown sends, acked messages lost (read
    back from the new master), and whether the old master, started again, rejoined as a
    slave and caught up (rejoin). Exit status 1 if any acked message is lost or a round
    does not recover. The failover target is the ZooKeeper session timeout + 1 s at p99.
    """
    with command_cluster(directory, start_cluster) as cluster:
        settings = DrillSettings(group=group, workload=WorkloadSettings(send_interval_ms=send_interval_ms))
        if not as_json:
            click.echo(f"failover drill on group {group} in {cluster.directory}: {rounds} round(s), ZooKeeper "
                       f"session timeout {cluster.topology.controller.session_timeout_ms} ms")
            click.echo(format_row(ROUND_HEADER))
        with progress_bar("failover drill rounds", total=rounds) as bar:   # stderr, on a terminal only
            def on_round(record: RoundRecord) -> None:
                if not as_json:
                    click.echo(format_row(round_row(record)))
                bar.advance()
            report = run_failover_drill(cluster, rounds, settings, on_round=on_round)
    if as_json:
        click.echo(json.dumps(report.to_json()))
    else:
        for line in summary_lines(report):
            click.echo(line)
    if not report.ok or len(report.rounds) < rounds:
        raise SystemExit(1)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def round_row(record: RoundRecord) -> tuple:
    return (record.round, record.killed, record.new_master or "-", record.new_epoch or "-",
            _ms(record.detection_ms), _ms(record.failover_ms), record.acked, record.failed, record.unknown,
            record.lost, record.duplicates, _ms(record.rejoin_ms), "yes" if record.ok else "NO")


def format_row(row: tuple) -> str:
    widths = (5, 8, 10, 5, 9, 11, 6, 5, 5, 5, 4, 9, 3)
    return "  ".join(str(cell).rjust(width) for cell, width in zip(row, widths))


def summary_lines(report: DrillReport) -> list[str]:
    """The drill's summary (and each failed round's reason) as text."""
    summary = report.summary()
    lines = [f"round {record.round}: {record.error}" for record in report.rounds if record.error]
    lines.append(f"failover (kill -9 -> first acked write on the new master): p50 {_ms(summary['failover_ms_p50'])} "
                 f"ms, p99 {_ms(summary['failover_ms_p99'])} ms, max {_ms(summary['failover_ms_max'])} ms; target "
                 f"<= {summary['target_ms']} ms (session timeout {summary['session_timeout_ms']} ms + 1 s): "
                 f"{'met' if summary['target_met'] else 'NOT met'}")
    lines.append(f"detection (kill -> new master in ZooKeeper): p50 {_ms(summary['detection_ms_p50'])} ms, "
                 f"p99 {_ms(summary['detection_ms_p99'])} ms")
    lines.append(f"acked {summary['acked']}, lost {summary['lost']}, duplicates {summary['duplicates']}; rounds "
                 f"recovered {summary['rounds_recovered']}/{summary['rounds']}: "
                 f"{'OK' if report.ok else 'FAILED'}")
    return lines


@click.group("chaos")
def chaos_group() -> None:
    """Chaos tests with network fault injection (Toxiproxy)."""


def _add_chaos_commands() -> None:
    from .run_cli import run_command
    from .toxiproxy.cli import toxiproxy_group

    chaos_group.add_command(toxiproxy_group)
    chaos_group.add_command(run_command)


_add_chaos_commands()
