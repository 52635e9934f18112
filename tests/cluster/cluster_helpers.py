"""Helpers of the local cluster tests: small-store topologies, the real command line, and
process and status checks that do not go through the supervisor under test."""

from __future__ import annotations

import subprocess
import sys

import trio

from node.client import open_admin
from node.cluster.cli import topology_from_mapping

# 1 MiB segments and tiny index files: a node starts in well under a second.
SMALL_STORE = {"commitlog_segment_bytes": 1 << 20, "consume_queue_entries_per_file": 4096,
               "index_hash_slots": 1024, "index_max_entries": 8192}


STATIC = {"mode": "static"}


def small_topology(**changes):
    """The default topology (g1: master + 2 slaves) with small stores and static roles, plus
    ``changes`` (``controller={...}`` for controller mode)."""
    return topology_from_mapping({"store": dict(SMALL_STORE), "startup_timeout_s": 20, "controller": STATIC,
                                  **changes})


def hastore(*args: str, timeout_s: float = 60, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the real `hastore` command line in a child process (``env``: its whole environment)."""
    return subprocess.run([sys.executable, "-m", "node.cli", *args], capture_output=True, text=True,
                          timeout=timeout_s, env=env)


def node_status(address: str, secret: str | None = None) -> dict:
    """A node's status reply, asked with the client library."""
    async def ask() -> dict:
        with trio.fail_after(5):
            async with open_admin(address, secret=secret) as admin:
                return await admin.status()
    return trio.run(ask)


def process_alive(pid: int) -> bool:
    """Whether ``pid`` is a live (not zombie) process, read from /proc."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except FileNotFoundError:
        return False
