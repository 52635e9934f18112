"""Master election for one group, as a pure function of what ZooKeeper holds.

    decide(GroupView(...), enable_elect_unclean_master=False) -> Decision

The master is alive while a node znode of its id is owned by the ZooKeeper session named
in the master record. Otherwise the controller elects from the live members of the
sync-state set, ordered by

    highest epoch, then highest max offset, then lowest priority number (then node id,
    so that the choice is deterministic)

The new epoch is one more than any epoch in sight (master record, sync-state set, live
nodes), and the new sync-state set is {new master}. A group that has never had a master
(no sync-state set znode) bootstraps from all its live nodes. With nobody eligible there is
no master, and the decision says why; ``enable_elect_unclean_master`` then allows the best
live node outside the set, at the price of the writes only the set's members held.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from .layout import MasterRecord, NodeRecord, SyncStateSet


class Outcome(enum.Enum):
    KEEP = "keep"              # the master is alive: nothing to do
    ELECT = "elect"            # write the new master and sync-state set
    NO_MASTER = "no_master"    # nobody is eligible: writes fail closed


@dataclass(frozen=True, slots=True)
class GroupView:
    """One group as read from ZooKeeper (znode versions travel separately, with the write)."""

    group: str
    master: MasterRecord | None
    sync_state_set: SyncStateSet | None
    live_nodes: dict[str, NodeRecord] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Decision:
    outcome: Outcome
    reason: str
    epoch: int
    new_master: NodeRecord | None = None
    unclean: bool = False

    @property
    def new_sync_state_set(self) -> SyncStateSet | None:
        if self.new_master is None:
            return None
        return SyncStateSet((self.new_master.node_id,), self.epoch)


def master_is_alive(view: GroupView) -> bool:
    """True while the master's node znode exists and is owned by the session it was elected under."""
    master = view.master
    if master is None:
        return False
    node = view.live_nodes.get(master.node_id)
    return node is not None and node.session_id == master.session_id


def election_key(node: NodeRecord) -> tuple:
    """Sort key: the best candidate sorts first."""
    return (-node.epoch, -node.max_offset, node.priority, node.node_id)


def rank(candidates) -> list[NodeRecord]:
    """Candidates best first."""
    return sorted(candidates, key=election_key)


def decide(view: GroupView, *, enable_elect_unclean_master: bool = False) -> Decision:
    """What the controller should do for this group now."""
    current_epoch = view.master.epoch if view.master is not None else 0
    if master_is_alive(view):
        return Decision(Outcome.KEEP, f"{view.master.node_id} is master in epoch {current_epoch}", current_epoch)
    new_epoch = 1 + max([current_epoch,
                         view.sync_state_set.epoch if view.sync_state_set is not None else 0,
                         *(node.epoch for node in view.live_nodes.values())])
    gone = _why_master_gone(view)
    if not view.live_nodes:
        return Decision(Outcome.NO_MASTER, f"{gone}; no node of group {view.group} is live", current_epoch)
    if view.sync_state_set is None and view.master is None:
        best = rank(view.live_nodes.values())[0]
        return Decision(Outcome.ELECT, f"first master of group {view.group} (no sync-state set yet)",
                        new_epoch, best)
    members = set(view.sync_state_set.members) if view.sync_state_set is not None else set()
    eligible = [node for node_id, node in view.live_nodes.items() if node_id in members]
    if eligible:
        best = rank(eligible)[0]
        return Decision(Outcome.ELECT, f"{gone}; elected from the sync-state set {sorted(members)}",
                        new_epoch, best)
    why = (f"{gone}; no live member of the sync-state set {sorted(members)} "
           f"(live: {sorted(view.live_nodes)})")
    if enable_elect_unclean_master:
        best = rank(view.live_nodes.values())[0]
        return Decision(Outcome.ELECT, f"{why}; unclean election of {best.node_id} "
                        f"(writes only the sync-state set held may be lost)", new_epoch, best, unclean=True)
    return Decision(Outcome.NO_MASTER, f"{why}; enable_elect_unclean_master is off", current_epoch)


def _why_master_gone(view: GroupView) -> str:
    master = view.master
    if master is None:
        return "no master record"
    node = view.live_nodes.get(master.node_id)
    if node is None:
        return f"master {master.node_id} of epoch {master.epoch} is not live"
    return (f"master {master.node_id} of epoch {master.epoch} re-registered under a new session "
            f"({node.session_id:#x}, elected under {master.session_id:#x})")
