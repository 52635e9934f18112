"""A node as its own process: ``hastore node start --config FILE`` on loopback.

    with NodeProcess.start(directory, {"flush": "async"}) as node:
        node.client_address               # "127.0.0.1:PORT", read from the node's ready line
    # left the block: SIGTERM, then SIGKILL if the node is not gone within stop_timeout_s

The demo, the benchmarks and tests use it so that a client and the node it talks to are
two processes, as they are in production. The node's stderr goes to a file in the
directory and is quoted in the error when the node fails to start or to stop. Spawning,
the ready line and the bounded stop are the process supervisor's (processes.py), the same
one LocalCluster runs its processes with.
"""

from __future__ import annotations

import os
import sys

import yaml

from ..errors import NodeProcessError
from .processes import SupervisedProcess, log_tail, read_ready_line, spawn, stop_child
from .topology import free_ports

READY_TIMEOUT_S = 60
STOP_TIMEOUT_S = 30
STDERR_TAIL_BYTES = 4000

__all__ = ["NodeProcess", "free_port", "stderr_tail"]


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now, below the ephemeral range (``free_ports``)."""
    return free_ports(host, 1)[0]


def stderr_tail(path: str, limit_bytes: int = STDERR_TAIL_BYTES) -> str:
    """The last bytes of a node's stderr log, as text ('' when there is none)."""
    return log_tail(path, bytes_max=limit_bytes, missing="")


class NodeProcess:
    """One running ``hastore node start`` process and what it reported when ready."""

    def __init__(self, supervised: SupervisedProcess, ready: dict, config_path: str, store_path: str,
                 stderr_path: str) -> None:
        self.supervised = supervised
        self.process = supervised.popen
        self.ready = ready
        self.config_path = config_path
        self.store_path = store_path
        self.stderr_path = stderr_path
        self.exit_status: int | None = None

    @property
    def client_address(self) -> str:
        return self.ready["client_address"]

    @property
    def pid(self) -> int:
        return self.process.pid

    @classmethod
    def start(cls, directory: str, config: dict | None = None, *, python_options: tuple[str, ...] = (),
              ready_timeout_s: float = READY_TIMEOUT_S) -> "NodeProcess":
        """Write ``directory``/node.yaml (loopback, a free client port, the store in
        ``directory``/store, then ``config`` on top) and run a node with it until it serves.

        ``python_options`` go between the interpreter and ``-m node.cli`` (for instance
        ``("-m", "cProfile", "-o", "node.prof")`` to profile the node).
        """
        os.makedirs(directory, exist_ok=True)
        settings = {"node_id": "n1", "store_path": os.path.join(directory, "store"),
                    "client_address": f"127.0.0.1:{free_port()}", "metrics_address": "127.0.0.1:0",
                    "ha_address": f"127.0.0.1:{free_port()}",
                    **(config or {})}
        config_path = os.path.join(directory, "node.yaml")
        with open(config_path, "w", encoding="utf-8") as handle:
            yaml.safe_dump(settings, handle)
        stderr_path = os.path.join(directory, "node.stderr.log")
        # -P: the caller's working directory is not put on the node's sys.path (``-m`` would put
        # it first, ahead of PYTHONPATH: a node started from a checkout ran that checkout's code)
        command = [sys.executable, "-P", *python_options, "-m", "node.cli", "node", "start", "--config", config_path]
        process = spawn(command, stderr_path, append=False, ready_pipe=True)
        try:
            ready = read_ready_line(process, ready_timeout_s)
        except BaseException as error:
            try:
                stop_child(process, 5)
            finally:
                process.close()
            if isinstance(error, NodeProcessError):
                raise NodeProcessError(f"node did not start: {error}\n{stderr_tail(stderr_path)}") from None
            raise
        return cls(process, ready, config_path, os.path.expanduser(settings["store_path"]), stderr_path)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM (SIGKILL after ``timeout_s``); the exit status, 0 after a clean shutdown."""
        if self.exit_status is None:
            try:
                self.exit_status = stop_child(self.supervised, timeout_s, STOP_TIMEOUT_S)
            finally:
                self.supervised.close()
        return self.exit_status

    def stopped_cleanly(self) -> bool:
        """Exit status 0 and no abort file left in the store (the store shut down cleanly)."""
        return self.exit_status == 0 and not os.path.exists(os.path.join(self.store_path, "abort"))

    def stderr_tail(self) -> str:
        return stderr_tail(self.stderr_path)

    def __enter__(self) -> "NodeProcess":
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()
