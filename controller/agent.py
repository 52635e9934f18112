"""The node agent: a node's presence in ZooKeeper, its role assignments and its write fence.

The node embeds one NodeAgent and gives it an object implementing ``AgentNode``:

    class AgentNode(Protocol):
        def node_info(self) -> dict                    # client_address, ha_address, max_offset,
                                                       # epoch, priority
        def on_become_master(self, epoch: int) -> None
        def on_become_slave(self, epoch: int, master: MasterRecord) -> None
        def on_fence(self, reason: str) -> None

All four are called on the agent's own worker thread (named ``hastore-agent-{node_id}``),
one at a time, in the order the agent decided them; never on a kazoo thread and never on
the node's trio thread. They must return promptly: a trio node hands them over with
``trio_token.run_sync_soon(...)`` (or ``trio.from_thread.run_sync``) and does the work of
the role change in its own tasks. ``node_info`` must be safe to call from that thread (it
reads a few integers). Assignments are level-triggered: after a fence, the current
assignment is told again, so ``on_become_master(epoch)`` may repeat an epoch the node
already holds and means "you may resume acking in this epoch".

The fence does not wait for a callback. ``may_ack(epoch)`` is the synchronous check the
node makes at the moment it acks a write: it is true only while

    - the ZooKeeper session is CONNECTED (the permit is revoked inside kazoo's state
      listener, the instant the session is SUSPENDED or LOST), and
    - the master znode, read since the last reconnection, names this node, this session and
      ``epoch`` (a newer epoch in the master znode revokes it as soon as it is read), and
    - that read began less than a lease ago: two thirds of the session timeout. A process
      stopped for longer (SIGSTOP, a stall) may have lost its session without kazoo knowing
      yet, and a new master may be acking; after such a pause the permit is gone until a
      fresh read of the master znode confirms the epoch again. The ZooKeeper server expires
      a session no sooner than a session timeout after the last request it received, so a
      lease measured from a read's start ends before any successor can be elected. A
      master renews it by reading the master znode every third of a lease.

``on_fence(reason)`` follows on the worker thread to let the node drop its master state
(only a node that was told it is master is fenced: slaves ack nothing). A master that the
master znode deposes (another node, newer epoch) is told ``on_become_slave`` directly, its
permit already gone.
After a reconnection the agent re-reads the master znode before it grants the permit again.

``update_sync_state_set(members)`` is the master's way of persisting its sync-state set; it
blocks for up to ``zk_timeout_s`` (call it from a worker thread) and raises
DeposedMasterError if the master znode moved since this node became master.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable, Protocol

from kazoo.client import KazooState
from kazoo.exceptions import KazooException, NodeExistsError, NoNodeError

from . import layout, znodes
from .errors import DeposedMasterError, FencedError, ZooKeeperUnavailableError
from .layout import MasterRecord, NodeRecord, SyncStateSet

log = logging.getLogger(__name__)

_RETRY_BACKOFF_S = 0.1
# the permit's lease, as a fraction of the session timeout (the rest is margin for clock rates)
LEASE_FRACTION = 2 / 3


class AgentNode(Protocol):
    """What the agent needs from the node (see the module docstring for threads)."""

    def node_info(self) -> dict: ...

    def on_become_master(self, epoch: int) -> None: ...

    def on_become_slave(self, epoch: int, master: MasterRecord) -> None: ...

    def on_fence(self, reason: str) -> None: ...


@dataclass(frozen=True, slots=True)
class AgentSettings:
    zk_hosts: str
    cluster: str
    group: str
    node_id: str
    session_timeout_ms: int = 6000
    refresh_interval_ms: int = 1000
    zk_timeout_s: float = 5.0


@dataclass(frozen=True, slots=True)
class _Permit:
    epoch: int
    master_version: int
    lease_until_s: float     # on the agent's clock: the confirming read's start plus a lease


@dataclass(frozen=True, slots=True)
class AgentStatistics:
    node_id: str
    zk_state: str
    session_id: int | None
    registered: bool
    assignment: str                   # "master", "slave", "fenced" or "none"
    epoch: int | None
    master_node_id: str | None
    write_permit_epoch: int | None
    fences: int
    waiting_reason: str | None


class NodeAgent:
    """Registers one node, follows its group's master znode and fences its writes."""

    def __init__(self, settings: AgentSettings, node: AgentNode, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``clock``: seconds on a clock that keeps running while the process is stopped
        (CLOCK_MONOTONIC does), for the permit's lease."""
        self.settings = settings
        self._node = node
        self._clock = clock
        self._lease_s = settings.session_timeout_ms / 1000 * LEASE_FRACTION
        self.client = znodes.make_client(settings.zk_hosts, settings.session_timeout_ms)
        self._paths = (layout.node_path(settings.cluster, settings.group, settings.node_id),
                       layout.master_path(settings.cluster, settings.group))
        self._permit_lock = threading.Lock()
        self._permit: _Permit | None = None
        self._zk_state = KazooState.LOST
        self._generation = 0             # bumped on every connection state change
        self._cond = threading.Condition()
        self._pending_fence: str | None = None
        self._need_register = True
        self._need_master_read = True
        self._registered_session: int | None = None
        self._written_info: tuple | None = None
        self._told: tuple = ("none",)
        self._fences = 0
        self._waiting_reason: str | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Connect, register and start following the master znode (ZooKeeperUnavailableError if
        ZooKeeper does not answer within ``zk_timeout_s``)."""
        self.client.add_listener(self._on_state)
        znodes.start_client(self.client, self.settings.zk_timeout_s, f"node {self.settings.node_id}")
        znodes.ensure_path(self.client, layout.nodes_path(self.settings.cluster, self.settings.group),
                           self.settings.zk_timeout_s)
        self.client.DataWatch(self._paths[1], self._on_master_changed)
        self._thread = threading.Thread(target=self._work, name=f"hastore-agent-{self.settings.node_id}",
                                        daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Revoke the permit, close the session (the node znode goes at once) and stop the thread."""
        self._revoke()
        self._stopping.set()
        with self._cond:
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)
            assert not self._thread.is_alive(), "agent thread did not stop"
        self.client.stop()
        self.client.close()

    def __enter__(self) -> "NodeAgent":
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    # -- the node's side ----------------------------------------------------------------------

    def may_ack(self, epoch: int) -> bool:
        """True while this node may ack writes as master of ``epoch`` (any thread, never blocks)."""
        permit = self._permit
        return permit is not None and permit.epoch == epoch and self._clock() < permit.lease_until_s

    def write_permit(self) -> int | None:
        """The epoch this node may ack writes in, or None (no permit, or its lease ran out)."""
        permit = self._permit
        return permit.epoch if permit is not None and self._clock() < permit.lease_until_s else None

    def check_write_permit(self, epoch: int) -> None:
        """Raise FencedError unless ``may_ack(epoch)``."""
        if not self.may_ack(epoch):
            raise FencedError(f"node {self.settings.node_id} may not ack writes in epoch {epoch}: "
                              f"{self._fence_reason()}")

    def update_sync_state_set(self, members) -> SyncStateSet:
        """Persist the sync-state set as this node's master term knows it (blocking)."""
        members = set(members)
        if self.settings.node_id not in members:
            raise ValueError(f"the sync-state set must contain the master {self.settings.node_id}: {sorted(members)}")
        permit = self._permit
        if permit is None or self._clock() >= permit.lease_until_s:
            raise FencedError(f"node {self.settings.node_id} cannot update the sync-state set: "
                              f"{self._fence_reason()}")
        try:
            return znodes.update_sync_state_set(self.client, self.settings.cluster, self.settings.group, members,
                                                permit.epoch, permit.master_version, self.settings.zk_timeout_s)
        except DeposedMasterError:
            self._revoke_if(permit)
            self._mark(master_read=True)
            raise

    @property
    def session_id(self) -> int | None:
        client_id = self.client.client_id
        return client_id[0] if client_id else None

    def statistics(self) -> AgentStatistics:
        told = self._told
        return AgentStatistics(self.settings.node_id, str(self._zk_state), self.session_id,
                               self._registered_session is not None and self._registered_session == self.session_id,
                               told[0], told[1] if len(told) > 1 else None,
                               told[2] if told[0] == "slave" else (self.settings.node_id if told[0] == "master" else None),
                               self.write_permit(), self._fences, self._waiting_reason)

    # -- kazoo callbacks (kazoo's threads: revoke synchronously, defer the rest) -----------

    def _on_state(self, state: str) -> None:
        with self._permit_lock:
            self._generation += 1
            self._zk_state = state
            had_permit = self._permit is not None
            self._permit = None        # SUSPENDED/LOST: fence now; CONNECTED: re-read before unfencing
        with self._cond:
            if state != KazooState.CONNECTED:
                self._pending_fence = f"ZooKeeper session {state.lower()}"
                if had_permit:
                    log.warning("node %s: fenced: ZooKeeper session %s", self.settings.node_id, state.lower())
            if state == KazooState.LOST:
                self._need_register = True
            if state == KazooState.CONNECTED:
                self._need_master_read = True
                self._need_register = True
            self._cond.notify_all()

    def _on_master_changed(self, _data, _stat, *_event) -> bool:
        self._mark(master_read=True)
        return not self._stopping.is_set()

    # -- the worker thread -------------------------------------------------------------------

    def _mark(self, master_read: bool = False) -> None:
        with self._cond:
            self._need_master_read = self._need_master_read or master_read
            self._cond.notify_all()

    def _work(self) -> None:
        try:
            self._work_until_stopped()
        except BaseException:
            # a bug, not an operating failure: never leave a dead agent holding the write permit
            self._revoke()
            log.exception("node %s: agent thread crashed; the node is fenced for good", self.settings.node_id)
            raise

    def _work_until_stopped(self) -> None:
        # Runs until stop(); each pass handles what is pending, then waits at most one interval.
        interval_s = self.settings.refresh_interval_ms / 1000
        while not self._stopping.is_set():
            # a master renews its lease: it reads the master znode every third of a lease
            renewing = self._told[0] == "master"
            with self._cond:
                if self._pending_fence is None and not self._need_master_read and not self._need_register:
                    self._cond.wait(min(interval_s, self._lease_s / 3) if renewing else interval_s)
                fence, self._pending_fence = self._pending_fence, None
                register, master_read = self._need_register, self._need_master_read or renewing
                self._need_register = self._need_master_read = False
            if self._stopping.is_set():
                return
            if fence is not None:
                self._tell_fenced(fence)
            if self._zk_state != KazooState.CONNECTED:
                continue
            try:
                self._register_or_refresh(register)
                if master_read:
                    self._follow_master()
            except (ZooKeeperUnavailableError, KazooException) as error:
                log.info("node %s: ZooKeeper call failed (%s); will retry", self.settings.node_id, error)
                with self._cond:
                    self._need_register = self._need_register or register
                    self._need_master_read = self._need_master_read or master_read
                self._stopping.wait(_RETRY_BACKOFF_S)

    def _register_or_refresh(self, register: bool) -> None:
        info = self._node_record()
        key = (info.client_address, info.ha_address, info.max_offset, info.epoch, info.priority)
        session = self.session_id
        path = self._paths[0]
        timeout_s = self.settings.zk_timeout_s
        if register or self._registered_session != session:
            try:
                znodes.wait(self.client.create_async(path, layout.encode(info), ephemeral=True), timeout_s,
                            f"create {path}")
            except NodeExistsError:
                _, stat = znodes.get_or_none(self.client, path, timeout_s)
                if stat is not None and stat.ephemeralOwner != session:
                    # an earlier process of this node id, whose session has not expired yet
                    self._waiting_reason = (f"node znode {path} is held by session {stat.ephemeralOwner:#x}; "
                                            f"waiting for it to expire")
                    self._registered_session = None
                    with self._cond:
                        self._need_register = True
                    self._stopping.wait(_RETRY_BACKOFF_S)
                    return
                if stat is None:
                    with self._cond:
                        self._need_register = True
                    return
            self._registered_session = session
            self._waiting_reason = None
            self._written_info = None
            with self._cond:
                self._need_master_read = True    # whether we are master depends on this session
        if key == self._written_info:
            return
        try:
            znodes.wait(self.client.set_async(path, layout.encode(info)), timeout_s, f"set {path}")
        except NoNodeError:
            with self._cond:
                self._need_register = True
            return
        self._written_info = key

    def _node_record(self) -> NodeRecord:
        info = self._node.node_info()
        return NodeRecord(self.settings.node_id, str(info["client_address"]), str(info.get("ha_address", "")),
                          int(info["max_offset"]), int(info["epoch"]), int(info.get("priority", 0)), layout.now_ms())

    def _follow_master(self) -> None:
        with self._permit_lock:
            generation = self._generation
        started_s = self._clock()  # the lease runs from before the read: the session lived then
        data, stat = znodes.get_or_none(self.client, self._paths[1], self.settings.zk_timeout_s)
        record = layout.decode(MasterRecord, data, self._paths[1]) if data is not None else None
        session = self.session_id
        me = self.settings.node_id
        if record is not None and record.node_id == me and record.session_id == session \
                and self._registered_session == session:
            with self._permit_lock:
                if generation != self._generation or self._zk_state != KazooState.CONNECTED:
                    return        # the connection moved while we read: the state listener asked for a re-read
                self._permit = _Permit(record.epoch, stat.version, started_s + self._lease_s)
            if self._told != ("master", record.epoch):
                self._told = ("master", record.epoch)
                log.warning("node %s: master in epoch %d", me, record.epoch)
                self._node.on_become_master(record.epoch)
            return
        self._revoke()
        if record is not None and record.node_id != me:
            assignment = ("slave", record.epoch, record.node_id)
            if self._told != assignment:
                self._told = assignment
                self._node.on_become_slave(record.epoch, record)
            return
        why = ("no master has been elected" if record is None else
               f"the master znode names this node's earlier session {record.session_id:#x} (epoch {record.epoch}); "
               f"waiting for the controller")
        if self._told[0] == "master":
            self._tell_fenced(why)

    def _tell_fenced(self, reason: str) -> None:
        if self._told[0] != "master":
            return                   # slaves ack nothing: nothing to fence
        self._told = ("fenced", self._told[1])
        self._fences += 1
        self._node.on_fence(reason)

    def _revoke(self) -> None:
        with self._permit_lock:
            self._permit = None

    def _revoke_if(self, permit: _Permit) -> None:
        with self._permit_lock:
            if self._permit == permit:
                self._permit = None

    def _fence_reason(self) -> str:
        if self._zk_state != KazooState.CONNECTED:
            return f"ZooKeeper session {str(self._zk_state).lower()}"
        told = self._told
        if told[0] == "slave":
            return f"{told[2]} is master in epoch {told[1]}"
        permit = self._permit
        if permit is not None and self._clock() >= permit.lease_until_s:
            return (f"the write permit's lease ({self._lease_s:.1f} s) ran out without ZooKeeper confirming this "
                    f"master (the process was paused or stalled); waiting for a fresh read of the master znode")
        return self._waiting_reason or "the master znode does not name this node in that epoch"
