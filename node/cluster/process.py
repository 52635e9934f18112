"""A node as its own process: ``hastore node start --config FILE`` on loopback.

    with NodeProcess.start(directory, {"flush": "async"}) as node:
        node.client_address               # "127.0.0.1:PORT", read from the node's ready line
    # left the block: SIGTERM, then SIGKILL if the node is not gone within stop_timeout_s

The demo, the benchmarks and tests use it so that a client and the node it talks to are
two processes, as they are in production. The node's stderr goes to a file in the
directory and is quoted in the error when the node fails to start or to stop.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time

import yaml

from ..errors import NodeProcessError

READY_TIMEOUT_S = 60
STOP_TIMEOUT_S = 30
READY_LINE_BYTES_MAX = 64 * 1024
STDERR_TAIL_BYTES = 4000


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now (the OS picks it)."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def stderr_tail(path: str, limit_bytes: int = STDERR_TAIL_BYTES) -> str:
    """The last bytes of a log file, as text ('' when there is none)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, os.path.getsize(path) - limit_bytes))
            return handle.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def read_ready_line(process: subprocess.Popen, timeout_s: float) -> dict:
    """The JSON line a process prints on stdout once it serves; NodeProcessError if none in time."""
    deadline = time.monotonic() + timeout_s
    fd = process.stdout.fileno()
    line = b""
    while not line.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise NodeProcessError(f"no ready line within {timeout_s} s")
        readable, _, _ = select.select([fd], [], [], remaining)
        if not readable:
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            raise NodeProcessError(f"the process exited before it was ready (exit status {process.wait(5)})")
        line += chunk
        if len(line) > READY_LINE_BYTES_MAX:
            raise NodeProcessError("the ready line is too long: not a node's ready line")
    try:
        return json.loads(line)
    except ValueError:
        raise NodeProcessError(f"the ready line is not JSON: {line[:200]!r}") from None


def stop_process(process: subprocess.Popen, timeout_s: float = STOP_TIMEOUT_S) -> int:
    """SIGTERM, wait up to ``timeout_s``, then SIGKILL; returns the exit status (-9 when killed)."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            return process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
    return process.wait(STOP_TIMEOUT_S)


class NodeProcess:
    """One running ``hastore node start`` process and what it reported when ready."""

    def __init__(self, process: subprocess.Popen, ready: dict, config_path: str, store_path: str,
                 stderr_path: str) -> None:
        self.process = process
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
        command = [sys.executable, *python_options, "-m", "node.cli", "node", "start", "--config", config_path]
        with open(stderr_path, "wb") as stderr:
            process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, stdin=subprocess.DEVNULL)
        try:
            ready = read_ready_line(process, ready_timeout_s)
        except BaseException as error:
            stop_process(process, 5)
            process.stdout.close()
            if isinstance(error, NodeProcessError):
                raise NodeProcessError(f"node did not start: {error}\n{stderr_tail(stderr_path)}") from None
            raise
        return cls(process, ready, config_path, os.path.expanduser(settings["store_path"]), stderr_path)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM (SIGKILL after ``timeout_s``); the exit status, 0 after a clean shutdown."""
        if self.exit_status is None:
            try:
                self.exit_status = stop_process(self.process, timeout_s)
            finally:
                self.process.stdout.close()
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
