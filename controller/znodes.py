"""Reading a group from ZooKeeper and writing its master and sync-state set, version-guarded.

Every call takes a started KazooClient and a deadline (``timeout_s``) and turns a
connection loss, an expired session or a timeout into ZooKeeperUnavailableError, so no
caller blocks on a ZooKeeper that is down. Writes are single ZooKeeper transactions
(``multi``) whose ``check`` operations pin the znode versions that the decision was made
on: if anything moved in between, nothing is written and the caller re-reads.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from kazoo.client import KazooClient
from kazoo.exceptions import (BadVersionError, ConnectionLoss, KazooException, NodeExistsError, NoNodeError,
                              RolledBackError, RuntimeInconsistency, SessionExpiredError)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.retry import KazooRetry

from . import layout
from .election import Decision, GroupView, Outcome, master_is_alive
from .errors import DeposedMasterError, NoMasterError, ZooKeeperUnavailableError
from .layout import GroupStatus, MasterRecord, NodeRecord, SyncStateSet

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 5.0
_SSS_UPDATE_TRIES_MAX = 5


def make_client(hosts: str, session_timeout_ms: int = 6000, *, read_only: bool = False) -> KazooClient:
    """A KazooClient whose reconnection keeps trying forever (a node outlives an outage) with a
    short capped backoff, so that it is back soon after ZooKeeper is."""
    retry = KazooRetry(max_tries=-1, delay=0.05, backoff=2, max_jitter=0.1, max_delay=0.5, ignore_expire=True)
    return KazooClient(hosts=hosts, timeout=session_timeout_ms / 1000, connection_retry=retry,
                       read_only=read_only)


def start_client(client: KazooClient, timeout_s: float, who: str) -> None:
    """Connect ``client``; if ZooKeeper does not answer within ``timeout_s``, release it and
    raise ZooKeeperUnavailableError naming ``who`` was connecting."""
    try:
        client.start(timeout=timeout_s)
    except KazooTimeoutError as error:
        client.stop()
        client.close()
        raise ZooKeeperUnavailableError(f"{who}: no ZooKeeper at {client.hosts} within {timeout_s} s") from error


def wait(async_result, timeout_s: float, what: str):
    """The result of a kazoo async call; unavailability becomes ZooKeeperUnavailableError."""
    try:
        return async_result.get(timeout=timeout_s)
    except KazooTimeoutError as error:
        raise ZooKeeperUnavailableError(f"ZooKeeper did not answer {what} within {timeout_s} s") from error
    except (ConnectionLoss, SessionExpiredError) as error:
        raise ZooKeeperUnavailableError(f"ZooKeeper connection failed during {what}: "
                                        f"{type(error).__name__}") from error


def ensure_path(client: KazooClient, path: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    wait(client.ensure_path_async(path), timeout_s, f"ensure_path {path}")


def get_or_none(client: KazooClient, path: str, timeout_s: float = DEFAULT_TIMEOUT_S):
    """``(data, stat)`` or ``(None, None)`` when the znode does not exist."""
    try:
        return wait(client.get_async(path), timeout_s, f"get {path}")
    except NoNodeError:
        return None, None


def children_or_empty(client: KazooClient, path: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> list[str]:
    try:
        return sorted(wait(client.get_children_async(path), timeout_s, f"get_children {path}"))
    except NoNodeError:
        return []


@dataclass(frozen=True, slots=True)
class GroupSnapshot:
    """A GroupView plus the znode versions it was read at (None: the znode did not exist)."""

    view: GroupView
    master_version: int | None
    sync_state_set_version: int | None
    node_versions: dict[str, int] = field(default_factory=dict)
    status: GroupStatus | None = None


def read_group(client: KazooClient, cluster: str, group: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> GroupSnapshot:
    """Read the group's master, sync-state set, status and live nodes."""
    live: dict[str, NodeRecord] = {}
    versions: dict[str, int] = {}
    for node_id in children_or_empty(client, layout.nodes_path(cluster, group), timeout_s):
        path = layout.node_path(cluster, group, node_id)
        data, stat = get_or_none(client, path, timeout_s)
        if data is None:
            continue        # left between the listing and the read
        live[node_id] = layout.decode(NodeRecord, data, path, session_id=stat.ephemeralOwner)
        versions[node_id] = stat.version
    master_znode = layout.master_path(cluster, group)
    data, master_stat = get_or_none(client, master_znode, timeout_s)
    master = layout.decode(MasterRecord, data, master_znode) if data is not None else None
    sss_znode = layout.sync_state_set_path(cluster, group)
    data, sss_stat = get_or_none(client, sss_znode, timeout_s)
    sss = layout.decode(SyncStateSet, data, sss_znode) if data is not None else None
    status_znode = layout.status_path(cluster, group)
    data, _ = get_or_none(client, status_znode, timeout_s)
    status = layout.decode(GroupStatus, data, status_znode) if data is not None else None
    return GroupSnapshot(GroupView(group, master, sss, live),
                         master_stat.version if master_stat is not None else None,
                         sss_stat.version if sss_stat is not None else None,
                         versions, status)


def write_election(client: KazooClient, cluster: str, snapshot: GroupSnapshot, decision: Decision,
                   controller_id: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
    """Commit an ELECT decision in one transaction; False if any pinned version moved.

    The transaction checks the new master's node znode (it is still registered, under the
    same session, with the record the choice was made on), and creates or version-sets the
    master, sync-state set and status znodes, so two controllers racing on the same
    snapshot cannot both win, and a decision made on stale reads is never written.
    """
    assert decision.outcome is Outcome.ELECT and decision.new_master is not None, decision
    group = snapshot.view.group
    node = decision.new_master
    record = MasterRecord(node.node_id, decision.epoch, node.session_id, node.client_address, node.ha_address,
                          layout.now_ms(), controller_id, decision.unclean)
    status = GroupStatus("master", decision.reason, decision.epoch, controller_id, layout.now_ms())
    transaction = client.transaction()
    transaction.check(layout.node_path(cluster, group, node.node_id), snapshot.node_versions[node.node_id])
    _create_or_set(transaction, layout.master_path(cluster, group), layout.encode(record), snapshot.master_version)
    _create_or_set(transaction, layout.sync_state_set_path(cluster, group),
                   layout.encode(decision.new_sync_state_set), snapshot.sync_state_set_version)
    _put_status(client, transaction, cluster, group, status, timeout_s)
    return _commit(transaction, timeout_s, f"election in group {group}")


def write_no_master_status(client: KazooClient, cluster: str, snapshot: GroupSnapshot, decision: Decision,
                           controller_id: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
    """Record why the group has no master, pinned to the master znode version it describes."""
    group = snapshot.view.group
    previous = snapshot.status
    if previous is not None and previous.state == "no_master" and previous.reason == decision.reason:
        return True         # already said; do not rewrite it on every resync
    status = GroupStatus("no_master", decision.reason, decision.epoch, controller_id, layout.now_ms())
    transaction = client.transaction()
    if snapshot.master_version is not None:
        transaction.check(layout.master_path(cluster, group), snapshot.master_version)
    _put_status(client, transaction, cluster, group, status, timeout_s)
    return _commit(transaction, timeout_s, f"no-master status of group {group}")


def update_sync_state_set(client: KazooClient, cluster: str, group: str, members, epoch: int,
                          master_version: int, timeout_s: float = DEFAULT_TIMEOUT_S) -> SyncStateSet:
    """The master's own sync-state set update, in a transaction that checks that the master
    znode still has ``master_version`` (the version that made this node master). Raises
    DeposedMasterError if it does not: a deposed master can never change the set."""
    sss = SyncStateSet(tuple(sorted(set(members))), epoch)
    sss_znode = layout.sync_state_set_path(cluster, group)
    for _ in range(_SSS_UPDATE_TRIES_MAX):
        _, stat = get_or_none(client, sss_znode, timeout_s)
        transaction = client.transaction()
        transaction.check(layout.master_path(cluster, group), master_version)
        _create_or_set(transaction, sss_znode, layout.encode(sss), stat.version if stat is not None else None)
        results = wait(transaction.commit_async(), timeout_s, f"sync-state set update of group {group}")
        if not any(isinstance(result, Exception) for result in results):
            return sss
        if not isinstance(results[0], RolledBackError):
            raise DeposedMasterError(f"sync-state set update of group {group} refused: the master znode is no "
                                     f"longer at version {master_version} (another master was elected after "
                                     f"epoch {epoch})")
        # the set moved under us (our own concurrent update): read its version again
    raise ZooKeeperUnavailableError(f"sync-state set update of group {group} kept conflicting "
                                    f"after {_SSS_UPDATE_TRIES_MAX} tries")


def find_master_with_client(client: KazooClient, cluster: str, group: str,
                            timeout_s: float = DEFAULT_TIMEOUT_S) -> MasterRecord:
    """The group's current master, if it is alive; NoMasterError (with the controller's reason) if not."""
    snapshot = read_group(client, cluster, group, timeout_s)
    view = snapshot.view
    if master_is_alive(view):
        return view.master
    reason = snapshot.status.reason if snapshot.status is not None and snapshot.status.state == "no_master" else None
    named = (f"the master record names {view.master.node_id} (epoch {view.master.epoch}), which is not live"
             if view.master is not None else "no master has been elected")
    raise NoMasterError(f"group {group} of cluster {cluster} has no live master: {named}"
                        + (f"; controller: {reason}" if reason else ""), reason)


def find_master(zk_hosts: str, cluster: str, group: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> MasterRecord:
    """Connect to ZooKeeper, return the group's live master record (addresses included), disconnect.

    Raises NoMasterError when the group has no live master and ZooKeeperUnavailableError when
    ZooKeeper cannot be reached within ``timeout_s``."""
    client = make_client(zk_hosts, session_timeout_ms=max(2000, int(timeout_s * 1000)))
    start_client(client, timeout_s, f"finding the master of group {group}")
    try:
        return find_master_with_client(client, cluster, group, timeout_s)
    finally:
        client.stop()
        client.close()


def _create_or_set(transaction, path: str, value: bytes, version: int | None) -> None:
    if version is None:
        transaction.create(path, value)        # fails if someone created it meanwhile
    else:
        transaction.set_data(path, value, version)


def _put_status(client: KazooClient, transaction, cluster: str, group: str, status: GroupStatus,
                timeout_s: float) -> None:
    path = layout.status_path(cluster, group)
    _, stat = get_or_none(client, path, timeout_s)
    _create_or_set(transaction, path, layout.encode(status), stat.version if stat is not None else None)


def _commit(transaction, timeout_s: float, what: str) -> bool:
    results = wait(transaction.commit_async(), timeout_s, what)
    failures = [result for result in results if isinstance(result, Exception)]
    for failure in failures:
        if not isinstance(failure, (RolledBackError, RuntimeInconsistency, BadVersionError, NoNodeError,
                                    NodeExistsError)):
            raise failure if isinstance(failure, KazooException) else AssertionError(failure)
    if failures:
        log.info("%s not written: a pinned znode moved (%s)", what,
                 ", ".join(type(f).__name__ for f in failures
                           if not isinstance(f, (RolledBackError, RuntimeInconsistency))))
    return not failures
