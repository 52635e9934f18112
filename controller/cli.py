"""``hastore controller``: run a controller in the foreground, or show each group's master.

    hastore controller start  --zk 127.0.0.1:2181 --cluster prod [--session-timeout-ms 6000]
                              [--enable-elect-unclean-master]
    hastore controller status --zk 127.0.0.1:2181 --cluster prod [--group g1] [--json]
"""

from __future__ import annotations

import json
import signal
import sys
import threading

import click

from . import layout, znodes
from .controller import Controller, ControllerSettings, default_controller_id
from .election import master_is_alive
from .errors import ControllerError

_STATUS_TIMEOUT_S = 5.0


@click.group("controller")
def controller_group() -> None:
    """The ZooKeeper-backed controller that elects each group's master."""


@controller_group.command("start")
@click.option("--zk", "zk_hosts", required=True, help="ZooKeeper connect string, host:port[,host:port...].")
@click.option("--cluster", required=True, help="Cluster name (znodes under /hastore/CLUSTER).")
@click.option("--session-timeout-ms", default=6000, show_default=True, type=click.IntRange(min=1000),
              help="ZooKeeper session timeout (the server clamps it to 2-20 ticks).")
@click.option("--enable-elect-unclean-master", is_flag=True,
              help="Elect a live node outside the sync-state set when no member is live (may lose writes).")
@click.option("--resync-interval-ms", default=2000, show_default=True, type=click.IntRange(min=100),
              help="Re-check every group this often, besides reacting to watches.")
@click.option("--id", "controller_id", default=None, help="This controller's name (default host:pid).")
def start_command(zk_hosts: str, cluster: str, session_timeout_ms: int, enable_elect_unclean_master: bool,
                  resync_interval_ms: int, controller_id: str | None) -> None:
    """Run a controller until SIGTERM or SIGINT; one of several becomes active."""
    settings = ControllerSettings(zk_hosts, cluster, session_timeout_ms, enable_elect_unclean_master,
                                  resync_interval_ms, controller_id=controller_id or default_controller_id())
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    controller = Controller(settings)
    try:
        controller.start()
    except ControllerError as error:
        raise click.ClickException(str(error)) from error
    click.echo(f"controller {settings.controller_id} running for cluster {cluster} at {zk_hosts}", err=True)
    try:
        while not stop.wait(1.0):      # wakes for the signal; the controller works in its own thread
            pass
    finally:
        controller.stop()
    click.echo(f"controller {settings.controller_id} stopped", err=True)


@controller_group.command("status")
@click.option("--zk", "zk_hosts", required=True, help="ZooKeeper connect string.")
@click.option("--cluster", required=True, help="Cluster name.")
@click.option("--group", "groups", multiple=True, help="Only these groups (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def status_command(zk_hosts: str, cluster: str, groups: tuple[str, ...], as_json: bool) -> None:
    """Each group's master, epoch, sync-state set, live nodes, and why there is no master."""
    try:
        report = cluster_status(zk_hosts, cluster, groups)
    except ControllerError as error:
        raise click.ClickException(str(error)) from error
    if as_json:
        click.echo(json.dumps(report, indent=2, sort_keys=True))
        return
    click.echo(f"cluster {cluster}: active controller {report['active_controller'] or '(none)'}")
    for name, group in report["groups"].items():
        master = group["master"]
        head = (f"master {master['node_id']} at {master['client_address']} in epoch {master['epoch']}"
                if group["has_master"] else f"NO MASTER: {group['why_no_master']}")
        click.echo(f"group {name}: {head}")
        click.echo(f"  sync-state set: {group['sync_state_set']}")
        for node_id, node in group["live_nodes"].items():
            click.echo(f"  live {node_id}: {node['client_address']} epoch {node['epoch']} "
                       f"max_offset {node['max_offset']} priority {node['priority']}")
    if not report["groups"]:
        click.echo("  (no groups registered)")


def cluster_status(zk_hosts: str, cluster: str, groups=()) -> dict:
    """The data behind ``hastore controller status`` (a JSON-ready dict)."""
    client = znodes.make_client(zk_hosts, session_timeout_ms=4000)
    znodes.start_client(client, _STATUS_TIMEOUT_S, f"status of cluster {cluster}")
    try:
        names = groups or znodes.children_or_empty(client, layout.groups_path(cluster), _STATUS_TIMEOUT_S)
        contenders = znodes.children_or_empty(client, layout.election_path(cluster), _STATUS_TIMEOUT_S)
        active = None
        if contenders:
            first = min(contenders, key=lambda name: name[-10:])     # lowest sequence number leads
            data, _ = znodes.get_or_none(client, f"{layout.election_path(cluster)}/{first}", _STATUS_TIMEOUT_S)
            active = data.decode(errors="replace") if data is not None else None
        return {"cluster": cluster, "active_controller": active,
                "groups": {name: _group_status(client, cluster, name) for name in names}}
    finally:
        client.stop()
        client.close()


def _group_status(client, cluster: str, group: str) -> dict:
    snapshot = znodes.read_group(client, cluster, group, _STATUS_TIMEOUT_S)
    view = snapshot.view
    alive = master_is_alive(view)
    why = None
    if not alive:
        status = snapshot.status
        if status is not None and status.state == "no_master":
            why = status.reason
        elif view.master is not None:
            why = f"master {view.master.node_id} of epoch {view.master.epoch} is not live (controller has not acted yet)"
        else:
            why = "no master elected yet (is a controller running?)"
    return {
        "has_master": alive,
        "master": _asdict(view.master),
        "epoch": view.master.epoch if view.master is not None else None,
        "sync_state_set": list(view.sync_state_set.members) if view.sync_state_set is not None else None,
        "live_nodes": {node_id: _asdict(node) for node_id, node in sorted(view.live_nodes.items())},
        "why_no_master": why,
        "status": _asdict(snapshot.status),
    }


def _asdict(record):
    if record is None:
        return None
    return {name: getattr(record, name) for name in record.__dataclass_fields__}


if __name__ == "__main__":
    sys.exit(controller_group())
