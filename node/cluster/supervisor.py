"""LocalCluster: the processes of a local cluster, started, watched and stopped from one directory.

    cluster = LocalCluster("/tmp/c")               # the default topology, or the one DIR last ran
    cluster.up()                                   # ZooKeeper, controllers, nodes; a master per group
    cluster.current_master("g1")                   # MasterRecord from ZooKeeper (controller mode)
    cluster.wait_for_master("g1", 10, not_node="g1-n1")
    cluster.kill("g1-n1", signal.SIGKILL)          # chaos and drills: kill -9, SIGSTOP, SIGCONT
    cluster.restart("g1-n1")
    cluster.status()                               # [ProcessStatus], a dead process is state "down"
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

Every process is described by a ``ProcessSpec`` with a ``kind``; the start order is by
``phase`` and readiness is the kind's probe (``PROBES``):

    phase 0  zookeeper    answers the `srvr` four-letter word, and `conf` names DIR's data
    phase 1  controller   its id is among the contenders of the cluster's controller election
    phase 2  node         answers `status` (controller mode: every node; then `up` also waits
                          until each group has an elected master)

In static mode (``controller: {mode: static}``) only nodes run: masters in phase 0, slaves
in phase 1. ``down`` stops in reverse phase order: nodes, controllers, ZooKeeper.

The API is synchronous (it runs short trio loops itself for the status probes); from trio
code call it through ``trio.to_thread.run_sync``. Processes start in their own session,
so they outlive the command that started them and a Ctrl-C at its terminal.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Awaitable, Callable

import trio
import yaml
from controller import MasterRecord, ZooKeeperServer, layout, znodes
from controller.errors import ControllerError, NoMasterError, ZooKeeperServerError

from ..client import open_admin
from .topology import (ClusterError, ClusterTopology, NodePorts, assign_ports, default_topology, free_ports,
                               port_is_free, topology_from_mapping)
from ..server.config import load_config
from ..wire.address import split_address
from ..errors import NodeConfigError, NodeError

STATE_FILE = "cluster.json"
LOCK_FILE = "cluster.lock"
STATE_FORMAT = 1
PROBE_INTERVAL_S = 0.1
PROBE_TIMEOUT_S = 2.0
EXIT_POLL_INTERVAL_S = 0.05
KILL_WAIT_S = 5.0
LOG_TAIL_LINES = 40
START_MARKER = "--- hastore cluster: starting"
ZOOKEEPER = "zookeeper"
MASTER_POLL_INTERVAL_S = 0.05
ZK_CALL_TIMEOUT_S = 5.0


class ClusterStartError(ClusterError):
    """A process did not become ready; the cluster was torn down. ``log_tails`` by process name."""

    def __init__(self, message: str, log_tails: dict[str, str]) -> None:
        super().__init__(message)
        self.log_tails = log_tails


@dataclass(frozen=True, slots=True)
class ProcessSpec:
    """One process of the cluster: what it is, how to run it, where it writes, how to reach it."""

    name: str                  # unique in the cluster: a node id, "zookeeper", "controller-N"
    kind: str                  # "node" | "zookeeper" | "controller"; the key of its probe in PROBES
    phase: int                 # start order: every process of a phase starts, then all must be ready
    argv: tuple[str, ...]
    config_path: str           # node.yaml, zoo.cfg; a controller's directory (it has no config file)
    log_path: str
    data_path: str             # the store directory (its abort file tells a crash from a clean stop)
    group: str | None = None
    role: str | None = None    # the static role of a node (controller mode: the preferred master)
    client_address: str | None = None  # a node's client address; ZooKeeper's host:port
    ha_address: str | None = None
    metrics_address: str | None = None

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "argv": list(self.argv)}

    @classmethod
    def from_json(cls, item: dict) -> "ProcessSpec":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{**{k: v for k, v in item.items() if k in names}, "argv": tuple(item["argv"])})


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


# --- readiness / status probes, one per process kind ----------------------------------------
async def probe_node(spec: ProcessSpec, secret: str | None, timeout_s: float) -> dict:
    """The node's status reply; raises NodeError/OSError/TooSlowError when it does not answer."""
    with trio.fail_after(timeout_s):
        async with open_admin(spec.client_address, secret=secret) as admin:
            status = await admin.status()
    if status.get("node_id") != spec.name:
        raise ClusterError(f"{spec.client_address} is answered by node {status.get('node_id')!r}, "
                           f"not {spec.name!r} (another process holds the port?)")
    return status


async def probe_zookeeper(spec: ProcessSpec, secret: str | None, timeout_s: float) -> dict:
    """ZooKeeper's mode and counters from `srvr`; ClusterError if `conf` names another data directory."""
    with trio.fail_after(timeout_s):
        srvr = await _four_letter_word(spec.client_address, b"srvr")
        conf = await _four_letter_word(spec.client_address, b"conf")
    if "Mode:" not in srvr:
        raise ClusterError(f"ZooKeeper at {spec.client_address} is not serving yet ({srvr.strip()[:80]!r})")
    if f"dataDir={spec.data_path}" not in conf:
        raise ClusterError(f"{spec.client_address} is answered by another ZooKeeper (not data {spec.data_path})")
    fields = dict(line.split(": ", 1) for line in srvr.splitlines() if ": " in line)
    return {"mode": fields.get("Mode"), "zxid": fields.get("Zxid"), "connections": fields.get("Connections"),
            "zk_hosts": spec.client_address}


async def _four_letter_word(address: str, word: bytes) -> str:
    host, port = split_address(address)
    stream = await trio.open_tcp_stream(host, port)
    async with stream:
        await stream.send_all(word)
        chunks = []
        for _ in range(256):  # replies are a few hundred bytes; the server closes after one
            chunk = await stream.receive_some(4096)
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


async def probe_controller(spec: ProcessSpec, secret: str | None, timeout_s: float) -> dict:
    """The controller's id is among the contenders of its cluster's election (the first leads)."""
    zk_hosts, cluster, controller_id = (_argv_value(spec.argv, flag) for flag in ("--zk", "--cluster", "--id"))
    contenders = await trio.to_thread.run_sync(_election_contenders, zk_hosts, cluster, timeout_s,
                                               abandon_on_cancel=True)
    if controller_id not in contenders:
        raise ClusterError(f"controller {controller_id} has not joined the election of cluster {cluster} "
                           f"(contenders: {', '.join(contenders) or 'none'})")
    return {"controller_id": controller_id, "active": contenders[0] == controller_id, "contenders": contenders}


def _election_contenders(zk_hosts: str, cluster: str, timeout_s: float) -> list[str]:
    """Contender ids of the controller election, leader first."""
    client = znodes.make_client(zk_hosts, session_timeout_ms=4000)
    try:
        client.start(timeout=timeout_s)
        path = layout.election_path(cluster)
        names = sorted(znodes.children_or_empty(client, path, timeout_s), key=lambda name: name[-10:])
        ids = []
        for name in names:
            data, _ = znodes.get_or_none(client, f"{path}/{name}", timeout_s)
            if data is not None:
                ids.append(data.decode(errors="replace"))
        return ids
    except Exception as error:  # kazoo's own timeout and connection types
        raise ClusterError(f"ZooKeeper at {zk_hosts}: {type(error).__name__}: {error}") from None
    finally:
        client.stop()
        client.close()


def _argv_value(argv: tuple[str, ...], flag: str) -> str:
    return argv[argv.index(flag) + 1]


PROBES: dict[str, Callable[[ProcessSpec, str | None, float], Awaitable[dict]]] = {
    "node": probe_node, "zookeeper": probe_zookeeper, "controller": probe_controller}
_PROBE_FAILURES = (NodeError, OSError, trio.TooSlowError)


async def _probe(spec: ProcessSpec, secret: str | None, timeout_s: float) -> tuple[dict | None, str | None]:
    """(status, None) or (None, why not)."""
    try:
        return await PROBES[spec.kind](spec, secret, timeout_s), None
    except _PROBE_FAILURES as error:
        return None, f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    except BaseExceptionGroup as group:
        matched, rest = group.split(_PROBE_FAILURES)
        if rest is not None:
            raise
        return None, "; ".join(str(e) for e in matched.exceptions)


# --- the cluster -----------------------------------------------------------------------------
class LocalCluster:
    """The processes of one cluster directory. See the module docstring."""

    def __init__(self, directory: str, topology: ClusterTopology | None = None) -> None:
        """``topology`` None: the one ``directory`` last ran (from cluster.json), else the default."""
        self.directory = os.path.abspath(directory)
        self.state_path = os.path.join(self.directory, STATE_FILE)
        self._state = self._read_state()
        if topology is None:
            topology = (topology_from_mapping(self._state["topology"]) if self._state else default_topology())
        self.topology = topology
        self._children: dict[str, subprocess.Popen] = {}
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

    def current_master(self, group: str = "g1", timeout_s: float = ZK_CALL_TIMEOUT_S) -> MasterRecord:
        """The group's live master as ZooKeeper records it. Raises controller's NoMasterError
        when it has none (its ``reason`` says why), ClusterError when ZooKeeper does not answer."""
        try:
            return znodes.find_master(self.zk_hosts, self.topology.cluster, group, timeout_s)
        except NoMasterError:
            raise
        except ControllerError as error:
            raise ClusterError(f"cannot read group {group}'s master: {error}") from None

    def wait_for_master(self, group: str, timeout_s: float, not_node: str | None = None) -> MasterRecord:
        """Poll ZooKeeper until ``group`` has a live master (other than ``not_node``); its record.
        ClusterError after ``timeout_s``, naming the controller's last reason."""
        deadline = time.monotonic() + timeout_s
        client = znodes.make_client(self.zk_hosts, session_timeout_ms=4000)
        last = "ZooKeeper did not answer"
        try:
            client.start(timeout=max(0.5, min(ZK_CALL_TIMEOUT_S, timeout_s)))
            for _ in range(int(timeout_s / MASTER_POLL_INTERVAL_S) + 2):
                try:
                    record = znodes.find_master_with_client(client, self.topology.cluster, group,
                                                            ZK_CALL_TIMEOUT_S)
                    if record.node_id != not_node:
                        return record
                    last = f"the master is still {not_node} (epoch {record.epoch})"
                except ControllerError as error:
                    last = str(error)
                if time.monotonic() >= deadline:
                    break
                time.sleep(MASTER_POLL_INTERVAL_S)
        except Exception as error:  # kazoo's connect timeout has its own type
            if isinstance(error, ClusterError):
                raise
            last = f"{type(error).__name__}: {error}"
        finally:
            client.stop()
            client.close()
        raise ClusterError(f"group {group} has no master{' other than ' + not_node if not_node else ''} "
                           f"after {timeout_s:g} s: {last}")

    def master(self, group: str = "g1") -> ProcessSpec:
        """``group``'s master: in controller mode the one ZooKeeper names now, else the
        process configured as master (static role)."""
        if self.topology.controller.enabled:
            return self.node(self.current_master(group).node_id)
        for spec in self.specs:
            if spec.kind == "node" and spec.group == group and spec.role == "master":
                return spec
        raise ClusterError(f"no master of group {group!r} in {self.directory}")

    def pid(self, name: str) -> int | None:
        """The pid of ``name`` when it is running, else None."""
        self.node(name)
        pid = self._pids().get(name)
        return pid if pid is not None and self._alive(name, pid) else None

    def running(self) -> list[str]:
        """Names of the processes alive now."""
        return [spec.name for spec in self.specs if self.pid(spec.name) is not None]

    def log_tail(self, name: str, lines: int = LOG_TAIL_LINES) -> str:
        """The last ``lines`` lines ``name`` logged since it was last started."""
        return _log_tail(self.node(name).log_path, lines)

    # --- up ------------------------------------------------------------------------------------
    def up(self) -> list[ProcessSpec]:
        """Write every node's config and start all processes, phase by phase, each phase ready
        (answering ``status``) within the topology's startup_timeout_s before the next starts.
        Refused while any process of this directory runs. On failure every process is stopped
        and ClusterStartError carries the log tails."""
        os.makedirs(self.directory, exist_ok=True)
        with self._locked():
            self._state = self._read_state()
            alive = self.running()
            if alive:
                listing = ", ".join(f"{name} (pid {self.pid(name)})" for name in alive)
                raise ClusterError(f"a cluster is already running in {self.directory}: {listing}; "
                                   f"stop it first with `hastore cluster down --dir {self.directory}`")
            specs = self._plan_processes()
            self._state = {"format": STATE_FORMAT, "cluster": self.topology.cluster, "directory": self.directory,
                           "topology": self.topology.source, "created_at_ms": int(time.time() * 1000),
                           "processes": [spec.to_json() for spec in specs], "pids": {}}
            self._write_state()
            try:
                for phase in sorted({spec.phase for spec in specs}):
                    batch = [spec for spec in specs if spec.phase == phase]
                    for spec in batch:
                        self._spawn(spec)
                    self._wait_ready(batch)
                if self.topology.controller.enabled:
                    self._wait_for_masters(time.monotonic() + self.topology.startup_timeout_s)
            except BaseException:
                self._stop_all()
                raise
        return specs

    def _plan_processes(self) -> list[ProcessSpec]:
        """Every process's spec, with configs written: ZooKeeper and controllers (controller mode), nodes."""
        if not self.topology.controller.enabled:
            return self._write_node_configs(None, node_phase=None)
        zookeeper = self._zookeeper_spec()
        controllers = [self._controller_spec(index, zookeeper.client_address)
                       for index in range(1, self.topology.controller.controllers + 1)]
        return [zookeeper, *controllers, *self._write_node_configs(zookeeper.client_address, node_phase=2)]

    def _zookeeper_spec(self) -> ProcessSpec:
        settings = self.topology.controller
        base_dir = os.path.join(self.directory, ZOOKEEPER)
        previous = next((spec for spec in self.specs if spec.kind == "zookeeper"), None)
        if settings.zookeeper_port:
            port = settings.zookeeper_port
            if not port_is_free("127.0.0.1", port):
                raise ClusterError(f"ZooKeeper's port {port} on 127.0.0.1 is in use; free it or set "
                                   f"controller.zookeeper.port to another port (0: a free one)")
        elif previous and port_is_free("127.0.0.1", split_address(previous.client_address)[1]):
            port = split_address(previous.client_address)[1]
        else:
            taken = {p for spec in self.specs if spec.kind == "node"
                     for p in (split_address(a)[1] for a in (spec.client_address, spec.ha_address,
                                                            spec.metrics_address))}
            port = free_ports("127.0.0.1", 1, exclude=taken)[0]
        try:
            argv = ZooKeeperServer(base_dir, port, settings.zookeeper_tick_ms).launch_command(port)
        except ZooKeeperServerError as error:
            raise ClusterError(f"controller mode needs ZooKeeper: {error}; or set `controller: {{mode: static}}` "
                               f"in cluster.yaml") from None
        return ProcessSpec(name=ZOOKEEPER, kind="zookeeper", phase=0, argv=tuple(argv),
                           config_path=os.path.join(base_dir, "conf", "zoo.cfg"),
                           log_path=os.path.join(base_dir, "zookeeper.log"), data_path=os.path.join(base_dir, "data"),
                           client_address=f"127.0.0.1:{port}")

    def _controller_spec(self, index: int, zk_hosts: str) -> ProcessSpec:
        settings = self.topology.controller
        name = f"controller-{index}"
        base_dir = os.path.join(self.directory, name)
        os.makedirs(base_dir, exist_ok=True)
        argv = (*_hastore_argv(), "controller", "start", "--zk", zk_hosts, "--cluster", self.topology.cluster,
                "--session-timeout-ms", str(settings.session_timeout_ms), "--id", name,
                *(("--enable-elect-unclean-master",) if settings.enable_elect_unclean_master else ()))
        return ProcessSpec(name=name, kind="controller", phase=1, argv=argv, config_path=base_dir,
                           log_path=os.path.join(base_dir, "controller.log"), data_path=base_dir)

    def _write_node_configs(self, zk_hosts: str | None, node_phase: int | None) -> list[ProcessSpec]:
        previous = {spec.name: NodePorts(*(split_address(a)[1] for a in
                                           (spec.client_address, spec.ha_address, spec.metrics_address)))
                    for spec in self.specs if spec.kind == "node"}
        ports = assign_ports(self.topology, previous)
        if zk_hosts is not None and split_address(zk_hosts)[1] in {p for n in ports.values() for p in n.as_list()}:
            raise ClusterError(f"ZooKeeper's port {zk_hosts} is also given to a node; choose other ports")
        specs = []
        for node in self.topology.nodes:
            node_dir = os.path.join(self.directory, node.node_id)
            os.makedirs(node_dir, exist_ok=True)
            config_path = os.path.join(node_dir, "node.yaml")
            store_path = os.path.join(node_dir, "store")
            mapping = self.topology.node_config(node, ports, store_path, zk_hosts=zk_hosts)
            _write_atomically(config_path, "# written by `hastore cluster up`; rewritten at every up\n"
                              + yaml.safe_dump(mapping, sort_keys=False), private=self.topology.secret is not None)
            phase = node_phase if node_phase is not None else (0 if node.role == "master" else 1)
            specs.append(ProcessSpec(
                name=node.node_id, kind="node", phase=phase,
                argv=(*_hastore_argv(), "node", "start", "--config", config_path), config_path=config_path,
                log_path=os.path.join(node_dir, "node.log"), data_path=store_path, group=node.group,
                role=node.role, client_address=mapping["client_address"], ha_address=mapping["ha_address"],
                metrics_address=mapping["metrics_address"]))
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
            tails = {name: _log_tail(self.node(name).log_path, LOG_TAIL_LINES) for name in names}
            text = "; ".join(f"group {group}: {why}" for group, why in missing.items())
            raise ClusterStartError(f"the cluster in {self.directory} did not start: {text}", tails)

    def _spawn(self, spec: ProcessSpec) -> None:
        with open(spec.log_path, "ab") as log:
            log.write(f"{START_MARKER} {spec.kind} {spec.name} at {time.strftime('%Y-%m-%d %H:%M:%S')} ---\n"
                      .encode())
            log.flush()
            process = subprocess.Popen(spec.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True, cwd=os.path.dirname(spec.log_path),
                                       env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self._children[spec.name] = process
        self._state["pids"][spec.name] = process.pid
        self._write_state()

    def _wait_ready(self, specs: list[ProcessSpec]) -> None:
        deadline = time.monotonic() + self.topology.startup_timeout_s
        failures = trio.run(self._ready_or_failures, specs, deadline)
        if failures:
            tails = {name: _log_tail(self.node(name).log_path, LOG_TAIL_LINES) for name in failures}
            text = "; ".join(f"{name} {why}" for name, why in failures.items())
            raise ClusterStartError(f"the cluster in {self.directory} did not start: {text}", tails)

    async def _ready_or_failures(self, specs: list[ProcessSpec], deadline: float) -> dict[str, str]:
        pending = {spec.name: spec for spec in specs}
        failures: dict[str, str] = {}
        last_error: dict[str, str] = {}
        rounds_max = int(self.topology.startup_timeout_s / PROBE_INTERVAL_S) + 2
        for _ in range(rounds_max):
            for name in list(pending):
                process = self._children[name]
                if process.poll() is not None:
                    failures[name] = f"exited with status {process.returncode} before it was ready"
                    del pending[name]
            probe_timeout_s = min(PROBE_TIMEOUT_S, max(0.2, deadline - time.monotonic()))

            async def probe(spec: ProcessSpec) -> None:
                status, error = await _probe(spec, self._secret(spec), probe_timeout_s)
                if status is not None:
                    del pending[spec.name]
                else:
                    last_error[spec.name] = error
            async with trio.open_nursery() as nursery:
                for spec in list(pending.values()):
                    nursery.start_soon(probe, spec)
            if not pending or failures or time.monotonic() >= deadline:
                break
            await trio.sleep(PROBE_INTERVAL_S)
        for name in pending:
            failures[name] = (f"did not answer status within {self.topology.startup_timeout_s:g} s "
                              f"(last: {last_error.get(name, 'no probe')})")
        return failures

    # --- down / stop -----------------------------------------------------------------------
    def down(self) -> list[StopReport]:
        """Stop every process: SIGTERM, wait up to shutdown_timeout_s, then SIGKILL. Works when
        some already died, and again when all are gone (every report then says ``not running``)."""
        if not os.path.exists(self.state_path):
            return []
        with self._locked():
            self._state = self._read_state()
            return self._stop_all()

    def stop(self, name: str) -> StopReport:
        """Stop one process as ``down`` does."""
        with self._locked():
            self._state = self._read_state()
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
        for spec in specs:
            if pids[spec.name] is not None:
                _signal(pids[spec.name], signal.SIGCONT)  # a paused process cannot act on SIGTERM
                _signal(pids[spec.name], signal.SIGTERM)
        exited = self._wait_exit([s.name for s in specs if pids[s.name]], self.topology.shutdown_timeout_s)
        killed = [spec.name for spec in specs if pids[spec.name] and spec.name not in exited]
        for name in killed:
            _signal(pids[name], signal.SIGKILL)
        exited.update(self._wait_exit(killed, KILL_WAIT_S))
        reports = []
        for spec in specs:
            pid = pids[spec.name]
            abort = os.path.exists(os.path.join(spec.data_path, "abort"))
            status = self._children[spec.name].returncode if spec.name in self._children else None
            if pid is None:
                outcome, seconds = "not running", 0.0
            elif spec.name not in exited:
                outcome, seconds = "stuck", time.monotonic() - started
            else:
                seconds = exited[spec.name] - started
                if spec.name in killed:
                    outcome = "killed"
                elif abort or status not in (None, 0, *_CLEAN_TERM_STATUSES.get(spec.kind, ())):
                    outcome = "exited-unclean"
                else:
                    outcome = "clean"
            if pid is None or spec.name in exited:
                self._state["pids"].pop(spec.name, None)
                self._children.pop(spec.name, None)
            reports.append(StopReport(spec.name, pid, outcome, round(seconds, 3), abort, status))
        self._write_state()
        return reports

    def _wait_exit(self, names: list[str], timeout_s: float) -> dict[str, float]:
        """Poll until each of ``names`` has exited or ``timeout_s`` passes; name -> exit time."""
        exited: dict[str, float] = {}
        deadline = time.monotonic() + timeout_s
        for _ in range(int(timeout_s / EXIT_POLL_INTERVAL_S) + 2):
            for name in names:
                if name not in exited and self.pid(name) is None:
                    exited[name] = time.monotonic()
            if len(exited) == len(names) or time.monotonic() >= deadline:
                break
            time.sleep(EXIT_POLL_INTERVAL_S)
        return exited

    # --- process control for drills and chaos ----------------------------------------------
    def kill(self, name: str, sig: int = signal.SIGKILL) -> int:
        """Send ``sig`` to ``name`` (default SIGKILL); its pid. ClusterError if it is not running."""
        pid = self.pid(name)
        if pid is None:
            raise ClusterError(f"{name} is not running in {self.directory}")
        os.kill(pid, sig)
        if sig == signal.SIGKILL:
            self._wait_exit([name], KILL_WAIT_S)
        return pid

    def pause(self, name: str) -> int:
        """SIGSTOP: the process holds its sockets but answers nothing (a hung node)."""
        return self.kill(name, signal.SIGSTOP)

    def resume(self, name: str) -> int:
        """SIGCONT after ``pause``."""
        return self.kill(name, signal.SIGCONT)

    def start(self, name: str) -> ProcessSpec:
        """Start ``name`` again with its recorded config (same ports) and wait until it is ready."""
        with self._locked():
            self._state = self._read_state()
            spec = self.node(name)
            if self.pid(name) is not None:
                raise ClusterError(f"{name} is already running (pid {self.pid(name)})")
            self._spawn(spec)
            try:
                self._wait_ready([spec])
            except ClusterStartError:
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

        async def probe_all() -> dict[str, tuple[dict | None, str | None]]:
            found: dict[str, tuple[dict | None, str | None]] = {}

            async def one(spec: ProcessSpec) -> None:
                found[spec.name] = await _probe(spec, self._secret(spec), timeout_s)
            async with trio.open_nursery() as nursery:
                for spec in specs:
                    if pids[spec.name] is not None:
                        nursery.start_soon(one, spec)
            return found

        found = trio.run(probe_all)
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
    def _pids(self) -> dict[str, int]:
        return dict((self._state or {}).get("pids", {}))

    def _alive(self, name: str, pid: int) -> bool:
        process = self._children.get(name)
        if process is not None and process.pid == pid:
            return process.poll() is None
        spec = self.node(name)
        return _process_alive(pid, spec.config_path, os.path.dirname(spec.log_path))

    def _secret(self, spec: ProcessSpec) -> str | None:
        if spec.kind != "node":
            return None
        if spec.name not in self._secrets:
            try:
                self._secrets[spec.name] = load_config(spec.config_path).secret
            except NodeConfigError:
                self._secrets[spec.name] = self.topology.secret
        return self._secrets[spec.name]

    def _read_state(self) -> dict | None:
        try:
            with open(self.state_path, encoding="utf-8") as handle:
                state = json.load(handle)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as error:
            raise ClusterError(f"cannot read {self.state_path}: {error}; if no cluster process runs, "
                               f"remove the file") from None
        if state.get("format") != STATE_FORMAT:
            raise ClusterError(f"{self.state_path} has format {state.get('format')!r}, expected {STATE_FORMAT}")
        return state

    def _write_state(self) -> None:
        _write_atomically(self.state_path, json.dumps(self._state, indent=2) + "\n")

    @contextlib.contextmanager
    def _locked(self):
        os.makedirs(self.directory, exist_ok=True)
        with open(os.path.join(self.directory, LOCK_FILE), "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise ClusterError(f"another `hastore cluster` command is changing {self.directory}; "
                                   f"try again when it is done") from None
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)


# --- helpers ---------------------------------------------------------------------------------
# The JVM exits with 128 + SIGTERM after running its shutdown hooks: that is ZooKeeper's clean stop.
_CLEAN_TERM_STATUSES = {"zookeeper": (128 + signal.SIGTERM,)}



def _hastore_argv() -> tuple[str, ...]:
    """How to run the hastore CLI: the script beside this interpreter, else ``python -m node.cli``."""
    script = shutil.which("hastore", path=os.path.dirname(sys.executable))
    return (script,) if script else (sys.executable, "-m", "node.cli")


def _process_alive(pid: int, config_path: str, work_dir: str) -> bool:
    """Whether ``pid`` runs and is the process started with ``config_path`` in its argv, or
    (a controller, which has no config file) started in ``work_dir`` (pids get reused)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            state = handle.read().rsplit(b")", 1)[1].split()[0]
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            argv = handle.read().split(b"\0")
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except (FileNotFoundError, ProcessLookupError, PermissionError, IndexError):
        return False
    if state in (b"Z", b"X"):
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # our own zombie (started by another LocalCluster here): reap it
        return False
    return os.fsencode(config_path) in argv or cwd == work_dir


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _log_tail(path: str, lines: int) -> str:
    """The last ``lines`` lines of ``path`` after its last start marker (reads at most 256 KiB)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 256 * 1024))
            text = handle.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return f"(no log at {path})"
    marker = text.rfind(START_MARKER)
    if marker >= 0:
        text = text[marker:]
    return "\n".join(text.splitlines()[-lines:])


def _write_atomically(path: str, text: str, private: bool = False) -> None:
    temporary = f"{path}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
