"""Helpers of the hostile-client tests: node processes on loopback (free ports), stopped by
pid; memory read from /proc; a config file written beside the store."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

HASTORE = [sys.executable, "-m", "node.cli"]
SMALL_STORE = {"commitlog_segment_bytes": 64 << 20, "index_hash_slots": 1024, "index_max_entries": 8192,
               "consume_queue_entries_per_file": 4096, "preallocate_next_segment": False}
READY_TIMEOUT_S = 60


def write_config(directory: Path, **changes) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    config = {"store_path": str(directory / "store"), "client_address": "127.0.0.1:0",
              "ha_address": "127.0.0.1:0", "metrics_address": "127.0.0.1:0", "store": dict(SMALL_STORE)}
    config.update(changes)
    path = directory / "node.yaml"
    path.write_text(yaml.safe_dump(config))
    os.chmod(path, 0o600)
    return path


class NodeProcess:
    """``hastore node start`` in a process of its own; ``ready`` is its first stdout line."""

    def __init__(self, config_path: Path, env: dict | None = None) -> None:
        self.log = open(config_path.parent / "node.err", "wb")
        self.process = subprocess.Popen(HASTORE + ["node", "start", "--config", str(config_path)],
                                        stdout=subprocess.PIPE, stderr=self.log,
                                        env={**os.environ, **(env or {})})
        line = self._first_line()
        self.ready = json.loads(line)
        self.client_address = self.ready["client_address"]
        self.pid = self.process.pid

    def _first_line(self) -> bytes:
        deadline = time.monotonic() + READY_TIMEOUT_S
        line = self.process.stdout.readline()  # the node prints it once serving (or exits)
        if not line or time.monotonic() > deadline:
            self.stop()
            raise AssertionError(f"node did not start: {self.stderr()}")
        return line

    def stderr(self) -> str:
        if not self.log.closed:
            self.log.flush()
        return Path(self.log.name).read_text(errors="replace")

    def rss_bytes(self) -> int:
        """Resident memory of the node process, from /proc."""
        with open(f"/proc/{self.pid}/status") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS in /proc status")

    def memory_status(self) -> dict[str, int]:
        """VmRSS, RssAnon, RssFile and VmHWM in bytes, from /proc."""
        found = {}
        with open(f"/proc/{self.pid}/status") as handle:
            for line in handle:
                name, _, value = line.partition(":")
                if name in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
                    found[name] = int(value.split()[0]) * 1024
        return found

    def stop(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=30)
        self.log.close()


def run_hastore(*args: str, timeout_s: float = 60, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(HASTORE + list(args), capture_output=True, text=True, timeout=timeout_s,
                          env={**os.environ, **(env or {})})
