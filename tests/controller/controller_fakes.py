"""A node-like object for the agent: it records what it is told and really refuses writes
when it may not ack them, plus the shared history of acked writes and its checker.

``FakeNode.write()`` is what a real node does at the moment it would ack a put: it acks only
if it was told it is master of an epoch and the agent's permit (``may_ack``) still holds
for that epoch. The check and the append to the history happen under the history's lock,
so the history's order is the order in which acks were granted.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from controller import AgentSettings, MasterRecord, NodeAgent

TICK_MS = 250                 # the test server grants sessions of 0.5-5 s
SESSION_TIMEOUT_MS = 2000


@dataclass(frozen=True)
class Ack:
    index: int
    node_id: str
    epoch: int
    at: float


class AckHistory:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.acks: list[Ack] = []

    def violations(self) -> list[str]:
        """Acks that break 'one master per epoch, epochs only move forward'."""
        problems = []
        owner: dict[int, str] = {}
        newest = 0
        for ack in self.acks:
            if owner.setdefault(ack.epoch, ack.node_id) != ack.node_id:
                problems.append(f"epoch {ack.epoch} acked by {owner[ack.epoch]} and {ack.node_id} (ack {ack.index})")
            if ack.epoch < newest:
                problems.append(f"ack {ack.index} by {ack.node_id} in epoch {ack.epoch} after epoch {newest}")
            newest = max(newest, ack.epoch)
        return problems

    def by_node(self, node_id: str) -> list[Ack]:
        with self.lock:
            return [ack for ack in self.acks if ack.node_id == node_id]


class FakeNode:
    """Implements the agent's AgentNode protocol; methods are called on the agent's thread.
    It embeds its agent as a node does (``agent``, not started)."""

    def __init__(self, settings: AgentSettings, history: AckHistory, *, max_offset: int = 0, epoch: int = 0,
                 priority: int = 0, clock=time.monotonic) -> None:
        self.node_id = settings.node_id
        self.history = history
        self.max_offset = max_offset
        self.epoch = epoch
        self.priority = priority
        self.role = "slave"
        self.master_id: str | None = None
        self.events: list[tuple] = []
        self._cond = threading.Condition()
        self.agent = NodeAgent(settings, self, clock=clock)

    # -- AgentNode ----------------------------------------------------------------------------
    def node_info(self) -> dict:
        return {"client_address": f"{self.node_id}.test:10911", "ha_address": f"{self.node_id}.test:10912",
                "max_offset": self.max_offset, "epoch": self.epoch, "priority": self.priority}

    def on_become_master(self, epoch: int) -> None:
        with self._cond:
            self.role, self.epoch, self.master_id = "master", epoch, self.node_id
            self.events.append(("master", epoch, time.monotonic()))
            self._cond.notify_all()

    def on_become_slave(self, epoch: int, master: MasterRecord) -> None:
        with self._cond:
            self.role, self.epoch, self.master_id = "slave", epoch, master.node_id
            self.events.append(("slave", epoch, time.monotonic(), master.node_id))
            self._cond.notify_all()

    def on_fence(self, reason: str) -> None:
        with self._cond:
            self.role = "fenced"
            self.events.append(("fence", self.epoch, time.monotonic(), reason))
            self._cond.notify_all()

    # -- the node's write path ---------------------------------------------------------------
    def write(self) -> bool:
        with self.history.lock:
            if self.role != "master" or not self.agent.may_ack(self.epoch):
                return False
            self.max_offset += 100
            self.history.acks.append(Ack(len(self.history.acks), self.node_id, self.epoch, time.monotonic()))
            return True

    def wait_for(self, predicate, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not predicate(self):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{self.node_id}: not {what} within {timeout_s} s; events {self.events}")
                self._cond.wait(min(left, 0.05))

    def became_master_at(self, epoch: int) -> float | None:
        return next((e[2] for e in self.events if e[0] == "master" and e[1] == epoch), None)


def wait_until(predicate, timeout_s: float, what: str, interval_s: float = 0.02):
    """Poll ``predicate`` until true (returned) or fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"not {what} within {timeout_s} s")
        time.sleep(interval_s)


class Writers:
    """One thread per node calling ``write()`` until stopped (bounded count and time)."""

    def __init__(self, nodes, max_writes: int = 200_000, max_seconds: float = 60.0) -> None:
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(node, max_writes, max_seconds), daemon=True)
                         for node in nodes]

    def _run(self, node: FakeNode, max_writes: int, max_seconds: float) -> None:
        deadline = time.monotonic() + max_seconds
        for _ in range(max_writes):
            if self._stop.is_set() or time.monotonic() > deadline:
                return
            node.write()
            time.sleep(0.001)

    def __enter__(self) -> "Writers":
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(5)


class Harness:
    """Starts controllers and agent-driven fake nodes for one test and stops them all at the end."""

    def __init__(self, hosts: str, cluster: str, session_timeout_ms: int, history: AckHistory | None = None) -> None:
        self.hosts = hosts
        self.cluster = cluster
        self.session_timeout_ms = session_timeout_ms
        self.history = history or AckHistory()
        self._running: list = []

    def controller(self, controller_id: str = "c1", **changes):
        from controller import Controller, ControllerSettings
        settings = dict(zk_hosts=self.hosts, cluster=self.cluster, session_timeout_ms=self.session_timeout_ms,
                        resync_interval_ms=1000, zk_timeout_s=3.0, controller_id=controller_id)
        settings.update(changes)
        instance = Controller(ControllerSettings(**settings))
        instance.start()
        self._running.append(instance)
        return instance

    def node(self, node_id: str, group: str = "g1", *, max_offset: int = 0, epoch: int = 0, priority: int = 0,
             session_timeout_ms: int | None = None, refresh_interval_ms: int = 200, clock=time.monotonic) -> FakeNode:
        settings = AgentSettings(self.hosts, self.cluster, group, node_id,
                                 session_timeout_ms=session_timeout_ms or self.session_timeout_ms,
                                 refresh_interval_ms=refresh_interval_ms, zk_timeout_s=3.0)
        node = FakeNode(settings, self.history, max_offset=max_offset, epoch=epoch, priority=priority, clock=clock)
        node.agent.start()
        self._running.append(node.agent)
        return node

    def stop(self, component) -> None:
        """Stop a controller or a node's agent (a clean shutdown: its session closes at once)."""
        component = component.agent if isinstance(component, FakeNode) else component
        self._running.remove(component)
        component.stop()

    def close(self) -> None:
        errors = []
        for component in reversed(self._running):
            try:
                component.stop()
            except Exception as error:     # keep stopping the others; report at the end
                errors.append(error)
        self._running.clear()
        if errors:
            raise errors[0]
