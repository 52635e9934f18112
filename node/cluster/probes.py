"""Probing a local cluster's processes: one readiness/status probe per process kind, and the
concurrent loops ``up`` and ``status`` run them in.

    zookeeper    answers the `srvr` four-letter word, and `conf` names the cluster's data directory
    controller   its id is among the contenders of the cluster's controller election
    node         answers `status` with its own node id
    toxiproxy    answers GET /version (a proxied cluster's proxy server)

A probe returns the process's status as a dict, or raises one of ``PROBE_FAILURES`` (or
ClusterError) saying why it is not ready; ``probe`` turns that into ``(None, why)``.
"""

from __future__ import annotations

import time
from typing import Awaitable, Callable, Mapping

import trio

from ..client import open_admin
from ..errors import NodeError
from ..wire.address import split_address
from .processes import SupervisedProcess
from .proxies import ToxiproxyAPI
from .records import ClusterRecords
from .state import ProcessSpec
from .topology import ClusterError

PROBE_INTERVAL_S = 0.1
PROBE_TIMEOUT_S = 2.0
FOUR_LETTER_REPLY_CHUNKS_MAX = 256   # replies are a few hundred bytes; the server closes after one

SecretOf = Callable[[ProcessSpec], "str | None"]


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
        for _ in range(FOUR_LETTER_REPLY_CHUNKS_MAX):
            chunk = await stream.receive_some(4096)
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


async def probe_controller(spec: ProcessSpec, secret: str | None, timeout_s: float) -> dict:
    """The controller's id is among the contenders of its cluster's election (the first leads)."""
    zk_hosts, cluster, controller_id = (_argv_value(spec.argv, flag) for flag in ("--zk", "--cluster", "--id"))
    zk_hosts = spec.zk_address or zk_hosts   # ZooKeeper itself, not the controller's proxy to it
    contenders = await trio.to_thread.run_sync(_election_contenders, zk_hosts, cluster, timeout_s,
                                               abandon_on_cancel=True)
    if controller_id not in contenders:
        raise ClusterError(f"controller {controller_id} has not joined the election of cluster {cluster} "
                           f"(contenders: {', '.join(contenders) or 'none'})")
    return {"controller_id": controller_id, "active": contenders[0] == controller_id, "contenders": contenders}


def _election_contenders(zk_hosts: str, cluster: str, timeout_s: float) -> list[str]:
    with ClusterRecords(zk_hosts, cluster, call_timeout_s=timeout_s).open(timeout_s) as records:
        return records.election_contenders()


async def probe_toxiproxy(spec: ProcessSpec, secret: str | None, timeout_s: float) -> dict:
    """The proxy server's version, from its REST API."""
    api = ToxiproxyAPI(spec.client_address, timeout_s)
    version = await trio.to_thread.run_sync(api.version, abandon_on_cancel=True)
    return {"version": version, "url": api.url}


def _argv_value(argv: tuple[str, ...], flag: str) -> str:
    return argv[argv.index(flag) + 1]


PROBES: dict[str, Callable[[ProcessSpec, str | None, float], Awaitable[dict]]] = {
    "node": probe_node, "zookeeper": probe_zookeeper, "controller": probe_controller, "toxiproxy": probe_toxiproxy}
PROBE_FAILURES = (NodeError, OSError, trio.TooSlowError)


async def probe(spec: ProcessSpec, secret: str | None, timeout_s: float) -> tuple[dict | None, str | None]:
    """(status, None) or (None, why not)."""
    try:
        return await PROBES[spec.kind](spec, secret, timeout_s), None
    except PROBE_FAILURES as error:
        return None, f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    except BaseExceptionGroup as group:
        matched, rest = group.split(PROBE_FAILURES)
        if rest is not None:
            raise
        return None, "; ".join(str(e) for e in matched.exceptions)


async def probe_all(specs: list[ProcessSpec], secret_of: SecretOf,
                    timeout_s: float) -> dict[str, tuple[dict | None, str | None]]:
    """Probe every spec concurrently; name -> ``probe``'s answer."""
    found: dict[str, tuple[dict | None, str | None]] = {}

    async def one(spec: ProcessSpec) -> None:
        found[spec.name] = await probe(spec, secret_of(spec), timeout_s)
    async with trio.open_nursery() as nursery:
        for spec in specs:
            nursery.start_soon(one, spec)
    return found


async def ready_or_failures(specs: list[ProcessSpec], processes: Mapping[str, SupervisedProcess],
                            secret_of: SecretOf, deadline: float, startup_timeout_s: float) -> dict[str, str]:
    """Probe ``specs`` every PROBE_INTERVAL_S until each answers, one exits (its process in
    ``processes``) or ``deadline`` (time.monotonic()) passes; name -> why, for those not ready."""
    pending = {spec.name: spec for spec in specs}
    failures: dict[str, str] = {}
    last_error: dict[str, str] = {}
    for _ in range(int(startup_timeout_s / PROBE_INTERVAL_S) + 2):
        for name in list(pending):
            process = processes[name]
            if not process.alive():
                failures[name] = f"exited with status {process.exit_status} before it was ready"
                del pending[name]
        probe_timeout_s = min(PROBE_TIMEOUT_S, max(0.2, deadline - time.monotonic()))
        found = await probe_all(list(pending.values()), secret_of, probe_timeout_s)
        for name, (status, error) in found.items():
            if status is not None:
                del pending[name]
            else:
                last_error[name] = error
        if not pending or failures or time.monotonic() >= deadline:
            break
        await trio.sleep(PROBE_INTERVAL_S)
    for name in pending:
        failures[name] = (f"did not answer status within {startup_timeout_s:g} s "
                          f"(last: {last_error.get(name, 'no probe')})")
    return failures
