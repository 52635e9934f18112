"""LocalCluster: the processes of a local cluster, started, watched and stopped from one directory.

    cluster = LocalCluster("/tmp/c")               # the default topology, or the one DIR last ran
    cluster.up()                                   # ZooKeeper, controllers, nodes; a master per group
    cluster.current_master("g1")                   # MasterRecord from ZooKeeper (controller mode)
    cluster.wait_for_master("g1", 10, not_node="g1-n1")
    with cluster.records() as records:             # one ZooKeeper session: master records with
        records.group("g1")                        # epochs, sync-state sets, live nodes, waits
    cluster.kill("g1-n1", signal.SIGKILL)          # chaos and drills: kill -9, SIGSTOP, SIGCONT
    cluster.restart("g1-n1")
    cluster.status()                               # [ProcessStatus], a dead process is state "down"
    cluster.proxy_links()                          # a proxied cluster's proxies (proxies.py), and
    cluster.proxy_listing()                        # each one's state in the proxy server (toxics)
    cluster.down()                                 # SIGTERM, bounded wait, SIGKILL; idempotent

Directory layout::

    DIR/cluster.json          the cluster's state: topology, and per process kind, argv,
                              config/log/data paths, addresses and pid (written atomically)
    DIR/cluster.lock          flock held while a command changes the cluster
    DIR/<node>/node.yaml      the node's config, ports resolved (stable across restarts)
    DIR/<node>/node.log       its stdout and stderr, appended across restarts
    DIR/<node>/store/         its store
    DIR/zookeeper/            controller mode: conf/zoo.cfg, data/, zookeeper.log (server log
                              and JVM output)
    DIR/controller-N/         controller mode: controller.log (`hastore controller start`)
    DIR/toxiproxy/            proxied: toxiproxy.log (`hastore chaos toxiproxy serve`)
    DIR/secret                the secret taken from HASTORE_SECRET at `up` (mode 0600)

Every process is described by a ``ProcessSpec`` with a ``kind``; the start order is by
``phase`` (plan.py) and readiness is the kind's probe (probes.py):

    phase -1 toxiproxy    proxied only: answers GET /version; then every proxy is created
                          (with TOXIPROXY_URL set: that Toxiproxy, before phase 0, no process)
    phase 0  zookeeper    answers the `srvr` four-letter word, and `conf` names DIR's data
    phase 1  controller   its id is among the contenders of the cluster's controller election
    phase 2  node         answers `status` (controller mode: every node; then `up` also waits
                          until each group has an elected master)

In static mode (``controller: {mode: static}``) only nodes run: masters in phase 0, slaves
in phase 1. ``down`` stops in reverse phase order: nodes, controllers, ZooKeeper, the proxy server (or
deletes the cluster's proxies from TOXIPROXY_URL's Toxiproxy).

The pieces: state.py (cluster.json and the lock), plan.py (the specs, configs written),
processes.py (the process supervisor: spawn, signal, liveness by pid, bounded stop, shared
with NodeProcess), probes.py (readiness and status), records.py (ZooKeeper's records).

The API is synchronous (it runs short trio loops itself for the status probes); from trio
code call it through ``trio.to_thread.run_sync``. Processes start in their own session,
so they outlive the command that started them and a Ctrl-C at its terminal.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import time
from dataclasses import dataclass

import trio
from controller import MasterRecord

from ..errors import NodeConfigError
from ..server.config import load_config
from .cluster_secret import with_secret_from_environment
from .plan import plan_processes
from .probes import PROBE_TIMEOUT_S, probe_all, ready_or_failures
from .processes import KILL_WAIT_S, SupervisedProcess, log_tail, spawn, stop as stop_processes, wait_exit, wait_stopped
from .proxies import API_TIMEOUT_S, TOXIPROXY, ProxyLink, ToxiproxyAPI, client_proxies
from .records import CALL_TIMEOUT_S, ClusterRecords
from .state import STATE_FILE, STATE_FORMAT, ProcessSpec, locked, read_state, write_state
from .topology import ClusterError, ClusterTopology, default_topology, topology_from_mapping

__all__ = ["LocalCluster", "ClusterStartError", "ProcessSpec", "ProcessStatus", "StopReport"]

log = logging.getLogger(__name__)

LOG_TAIL_LINES = 40
START_MARKER = "--- hastore cluster: starting"
# The JVM exits with 128 + SIGTERM after running its shutdown hooks: that is ZooKeeper's clean stop.
CLEAN_TERM_STATUSES = {"zookeeper": (128 + signal.SIGTERM,)}


class ClusterStartError(ClusterError):
    """A process did not become ready; the cluster was torn down. ``log_tails`` by process name."""

    def __init__(self, message: str, log_tails: dict[str, str]) -> None:
        super().__init__(message)
        self.log_tails = log_tails


@dataclass(frozen=True, slots=True)
class ProcessStatus:
    """What ``status`` found about one process. ``state``: up | down | unresponsive | never started."""

    spec: ProcessSpec
    state: str
    pid: int | None
    status: dict | None        # the node's status reply when up
    error: str | None          # why it is unresponsive

    def to_json(self) -> dict:
        return {"name": self.spec.name, "kind": self.spec.kind, "group": self.spec.group,
                "configured_role": self.spec.role, "state": self.state, "pid": self.pid,
                "client_address": self.spec.client_address, "ha_address": self.spec.ha_address,
                "metrics_address": self.spec.metrics_address, "config_path": self.spec.config_path,
                "log_path": self.spec.log_path, "status": self.status, "error": self.error}


@dataclass(frozen=True, slots=True)
class StopReport:
    """How one process ended in ``down`` or ``stop``.

    ``outcome``: ``clean`` (exited on SIGTERM, no abort file), ``exited-unclean`` (exited on
    SIGTERM but left an abort file or a failure status), ``killed`` (needed SIGKILL),
    ``not running`` (already gone), ``stuck`` (survived SIGKILL: should never happen).
    """

    name: str
    pid: int | None
    outcome: str
    seconds: float
    abort_file: bool           # the store's abort file after the stop: next start recovers abnormally
    exit_status: int | None    # known only for processes this object started

    @property
    def clean(self) -> bool:
        return self.outcome == "clean"

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "clean": self.clean}


class LocalCluster:
    """The processes of one cluster directory. See the module docstring."""

    def __init__(self, directory: str, topology: ClusterTopology | None = None) -> None:
        """``topology`` None: the one ``directory`` last ran (from cluster.json), else the default."""
        self.directory = os.path.abspath(directory)
        self.state_path = os.path.join(self.directory, STATE_FILE)
        self._state = read_state(self.state_path)
        if topology is None:
            topology = (topology_from_mapping(self._state["topology"]) if self._state else default_topology())
        self.topology = topology
        self._children: dict[str, SupervisedProcess] = {}
        self._secrets: dict[str, str | None] = {}

    # --- views -------------------------------------------------------------------------------
    @property
    def specs(self) -> list[ProcessSpec]:
        """Every process recorded in cluster.json (empty before the first ``up``)."""
        return [ProcessSpec.from_json(item) for item in (self._state or {}).get("processes", [])]

    def node(self, name: str) -> ProcessSpec:
        """The recorded process named ``name`` (a node id)."""
        for spec in self.specs:
            if spec.name == name:
                return spec
        known = ", ".join(spec.name for spec in self.specs) or "none: the cluster was never started here"
        raise ClusterError(f"no process {name!r} in {self.directory} (processes: {known})")

    @property
    def zk_hosts(self) -> str:
        """ZooKeeper's connect string (controller mode); ClusterError in static mode."""
        for spec in self.specs:
            if spec.kind == "zookeeper":
                return spec.client_address
        raise ClusterError(f"the cluster in {self.directory} runs no ZooKeeper (static roles, or never started)")

    def nodes(self, group: str | None = None) -> list[ProcessSpec]:
        """The node processes (of ``group`` when given), in topology order."""
        return [spec for spec in self.specs if spec.kind == "node" and group in (None, spec.group)]

    # --- proxies (a proxied cluster, proxies.py) ---------------------------------------------
    @property
    def proxied(self) -> bool:
        """Whether the cluster that last ran here routes every link through a proxy."""
        return bool((self._state or {}).get("proxies"))

    @property
    def proxy_api_url(self) -> str | None:
        """The URL of the Toxiproxy API holding this cluster's proxies; None when not proxied."""
        return ((self._state or {}).get("proxies") or {}).get("api")

    def proxy_links(self) -> list[ProxyLink]:
        """The cluster's proxies as planned (name, upstream, kind, owner, peer, listen)."""
        return [ProxyLink.from_json(item) for item in ((self._state or {}).get("proxies") or {}).get("links", [])]

    def advertised_client_address(self, name: str) -> str:
        """Where clients are told to reach node ``name``: its client proxy in a proxied cluster
        (the ``advertised_client_address`` of its node.yaml), else its client address."""
        return client_proxies(self.proxy_links()).get(name) or self.node(name).client_address

    def proxy_listing(self, timeout_s: float = API_TIMEOUT_S) -> list[dict]:
        """Each proxy as the server holds it now (name, listen, upstream, enabled, toxics), with
        its kind, owner and peer; ClusterError when the server does not answer."""
        found = ToxiproxyAPI(self.proxy_api_url, timeout_s).proxies() if self.proxied else {}
        listing = []
        for link in self.proxy_links():
            held = found.get(link.name)
            listing.append({**link.to_json(), "present": held is not None,
                            "enabled": bool(held and held.get("enabled")),
                            "toxics": (held or {}).get("toxics") or []})
        return listing

    def _create_proxies(self) -> None:
        """Create every proxy of the plan on the proxy server (replacing any of the same name)."""
        ToxiproxyAPI(self.proxy_api_url).populate(self.proxy_links())

    def _delete_external_proxies(self) -> None:
        """``down`` with TOXIPROXY_URL's Toxiproxy: remove the cluster's proxies from it."""
        proxies = (self._state or {}).get("proxies") or {}
        if not proxies.get("external"):
            return
        api = ToxiproxyAPI(proxies["api"])
        try:
            held = api.proxies()
            for link in self.proxy_links():
                if link.name in held:
                    api.delete(link.name)
        except ClusterError as error:   # the cluster is down all the same; the proxies outlive it
            log.warning("could not remove the cluster's proxies from %s: %s", proxies["api"], error)

    # --- ZooKeeper's records (controller mode) -------------------------------------------------
    def records(self, call_timeout_s: float = CALL_TIMEOUT_S) -> ClusterRecords:
        """An open ZooKeeper session reading this cluster's records (master records with their
        epochs, sync-state sets, live nodes; waits for a master). Close it, or use it in ``with``.
        ClusterError when ZooKeeper does not answer within ``call_timeout_s``."""
        return ClusterRecords(self.zk_hosts, self.topology.cluster, call_timeout_s=call_timeout_s).open(call_timeout_s)

    def current_master(self, group: str = "g1", timeout_s: float = CALL_TIMEOUT_S) -> MasterRecord:
        """The group's live master as ZooKeeper records it. Raises controller's NoMasterError
        when it has none (its ``reason`` says why), ClusterError when ZooKeeper does not answer."""
        with ClusterRecords(self.zk_hosts, self.topology.cluster, call_timeout_s=timeout_s,
                            session_timeout_ms=max(2000, int(timeout_s * 1000))).open(timeout_s) as records:
            return records.live_master(group)

    def wait_for_master(self, group: str, timeout_s: float, not_node: str | None = None) -> MasterRecord:
        """Poll ZooKeeper until ``group`` has a live master (other than ``not_node``); its record.
        ClusterError after ``timeout_s``, naming the controller's last reason."""
        try:
            records = self.records(max(0.5, min(CALL_TIMEOUT_S, timeout_s)))
        except ClusterError as error:
            raise ClusterError(f"group {group} has no master{' other than ' + not_node if not_node else ''} "
                               f"after {timeout_s:g} s: {error}") from None
        with records:
            return records.wait_for_master(group, timeout_s, not_node)

    def master(self, group: str = "g1") -> ProcessSpec:
        """``group``'s master: in controller mode the one ZooKeeper names now, else the
        process configured as master (static role)."""
        if self.topology.controller.enabled:
            return self.node(self.current_master(group).node_id)
        for spec in self.specs:
            if spec.kind == "node" and spec.group == group and spec.role == "master":
                return spec
        raise ClusterError(f"no master of group {group!r} in {self.directory}")

    # --- processes ---------------------------------------------------------------------------
    def pid(self, name: str) -> int | None:
        """The pid of ``name`` when it is running, else None."""
        self.node(name)
        process = self._process(name)
        return process.pid if process is not None and process.alive() else None

    def running(self) -> list[str]:
        """Names of the processes alive now."""
        return [spec.name for spec in self.specs if self.pid(spec.name) is not None]

    def log_tail(self, name: str, lines: int = LOG_TAIL_LINES) -> str:
        """The last ``lines`` lines ``name`` logged since it was last started."""
        return log_tail(self.node(name).log_path, lines=lines, after=START_MARKER)

    # --- up ------------------------------------------------------------------------------------
    def up(self) -> list[ProcessSpec]:
        """Write every node's config and start all processes, phase by phase, each phase ready
        (answering ``status``) within the topology's startup_timeout_s before the next starts.
        Refused while any process of this directory runs. On failure every process is stopped
        and ClusterStartError carries the log tails."""
        os.makedirs(self.directory, exist_ok=True)
        with locked(self.directory):
            self._state = read_state(self.state_path)
            alive = self.running()
            if alive:
                listing = ", ".join(f"{name} (pid {self.pid(name)})" for name in alive)
                raise ClusterError(f"a cluster is already running in {self.directory}: {listing}; "
                                   f"stop it first with `hastore cluster down --dir {self.directory}`")
            self.topology = with_secret_from_environment(self.topology, self.directory, os.environ)
            plan = plan_processes(self.directory, self.topology, self.specs, (self._state or {}).get("proxies"))
            specs = plan.processes
            self._state = {"format": STATE_FORMAT, "cluster": self.topology.cluster, "directory": self.directory,
                           "topology": self.topology.source, "created_at_ms": int(time.time() * 1000),
                           "processes": [spec.to_json() for spec in specs], "pids": {}, "proxies": plan.proxies}
            self._write_state()
            try:
                if plan.proxies and plan.proxies["external"]:
                    self._create_proxies()
                for phase in sorted({spec.phase for spec in specs}):
                    batch = [spec for spec in specs if spec.phase == phase]
                    for spec in batch:
                        self._spawn(spec)
                    self._wait_ready(batch)
                    if any(spec.kind == TOXIPROXY for spec in batch):
                        self._create_proxies()
                if self.topology.controller.enabled:
                    self._wait_for_masters(time.monotonic() + self.topology.startup_timeout_s)
            except BaseException:
                self._stop_all()
                self._delete_external_proxies()
                raise
        return specs

    def _wait_for_masters(self, deadline: float) -> None:
        """Controller mode: every group has a live master by ``deadline``, else ClusterStartError."""
        missing = {}
        for group in self.topology.groups:
            try:
                self.wait_for_master(group.name, max(0.1, deadline - time.monotonic()))
            except ClusterError as error:
                missing[group.name] = str(error)
        if missing:
            names = [spec.name for spec in self.specs if spec.kind == "controller"]
            tails = {name: self.log_tail(name) for name in names}
            text = "; ".join(f"group {group}: {why}" for group, why in missing.items())
            raise ClusterStartError(f"the cluster in {self.directory} did not start: {text}", tails)

    def _spawn(self, spec: ProcessSpec) -> None:
        header = f"{START_MARKER} {spec.kind} {spec.name} at {time.strftime('%Y-%m-%d %H:%M:%S')} ---"
        process = spawn(spec.argv, spec.log_path, header=header, detached=True, work_dir=spec.work_dir,
                        env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self._children[spec.name] = process
        self._state["pids"][spec.name] = process.pid
        self._write_state()

    def _wait_ready(self, specs: list[ProcessSpec]) -> None:
        deadline = time.monotonic() + self.topology.startup_timeout_s
        failures = trio.run(ready_or_failures, specs, self._children, self._secret, deadline,
                            self.topology.startup_timeout_s)
        if failures:
            tails = {name: self.log_tail(name) for name in failures}
            text = "; ".join(f"{name} {why}" for name, why in failures.items())
            raise ClusterStartError(f"the cluster in {self.directory} did not start: {text}", tails)

    # --- down / stop -----------------------------------------------------------------------
    def down(self) -> list[StopReport]:
        """Stop every process: SIGTERM, wait up to shutdown_timeout_s, then SIGKILL. Works when
        some already died, and again when all are gone (every report then says ``not running``)."""
        if not os.path.exists(self.state_path):
            return []
        with locked(self.directory):
            self._state = read_state(self.state_path)
            reports = self._stop_all()
            self._delete_external_proxies()
            return reports

    def stop(self, name: str) -> StopReport:
        """Stop one process as ``down`` does."""
        with locked(self.directory):
            self._state = read_state(self.state_path)
            return self._stop_many([self.node(name)])[0]

    def _stop_all(self) -> list[StopReport]:
        # Reverse start order, one phase at a time: nodes leave ZooKeeper while it still runs,
        # then the controllers, then ZooKeeper (static mode: slaves, then masters).
        reports = []
        for phase in sorted({spec.phase for spec in self.specs}, reverse=True):
            reports += self._stop_many([spec for spec in self.specs if spec.phase == phase])
        return reports

    def _stop_many(self, specs: list[ProcessSpec]) -> list[StopReport]:
        started = time.monotonic()
        pids = {spec.name: self.pid(spec.name) for spec in specs}
        running = [spec.name for spec in specs if pids[spec.name] is not None]
        endings = dict(zip(running, stop_processes([self._process(name) for name in running],
                                                   self.topology.shutdown_timeout_s, KILL_WAIT_S)))
        reports = []
        for spec in specs:
            pid, ending = pids[spec.name], endings.get(spec.name)
            abort = os.path.exists(os.path.join(spec.data_path, "abort"))
            status = self._children[spec.name].exit_status if spec.name in self._children else None
            if ending is None:
                outcome, seconds = "not running", 0.0
            elif ending.exited_at is None:
                outcome, seconds = "stuck", time.monotonic() - started
            else:
                seconds = ending.exited_at - started
                if ending.killed:
                    outcome = "killed"
                elif abort or status not in (None, 0, *CLEAN_TERM_STATUSES.get(spec.kind, ())):
                    outcome = "exited-unclean"
                else:
                    outcome = "clean"
            if ending is None or ending.exited_at is not None:
                self._state["pids"].pop(spec.name, None)
                self._children.pop(spec.name, None)
            reports.append(StopReport(spec.name, pid, outcome, round(seconds, 3), abort, status))
        self._write_state()
        return reports

    # --- process control for drills and chaos ----------------------------------------------
    def kill(self, name: str, sig: int = signal.SIGKILL) -> int:
        """Send ``sig`` to ``name`` (default SIGKILL); its pid. ClusterError if it is not running."""
        pid = self.pid(name)
        if pid is None:
            raise ClusterError(f"{name} is not running in {self.directory}")
        os.kill(pid, sig)
        if sig == signal.SIGKILL:
            wait_exit([self._process(name)], KILL_WAIT_S)
        return pid

    def pause(self, name: str) -> int:
        """SIGSTOP: the process holds its sockets but answers nothing (a hung node). Returns
        once every thread of it has stopped (ClusterError if that takes over KILL_WAIT_S)."""
        return self._signal_and_wait(name, stopped=True)

    def resume(self, name: str) -> int:
        """SIGCONT after ``pause``; returns once no thread of it is stopped any more."""
        return self._signal_and_wait(name, stopped=False)

    def _signal_and_wait(self, name: str, *, stopped: bool) -> int:
        """SIGSTOP (``stopped``) or SIGCONT, then wait until every thread of the process is
        stopped, or none is; its pid, or ClusterError after KILL_WAIT_S."""
        sig, failed = (signal.SIGSTOP, "did not stop") if stopped else (signal.SIGCONT, "did not go on")
        pid = self.kill(name, sig)
        if not wait_stopped(pid, stopped, KILL_WAIT_S):
            raise ClusterError(f"{name} (pid {pid}) {failed} within {KILL_WAIT_S:g} s of {sig.name}")
        return pid

    def start(self, name: str) -> ProcessSpec:
        """Start ``name`` again with its recorded config (same ports) and wait until it is ready."""
        with locked(self.directory):
            self._state = read_state(self.state_path)
            spec = self.node(name)
            if self.pid(name) is not None:
                raise ClusterError(f"{name} is already running (pid {self.pid(name)})")
            self._spawn(spec)
            try:
                self._wait_ready([spec])
                if spec.kind == TOXIPROXY:   # a new server holds no proxy yet
                    self._create_proxies()
            except ClusterError:
                self._stop_many([spec])
                raise
        return spec

    def restart(self, name: str) -> tuple[StopReport, ProcessSpec]:
        """Stop ``name`` if it runs (SIGTERM, then SIGKILL), start it again and wait until it is ready."""
        report = self.stop(name)
        return report, self.start(name)

    # --- status ------------------------------------------------------------------------------
    def status(self, timeout_s: float = PROBE_TIMEOUT_S) -> list[ProcessStatus]:
        """Every process's state and, for live ones, its status reply (probed concurrently)."""
        specs = self.specs
        pids = {spec.name: self.pid(spec.name) for spec in specs}
        found = trio.run(probe_all, [spec for spec in specs if pids[spec.name] is not None], self._secret, timeout_s)
        result = []
        for spec in specs:
            pid = pids[spec.name]
            if pid is None:
                never = spec.name not in (self._state or {}).get("pids", {}) and not os.path.exists(spec.data_path)
                result.append(ProcessStatus(spec, "never started" if never else "down", None, None, None))
                continue
            status, error = found[spec.name]
            result.append(ProcessStatus(spec, "up" if status else "unresponsive", pid, status, error))
        return result

    # --- context manager: always torn down -----------------------------------------------------
    def __enter__(self) -> "LocalCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.down()

    # --- internals ---------------------------------------------------------------------------
    def _process(self, name: str) -> SupervisedProcess | None:
        """The recorded process ``name``, alive or not: our own child when we started it, else
        the pid from cluster.json, identified by its config path or work directory."""
        pid = (self._state or {}).get("pids", {}).get(name)
        if pid is None:
            return None
        child = self._children.get(name)
        if child is not None and child.pid == pid:
            return child
        spec = self.node(name)
        return SupervisedProcess.adopt(pid, spec.config_path, spec.work_dir)

    def _secret(self, spec: ProcessSpec) -> str | None:
        if spec.kind != "node":
            return None
        if spec.name not in self._secrets:
            try:
                self._secrets[spec.name] = load_config(spec.config_path).secret
            except NodeConfigError:
                self._secrets[spec.name] = self.topology.secret
        return self._secrets[spec.name]

    def _write_state(self) -> None:
        write_state(self.state_path, self._state)
