"""The routing client's pure parts: queue order across groups, passing over paused groups,
pauses that grow and end. No process, no socket."""

from __future__ import annotations

import pytest

from node.client.routing import GroupHealth, MessageQueue, QueueSelector, message_queues
from node.errors import GroupUnavailableError, NoRouteError


def test_queues_interleave_groups_so_taking_them_in_turn_alternates_groups():
    assert message_queues({"g1": (0, 1, 2), "g2": (0,)}) == [
        MessageQueue("g1", 0), MessageQueue("g2", 0), MessageQueue("g1", 1), MessageQueue("g1", 2)]


def test_the_selector_goes_round_and_passes_over_unavailable_and_excluded_groups():
    selector = QueueSelector("t", {"g1": (0, 1), "g2": (0, 1)})
    every = lambda group: True  # noqa: E731
    assert [str(selector.next(every)) for _ in range(5)] == ["g1/0", "g2/0", "g1/1", "g2/1", "g1/0"]
    only_g2 = lambda group: group == "g2"  # noqa: E731
    assert [str(selector.next(only_g2)) for _ in range(3)] == ["g2/0", "g2/1", "g2/0"]
    assert selector.next(every, exclude={"g1"}).group == "g2"
    with pytest.raises(GroupUnavailableError, match="no group of topic t can take a send"):
        selector.next(lambda group: False)


def test_an_empty_route_is_refused():
    with pytest.raises(NoRouteError):
        QueueSelector("t", {})


def test_a_pause_doubles_on_each_failure_in_a_row_up_to_the_cap_and_ends_on_recovery():
    health = GroupHealth(pause_ms_min=100, pause_ms_max=500)
    assert health.available("g1", 0.0)
    assert [health.failed("g1", 10.0) for _ in range(4)] == [0.1, 0.2, 0.4, 0.5]
    assert not health.available("g1", 10.4) and health.available("g1", 10.5)
    assert health.paused(10.2) == ["g1"] and health.pause_left_s("g1", 10.2) == pytest.approx(0.3)
    assert health.available("g2", 10.2)
    health.recovered("g1")
    assert health.available("g1", 10.2) and health.failed("g1", 11.0) == 0.1
