"""The controller: one active instance per cluster elects a master for every group.

    controller = Controller(ControllerSettings(zk_hosts, cluster))
    controller.start()          # connects, then contends for leadership in a thread
    ...
    controller.stop()

Several controllers may run; a kazoo Election under ``/hastore/{cluster}/controller/election``
makes one of them active. The active one keeps, per group, a ChildrenWatch on ``nodes/``
and a DataWatch on ``master`` (and one on ``groups/`` for new groups). A watch only marks
its group dirty; the leader thread then reconciles that group: read it, ``election.decide``,
and write the result in one version-guarded transaction (``znodes.write_election``). Every
group is also reconciled every ``resync_interval_ms`` as a safety net, never as the main
path: an ephemeral node's deletion reaches the controller through its watch.

Reconciling is level-triggered: the decision is a function of what ZooKeeper holds, and the
write is atomic, so a controller that dies at any point leaves either the old state or the
new one, and the next active controller, which starts by reconciling every group, carries
on from there. No decision is lost; none is taken twice (the version checks fail).

While the controller's own session is SUSPENDED it decides nothing (a leadership claim is
not trusted); when the session is LOST it gives up leadership and contends again.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field

from kazoo.client import KazooState
from kazoo.exceptions import KazooException

from . import layout, znodes
from .election import Decision, Outcome, decide
from .errors import ZooKeeperUnavailableError

log = logging.getLogger(__name__)

_RECONCILE_TRIES_MAX = 5          # a version conflict means someone moved: re-read, a few times
_UNAVAILABLE_BACKOFF_S = 0.2


def default_controller_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True, slots=True)
class ControllerSettings:
    zk_hosts: str
    cluster: str
    session_timeout_ms: int = 6000
    enable_elect_unclean_master: bool = False
    resync_interval_ms: int = 2000
    zk_timeout_s: float = 5.0
    controller_id: str = field(default_factory=default_controller_id)


@dataclass(frozen=True, slots=True)
class ControllerStatistics:
    controller_id: str
    active: bool
    elections: int
    no_master_groups: tuple[str, ...]
    last_reasons: dict


class Controller:
    """One controller process's logic (it owns its ZooKeeper session and one thread)."""

    def __init__(self, settings: ControllerSettings) -> None:
        self.settings = settings
        self.client = znodes.make_client(settings.zk_hosts, settings.session_timeout_ms)
        self._cond = threading.Condition()
        self._dirty: set[str] = set()
        self._groups_dirty = True
        self._watched: set[str] = set()
        self._groups_watch_installed = False
        self._suspended = False
        self._losses = 0
        self._lead_losses = -1           # _losses when the current leadership began
        self._stopping = threading.Event()
        self._active = False
        self._elections = 0
        self._last: dict[str, Decision] = {}
        self._election = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Connect (ZooKeeperUnavailableError if ZooKeeper does not answer), then contend."""
        self.client.add_listener(self._on_state)
        znodes.start_client(self.client, self.settings.zk_timeout_s, f"controller {self.settings.controller_id}")
        znodes.ensure_path(self.client, layout.groups_path(self.settings.cluster), self.settings.zk_timeout_s)
        self._thread = threading.Thread(target=self._contend, name=f"hastore-controller-{self.settings.controller_id}",
                                        daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Leave the election and close the session (the next controller takes over at once)."""
        self._stopping.set()
        with self._cond:
            self._cond.notify_all()
        election = self._election
        if election is not None:
            election.cancel()
        # closing the session deletes the election znode server-side and fails pending calls
        self.client.stop()
        if self._thread is not None:
            self._thread.join(timeout_s)
            assert not self._thread.is_alive(), "controller thread did not stop"
        self.client.close()

    def __enter__(self) -> "Controller":
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    @property
    def is_active(self) -> bool:
        """Leading, with a session that is connected (a suspended leader is not trusted)."""
        return self._trusted()

    def statistics(self) -> ControllerStatistics:
        last = dict(self._last)
        return ControllerStatistics(self.settings.controller_id, self.is_active, self._elections,
                                    tuple(sorted(g for g, d in last.items() if d.outcome is Outcome.NO_MASTER)),
                                    {g: d.reason for g, d in last.items()})

    # -- reconciling one group --------------------------------------------------------------

    def reconcile_group(self, group: str) -> Decision:
        """Read the group, decide, write; re-read on a version conflict. Returns the decision taken."""
        settings = self.settings
        decision = None
        for _ in range(_RECONCILE_TRIES_MAX):
            snapshot = znodes.read_group(self.client, settings.cluster, group, settings.zk_timeout_s)
            decision = decide(snapshot.view, enable_elect_unclean_master=settings.enable_elect_unclean_master)
            if decision.outcome is Outcome.KEEP:
                break
            if not self._trusted():
                raise ZooKeeperUnavailableError("controller session suspended or leadership lost: not deciding")
            if decision.outcome is Outcome.ELECT:
                if znodes.write_election(self.client, settings.cluster, snapshot, decision,
                                         settings.controller_id, settings.zk_timeout_s):
                    self._elections += 1
                    log.warning("controller %s: group %s: %s is master in epoch %d (%s)", settings.controller_id,
                                group, decision.new_master.node_id, decision.epoch, decision.reason)
                    break
            elif znodes.write_no_master_status(self.client, settings.cluster, snapshot, decision,
                                               settings.controller_id, settings.zk_timeout_s):
                log.warning("controller %s: group %s has no master: %s", settings.controller_id, group,
                            decision.reason)
                break
        assert decision is not None
        self._last[group] = decision
        return decision

    # -- leadership -------------------------------------------------------------------------

    def _contend(self) -> None:
        # Runs until stop(); each pass blocks in the election until this controller leads.
        while not self._stopping.is_set():
            self._election = self.client.Election(layout.election_path(self.settings.cluster),
                                                  self.settings.controller_id)
            try:
                self._election.run(self._lead)
            except (KazooException, ZooKeeperUnavailableError) as error:
                if self._stopping.is_set():
                    return
                log.warning("controller %s: election interrupted (%s); contending again",
                            self.settings.controller_id, error)
                self._stopping.wait(_UNAVAILABLE_BACKOFF_S)

    def _lead(self) -> None:
        losses_at_start = self._lead_losses = self._losses
        if not self._holds_election_znode():
            return
        log.warning("controller %s is active for cluster %s", self.settings.controller_id, self.settings.cluster)
        self._active = True
        try:
            with self._cond:
                self._groups_dirty = True
                self._dirty.update(self._watched)
            next_resync = time.monotonic()
            while not self._stopping.is_set() and self._losses == losses_at_start:
                if time.monotonic() >= next_resync:
                    next_resync = time.monotonic() + self.settings.resync_interval_ms / 1000
                    with self._cond:
                        self._groups_dirty = True
                        self._dirty.update(self._watched)
                self._reconcile_dirty()
                with self._cond:
                    if not self._dirty and not self._groups_dirty and not self._stopping.is_set():
                        self._cond.wait(max(0.0, next_resync - time.monotonic()))
        finally:
            self._active = False
            log.warning("controller %s is no longer active", self.settings.controller_id)

    def _holds_election_znode(self) -> bool:
        """The election's lock znode exists under this controller's current session."""
        node = self._election.lock.node
        if node is None:
            return False
        try:
            _, stat = znodes.get_or_none(self.client, f"{layout.election_path(self.settings.cluster)}/{node}",
                                         self.settings.zk_timeout_s)
        except ZooKeeperUnavailableError:
            return False
        return stat is not None and stat.ephemeralOwner == self.client.client_id[0]

    def _trusted(self) -> bool:
        return (self._active and not self._suspended and self._losses == self._lead_losses
                and not self._stopping.is_set())

    def _reconcile_dirty(self) -> None:
        if self._suspended:
            with self._cond:
                self._cond.wait(_UNAVAILABLE_BACKOFF_S)
            return
        try:
            if self._groups_dirty:
                self._groups_dirty = False
                self._watch_new_groups()
            with self._cond:
                groups, self._dirty = sorted(self._dirty), set()
            for index, group in enumerate(groups):
                try:
                    self.reconcile_group(group)
                except BaseException:
                    with self._cond:
                        self._dirty.update(groups[index:])
                    raise
        except (ZooKeeperUnavailableError, KazooException) as error:
            log.info("controller %s: reconcile deferred: %s", self.settings.controller_id, error)
            self._stopping.wait(_UNAVAILABLE_BACKOFF_S)

    def _watch_new_groups(self) -> None:
        cluster = self.settings.cluster
        if not self._groups_watch_installed:
            self.client.ChildrenWatch(layout.groups_path(cluster), self._on_groups_changed)
            self._groups_watch_installed = True
        for group in znodes.children_or_empty(self.client, layout.groups_path(cluster), self.settings.zk_timeout_s):
            if group in self._watched:
                continue
            znodes.ensure_path(self.client, layout.nodes_path(cluster, group), self.settings.zk_timeout_s)
            self.client.ChildrenWatch(layout.nodes_path(cluster, group), self._group_watch(group))
            self.client.DataWatch(layout.master_path(cluster, group), self._group_watch(group))
            self._watched.add(group)
            with self._cond:
                self._dirty.add(group)

    # -- kazoo callbacks (kazoo's threads: never block here) ---------------------------------

    def _group_watch(self, group: str):
        def on_change(*_args) -> bool:
            with self._cond:
                self._dirty.add(group)
                self._cond.notify_all()
            return not self._stopping.is_set()     # False ends the watch
        return on_change

    def _on_groups_changed(self, _children) -> bool:
        with self._cond:
            self._groups_dirty = True
            self._cond.notify_all()
        return not self._stopping.is_set()

    def _on_state(self, state: str) -> None:
        if state == KazooState.LOST:
            self._suspended = True
            self._losses += 1
        elif state == KazooState.SUSPENDED:
            self._suspended = True
        else:
            self._suspended = False
        with self._cond:
            self._cond.notify_all()
