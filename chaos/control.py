"""The chaos run's hands on a local cluster: ``LocalControl`` (process control and proxies, for
nemeses), ``ClusterLocator`` (where clients connect), and the end-of-run I/O the checkers need
(caught-up replicas, the CommitLog bytes of each node, the final reads).

It uses LocalCluster's public methods, ZooKeeper's records through ``LocalCluster.records()``
(as the drill does) and the client library; CommitLog bytes are read from each node's store
directory (the segment files, named by their start offset), never through store code.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import trio

from node.client import open_admin
from node.cluster import ClusterError, LocalCluster

from .checkers import FinalMessage
from .errors import NemesisError, RunError

ZK_TIMEOUT_S = 5.0
READ_BATCH_COUNT = 256
SEGMENT_NAME_DIGITS = 20


class LocalControl:
    """ClusterControl over a LocalCluster (and a Toxiproxy client when proxied). Synchronous:
    call it from trio through ``trio.to_thread.run_sync``."""

    def __init__(self, cluster: LocalCluster, proxies=None) -> None:
        self.cluster = cluster
        self.proxies = proxies
        self.proxied = proxies is not None
        self.session_timeout_ms = cluster.topology.controller.session_timeout_ms

    def master(self, group: str) -> str:
        try:
            return self.cluster.current_master(group).node_id
        except Exception as error:   # NoMasterError, ClusterError: no master to fault now
            raise NemesisError(f"group {group} has no master now: {error}") from None

    def slaves(self, group: str) -> list[str]:
        master = self.master(group)
        return [spec.name for spec in self.cluster.nodes(group)
                if spec.name != master and self.cluster.pid(spec.name) is not None]

    def nodes(self) -> list[str]:
        return [spec.name for spec in self.cluster.nodes() if self.cluster.pid(spec.name) is not None]

    def active_controller(self) -> str:
        for status in self.cluster.status():
            if status.spec.kind == "controller" and status.status and status.status.get("active"):
                return status.spec.name
        raise NemesisError(f"no active controller in {self.cluster.directory}")

    def kill(self, name: str) -> None:
        self.cluster.kill(name)

    def start(self, name: str) -> None:
        self.cluster.start(name)

    def pause(self, name: str) -> None:
        self.cluster.pause(name)

    def resume(self, name: str) -> None:
        self.cluster.resume(name)

    def disable_proxy(self, name: str) -> None:
        self.proxies.disable(name)

    def enable_proxy(self, name: str) -> None:
        self.proxies.enable(name)

    def add_toxic(self, proxy: str, type: str, name: str, stream: str, attributes: dict) -> None:
        self.proxies.add_toxic(proxy, type, name=name, stream=stream, attributes=attributes)

    def remove_toxic(self, proxy: str, name: str) -> None:
        self.proxies.remove_toxic(proxy, name)

    def down_processes(self) -> list[str]:
        """Processes of the cluster not running now."""
        return [spec.name for spec in self.cluster.specs if self.cluster.pid(spec.name) is None]


class ClusterLocator:
    """Finds a group's master and slaves in ZooKeeper; ``address_of`` maps a node id to the
    address clients use (its own, or its proxy's)."""

    def __init__(self, cluster: LocalCluster, group: str, address_of=None) -> None:
        self.cluster = cluster
        self.group = group
        self.address_of = address_of or (lambda node_id: cluster.node(node_id).client_address)
        self._records = None

    async def open(self) -> None:
        try:
            self._records = await trio.to_thread.run_sync(self.cluster.records, ZK_TIMEOUT_S)
        except ClusterError as error:
            raise RunError(f"cannot connect to ZooKeeper at {self.cluster.zk_hosts}: {error}") from None

    async def aclose(self) -> None:
        await trio.to_thread.run_sync(self._records.close)

    async def master_id(self) -> str | None:
        try:
            record = await trio.to_thread.run_sync(self._records.live_master, self.group, abandon_on_cancel=True)
        except Exception:   # ControllerError (no master now), or ZooKeeper unreachable: ask again later
            return None
        return record.node_id

    async def master(self) -> str | None:
        node_id = await self.master_id()
        return self.address_of(node_id) if node_id else None

    async def slaves(self) -> list[str]:
        master = await self.master_id()
        if master is None:
            return []
        return [self.address_of(spec.name) for spec in self.cluster.nodes(self.group) if spec.name != master]


@dataclass(frozen=True, slots=True)
class ReplicaState:
    """A node's status as the end of a run found it."""

    node: str
    role: str
    max_offset: int
    confirm_offset: int | None


async def replica_states(cluster: LocalCluster, group: str, secret: str | None) -> dict[str, ReplicaState]:
    """The status of every node of ``group`` that answers."""
    states = {}
    for spec in cluster.nodes(group):
        try:
            with trio.fail_after(ZK_TIMEOUT_S):
                async with open_admin(spec.client_address, secret=secret) as admin:
                    status = await admin.status()
        except Exception:   # down or not answering: not a caught-up replica
            continue
        replication = status.get("replication", {})
        states[spec.name] = ReplicaState(spec.name, status.get("role", ""), status["store"]["max_physical_offset"],
                                         replication.get("confirm_offset"))
    return states


async def wait_caught_up(cluster: LocalCluster, group: str, secret: str | None, timeout_s: float
                         ) -> tuple[str | None, dict[str, ReplicaState]]:
    """Until one master answers and every node of the group holds its max offset (bounded);
    (the master, the last states). The master is None when none answered."""
    states: dict[str, ReplicaState] = {}
    master = None
    with trio.move_on_after(timeout_s):
        while True:
            states = await replica_states(cluster, group, secret)
            masters = [s for s in states.values() if s.role == "master"]
            master = masters[0].node if len(masters) == 1 else None
            if master and len(states) == len(cluster.nodes(group)) and all(
                    s.max_offset == states[master].max_offset for s in states.values()):
                return master, states
            await trio.sleep(0.2)
    return master, states


def commitlog_bytes(store_path: str, end_offset: int) -> tuple[int, bytes]:
    """(start offset, bytes) of the CommitLog in ``store_path`` from its first segment up to
    ``end_offset`` (or as far as the segments go). Segments are files named by their start
    offset in 20 digits; bytes past a node's max offset are preallocated zeros, so callers
    compare only up to an offset every node holds."""
    directory = os.path.join(store_path, "commitlog")
    names = sorted(name for name in os.listdir(directory) if name.isdigit() and len(name) == SEGMENT_NAME_DIGITS)
    if not names:
        return 0, b""
    base = int(names[0])
    chunks = []
    position = base
    for name in names:
        start = int(name)
        if start >= end_offset:
            break
        if start != position:
            break   # a hole between segments: stop where the contiguous log ends
        with open(os.path.join(directory, name), "rb") as handle:
            data = handle.read(end_offset - start)
        chunks.append(data)
        position = start + len(data)
    return base, b"".join(chunks)


async def read_final(address: str, topic: str, queue_count: int, *, secret: str | None,
                     group: str | None = None) -> tuple[list[FinalMessage], dict[int, int]]:
    """Every message of ``topic`` at ``address`` (all queues, min to max offset) and, when
    ``group`` is given, the group's committed offsets there."""
    messages: list[FinalMessage] = []
    async with open_admin(address, secret=secret) as admin:
        for queue_id in range(queue_count):
            offset, end = await admin.queue_offsets(topic, queue_id)
            for _ in range(1_000_000):   # bounded; each pass reads up to READ_BATCH_COUNT
                if offset >= end:
                    break
                reply = await admin.pull(topic, queue_id, offset, max_count=READ_BATCH_COUNT)
                if not reply["messages"]:
                    await trio.sleep(0.05)   # beyond the confirm offset for now
                    continue
                messages.extend(FinalMessage(m.keys[0] if m.keys else "", m.queue_id, m.queue_offset)
                                for m in reply["messages"])
                offset = reply["next_offset"]
        offsets = await admin.query_offsets(group, topic) if group else {}
    return messages, offsets
