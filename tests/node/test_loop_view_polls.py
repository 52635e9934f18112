"""The waits of node/wire/loop_view.py without a loop: ``busy_poll`` (what each turn polls,
when it yields, when it ends) and ``ReplyPoll`` (when a caller polls for its reply), on
scripted polls and clocks."""

import pytest

from node.wire.loop_view import ReplyPoll, busy_poll


class _Turns:
    """busy_poll's collaborators, scripted: what each poll finds, a clock, and the yields."""

    def __init__(self, found: list, step_s: float) -> None:
        self.found, self.step_s = found, step_s
        self.now = 0.0
        self.polls = self.yields = 0

    def poll(self, timeout_ms):
        assert timeout_ms == 0   # a busy poll never sleeps
        self.polls += 1
        return self.found.pop(0) if self.found else []

    def clock(self) -> float:
        self.now += self.step_s
        return self.now

    def give_way(self) -> None:
        self.yields += 1


def test_a_busy_poll_gives_the_cpu_way_after_each_empty_poll_until_something_is_ready():
    turns = _Turns([[], [], [], [(7, 1)]], step_s=1e-6)
    assert busy_poll(turns.poll, 1e-3, turns.clock, turns.give_way) == [(7, 1)]
    assert turns.polls == 4 and turns.yields == 3


def test_a_busy_poll_that_finds_something_at_once_neither_yields_nor_reads_the_clock():
    turns = _Turns([[(7, 1)]], step_s=1.0)
    assert busy_poll(turns.poll, 1e-3, turns.clock, turns.give_way) == [(7, 1)]
    assert turns.polls == 1 and turns.yields == 0 and turns.now == 0


def test_a_busy_poll_ends_empty_once_its_window_has_passed():
    turns = _Turns([], step_s=10e-6)
    assert busy_poll(turns.poll, 100e-6, turns.clock, turns.give_way) == []
    # the clock read at the start, then after each poll: the window ends on the 10th turn
    assert turns.polls == 11 and turns.yields == 10


def test_reply_poll_stops_after_its_misses_in_a_row_and_comes_back_with_a_reply_caught():
    now = [0.0]
    poll = ReplyPoll(200, misses_max=3, rest_waits=4, clock=lambda: now[0])
    poll.waited()                                         # a wait just ended: the next one polls

    def window() -> float:
        found = poll.window()
        poll.waited()
        return found
    for answered in (False, False, True, False, False):   # a reply caught starts the count again
        assert window() == pytest.approx(200e-6)
        poll.polled(answered)
    assert window() > 0
    poll.polled(False)                                    # the third miss in a row
    assert poll.rests == 1
    assert [window() for _ in range(4)] == [0.0] * 4      # rest_waits sleep at once
    assert window() > 0                                   # then one polls again ...
    poll.polled(False)                                    # ... and misses: another rest at once
    assert poll.rests == 2
    assert [window() for _ in range(4)] == [0.0] * 4
    assert window() > 0
    poll.polled(True)                                     # caught: polling is back
    poll.polled(False)
    poll.polled(False)
    assert poll.rests == 2 and window() > 0


def test_reply_poll_does_not_poll_for_a_request_long_after_the_last_wait():
    now = [100.0]
    poll = ReplyPoll(200, gap_s=0.001, clock=lambda: now[0])
    assert poll.window() == 0.0          # no wait yet: the first request is not polled for
    poll.waited()
    now[0] += 0.0009
    assert poll.window() == pytest.approx(200e-6)
    poll.waited()
    now[0] += 0.02                        # 20 ms idle: the node's own poll ended long ago
    assert poll.window() == 0.0
    poll.waited()
    now[0] += 0.0002
    assert poll.window() == pytest.approx(200e-6)
