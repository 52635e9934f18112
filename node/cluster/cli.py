"""``hastore cluster``: run a whole group (or several) as local processes on loopback.

    hastore cluster up --dir /tmp/c [--config cluster.yaml] [--proxied]   # ZooKeeper, 2 controllers, 3 nodes
    hastore cluster status --dir /tmp/c [--json]
    hastore cluster kill g1-n1 --dir /tmp/c [--signal KILL|STOP|CONT|TERM|INT]
    hastore cluster restart g1-n1 --dir /tmp/c
    hastore cluster logs g1-n1 --dir /tmp/c
    hastore cluster verify --dir /tmp/c [--json]              # the groups' CommitLogs compared (verify.py)
    hastore cluster down --dir /tmp/c

The topology (cluster.yaml) lives in topology.py, process control in supervisor.py
(``LocalCluster``, the Python API drills and chaos tests use); this module is only the
command line over them.
"""

from __future__ import annotations

import dataclasses
import json
import signal
from functools import partial

import click

from controller.cli import cluster_status as controller_cluster_status
from controller.errors import ControllerError

from .supervisor import ClusterStartError, LocalCluster, ProcessSpec, ProcessStatus, StopReport
from .topology import (ClusterConfigError, ClusterError, ClusterTopology, default_topology,
                               load_topology, topology_from_mapping)

__all__ = ["LocalCluster", "ProcessSpec", "ProcessStatus", "StopReport", "ClusterTopology", "ClusterError",
           "ClusterConfigError", "ClusterStartError", "load_topology", "default_topology", "topology_from_mapping",
           "cluster_group"]

dir_option = click.option("--dir", "directory", required=True, envvar="HASTORE_CLUSTER_DIR",
                          type=click.Path(file_okay=False),
                          help="The cluster's directory: cluster.json, and per node its node.yaml, node.log "
                               "and store/ (env HASTORE_CLUSTER_DIR).")
json_option = click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON on stdout.")
_SIGNALS = {"KILL": signal.SIGKILL, "TERM": signal.SIGTERM, "INT": signal.SIGINT, "STOP": signal.SIGSTOP,
            "CONT": signal.SIGCONT, "HUP": signal.SIGHUP}


def _fail(error: Exception) -> click.ClickException:
    return click.ClickException(str(error))


@click.group("cluster")
def cluster_group() -> None:
    """Run a local cluster: every process on 127.0.0.1, state and logs in one directory.

    With no config, `up` starts a ZooKeeper, two controllers and group g1 (g1-n1, g1-n2,
    g1-n3) in controller mode: the controller elects the master and fails over when it
    dies (ZooKeeper session timeout 2 s). `controller: {mode: static}` in cluster.yaml gives
    fixed roles instead. See `hastore cluster up --help` for cluster.yaml.
    """


@cluster_group.command("up")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, exists=True),
              help="cluster.yaml: cluster, host, base_port, nodes_per_group, replication, flush, secret, "
                   "secret_file, proxied, startup_timeout_s, shutdown_timeout_s, store, groups, nodes, controller. "
                   "Default: the topology DIR last ran, else one group g1 of three nodes.")
@dir_option
@click.option("--proxied", is_flag=True,
              help="Route every link through a Toxiproxy proxy of its own (as `proxied: true`): the proxy "
                   "server runs as a process of the cluster, or TOXIPROXY_URL's Toxiproxy is used.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(1, 600),
              help="Seconds each start phase may take to answer status (overrides startup_timeout_s).")
@json_option
def cluster_up(config_path, directory, proxied, timeout_s, as_json) -> None:
    """Start ZooKeeper, the controllers and every node; wait until each is ready and every
    group has a master.

    Controller mode (the default): ZooKeeper (DIR/zookeeper/), then the controllers
    (DIR/controller-N/), then the nodes, which start as fenced slaves and take their role
    from the controller; `up` returns once each group has an elected master. Static mode:
    masters start first, then slaves. Ports are written into DIR/<node>/node.yaml, so a
    restart keeps them; a new `up` in the same DIR reuses them when still free. Refused
    while any process of DIR runs. If a node is not ready in time its log tail is printed,
    every started process is stopped and the exit status is 1. The nodes keep running after
    this command returns; stop them with `hastore cluster down`.

    \b
    cluster.yaml (every key optional):
      cluster: hastore            base_port: 0 (free ports) or N (N+3i, N+3i+1, N+3i+2)
      host: 127.0.0.1             nodes_per_group: 3
      replication: sync           flush: async          secret: null    secret_file: null
      proxied: false
      min_in_sync_replicas: 1     all_ack_in_sync_state_set: true (controller mode; false in static)
      startup_timeout_s: 30       shutdown_timeout_s: 10
      store: {commitlog_segment_bytes: 67108864, ...}
      groups: {g1: {nodes: 3 | [ids], master: ID, replication, flush, min_in_sync_replicas,
                    all_ack_in_sync_state_set, store}}
      nodes: {ID: {client_port, ha_port, metrics_port, <NodeConfig keys>, store}}
      controller: {mode: controller | static, zookeeper: {tick_ms: 250, port: 0},
                   controllers: 2, session_timeout_ms: 2000, enable_elect_unclean_master: false}

    The session timeout is how long ZooKeeper waits before it declares a silent node dead:
    failover takes about that long plus the election (2 s default, short for local use; it
    must lie within 2-20 ZooKeeper ticks).

    \b
    Secret: `secret` in cluster.yaml, or better `secret_file: PATH` (mode 0600; each node.yaml
    names the file), or with neither HASTORE_SECRET in the environment (kept in DIR/secret,
    mode 0600, for later commands). Status, logs and JSON never print it.

    \b
    Proxied (--proxied, or `proxied: true`): `hastore chaos toxiproxy serve` runs as a process
    of the cluster (DIR/toxiproxy/; TOXIPROXY_URL: that Toxiproxy instead) and every link has
    a proxy of its own: client_to_NODE (clients -> NODE), SLAVE_to_MASTER_ha (every ordered
    pair of a group), NODE_to_zk and controller-N_to_zk. `cluster status` lists them; clients
    reach a node through its client_to_NODE listen address; `hastore chaos run --proxied`
    faults them.
    """
    try:
        topology = load_topology(config_path) if config_path else None
        cluster = LocalCluster(directory, topology)
        if timeout_s is not None:
            cluster.topology = dataclasses.replace(cluster.topology, startup_timeout_s=timeout_s)
        if proxied and not cluster.topology.proxied:
            cluster.topology = dataclasses.replace(cluster.topology, proxied=True,
                                                   source={**cluster.topology.source, "proxied": True})
        specs = cluster.up()
    except ClusterStartError as error:
        for name, tail in error.log_tails.items():
            click.echo(f"--- last lines of {name}'s log ---\n{tail}", err=True)
        click.echo("every process of the cluster was stopped", err=True)
        raise _fail(error) from None
    except ClusterError as error:
        raise _fail(error) from None
    masters = {}
    if cluster.topology.controller.enabled:
        try:
            masters = {group.name: cluster.current_master(group.name).node_id for group in cluster.topology.groups}
        except (ClusterError, ControllerError) as error:
            raise _fail(error) from None
    if as_json:
        click.echo(json.dumps({"directory": cluster.directory, "mode": cluster.topology.controller.mode,
                               "zk_hosts": cluster.zk_hosts if masters else None, "masters": masters,
                               "processes": [{**spec.to_json(), "pid": cluster.pid(spec.name)} for spec in specs],
                               "toxiproxy": cluster.proxy_api_url,
                               "proxies": [link.to_json() for link in cluster.proxy_links()]}))
        return
    click.echo(f"cluster {cluster.topology.cluster} is up in {cluster.directory}")
    through = {link.peer: link.listen for link in cluster.proxy_links() if link.kind == "client"}
    for spec in specs:
        if spec.kind == "node":
            role = "master" if masters.get(spec.group) == spec.name else ("slave" if masters else spec.role)
            proxy = f"proxy {through[spec.name]:<21} " if spec.name in through else ""
            click.echo(f"  {spec.name:<12} {role:<10} client {spec.client_address:<21} {proxy}"
                       f"ha {spec.ha_address:<21} pid {cluster.pid(spec.name)}")
        else:
            where = f"client {spec.client_address:<21}" if spec.client_address else f"log {spec.log_path}"
            click.echo(f"  {spec.name:<12} {spec.kind:<10} {where} pid {cluster.pid(spec.name)}")
    if masters:
        settings = cluster.topology.controller
        click.echo(f"masters (elected by the controller): "
                   f"{', '.join(f'{group} -> {node}' for group, node in masters.items())}; "
                   f"ZooKeeper session timeout {settings.session_timeout_ms} ms")
    if cluster.proxied:
        click.echo(f"{len(cluster.proxy_links())} proxies on Toxiproxy {cluster.proxy_api_url}; clients reach each "
                   f"node through its proxy (listed by status)")
    click.echo(f"status: hastore cluster status --dir {directory}    stop: hastore cluster down --dir {directory}")


@cluster_group.command("down")
@dir_option
@json_option
def cluster_down(directory, as_json) -> None:
    """Stop every process of DIR: SIGTERM, wait up to shutdown_timeout_s, SIGKILL the rest.

    Reports per process whether it stopped cleanly (no abort file left), exited unclean,
    had to be killed, or was not running. Safe to run again, and after crashes. Exit status
    1 only if a process survived SIGKILL.
    """
    try:
        reports = LocalCluster(directory).down()
    except ClusterError as error:
        raise _fail(error) from None
    if as_json:
        click.echo(json.dumps([report.to_json() for report in reports]))
    elif not reports:
        click.echo(f"nothing to stop: {directory} has no cluster")
    else:
        for report in reports:
            click.echo(f"{report.name:<12} {_describe_stop(report)}")
        if all(report.outcome == "not running" for report in reports):
            click.echo("no process was running")
    if any(report.outcome == "stuck" for report in reports):
        raise SystemExit(1)


def _describe_stop(report: StopReport) -> str:
    pid = f"pid {report.pid}: " if report.pid else ""
    text = {"clean": "stopped cleanly", "exited-unclean": "exited on SIGTERM but not cleanly",
            "killed": "did not stop on SIGTERM in time: killed with SIGKILL",
            "not running": "was not running", "stuck": "still running after SIGKILL"}[report.outcome]
    if report.pid:
        text += f" ({report.seconds:g} s)"
    if report.exit_status not in (None, 0):
        text += f", exit status {report.exit_status}"
    if report.abort_file:
        text += "; abort file present: its next start recovers abnormally"
    return pid + text


@cluster_group.command("status")
@dir_option
@json_option
@click.option("--timeout", "timeout_s", default=2.0, show_default=True, type=click.FloatRange(0.1, 60),
              help="Seconds to wait for each node's status reply before calling it unresponsive.")
def cluster_status(directory, as_json, timeout_s) -> None:
    """Per group: in controller mode the master, epoch and sync-state set ZooKeeper holds (or
    why there is no master); each node's state (up, down, unresponsive), role, epoch, client
    address, max CommitLog offset and lag behind the master (bytes); where a node reports a
    `replication` section, its sync-state set, confirm offset and per-slave lag. Then the
    ZooKeeper, controller and proxy server processes. A dead process is shown as down. A
    proxied cluster's proxies follow: name, listen, upstream, enabled, toxics (JSON: "proxies")."""
    try:
        cluster = LocalCluster(directory)
        if not cluster.specs:
            raise ClusterError(f"no cluster in {directory}: start one with `hastore cluster up --dir {directory}`")
        statuses = cluster.status(timeout_s)
    except ClusterError as error:
        raise _fail(error) from None
    controller = controller_report(cluster, statuses)
    proxies = proxy_report(cluster)
    if as_json:
        groups: dict[str, list] = {}
        for item in statuses:
            groups.setdefault(item.spec.group or item.spec.kind, []).append(item.to_json())
        click.echo(json.dumps({"cluster": cluster.topology.cluster, "directory": cluster.directory,
                               "mode": cluster.topology.controller.mode, "controller": controller,
                               "groups": groups, "proxies": proxies}))
        return
    click.echo(f"cluster {cluster.topology.cluster} in {cluster.directory} ({cluster.topology.controller.mode} mode)")
    for line in render_status(statuses, controller) + render_proxies(proxies):
        click.echo(line)


def proxy_report(cluster: LocalCluster) -> dict | None:
    """A proxied cluster's proxies as the proxy server holds them (or why not known); None
    when the cluster is not proxied."""
    if not cluster.proxied:
        return None
    try:
        return {"toxiproxy": cluster.proxy_api_url, "proxies": cluster.proxy_listing()}
    except ClusterError as error:
        return {"toxiproxy": cluster.proxy_api_url, "error": str(error),
                "proxies": [link.to_json() for link in cluster.proxy_links()]}


def render_proxies(report: dict | None) -> list[str]:
    """The proxies table: name, listen, upstream, enabled, toxics (type/stream, attributes)."""
    if report is None:
        return []
    lines = [f"proxies (Toxiproxy {report['toxiproxy']})"]
    if "error" in report:
        lines.append(f"  proxy server: {report['error']}")
    rows = [("proxy", "listen", "upstream", "enabled", "toxics")]
    for proxy in report["proxies"]:
        if "present" not in proxy:
            enabled = "?"                # the server did not answer
        else:
            enabled = ("yes" if proxy["enabled"] else "NO") if proxy["present"] else "missing"
        toxics = ", ".join(f"{toxic.get('name')} {toxic.get('type')}/{toxic.get('stream')} "
                           f"{json.dumps(toxic.get('attributes', {}), sort_keys=True)}"
                           for toxic in proxy.get("toxics") or []) or "-"
        rows.append((proxy["name"], proxy.get("listen") or "-", proxy["upstream"], enabled, toxics))
    return lines + ["  " + line for line in _table(rows)]


def controller_report(cluster: LocalCluster, statuses: list[ProcessStatus]) -> dict | None:
    """What ZooKeeper holds about each group (controller.cli.cluster_status), or why it is not
    known; None in static mode."""
    if not cluster.topology.controller.enabled:
        return None
    if not any(item.spec.kind == "zookeeper" and item.state == "up" for item in statuses):
        return {"error": "ZooKeeper is not running: masters and sync-state sets are unknown"}
    try:
        return controller_cluster_status(cluster.zk_hosts, cluster.topology.cluster,
                                         tuple(group.name for group in cluster.topology.groups))
    except ControllerError as error:
        return {"error": str(error)}


def render_status(statuses: list[ProcessStatus], controller: dict | None = None) -> list[str]:
    """The status table, one block per group (headed by what the controller recorded, when
    ``controller`` is given), replication sections below their node; then ZooKeeper and
    the controllers."""
    lines: list[str] = []
    header = ("node", "state", "role", "epoch", "client address", "max offset", "lag", "pid")
    by_group: dict[str, list[ProcessStatus]] = {}
    for item in statuses:
        by_group.setdefault(item.spec.group or item.spec.kind, []).append(item)
    groups = (controller or {}).get("groups", {})
    if controller and "error" in controller:
        lines.append(f"controller: {controller['error']}")
    for group, items in by_group.items():
        if items[0].spec.kind != "node":
            continue
        master_id = _master_of(items, groups.get(group))
        master_offset = next(((item.status or {}).get("store", {}).get("max_physical_offset")
                              for item in items if item.spec.name == master_id and item.status), None)
        rows = [header]
        for item in items:
            status = item.status or {}
            role = status.get("role") or f"({item.spec.role})"
            max_offset = (status.get("store") or {}).get("max_physical_offset", "-")
            lag = (str(max(0, master_offset - max_offset)) if isinstance(max_offset, int)
                   and isinstance(master_offset, int) else "-")
            rows.append((item.spec.name, item.state, role, str(status.get("epoch", "-")),
                         item.spec.client_address or "-", str(max_offset), lag, str(item.pid or "-")))
        lines.append(f"group {group}")
        if group in groups:
            lines.extend("  " + line for line in render_group_controller(groups[group]))
        lines.extend("  " + line for line in _table(rows))
        for item in items:   # each slave's lag status as its master judges it (replication/lag_history.py)
            slaves = ((item.status or {}).get("replication") or {}).get("slaves") or []
            if slaves and any("lag_status" in slave for slave in slaves):
                lines.append(f"  lag status (master {item.spec.name}): " + ", ".join(
                    f"{slave['node_id']} {slave.get('lag_status', '-')}" for slave in slaves))
        for item in items:
            if item.error:
                lines.append(f"  {item.spec.name}: {item.error}")
            replication = (item.status or {}).get("replication")
            if isinstance(replication, dict):
                lines.append(f"  replication ({item.spec.name}):")
                lines.extend("    " + line for line in render_replication(replication))
    control = [item for item in statuses if item.spec.kind != "node"]
    if control:
        rows = [("process", "kind", "state", "pid", "detail")]
        for item in control:
            status = item.status or {}
            if item.spec.kind == "zookeeper":
                detail = f"{item.spec.client_address} mode {status.get('mode', '-')}"
            elif item.spec.kind == "toxiproxy":
                detail = f"http://{item.spec.client_address} version {status.get('version', '-')}"
            else:
                detail = ("active" if status.get("active") else "standby") if item.status else item.error or "-"
            rows.append((item.spec.name, item.spec.kind, item.state, str(item.pid or "-"), detail))
        lines.append("control plane")
        lines.extend("  " + line for line in _table(rows))
    return lines


def _master_of(items: list[ProcessStatus], group: dict | None) -> str | None:
    """The group's master: ZooKeeper's when it has a live one, else a node that says it is master."""
    if group is not None:
        return group["master"]["node_id"] if group.get("has_master") else None
    return next((item.spec.name for item in items if (item.status or {}).get("role") == "master"), None)


def render_group_controller(group: dict) -> list[str]:
    """A group's master, epoch and sync-state set as ZooKeeper holds them (cluster_status shape)."""
    members = ", ".join(group.get("sync_state_set") or []) or "-"
    if group.get("has_master"):
        master = group["master"]
        head = f"master {master['node_id']} (epoch {master['epoch']}, {master['client_address']})"
    else:
        head = f"NO MASTER: {group.get('why_no_master')}"
    return [head, f"sync-state set: [{members}]  live in ZooKeeper: [{', '.join(group.get('live_nodes', {}))}]"]


# Keys shown first, in this order; any other key of the section is shown after them.
_REPLICATION_FIRST = ("sync_state_set", "confirm_offset")


def render_replication(section: dict, width: int = 100) -> list[str]:
    """A node's `replication` status section as text, whatever keys it has: scalars and lists
    as `key: value` pairs packed into lines of about ``width`` characters, a mapping or list
    of mappings (per slave) as a table below them."""
    keys = [k for k in _REPLICATION_FIRST if k in section] + [k for k in section if k not in _REPLICATION_FIRST]
    pairs: list[str] = []
    tables: list[str] = []
    for key in keys:
        value = section[key]
        rows = _rows(value)
        if rows is not None:
            tables.append(f"{key}:")
            tables.extend("  " + line for line in _table(rows))
        elif isinstance(value, list):
            pairs.append(f"{key}: [{', '.join(_cell(item) for item in value)}]")
        else:
            pairs.append(f"{key}: {_cell(value)}")
    lines: list[str] = []
    for pair in pairs:
        if lines and len(lines[-1]) + 2 + len(pair) <= width:
            lines[-1] += "  " + pair
        else:
            lines.append(pair)
    return lines + tables


def _rows(value: object) -> list[tuple] | None:
    """A table for a mapping of mappings (first column its keys) or a list of mappings; else None."""
    if isinstance(value, dict) and value and all(isinstance(v, dict) for v in value.values()):
        items = [{"": name, **item} for name, item in value.items()]
    elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        items = value
    else:
        return None
    columns: list[str] = []
    for item in items:
        columns.extend(key for key in item if key not in columns)
    return [tuple(columns)] + [tuple(_cell(item.get(column, "-")) for column in columns) for item in items]


def _cell(value: object) -> str:
    if isinstance(value, list):
        return "[" + ",".join(_cell(item) for item in value) + "]"
    if value is None:
        return "-"
    return json.dumps(value, default=str) if isinstance(value, dict) else str(value)


def _table(rows: list[tuple]) -> list[str]:
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]


@cluster_group.command("kill")
@click.argument("node")
@dir_option
@click.option("--signal", "signal_name", default="KILL", show_default=True,
              type=click.Choice(sorted(_SIGNALS), case_sensitive=False),
              help="KILL (crash), TERM/INT (clean stop), STOP (freeze: holds its sockets, answers nothing), "
                   "CONT (resume after STOP), HUP.")
def cluster_kill(node, directory, signal_name) -> None:
    """Send a signal to NODE's process (default SIGKILL, a crash that leaves an abort file).

    For failure drills: a killed node shows as down in `status`; bring it back with
    `hastore cluster restart NODE`.
    """
    sig = _SIGNALS[signal_name.upper()]
    cluster = LocalCluster(directory)
    # STOP and CONT return once every thread of the process has stopped, or none is stopped
    waited = {signal.SIGSTOP: (cluster.pause, "; it has stopped"), signal.SIGCONT: (cluster.resume, "; it goes on")}
    act, outcome = waited.get(sig, (partial(cluster.kill, sig=sig), ""))
    try:
        pid = act(node)
    except ClusterError as error:
        raise _fail(error) from None
    click.echo(f"sent SIG{signal_name.upper()} to {node} (pid {pid}){outcome}")


@cluster_group.command("restart")
@click.argument("node")
@dir_option
def cluster_restart(node, directory) -> None:
    """Stop NODE if it runs (SIGTERM, then SIGKILL after shutdown_timeout_s), start it again
    with the same node.yaml (same ports and store) and wait until it answers `status`."""
    cluster = LocalCluster(directory)
    try:
        report, spec = cluster.restart(node)
    except ClusterStartError as error:
        for name, tail in error.log_tails.items():
            click.echo(f"--- last lines of {name}'s log ---\n{tail}", err=True)
        raise _fail(error) from None
    except ClusterError as error:
        raise _fail(error) from None
    click.echo(f"{node}: {_describe_stop(report)}; started again as pid {cluster.pid(node)}, "
               f"client {spec.client_address}")


@cluster_group.command("logs")
@click.argument("node")
@dir_option
@click.option("--lines", default=40, show_default=True, type=click.IntRange(1, 10_000),
              help="How many of the last lines to print (since the node's last start).")
def cluster_logs(node, directory, lines) -> None:
    """Print the end of NODE's log (DIR/NODE/node.log) since it last started."""
    try:
        click.echo(LocalCluster(directory).log_tail(node, lines))
    except ClusterError as error:
        raise _fail(error) from None


# hastore cluster verify: the group's CommitLogs compared up to the confirm offset (verify.py)
from .verify import verify_command  # noqa: E402  (verify.py imports the supervisor, not this module)

cluster_group.add_command(verify_command)
