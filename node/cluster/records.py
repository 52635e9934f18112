"""ZooKeeper's records of a controller-mode cluster, read over one session: a group's master
record (node and epoch), its sync-state set and live nodes, the controller election; and the
waits built on them (a live master, a new master after the old one died).

    with cluster.records() as records:              # LocalCluster.records(): one ZooKeeper session
        records.live_master("g1")                   # MasterRecord; NoMasterError when none is live
        records.group("g1").successors("g1-n1")     # live sync-state set members besides g1-n1
        records.wait_for_new_master("g1", old, 30)  # the master record names another node or epoch

This is the read side of the cluster that ``up``, the controller probe, drills and chaos use,
so that none of them reads znodes itself; the znode layout stays the controller package's
(controller.layout, controller.znodes). Synchronous (kazoo): from trio, call it through
``trio.to_thread.run_sync``. Every read is bounded by ``call_timeout_s``; ZooKeeper not
answering becomes ClusterError.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from controller import MasterRecord, layout, znodes
from controller.errors import ControllerError, NoMasterError

from .topology import ClusterError

CALL_TIMEOUT_S = 5.0
SESSION_TIMEOUT_MS = 4000
MASTER_POLL_INTERVAL_S = 0.05


@dataclass(frozen=True, slots=True)
class GroupRecords:
    """What ZooKeeper holds about one group at one moment."""

    group: str
    master: MasterRecord | None             # the master record, whether or not its node is live
    sync_state_set: tuple[str, ...]         # members of the sync-state set (empty: none recorded)
    live_nodes: frozenset[str]              # nodes whose ephemeral znode exists

    def successors(self, master_id: str) -> tuple[str, ...]:
        """Live members of the sync-state set other than ``master_id``: the nodes the
        controller may elect if ``master_id`` dies."""
        return tuple(m for m in self.sync_state_set if m != master_id and m in self.live_nodes)


class ClusterRecords:
    """One ZooKeeper session reading the records of cluster ``cluster``. Open it (``open`` or
    ``with``) before reading, close it after."""

    def __init__(self, zk_hosts: str, cluster: str, *, call_timeout_s: float = CALL_TIMEOUT_S,
                 session_timeout_ms: int = SESSION_TIMEOUT_MS) -> None:
        self.zk_hosts = zk_hosts
        self.cluster = cluster
        self.call_timeout_s = call_timeout_s
        self._client = znodes.make_client(zk_hosts, session_timeout_ms=session_timeout_ms)

    def open(self, timeout_s: float = CALL_TIMEOUT_S) -> "ClusterRecords":
        """Connect; ClusterError if ZooKeeper does not answer within ``timeout_s``."""
        try:
            znodes.start_client(self._client, timeout_s, f"reading cluster {self.cluster}'s records")
        except ControllerError as error:
            raise ClusterError(str(error)) from None
        return self

    def close(self) -> None:
        """End the session."""
        self._client.stop()
        self._client.close()

    def __enter__(self) -> "ClusterRecords":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # --- reads -------------------------------------------------------------------------------
    def master_record(self, group: str) -> MasterRecord | None:
        """The group's master record as it stands, live or not (None: no master was ever elected)."""
        path = layout.master_path(self.cluster, group)
        try:
            data, _ = znodes.get_or_none(self._client, path, self.call_timeout_s)
            return layout.decode(MasterRecord, data, path) if data is not None else None
        except ControllerError as error:
            raise ClusterError(f"cannot read group {group}'s master record: {error}") from None

    def live_master(self, group: str) -> MasterRecord:
        """The group's master if its node is live. NoMasterError (its ``reason`` the
        controller's) when there is none; ClusterError when ZooKeeper does not answer."""
        try:
            return znodes.find_master_with_client(self._client, self.cluster, group, self.call_timeout_s)
        except NoMasterError:
            raise
        except ControllerError as error:
            raise ClusterError(f"cannot read group {group}'s master: {error}") from None

    def group(self, group: str) -> GroupRecords:
        """The group's master record, sync-state set and live nodes, read together."""
        try:
            view = znodes.read_group(self._client, self.cluster, group, self.call_timeout_s).view
        except ControllerError as error:
            raise ClusterError(f"cannot read group {group}: {error}") from None
        members = tuple(view.sync_state_set.members) if view.sync_state_set is not None else ()
        return GroupRecords(group, view.master, members, frozenset(view.live_nodes))

    def election_contenders(self) -> list[str]:
        """Contender ids of the controller election, leader first."""
        path = layout.election_path(self.cluster)
        try:
            names = sorted(znodes.children_or_empty(self._client, path, self.call_timeout_s),
                           key=lambda name: name[-10:])
            ids = []
            for name in names:
                data, _ = znodes.get_or_none(self._client, f"{path}/{name}", self.call_timeout_s)
                if data is not None:
                    ids.append(data.decode(errors="replace"))
            return ids
        except ControllerError as error:
            raise ClusterError(f"ZooKeeper at {self.zk_hosts}: {error}") from None

    # --- waits -------------------------------------------------------------------------------
    def wait_for_master(self, group: str, timeout_s: float, not_node: str | None = None,
                        interval_s: float = MASTER_POLL_INTERVAL_S) -> MasterRecord:
        """Poll until ``group`` has a live master (other than ``not_node``); its record.
        ClusterError after ``timeout_s``, naming the controller's last reason."""
        deadline = time.monotonic() + timeout_s
        last = "ZooKeeper did not answer"
        for _ in range(int(timeout_s / interval_s) + 2):
            try:
                record = self.live_master(group)
                if record.node_id != not_node:
                    return record
                last = f"the master is still {not_node} (epoch {record.epoch})"
            except (ControllerError, ClusterError) as error:
                last = str(error)
            if time.monotonic() >= deadline:
                break
            time.sleep(interval_s)
        raise ClusterError(f"group {group} has no master{' other than ' + not_node if not_node else ''} "
                           f"after {timeout_s:g} s: {last}")

    def wait_for_new_master(self, group: str, previous: MasterRecord, timeout_s: float,
                            interval_s: float = MASTER_POLL_INTERVAL_S) -> MasterRecord:
        """Poll the master record until it names another node than ``previous`` or a newer
        epoch (the controller has acted on the old master's death), and return it; the new
        master may not serve yet. A read ZooKeeper does not answer counts as "not yet" (it may be
        recovering too). ClusterError when the record has not moved within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        last_error = ""
        for _ in range(int(timeout_s / interval_s) + 2):
            try:
                record = self.master_record(group)
            except ClusterError as error:
                record, last_error = None, f" (last read: {error})"
            if record is not None and (record.node_id != previous.node_id or record.epoch > previous.epoch):
                return record
            if time.monotonic() >= deadline:
                break
            time.sleep(interval_s)
        raise ClusterError(f"the master record of group {group} still names {previous.node_id} "
                           f"(epoch {previous.epoch}) after {timeout_s:g} s{last_error}")
