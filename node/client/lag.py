"""``hastore lag``: replication lag of a group, now and over time.

    hastore lag --bootstrap 127.0.0.1:10911            one table (with each slave's lag status)
    hastore lag --bootstrap ... --watch                a live table, redrawn in place, a sparkline per slave
    hastore lag --bootstrap ... --json [--watch]       one JSON object (per refresh)
    hastore lag history --dir DIR --since 10m [--json] the samples the group's masters took
    hastore lag chart --dir DIR --out lag.png          lag in bytes and seconds per slave, failovers marked

Asked of a slave, ``hastore lag`` shows the slave's own view and, when the slave names its
master's client address, the master's per-slave table as well.

History: a master samples each slave every second (node/server/lag_sampler.py) and keeps a
bounded history, served by LAG_HISTORY. ``history`` and ``chart`` ask every node they are
given (``--dir``: every node of the group; ``--bootstrap``: that node, repeatable) and merge
what they answer, since each master holds only the samples of its own terms; ``--from-file``
reads the JSON lines files nodes write when ``lag_history_path`` is set (which keep the
samples of a master that was killed). Failovers (another master or epoch) and sync-state set
changes (a slave's in-sync flag flips) are found in the samples (replication/lag_history.py).
"""

from __future__ import annotations

import datetime as dt
import json
import re
import sys
import time

import click
import trio

ITERATIONS_MAX = 1_000_000
SPARK_CHARS = "▁▂▃▄▅▆▇█"
SPARK_WINDOW_S = 60
FILE_LINES_MAX = 10_000_000
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}


def _human_bytes(count: int) -> str:
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{count} B"


def sparkline(values: list[float], width: int = 30) -> str:
    """The newest ``width`` values as block characters, scaled from 0 to their maximum."""
    values = values[-width:]
    top = max(values, default=0)
    if top <= 0:
        return SPARK_CHARS[0] * len(values)
    return "".join(SPARK_CHARS[min(len(SPARK_CHARS) - 1, int(v / top * (len(SPARK_CHARS) - 1) + 0.5))]
                   for v in values)


def render_table(status: dict, master_status: dict | None, sparks: dict[str, str] | None = None) -> list[str]:
    """The lines of the lag table for a node's status (and its master's, for a slave);
    ``sparks``: a sparkline of recent lag per slave, shown in a last column."""
    replication = status.get("replication") or {}
    lines = [f"node {status['node_id']} ({status['group']}) {replication.get('role', status['role'])} "
             f"epoch {replication.get('epoch', status['epoch'])} mode {replication.get('mode', '?')}"
             f"{'  FENCED: ' + replication['fenced'] if replication.get('fenced') else ''}"]
    if replication.get("role") == "slave" and "master_ha_address" in replication:
        lines.append(f"  following {replication.get('master_node_id') or '?'} at {replication['master_ha_address']} "
                     f"{'connected' if replication['connected'] else 'DISCONNECTED'}  max offset "
                     f"{replication['max_offset']}  behind {_human_bytes(replication['lag_bytes'])}"
                     f"{'  last error: ' + replication['last_error'] if replication.get('last_error') and not replication['connected'] else ''}")
        replication = (master_status or {}).get("replication") or {}
        if not replication:
            return lines
        lines.append(f"master {master_status['node_id']}:")
    if "slaves" not in replication:
        return lines
    lines.append(f"  max offset {replication['max_offset']}  confirm offset {replication['confirm_offset']}  "
                 f"sync-state set {','.join(replication['sync_state_set'])}  "
                 f"min in-sync {replication['min_in_sync_replicas']}")
    header = (f"  {'SLAVE':<12} {'CONN':<5} {'IN-SYNC':<8} {'ACK OFFSET':>14} {'LAG':>11} {'LAG MS':>9} "
              f"{'RATE/S':>11}  {'STATUS':<14}")
    lines.append(header + (f" LAG (last {SPARK_WINDOW_S} s)" if sparks is not None else ""))
    for slave in replication["slaves"]:
        line = (f"  {slave['node_id']:<12} {'yes' if slave['connected'] else 'no':<5} "
                f"{'yes' if slave['in_sync'] else 'no':<8} {slave['ack_offset']:>14} "
                f"{_human_bytes(slave['lag_bytes']):>11} {slave['lag_ms']:>9} "
                f"{_human_bytes(int(slave['rate_bytes_per_s'])):>11}  {slave.get('lag_status', '-'):<14}")
        if sparks is not None:
            line += " " + sparks.get(slave["node_id"], "")
        lines.append(line.rstrip())
    if not replication["slaves"]:
        lines.append("  (no slave has connected)")
    return lines


async def _fetch(bootstrap: str, secret: str | None) -> tuple[dict, dict | None]:
    from . import open_admin
    async with open_admin(bootstrap, secret=secret) as admin:
        status = await admin.status()
    master_status = None
    replication = status.get("replication") or {}
    master_address = replication.get("master_client_address")
    if replication.get("role") == "slave" and master_address:
        try:
            async with open_admin(master_address, secret=secret) as admin:
                master_status = await admin.status()
        except Exception:  # the master may be down: show what the slave knows
            master_status = None
    return status, master_status


async def _sparks(status: dict, master_status: dict | None, secret: str | None) -> dict[str, str]:
    """A sparkline of the last SPARK_WINDOW_S seconds of lag per slave, from the master's history."""
    from . import open_admin
    from ..errors import NodeError
    shown = master_status if (status.get("replication") or {}).get("role") == "slave" else status
    shown = shown or {}
    address = shown.get("advertised_client_address") or shown.get("client_address")   # older nodes: bound only
    if not address:
        return {}
    try:
        async with open_admin(address, secret=secret) as admin:
            reply = await admin.lag_history(since_ms=int((time.time() - SPARK_WINDOW_S) * 1000))
    except NodeError:   # a node without LAG_HISTORY, or gone since: the table alone
        return {}
    lags: dict[str, list[float]] = {}
    for sample in reply["samples"]:
        lags.setdefault(sample["slave"], []).append(sample["lag_bytes"])
    return {slave: sparkline(values) for slave, values in lags.items()}


# --- hastore lag (no subcommand) -----------------------------------------------------------
def _watch_options(command):
    for option in reversed((
            click.option("--bootstrap", default="127.0.0.1:10911", show_default=True, metavar="HOST:PORT",
                         help="Client address of any node of the group."),
            click.option("--secret", envvar="HASTORE_SECRET", default=None,
                         help="Cluster secret (env HASTORE_SECRET)."),
            click.option("--watch", is_flag=True, help="Refresh until interrupted (or --iterations)."),
            click.option("--interval-ms", default=1000, show_default=True, type=click.IntRange(50, 3_600_000)),
            click.option("--iterations", default=ITERATIONS_MAX, show_default=True,
                         type=click.IntRange(1, ITERATIONS_MAX), help="With --watch: stop after this many refreshes."),
            click.option("--json", "as_json", is_flag=True,
                         help="Print JSON (one object per refresh with --watch)."))):
        command = option(command)
    return command


@click.group("lag", invoke_without_command=True)
@_watch_options
@click.pass_context
def lag_command(ctx, bootstrap, secret, watch, interval_ms, iterations, as_json) -> None:
    """Per-slave replication lag: ack offset, lag in bytes and in time, in-sync flag, rate and lag
    status (OK, CATCHING_UP, FALLING_BEHIND, STALLED, OFFLINE). Subcommands: history, chart."""
    if ctx.invoked_subcommand is not None:
        return
    from ..errors import NodeError

    async def main() -> None:
        drawn_lines = 0
        for _ in range(iterations if watch else 1):
            status, master_status = await _fetch(bootstrap, secret)
            if as_json:
                click.echo(json.dumps({"node": status["node_id"], "replication": status.get("replication"),
                                       "master": (master_status or {}).get("replication")}))
            else:
                sparks = await _sparks(status, master_status, secret) if watch else None
                lines = render_table(status, master_status, sparks)
                if watch and drawn_lines and sys.stdout.isatty():
                    click.echo(f"\x1b[{drawn_lines}F\x1b[J", nl=False)  # back to the table's top, clear below
                click.echo("\n".join(lines))
                drawn_lines = len(lines)
            sys.stdout.flush()
            if watch:
                await trio.sleep(interval_ms / 1000)

    try:
        trio.run(main)
    except NodeError as error:
        raise click.ClickException(str(error)) from None
    except KeyboardInterrupt:
        pass


# --- history and chart -----------------------------------------------------------------------
def parse_since(text: str, now_s: float) -> float | None:
    """``--since``: a duration back from now (90s, 10m, 2h, 1d; bare numbers are seconds), an
    ISO time (UTC unless it says), or ``all``; the time in seconds since the epoch (None: all)."""
    if text.strip().lower() in ("all", "0"):
        return None
    match = _DURATION.match(text)
    if match:
        return now_s - float(match.group(1)) * _UNIT_S[match.group(2)]
    try:
        when = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise click.BadParameter(f"{text!r}: give a duration (90s, 10m, 2h, 1d), an ISO time or 'all'") from None
    return (when if when.tzinfo else when.replace(tzinfo=dt.timezone.utc)).timestamp()


def _sources(command):
    for option in reversed((
            click.option("--dir", "cluster_dir", default=None, metavar="DIR", envvar="HASTORE_CLUSTER_DIR",
                         type=click.Path(file_okay=False),
                         help="Ask every node of the group in the local cluster in DIR (env HASTORE_CLUSTER_DIR)."),
            click.option("--group", default="g1", show_default=True, help="With --dir: the group."),
            click.option("--bootstrap", "bootstraps", multiple=True, metavar="HOST:PORT",
                         help="A node to ask (repeatable; default 127.0.0.1:10911 without --dir or --from-file)."),
            click.option("--from-file", "files", multiple=True, type=click.Path(dir_okay=False, exists=True),
                         help="A JSON lines file a node wrote (lag_history_path); repeatable."),
            click.option("--secret", envvar="HASTORE_SECRET", default=None,
                         help="Cluster secret (env HASTORE_SECRET; --dir reads it from the cluster)."),
            click.option("--since", "since", default="10m", show_default=True,
                         help="From when: a duration back from now (90s, 10m, 2h, 1d), an ISO time, or 'all'."),
            click.option("--slave", default=None, help="Only this slave."))):
        command = option(command)
    return command


def _addresses(cluster_dir: str | None, group: str, bootstraps: tuple[str, ...], files: tuple[str, ...],
               secret: str | None) -> tuple[list[str], str | None]:
    addresses = list(bootstraps)
    if cluster_dir:
        from ..cluster import LocalCluster   # only --dir needs the local cluster
        cluster = LocalCluster(cluster_dir)
        nodes = cluster.nodes(group)
        if not nodes:
            raise click.ClickException(f"no group {group!r} in a local cluster in {cluster_dir}: check --group, "
                                       f"or start one with `hastore cluster up --dir {cluster_dir}`")
        addresses += [spec.client_address for spec in nodes]
        secret = secret if secret is not None else cluster.topology.secret
    if not addresses and not files:
        addresses = ["127.0.0.1:10911"]
    return addresses, secret


def _read_files(files: tuple[str, ...]) -> list:
    from replication.lag_history import LagHistoryError, LagSample
    samples = []
    for path in files:
        with open(path, encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                if number > FILE_LINES_MAX:
                    raise click.ClickException(f"{path}: more than {FILE_LINES_MAX} lines; give a shorter file")
                if not line.strip():
                    continue
                try:
                    samples.append(LagSample.from_dict(json.loads(line)))
                except (ValueError, LagHistoryError) as error:
                    raise click.ClickException(f"{path}:{number}: not a lag sample ({error}); give a file a "
                                               f"node wrote with lag_history_path") from None
    return samples


async def _ask_nodes(addresses: list[str], secret: str | None, since_ms: int, slave: str | None) -> tuple[list, dict]:
    """Samples and statuses from every node that answers (the first master's statuses win);
    a node that does not answer is named on stderr."""
    from replication.lag_history import LagSample
    from . import open_admin
    from ..errors import NodeError
    samples, statuses, failures = [], {}, []
    for address in addresses:
        try:
            with trio.fail_after(10):
                async with open_admin(address, secret=secret) as admin:
                    reply = await admin.lag_history(since_ms=since_ms, slave=slave)
        except (NodeError, trio.TooSlowError, OSError) as error:
            failures.append(f"{address}: {error or type(error).__name__}")
            continue
        samples += [LagSample.from_dict(item) for item in reply["samples"]]
        if reply["statuses"] and not statuses:
            statuses = {"node": reply["node_id"], **reply["statuses"]}
    for failure in failures:
        click.echo(f"lag history: no answer from {failure}", err=True)
    if failures and len(failures) == len(addresses):
        raise click.ClickException("no node answered; check the addresses (or --dir) and that the nodes are up")
    return samples, statuses


def _gather(cluster_dir, group, bootstraps, files, secret, since, slave) -> tuple[list, dict, float | None]:
    """Merged samples (duplicates dropped, time order) and statuses from the nodes and files given."""
    since_s = parse_since(since, time.time())
    addresses, secret = _addresses(cluster_dir, group, bootstraps, files, secret)
    samples, statuses = [], {}
    if addresses:
        samples, statuses = trio.run(_ask_nodes, addresses, secret, int(since_s * 1000) if since_s else 0, slave)
    samples += _read_files(files)
    unique = {(s.time_s, s.slave, s.master): s for s in samples
              if (since_s is None or s.time_s >= since_s) and (slave is None or s.slave == slave)}
    return sorted(unique.values(), key=lambda s: (s.time_s, s.slave)), statuses, since_s


def _clock(time_s: float) -> str:
    return dt.datetime.fromtimestamp(time_s, tz=dt.timezone.utc).strftime("%H:%M:%S.%f")[:-4]


@lag_command.command("history")
@_sources
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: samples, events, statuses.")
def lag_history_command(cluster_dir, group, bootstraps, files, secret, since, slave, as_json) -> None:
    """Lag samples per slave over time, merged from every master's history (and files), with
    failovers and sync-state set changes."""
    from replication.lag_history import lag_events
    from ..errors import NodeError
    try:
        samples, statuses, since_s = _gather(cluster_dir, group, bootstraps, files, secret, since, slave)
    except NodeError as error:
        raise click.ClickException(str(error)) from None
    events = lag_events(samples)
    if as_json:
        click.echo(json.dumps({"since_s": since_s, "samples": [s.to_dict() for s in samples],
                               "events": [{"time_s": e.time_s, "kind": e.kind, "detail": e.detail} for e in events],
                               "statuses": statuses}))
        return
    rows = [("TIME (UTC)", "MASTER", "EPOCH", "SLAVE", "CONN", "IN-SYNC", "ACK OFFSET", "LAG", "LAG S", "RATE/S")]
    rows += [(_clock(s.time_s), s.master, str(s.epoch), s.slave, "yes" if s.connected else "no",
              "yes" if s.in_sync else "no", str(s.ack_offset), _human_bytes(s.lag_bytes), f"{s.lag_s:.3f}",
              _human_bytes(int(s.rate_bytes_per_s))) for s in samples]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    for event in events:
        click.echo(f"{_clock(event.time_s)}  {event.kind}: {event.detail}")
    if statuses:
        node = statuses.pop("node")
        click.echo(f"status now (master {node}): " + ", ".join(f"{k} {v}" for k, v in sorted(statuses.items())))
    click.echo(f"{len(samples)} samples of {len({s.slave for s in samples})} slaves, {len(events)} events")


@lag_command.command("chart")
@_sources
@click.option("--out", "out_path", required=True, type=click.Path(dir_okay=False, writable=True),
              help="The PNG file to write.")
@click.option("--title", default=None, help="The chart's title (default: the group and time span).")
def lag_chart_command(cluster_dir, group, bootstraps, files, secret, since, slave, out_path, title) -> None:
    """Draw lag in bytes and in seconds per slave over time as a PNG, failovers and sync-state
    set changes marked."""
    from replication.lag_history import lag_events
    from ..errors import NodeError
    from .lag_chart import draw_lag_chart
    try:
        import matplotlib  # noqa: F401  (lag_chart loads it; asked here to say how to get it)
    except ImportError:
        raise click.ClickException("lag chart needs matplotlib: pip install 'hastore[pipeline]' "
                                   "(or pip install matplotlib)") from None
    try:
        samples, _, _ = _gather(cluster_dir, group, bootstraps, files, secret, since, slave)
    except NodeError as error:
        raise click.ClickException(str(error)) from None
    if not samples:
        raise click.ClickException("no lag samples in that span: a master samples its slaves once a second; "
                                   "try a longer --since, or --from-file with a node's lag_history_path file")
    span = f"{_clock(samples[0].time_s)[:8]}-{_clock(samples[-1].time_s)[:8]} UTC"
    drawn = draw_lag_chart(samples, lag_events(samples), out_path,
                           title=title or f"replication lag, group {group}, {span}")
    click.echo(json.dumps(drawn))
