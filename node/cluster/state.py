"""A local cluster's state file and lock: DIR/cluster.json and DIR/cluster.lock.

cluster.json (written atomically: temp file, fsync, rename) holds::

    {"format": 1, "cluster": NAME, "directory": DIR, "topology": {...cluster.yaml...},
     "created_at_ms": ..., "processes": [ProcessSpec.to_json(), ...], "pids": {name: pid},
     "proxies": null | {"api": URL, "external": bool, "links": [ProxyLink.to_json(), ...]}}

so that any later command (another ``hastore cluster`` call, a drill, a test fixture) finds
the processes one ``up`` started. ``locked`` holds an flock on cluster.lock while a command
changes the cluster, so two commands never spawn or stop the same processes at once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
from dataclasses import dataclass
from typing import Iterator

from .topology import ClusterError

STATE_FILE = "cluster.json"
LOCK_FILE = "cluster.lock"
STATE_FORMAT = 1


@dataclass(frozen=True, slots=True)
class ProcessSpec:
    """One process of the cluster: what it is, how to run it, where it writes, how to reach it."""

    name: str                  # unique in the cluster: a node id, "zookeeper", "controller-N"
    kind: str                  # "node" | "zookeeper" | "controller" | "toxiproxy"; the key of its probe in probes.PROBES
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
    zk_address: str | None = None      # a controller's ZooKeeper itself (its --zk may be its proxy)

    @property
    def work_dir(self) -> str:
        """The directory the process runs in (its log's directory)."""
        return os.path.dirname(self.log_path)

    def to_json(self) -> dict:
        """The spec as cluster.json records it."""
        return {**dataclasses.asdict(self), "argv": list(self.argv)}

    @classmethod
    def from_json(cls, item: dict) -> "ProcessSpec":
        """A spec read back from cluster.json (unknown keys ignored)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{**{k: v for k, v in item.items() if k in names}, "argv": tuple(item["argv"])})


def read_state(path: str) -> dict | None:
    """The state in ``path``, None when there is none; ClusterError when it cannot be used."""
    try:
        with open(path, encoding="utf-8") as handle:
            state = json.load(handle)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        raise ClusterError(f"cannot read {path}: {error}; if no cluster process runs, "
                           f"remove the file") from None
    if state.get("format") != STATE_FORMAT:
        raise ClusterError(f"{path} has format {state.get('format')!r}, expected {STATE_FORMAT}")
    return state


def write_state(path: str, state: dict) -> None:
    """Replace ``path`` with ``state`` atomically."""
    write_atomically(path, json.dumps(state, indent=2) + "\n", private=True)  # its topology holds the secret


@contextlib.contextmanager
def locked(directory: str) -> Iterator[None]:
    """Hold the cluster's lock; ClusterError at once if another command holds it."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, LOCK_FILE), "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ClusterError(f"another `hastore cluster` command is changing {directory}; "
                               f"try again when it is done") from None
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def write_atomically(path: str, text: str, private: bool = False) -> None:
    """Write ``text`` to ``path`` through a temporary file, fsync and rename (mode 0600 when
    ``private``: a node config holding the cluster secret)."""
    temporary = f"{path}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    os.fchmod(fd, 0o600 if private else 0o644)  # a temporary file left behind keeps its old mode otherwise
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
