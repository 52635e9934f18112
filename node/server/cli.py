"""``hastore node start`` (run one node process in the foreground) and ``hastore node
config-example`` (a commented node.yaml with every key at its default).

A node that cannot start says why in one line on stderr and exits 1: a port in use, a
store_path that is a file, not writable or on a read-only file system, ZooKeeper not
reachable, a bad config. The traceback is shown only with ``hastore --log-level debug``.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import sys

import click
import trio

from store.errors import StoreError, exception_leaves

from ..errors import NodeConfigError, NodeError
from ..wire.address import split_address
from .config import NodeConfig, config_example, config_reference, load_config, with_secret_from_environment
from .memory import return_large_buffers_to_the_system

log = logging.getLogger(__name__)


class StartError(Exception):
    """Why a node cannot start, in words a person can act on."""


# --- node ----------------------------------------------------------------------------------
@click.group("node")
def node_group() -> None:
    """Run a hastore node."""


@node_group.command("start", epilog="\b\nnode.yaml keys and their defaults (`hastore node config-example` writes "
                                    "them as a file):\n" + config_reference())
@click.option("--config", "config_path", default=None, type=click.Path(dir_okay=False),
              help="YAML config; every key has a default (listed below). Without it the node runs on the "
                   "defaults. The secret may come from HASTORE_SECRET instead of the file.")
def node_start(config_path: str | None) -> None:
    """Run a node in the foreground until SIGTERM or SIGINT (then it shuts down cleanly).

    Once serving it prints one JSON line on stdout: {"ready": true, "client_address": ...}.
    """
    try:
        config = load_config(config_path) if config_path is not None else NodeConfig()
    except NodeConfigError as error:
        raise click.ClickException(f"bad config {config_path}: {error}") from None
    config = with_secret_from_environment(config, os.environ)
    click.echo(_store_line(config, config_path), err=True)
    try:
        check_can_start(config)
        _run(config)
    except StartError as error:
        raise click.ClickException(f"node {config.node_id} cannot start: {error}") from None


@node_group.command("config-example")
def node_config_example() -> None:
    """Print a node.yaml with every key at its default and what it means."""
    click.echo(config_example(), nl=False)


def _store_line(config: NodeConfig, config_path: str | None) -> str:
    store = config.store_config()
    source = f"config {config_path}" if config_path else "no --config: defaults"
    return (f"node {config.node_id} ({source}): store in {store.store_path}, commit log segments of "
            f"{_size(store.commitlog_segment_bytes)} (store.commitlog_segment_bytes), client port "
            f"{config.client_address}")


def _size(count: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= size and count % size == 0:
            return f"{count // size} {unit}"
    return f"{count} bytes"


GIL_SWITCH_INTERVAL_S = 0.0005


def _run(config: NodeConfig) -> None:
    from .node import run_node_until_signalled

    def ready(node) -> None:
        click.echo(json.dumps({"ready": True, "node_id": config.node_id, "client_address": node.client_address,
                               "metrics_address": node.metrics_address, "role": node.role.state.role.value}))
        sys.stdout.flush()

    return_large_buffers_to_the_system()
    # a thread woken by I/O (a slave's follow thread, replication/follow_thread.py) waits at
    # most this long for the GIL while the loop's thread runs Python, not CPython's default
    # 5 ms. Sync single sends' p99 (master and two slaves, alternated pairs, measured while a
    # slave's dispatch passes still ran on its loop's thread): lower in 3 of 3 pairs with it
    # on the slaves, 4 of 7 on every node: within this machine's noise, kept for what it bounds
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    try:
        trio.run(run_node_until_signalled, config, ready)
    except Exception as error:  # one line for a person; the traceback with --log-level debug
        if logging.getLogger().isEnabledFor(logging.DEBUG):
            raise
        raise StartError(describe_failure(error, config)) from None


# --- before starting: what would fail with a traceback later ----------------------------------
def check_can_start(config: NodeConfig) -> None:
    """StartError when the store path or a listening address cannot be used."""
    _check_store_path(os.path.expanduser(config.store_path))
    for name in ("client_address", "ha_address", "metrics_address"):
        _check_port_free(name, getattr(config, name))


def _check_store_path(path: str) -> None:
    if os.path.exists(path) and not os.path.isdir(path):
        raise StartError(f"store_path {path} is a file, not a directory: point store_path at a directory")
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, f".hastore-write-check-{os.getpid()}")
        with open(probe, "wb"):
            pass
        os.unlink(probe)
    except OSError as error:
        why = {errno.EROFS: "is on a read-only file system", errno.EACCES: "is not writable by this user",
               errno.EPERM: "is not writable by this user", errno.ENOTDIR: "has a file where a directory must be",
               errno.ENOSPC: "is on a full file system"}.get(error.errno, f"cannot be written ({error.strerror})")
        raise StartError(f"store_path {path} {why}: choose a store_path this user may write") from None


def _check_port_free(name: str, address: str) -> None:
    host, port = split_address(address)
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as error:
        raise StartError(f"{name} {address}: cannot resolve {host!r} ({error.strerror})") from None
    family, kind, proto, _, where = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as trio's listeners: TIME_WAIT is no conflict
        try:
            probe.bind(where)
        except OSError as error:
            raise StartError(_bind_failure(name, address, error)) from None


def _bind_failure(name: str, address: str, error: OSError) -> str:
    if error.errno == errno.EADDRINUSE:
        return (f"{name} {address} is in use by another process: stop it (`ss -ltnp | grep :{address.rsplit(':', 1)[1]}`) "
                f"or set another port in the config")
    if error.errno == errno.EADDRNOTAVAIL:
        return f"{name} {address}: no interface of this machine has that address"
    if error.errno == errno.EACCES:
        return f"{name} {address}: ports below 1024 need privileges; pick a higher port"
    return f"{name} {address}: cannot listen: {error.strerror}"


def describe_failure(error: BaseException, config: NodeConfig) -> str:
    """One line for a failure that ended a starting or running node."""
    leaves = exception_leaves(error) if isinstance(error, BaseExceptionGroup) else [error]
    first = next((leaf for leaf in leaves if not isinstance(leaf, trio.Cancelled)), leaves[0])
    from controller.errors import ControllerError
    if isinstance(first, ControllerError):
        return (f"{first}; check zk_hosts ({config.zk_hosts}) and that ZooKeeper runs there "
                f"(`hastore controller status --zk {config.zk_hosts}`)")
    if isinstance(first, OSError) and first.errno == errno.EADDRINUSE:
        return (f"a listening port is in use (client_address {config.client_address}, ha_address "
                f"{config.ha_address}, metrics_address {config.metrics_address}): free it or change it")
    if isinstance(first, OSError):
        where = f" ({first.filename})" if first.filename else ""
        return f"{first.strerror or first}{where}; check store_path {config.store_path} and the addresses"
    if isinstance(first, (NodeError, StoreError)):
        return str(first)
    return f"{type(first).__name__}: {first} (run `hastore --log-level debug node start ...` for the traceback)"
