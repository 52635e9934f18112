"""The pure election rule and the znode value codec (no ZooKeeper)."""

from __future__ import annotations

import pytest

from controller import GroupView, MasterRecord, NodeRecord, Outcome, SyncStateSet, ZnodeValueError, decide, layout


def node(node_id, *, epoch=1, max_offset=0, priority=0, session=None) -> NodeRecord:
    return NodeRecord(node_id, f"{node_id}:10911", f"{node_id}:10912", max_offset, epoch, priority, 0,
                      session_id=session if session is not None else hash(node_id) & 0xFFFF)


def master(node_id, epoch, session) -> MasterRecord:
    return MasterRecord(node_id, epoch, session, f"{node_id}:10911", f"{node_id}:10912", 0)


def view(live, *, master_record=None, members=None, sss_epoch=None) -> GroupView:
    sss = SyncStateSet(tuple(members), sss_epoch or (master_record.epoch if master_record else 1)) \
        if members is not None else None
    return GroupView("g", master_record, sss, {n.node_id: n for n in live})


def test_live_master_is_kept():
    a = node("a", session=7)
    decision = decide(view([a, node("b")], master_record=master("a", 3, 7), members=["a", "b"]))
    assert decision.outcome is Outcome.KEEP and decision.epoch == 3


def test_order_is_epoch_then_offset_then_priority_then_id():
    dead = master("m", 5, 1)
    members = ["b", "c", "d", "e", "f"]
    cases = [
        ([node("b", epoch=4, max_offset=900), node("c", epoch=5, max_offset=100)], "c"),      # epoch first
        ([node("b", epoch=5, max_offset=900), node("c", epoch=5, max_offset=100)], "b"),      # then offset
        ([node("b", max_offset=9, priority=2), node("c", max_offset=9, priority=1)], "c"),    # then priority
        ([node("e", max_offset=9, priority=1), node("d", max_offset=9, priority=1)], "d"),    # then id
    ]
    for live, expected in cases:
        decision = decide(view(live, master_record=dead, members=members))
        assert decision.outcome is Outcome.ELECT, decision
        assert decision.new_master.node_id == expected, (live, decision)
        assert decision.epoch == 6
        assert decision.new_sync_state_set == SyncStateSet((expected,), 6)


def test_only_sync_state_set_members_are_eligible():
    decision = decide(view([node("b", max_offset=10), node("c", max_offset=999)],
                           master_record=master("a", 2, 1), members=["a", "b"]))
    assert decision.new_master.node_id == "b" and not decision.unclean


def test_a_master_back_under_a_new_session_is_not_master():
    decision = decide(view([node("a", session=99, max_offset=50), node("b", max_offset=10)],
                           master_record=master("a", 2, 1), members=["a", "b"]))
    assert decision.outcome is Outcome.ELECT
    assert decision.new_master.node_id == "a" and decision.epoch == 3
    assert "new session" in decision.reason


def test_no_eligible_node_means_no_master_with_reason():
    decision = decide(view([node("c", max_offset=999)], master_record=master("a", 2, 1), members=["a", "b"]))
    assert decision.outcome is Outcome.NO_MASTER
    assert decision.new_master is None and decision.epoch == 2
    assert "a of epoch 2 is not live" in decision.reason
    assert "no live member of the sync-state set ['a', 'b']" in decision.reason
    assert "enable_elect_unclean_master is off" in decision.reason
    nobody = decide(view([], master_record=master("a", 2, 1), members=["a"]))
    assert nobody.outcome is Outcome.NO_MASTER and "no node of group g is live" in nobody.reason


def test_unclean_election_takes_the_best_live_node():
    live = [node("c", max_offset=5), node("d", max_offset=7)]
    decision = decide(view(live, master_record=master("a", 2, 1), members=["a"]), enable_elect_unclean_master=True)
    assert decision.outcome is Outcome.ELECT and decision.unclean
    assert decision.new_master.node_id == "d" and decision.epoch == 3


def test_first_master_bootstraps_from_all_live_nodes():
    decision = decide(view([node("a", epoch=0, max_offset=3), node("b", epoch=0, max_offset=8)]))
    assert decision.outcome is Outcome.ELECT and decision.new_master.node_id == "b"
    assert decision.epoch == 1 and not decision.unclean


def test_new_epoch_is_above_every_epoch_in_sight():
    decision = decide(view([node("b", epoch=9)], master_record=master("a", 4, 1), members=["b"], sss_epoch=7))
    assert decision.epoch == 10


def test_codec_round_trip_and_errors():
    record = master("a", 3, 12345)
    assert layout.decode(MasterRecord, layout.encode(record), "/m") == record
    sss = SyncStateSet(("b", "a"), 3)
    assert layout.encode(sss) == b'{"epoch":3,"members":["a","b"]}'
    nr = node("a", session=5)
    decoded = layout.decode(NodeRecord, layout.encode(nr), "/n", session_id=5)
    assert decoded == nr and decoded.session_id == 5 and b"session_id" not in layout.encode(nr)
    assert layout.decode(SyncStateSet, b'{"members":["a"],"epoch":1,"future":true}', "/s").members == ("a",)
    with pytest.raises(ZnodeValueError, match="/x"):
        layout.decode(MasterRecord, b"\x93not json", "/x")
    with pytest.raises(ZnodeValueError, match="lacks"):
        layout.decode(MasterRecord, b'{"node_id":"a"}', "/x")
    with pytest.raises(ValueError):
        layout.node_path("c", "g", "bad/id")
