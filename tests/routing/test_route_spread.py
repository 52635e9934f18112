"""Spreading a topic's queues over groups (controller/routes.py): pure, no ZooKeeper."""

from __future__ import annotations

import pytest

from controller.errors import RouteError, ZnodeValueError
from controller.routes import TopicRoute, decode, encode, extend, spread


def test_eight_queues_over_two_groups_are_four_each_numbered_from_zero():
    route = spread("orders", 8, ["g1", "g2"])
    assert route.queues == (("g1", (0, 1, 2, 3)), ("g2", (0, 1, 2, 3)))
    assert route.queue_count == 8 and route.groups == ("g1", "g2")
    assert route.as_mapping() == {"g1": (0, 1, 2, 3), "g2": (0, 1, 2, 3)}


def test_an_uneven_count_gives_the_first_groups_one_more_and_no_group_an_empty_share():
    assert spread("t", 7, ["a", "b", "c"]).queues == (("a", (0, 1, 2)), ("b", (0, 1)), ("c", (0, 1)))
    assert spread("t", 2, ["a", "b", "c"]).queues == (("a", (0,)), ("b", (0,)))


@pytest.mark.parametrize("count,groups", [(0, ["g1"]), (1025, ["g1"]), (4, []), (4, ["g1", "g1"])])
def test_bad_spreads_are_refused(count, groups):
    with pytest.raises(RouteError):
        spread("t", count, groups)


def test_extend_keeps_every_old_queue_and_deals_new_ones_to_the_groups_holding_fewest():
    old = spread("t", 4, ["g1", "g2"])
    assert extend(old, 8, ["g1", "g2"]).queues == (("g1", (0, 1, 2, 3)), ("g2", (0, 1, 2, 3)))
    grown = extend(old, 8, ["g1", "g2", "g3"])
    assert grown.queues == (("g1", (0, 1, 2)), ("g2", (0, 1, 2)), ("g3", (0, 1)))
    for group, ids in old.queues:
        assert set(ids) <= set(grown.queue_ids(group))
    assert extend(old, 4, ["g1", "g2"]) == old


def test_extend_never_shrinks_nor_drops_a_group():
    old = spread("t", 8, ["g1", "g2"])
    with pytest.raises(RouteError, match="never shrinks"):
        extend(old, 6, ["g1", "g2"])
    with pytest.raises(RouteError, match="g2"):
        extend(old, 8, ["g1"])


def test_a_route_survives_its_znode_encoding():
    route = spread("orders", 5, ["g1", "g2"])
    assert decode(encode(route), "/x") == route


@pytest.mark.parametrize("data", [b"nope", b"[]", b'{"topic": "t"}', b'{"topic": "t", "queues": [["g1", [1]]]}',
                                  b'{"topic": "t", "queues": [["g1", [0]], ["g1", [0]]]}'])
def test_a_bad_znode_value_names_its_path(data):
    with pytest.raises(ZnodeValueError, match="/hastore/c/topics/t"):
        decode(data, "/hastore/c/topics/t")


def test_queue_ids_of_a_group_not_in_the_route_are_empty():
    assert TopicRoute("t", (("g1", (0,)),)).queue_ids("g9") == ()
