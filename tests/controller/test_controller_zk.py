"""The controller and the node agent against a real ZooKeeper.

Each test uses its own cluster name (its own /hastore/{cluster} subtree). Waits are on
conditions with bounds; SESSION_TIMEOUT_MS is 2 s (the server's tick is 250 ms).
"""

from __future__ import annotations

import threading
import time

import pytest
from controller_fakes import SESSION_TIMEOUT_MS, Harness, Writers, wait_until
from kazoo.client import KazooState

from controller import (DeposedMasterError, FencedError, MasterRecord, NoMasterError, Outcome, SyncStateSet,
                        ZooKeeperServer, decide, expire_session, find_master, layout, read_group, znodes)

pytestmark = pytest.mark.integration   # a real ZooKeeper

GROUP = "g1"


@pytest.fixture
def harness(zk_server, cluster):
    h = Harness(zk_server.hosts, cluster, SESSION_TIMEOUT_MS)
    yield h
    h.close()


def is_master(epoch=None):
    return lambda node: node.role == "master" and (epoch is None or node.epoch == epoch)


def master_record(zk, cluster, group=GROUP) -> MasterRecord | None:
    data, _ = znodes.get_or_none(zk, layout.master_path(cluster, group))
    return layout.decode(MasterRecord, data, "master") if data is not None else None


def sync_state_set(zk, cluster, group=GROUP) -> SyncStateSet | None:
    data, _ = znodes.get_or_none(zk, layout.sync_state_set_path(cluster, group))
    return layout.decode(SyncStateSet, data, "sss") if data is not None else None


def expire(hosts: str, node, tries: int = 5) -> None:
    """Expire the node agent's session, retrying if the agent reconnected first; returns once it saw LOST."""
    lost = threading.Event()

    def listener(state):
        if state == KazooState.LOST:
            lost.set()
    client = node.agent.client
    client.add_listener(listener)
    try:
        for _ in range(tries):
            expire_session(hosts, client.client_id)
            if lost.wait(SESSION_TIMEOUT_MS / 1000 * 2):
                return
        raise AssertionError(f"could not expire the session of {node.node_id} in {tries} tries")
    finally:
        client.remove_listener(listener)


def test_first_master_is_the_best_node_and_others_follow(harness, zk, cluster, zk_server):
    a = harness.node("a", max_offset=100, epoch=0)
    b = harness.node("b", max_offset=500, epoch=0, priority=5)
    c = harness.node("c", max_offset=500, epoch=0, priority=1)
    harness.controller()
    c.wait_for(is_master(1), 10, "master of epoch 1")
    for follower in (a, b):
        follower.wait_for(lambda n: n.role == "slave" and n.master_id == "c" and n.epoch == 1, 10, "c's slave")
    assert sync_state_set(zk, cluster) == SyncStateSet(("c",), 1)
    found = find_master(zk_server.hosts, cluster, GROUP)
    assert (found.node_id, found.epoch, found.client_address) == ("c", 1, "c.test:10911")
    assert c.write() and not a.write() and not b.write()
    assert c.agent.may_ack(1) and not c.agent.may_ack(2) and not a.agent.may_ack(1)
    with pytest.raises(FencedError, match="c is master in epoch 1"):
        a.agent.check_write_permit(1)


def test_failover_elects_from_the_sync_state_set_in_order(harness, zk, cluster):
    a = harness.node("a", max_offset=1000)
    harness.controller()
    a.wait_for(is_master(1), 10, "master")
    b = harness.node("b", max_offset=900, epoch=1, priority=2)
    c = harness.node("c", max_offset=900, epoch=1, priority=1)
    d = harness.node("d", max_offset=5000, epoch=1)         # best offset, but not in the set
    for n in (b, c, d):
        n.wait_for(lambda n: n.role == "slave" and n.master_id == "a", 10, "a's slave")
    assert a.agent.update_sync_state_set(["a", "b", "c"]) == SyncStateSet(("a", "b", "c"), 1)
    for n in (b, c, d):           # let the agents' refreshes carry the offsets
        wait_until(lambda n=n: read_group(zk, cluster, GROUP).view.live_nodes[n.node_id].epoch == 1, 5, "refreshed")
    started = time.monotonic()
    harness.stop(a)                # clean stop: the session closes, the ephemeral znode goes at once
    c.wait_for(is_master(2), 10, "master of epoch 2 (lowest priority number among equals)")
    elapsed = time.monotonic() - started
    assert elapsed < 1.5, f"failover took {elapsed:.2f} s: the controller must react to the watch"
    assert sync_state_set(zk, cluster) == SyncStateSet(("c",), 2)
    for n in (b, d):
        n.wait_for(lambda n: n.master_id == "c" and n.epoch == 2, 10, "c's slave in epoch 2")
    assert master_record(zk, cluster).epoch == 2 and not master_record(zk, cluster).unclean


def test_master_session_expiry_steps_down_before_a_new_master_is_elected(harness, zk, cluster, zk_server):
    a = harness.node("a", max_offset=10)
    harness.controller()
    a.wait_for(is_master(1), 10, "master")
    b = harness.node("b", max_offset=10, epoch=1)
    b.wait_for(lambda n: n.master_id == "a", 10, "a's slave")
    a.agent.update_sync_state_set(["a", "b"])
    with Writers([a, b]):
        wait_until(lambda: len(harness.history.by_node("a")) > 20, 5, "a acking")
        expire(zk_server.hosts, a)
        b.wait_for(is_master(2), 10, "master of epoch 2")
        wait_until(lambda: len(harness.history.by_node("b")) > 20, 5, "b acking")
    fence_at = next(e[2] for e in a.events if e[0] == "fence")
    assert fence_at < b.became_master_at(2), (a.events, b.events)
    last_a_ack = harness.history.by_node("a")[-1].at
    assert last_a_ack < b.became_master_at(2)
    assert harness.history.violations() == []
    # the old master comes back (new session) and rejoins as a slave of the new epoch
    a.wait_for(lambda n: n.role == "slave" and n.master_id == "b" and n.epoch == 2, 10, "b's slave")
    assert not a.write()


def test_controller_failover_carries_on(harness, zk, cluster, zk_server):
    first = harness.controller("c1")
    wait_until(lambda: first.is_active, 10, "c1 active")
    second = harness.controller("c2")
    a = harness.node("a", max_offset=10)
    a.wait_for(is_master(1), 10, "master")
    b = harness.node("b", max_offset=10, epoch=1)
    b.wait_for(lambda n: n.master_id == "a", 10, "a's slave")
    a.agent.update_sync_state_set(["a", "b"])
    assert not second.is_active
    harness.stop(first)
    wait_until(lambda: second.is_active, 10, "c2 active")
    harness.stop(a)
    b.wait_for(is_master(2), 10, "master of epoch 2, elected by c2")
    assert master_record(zk, cluster).elected_by == "c2"
    # a decision pending while no controller runs is taken by the next one on start
    c = harness.node("c", max_offset=10, epoch=2)
    c.wait_for(lambda n: n.master_id == "b", 10, "b's slave")
    b.agent.update_sync_state_set(["b", "c"])
    harness.stop(second)
    harness.stop(b)
    time.sleep(0.3)
    assert c.role == "slave" and master_record(zk, cluster).epoch == 2     # nobody decided
    harness.controller("c3")
    c.wait_for(is_master(3), 10, "master of epoch 3, elected by c3")
    assert master_record(zk, cluster).elected_by == "c3"


def test_active_controller_session_expiry_hands_over(harness, zk, cluster, zk_server):
    first = harness.controller("c1")
    wait_until(lambda: first.is_active, 10, "c1 active")
    second = harness.controller("c2")
    a = harness.node("a")
    a.wait_for(is_master(1), 10, "master")
    for _ in range(5):            # c1 may win the race back to its session: expire it again
        expire_session(zk_server.hosts, first.client.client_id)
        try:
            wait_until(lambda: second.is_active, 3, "c2 active")
            break
        except AssertionError:
            continue
    assert second.is_active and not first.is_active
    b = harness.node("b", epoch=1)
    b.wait_for(lambda n: n.master_id == "a", 10, "a's slave")
    a.agent.update_sync_state_set(["a", "b"])
    harness.stop(a)
    b.wait_for(is_master(2), 10, "master of epoch 2")
    assert sum(1 for c in (first, second) if c.is_active) == 1


def test_unclean_election_off_then_on(harness, zk, cluster, zk_server):
    controller = harness.controller()
    a = harness.node("a", max_offset=10)
    a.wait_for(is_master(1), 10, "master")
    b = harness.node("b", max_offset=5, epoch=1)
    b.wait_for(lambda n: n.master_id == "a", 10, "a's slave")
    assert sync_state_set(zk, cluster).members == ("a",)       # b never caught up
    harness.stop(a)
    wait_until(lambda: controller.statistics().no_master_groups == (GROUP,), 10, "no master")
    reason = controller.statistics().last_reasons[GROUP]
    assert "no live member of the sync-state set ['a']" in reason and "unclean" in reason
    assert master_record(zk, cluster).node_id == "a" and master_record(zk, cluster).epoch == 1
    with pytest.raises(NoMasterError) as raised:
        find_master(zk_server.hosts, cluster, GROUP)
    assert raised.value.reason == reason
    assert not b.write() and b.role == "slave"                  # writes fail closed
    harness.stop(controller)
    harness.controller("unclean", enable_elect_unclean_master=True)
    b.wait_for(is_master(2), 10, "unclean master of epoch 2")
    record = master_record(zk, cluster)
    assert record.node_id == "b" and record.unclean and sync_state_set(zk, cluster) == SyncStateSet(("b",), 2)
    assert b.write()


def test_racing_elections_have_one_winner(zk_server, zk, cluster, harness):
    nodes = [harness.node(name, max_offset=offset) for name, offset in (("a", 1), ("b", 2), ("c", 3))]
    snapshot = read_group(zk, cluster, GROUP)
    clients = [znodes.make_client(zk_server.hosts) for _ in range(6)]
    results = [None] * len(clients)
    barrier = threading.Barrier(len(clients))
    try:
        for client in clients:
            client.start(timeout=10)

        def race(index: int) -> None:
            client = clients[index]
            # each contender decides on the same snapshot; some are unclean and prefer another node
            view = snapshot.view
            decision = decide(view)
            if index % 2:
                live = {k: v for k, v in view.live_nodes.items() if k != decision.new_master.node_id}
                decision = decide(type(view)(view.group, view.master, view.sync_state_set, live))
            barrier.wait(5)
            results[index] = znodes.write_election(client, cluster, snapshot, decision, f"racer{index}")
        threads = [threading.Thread(target=race, args=(i,)) for i in range(len(clients))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
    finally:
        for client in clients:
            client.stop()
            client.close()
    assert results.count(True) == 1 and results.count(False) == len(clients) - 1, results
    record = master_record(zk, cluster)
    assert record.epoch == 1
    winner = next(n for n in nodes if n.node_id == record.node_id)
    winner.wait_for(is_master(1), 10, "the one master of epoch 1")
    time.sleep(0.2)
    assert [n.node_id for n in nodes if n.role == "master"] == [winner.node_id]
    # the controller, started now, keeps the winner: nothing to decide twice
    controller = harness.controller()
    assert controller.reconcile_group(GROUP).outcome is Outcome.KEEP
    assert master_record(zk, cluster) == record


def test_deposed_master_cannot_change_the_sync_state_set(harness, zk, cluster, zk_server):
    harness.controller()
    a = harness.node("a", max_offset=10)
    a.wait_for(is_master(1), 10, "master")
    b = harness.node("b", max_offset=10, epoch=1)
    b.wait_for(lambda n: n.master_id == "a", 10, "a's slave")
    a.agent.update_sync_state_set(["a", "b"])
    _, stat = zk.get(layout.master_path(cluster, GROUP))
    old_version = stat.version
    expire(zk_server.hosts, a)
    b.wait_for(is_master(2), 10, "master of epoch 2")
    a.wait_for(lambda n: n.master_id == "b", 10, "back, under a new session, as b's slave")
    # the ZooKeeper-side guard: the old master's version no longer matches
    with pytest.raises(DeposedMasterError):
        znodes.update_sync_state_set(a.agent.client, cluster, GROUP, ["a", "b"], 1, old_version)
    # the agent-side guard: a has no permit any more
    with pytest.raises((FencedError, DeposedMasterError)):
        a.agent.update_sync_state_set(["a", "b"])
    assert sync_state_set(zk, cluster) == SyncStateSet(("b",), 2)
    assert b.agent.update_sync_state_set(["a", "b"]) == SyncStateSet(("a", "b"), 2)


def test_master_znode_with_a_newer_epoch_fences_the_old_master(harness, zk, cluster):
    harness.controller()
    a = harness.node("a", max_offset=10)
    a.wait_for(is_master(1), 10, "master")
    b = harness.node("b", max_offset=10, epoch=1)
    b.wait_for(lambda n: n.master_id == "a", 10, "a's slave")
    # another master in a newer epoch appears (as if written by a controller a cannot see)
    b_node = read_group(zk, cluster, GROUP).view.live_nodes["b"]
    newer = MasterRecord("b", 2, b_node.session_id, "b.test:10911", "b.test:10912", layout.now_ms(), "test")
    zk.set(layout.master_path(cluster, GROUP), layout.encode(newer))
    b.wait_for(is_master(2), 10, "master of epoch 2")
    a.wait_for(lambda n: n.role == "slave" and n.epoch == 2, 10, "demoted")
    assert not a.agent.may_ack(1) and not a.write() and b.write()


def test_zookeeper_outage_fences_within_the_session_timeout(tmp_path, request):
    server = ZooKeeperServer(tmp_path / "zk", tick_ms=250, die_with_parent=True)
    request.node.funcargs["outage_zk"] = server        # its log is shown if this test fails
    with server:
        h = Harness(server.hosts, "outage", SESSION_TIMEOUT_MS)
        try:
            h.controller()
            a = h.node("a", max_offset=10)
            a.wait_for(is_master(1), 10, "master")
            b = h.node("b", max_offset=10, epoch=1)
            b.wait_for(lambda n: n.master_id == "a", 10, "a's slave")
            a.agent.update_sync_state_set(["a", "b"])
            with Writers([a, b]):
                wait_until(lambda: len(h.history.by_node("a")) > 10, 5, "a acking")
                stopped = time.monotonic()
                server.stop()
                wait_until(lambda: not a.agent.may_ack(1), SESSION_TIMEOUT_MS / 1000, "fenced within the timeout")
                fenced = time.monotonic()
                a.wait_for(lambda n: n.role == "fenced", 5, "told it is fenced")
                acks_when_fenced = len(h.history.by_node("a"))
                time.sleep(0.5)
                assert len(h.history.by_node("a")) == acks_when_fenced, "acked a write while fenced"
                assert all(ack.at <= fenced for ack in h.history.by_node("a"))
                server.start()           # same port and data: sessions survive if resumed in time
                # a resumes in epoch 1 after re-reading the master znode if its session survived the
                # restart; if the server expired it meanwhile, the controller elects again (epoch 2)
                resumed = wait_until(lambda: next((n for n in (a, b) if n.write()), None), 15,
                                     "a master acking again after the outage")
                assert (resumed.node_id, resumed.epoch) in (("a", 1), ("a", 2), ("b", 2)), resumed.events
                acks_at_resume = len(h.history.acks)
                wait_until(lambda: len(h.history.acks) > acks_at_resume + 10, 5, "acking again")
            assert fenced - stopped < SESSION_TIMEOUT_MS / 1000
            assert h.history.violations() == []
        finally:
            h.close()


def test_stale_registration_of_the_same_node_id_waits(harness, zk, cluster, zk_server):
    harness.controller()
    a = harness.node("a", max_offset=10)
    a.wait_for(is_master(1), 10, "master")
    # a second process with the same node id (a restart while the old session lives on)
    twin = harness.node("a", max_offset=10)
    wait_until(lambda: twin.agent.statistics().waiting_reason is not None, 5, "waiting for the old session")
    assert not twin.write() and a.write()
    harness.stop(a)
    twin.wait_for(is_master(2), 10, "master of epoch 2 under its own session")
