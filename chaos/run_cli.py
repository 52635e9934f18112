"""``hastore chaos run``: a seeded schedule of faults under a concurrent workload, checked.

    hastore chaos run --dir DIR [--up] [--proxied] --nemesis kill,pause,... --cycles N
                      --time-limit S --seed N [--json]

Prints one row per cycle (fault, target, duration from the fault to its heal, acked, info,
lost, unavailable ms), a summary with the safety violations and a table of the unavailability
per fault kind (median, p99, max), and the history file's path. Exit status 1 on any safety violation (lost, duplicated, failed-but-present, order,
dirty read, committed offset going back, replica divergence), and when a cycle did not
recover or the group did not catch up at the end.

Proxies: ``--up --proxied`` starts a lasting proxied cluster (as ``hastore cluster up
--proxied``); a cluster started proxied is run through its proxies with or without
``--proxied``; ``--proxied`` on a running unproxied cluster routes it through temporary
proxies for the run (chaos/proxied_cluster.py).
"""

from __future__ import annotations

import contextlib
import json
import logging

import click

from node.client.progress import progress_bar
from node.cluster import LocalCluster

from .command_cluster import command_cluster
from .run import CycleRecord, RunReport, RunSettings, run_chaos
from .workload import LoadSettings

# The producers send about 1,000 to 2,500 messages a cycle on a local cluster: the default
# bound leaves room for twice that, so a long run is not cut short by its own workload.
MESSAGES_PER_CYCLE = 5_000
MESSAGES_MIN = 200_000

CYCLE_HEADER = ("cycle", "fault", "target", "duration s", "acked", "info", "lost", "unavail ms", "ok")
WIDTHS = (5, 24, 12, 10, 6, 5, 5, 10, 3)
KIND_HEADER = ("fault kind", "faults", "p50 ms", "p99 ms", "max ms", "no ack")
KIND_WIDTHS = (24, 6, 8, 8, 8, 6)


@click.command("run")
@click.option("--dir", "directory", required=True, envvar="HASTORE_CLUSTER_DIR", type=click.Path(file_okay=False),
              help="The cluster's directory (env HASTORE_CLUSTER_DIR); the history goes to DIR/chaos/.")
@click.option("--up", "start_cluster", is_flag=True,
              help="Start a cluster in DIR if none runs, and stop it after the run.")
@click.option("--proxied", is_flag=True,
              help="Route links through Toxiproxy proxies (needed by partition and toxic faults). With --up: "
                   "start the cluster proxied, as `hastore cluster up --proxied`. On a running unproxied "
                   "cluster: temporary proxies for the run (nodes restarted onto them, and back after). A "
                   "cluster started proxied is always run through its proxies, with or without this flag.")
@click.option("--nemesis", default="kill,pause", show_default=True,
              help="Fault families (kill, controller, zookeeper, pause, partition, toxic, all) or kinds, "
                   "comma separated.")
@click.option("--cycles", default=3, show_default=True, type=click.IntRange(1, 100_000))
@click.option("--time-limit", "time_limit_s", default=300.0, show_default=True, type=click.FloatRange(1, 7 * 86400),
              help="Seconds of faulting at most (cycles left then are not run).")
@click.option("--seed", default=0, show_default=True, type=int, help="The schedule follows from it.")
@click.option("--group", default="g1", show_default=True)
@click.option("--producers", default=3, show_default=True, type=click.IntRange(1, 64))
@click.option("--no-slave-reads", is_flag=True, help="Leave out the readers that pull through slaves.")
@click.option("--messages-max", type=click.IntRange(1000, 100_000_000), default=None,
              help=f"Messages the producers may send over the run, a bound on its history [default: "
                   f"{MESSAGES_PER_CYCLE} per cycle, at least {MESSAGES_MIN}]. A run whose producers have sent "
                   f"them all stops before its next fault.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (summary, cycles, schedule, verdict).")
def run_command(directory, start_cluster, proxied, nemesis, cycles, time_limit_s, seed, group, producers,
                no_slave_reads, messages_max, as_json) -> None:
    """Run the workload with a seeded schedule of faults and check the history."""
    # kazoo logs every dropped connection while ZooKeeper is faulted: the cycle lines say enough
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    settings = RunSettings(nemesis=nemesis, cycles=cycles, seed=seed, time_limit_s=time_limit_s, group=group,
                           load=LoadSettings(producers=producers, slave_readers=0 if no_slave_reads else 1,
                                             messages_max=messages_max or max(MESSAGES_MIN, MESSAGES_PER_CYCLE * cycles)))
    with command_cluster(directory, start_cluster, proxied) as cluster, contextlib.ExitStack() as stack:
        proxies, address_of = _proxies(stack, cluster, proxied or cluster.proxied)
        if not as_json:
            click.echo(f"chaos run on group {group} in {cluster.directory}: {cycles} cycle(s) of {nemesis}, "
                       f"seed {seed}")
        bar = stack.enter_context(progress_bar(f"chaos cycles ({nemesis})", total=cycles))  # a terminal only

        def on_cycle(record: CycleRecord) -> None:
            if not as_json:
                _progress(record)
            bar.advance()
        report = run_chaos(cluster, settings, proxies=proxies, address_of=address_of, on_cycle=on_cycle)
    if as_json:
        click.echo(json.dumps(report.to_json()))
    else:
        click.echo(format_row(CYCLE_HEADER))
        for record in report.cycles:
            click.echo(format_row(cycle_row(record)))
        for line in summary_lines(report):
            click.echo(line)
    if not report.ok:
        raise SystemExit(1)


def _proxies(stack: contextlib.ExitStack, cluster: LocalCluster, proxied: bool):
    """(ToxiproxyClient, node id -> client address) of a proxied cluster, or (None, None).
    ``proxied`` is true for a cluster started proxied even without --proxied: every client link
    of it goes through a proxy, so the run uses them (and its partition faults are allowed)."""
    if not proxied:
        return None, None
    from .proxied_cluster import open_proxies
    return stack.enter_context(open_proxies(cluster))


def _progress(record: CycleRecord) -> None:
    """A line per cycle while the run goes (stderr; the table with each cycle's counts follows the run)."""
    click.echo(f"cycle {record.cycle}: {record.kind} on {record.target}, held {record.hold_s:.1f} s, unavailable "
               f"{_ms(record.unavailable_ms)} ms{': ' + record.error if record.error else ''}", err=True)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def cycle_row(record: CycleRecord) -> tuple:
    duration = "-" if record.duration_s is None else f"{record.duration_s:.1f}"
    return (record.cycle, record.kind, record.target, duration, record.acked, record.info, record.lost,
            _ms(record.unavailable_ms), "yes" if record.recovered and not record.lost else "NO")


def format_row(row: tuple, widths: tuple[int, ...] = WIDTHS) -> str:
    return "  ".join(str(cell).rjust(width) for cell, width in zip(row, widths))


def kind_rows(by_kind: dict[str, dict]) -> list[tuple]:
    """The unavailability table's rows: one per fault kind (summary()["unavailability_by_kind"])."""
    return [(kind, row["faults"], _ms(row["p50_ms"]), _ms(row["p99_ms"]), _ms(row["max_ms"]), row["no_ack_after"])
            for kind, row in by_kind.items()]


def summary_lines(report: RunReport) -> list[str]:
    """The run's summary as text: errors of cycles, violations, unavailability per kind, history path."""
    summary = report.summary()
    lines = [f"cycle {c.cycle}: {c.error}" for c in report.cycles if c.error]
    lines.append(f"sends: invoked {summary['invoked']}, acked {summary['acked']}, failed {summary['failed']}, "
                 f"info {summary['info']} ({summary['info_present']} of them stored)")
    violations = report.verdict.violations()
    lines.append("safety: " + ", ".join(f"{name} {count}" for name, count in violations.items())
                 + (": OK" if report.safe else ": VIOLATED"))
    lines.append("unavailability per fault kind (fault -> first acked write invoked after it):")
    lines.append(format_row(KIND_HEADER, KIND_WIDTHS))
    lines.extend(format_row(row, KIND_WIDTHS) for row in kind_rows(summary["unavailability_by_kind"]))
    lines.append(format_row(*kind_rows({"all": summary["unavailability"]}), KIND_WIDTHS))
    lines.append(f"cycles recovered {summary['cycles_recovered']}/{summary['cycles_run']} "
                 f"(planned {summary['cycles_planned']}); final master {summary['final_master']}, "
                 f"replicas caught up: {'yes' if report.caught_up else 'NO'}: {'OK' if report.ok else 'FAILED'}")
    details = report.verdict.to_json(examples_max=5)
    for name in ("order", "dirty_reads", "offset_regressions", "divergence"):
        if details[name]:
            lines.append(f"{name}: {json.dumps(details[name])}")
    if details["sends"]["lost"]:
        lines.append(f"lost: {details['sends']['lost'][:10]}")
    lines.append(f"history: {report.history_path}")
    return lines
