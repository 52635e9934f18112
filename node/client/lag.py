"""``hastore lag``: replication lag of a group, from any node's status.

    hastore lag --bootstrap 127.0.0.1:10911            one table
    hastore lag --bootstrap ... --watch                a live table, redrawn in place
    hastore lag --bootstrap ... --json [--watch]       one JSON object (per refresh)

Asked of a slave, it shows the slave's own view and, when the slave names its master's
client address, the master's per-slave table as well.
"""

from __future__ import annotations

import json
import sys

import click
import trio

ITERATIONS_MAX = 1_000_000


def _human_bytes(count: int) -> str:
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{count} B"


def render_table(status: dict, master_status: dict | None) -> list[str]:
    """The lines of the lag table for a node's status (and its master's, for a slave)."""
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
    header = f"  {'SLAVE':<12} {'CONN':<5} {'IN-SYNC':<8} {'ACK OFFSET':>14} {'LAG':>11} {'LAG MS':>9} {'RATE/S':>11}"
    lines.append(header)
    for slave in replication["slaves"]:
        lines.append(f"  {slave['node_id']:<12} {'yes' if slave['connected'] else 'no':<5} "
                     f"{'yes' if slave['in_sync'] else 'no':<8} {slave['ack_offset']:>14} "
                     f"{_human_bytes(slave['lag_bytes']):>11} {slave['lag_ms']:>9} "
                     f"{_human_bytes(int(slave['rate_bytes_per_s'])):>11}")
    if not replication["slaves"]:
        lines.append("  (no slave has connected)")
    return lines


async def _fetch(bootstrap: str, secret: str | None) -> tuple[dict, dict | None]:
    from ..client import open_admin
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


@click.command("lag")
@click.option("--bootstrap", default="127.0.0.1:10911", show_default=True, metavar="HOST:PORT",
              help="Client address of any node of the group.")
@click.option("--secret", envvar="HASTORE_SECRET", default=None, help="Cluster secret (env HASTORE_SECRET).")
@click.option("--watch", is_flag=True, help="Refresh until interrupted (or --iterations).")
@click.option("--interval-ms", default=1000, show_default=True, type=click.IntRange(50, 3_600_000))
@click.option("--iterations", default=ITERATIONS_MAX, show_default=True, type=click.IntRange(1, ITERATIONS_MAX),
              help="With --watch: stop after this many refreshes.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (one object per refresh with --watch).")
def lag_command(bootstrap, secret, watch, interval_ms, iterations, as_json) -> None:
    """Per-slave replication lag: ack offset, lag in bytes and in time, in-sync flag, rate."""
    from ..errors import NodeError

    async def main() -> None:
        drawn_lines = 0
        for _ in range(iterations if watch else 1):
            status, master_status = await _fetch(bootstrap, secret)
            if as_json:
                click.echo(json.dumps({"node": status["node_id"], "replication": status.get("replication"),
                                       "master": (master_status or {}).get("replication")}))
            else:
                lines = render_table(status, master_status)
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
