"""The send checker and percentiles: pure functions over hand-written histories."""

from __future__ import annotations

import pytest

from chaos import History, Op, check_sends, percentile


def _history(*outcomes: tuple[str, str]) -> list[Op]:
    ops = []
    for index, (key, outcome) in enumerate(outcomes):
        ops.append(Op("invoke", "send", key, 2.0 * index))
        ops.append(Op(outcome, "send", key, 2.0 * index + 1))
    return ops


def test_every_acked_message_read_once_is_valid_and_unknowns_may_go_either_way():
    ops = _history(("a", "ok"), ("b", "ok"), ("c", "fail"), ("d", "info"), ("e", "info"))
    verdict = check_sends(ops, ["a", "b", "d"])
    assert verdict.valid
    assert (verdict.invoked, verdict.acked, verdict.failed, verdict.unknown) == (5, 2, 1, 2)
    assert (verdict.unknown_present, verdict.unknown_absent) == (1, 1)
    assert verdict.lost == () and verdict.duplicated == () and verdict.unexpected == ()


def test_an_acked_message_not_read_is_lost():
    verdict = check_sends(_history(("a", "ok"), ("b", "ok"), ("c", "ok")), ["a", "c"])
    assert not verdict.valid and verdict.lost == ("b",)
    assert verdict.to_json()["lost"] == ["b"] and verdict.to_json()["valid"] is False


def test_duplicates_failed_but_present_and_unexpected_messages_are_invalid():
    assert check_sends(_history(("a", "ok")), ["a", "a"]).duplicated == ("a",)
    failed = check_sends(_history(("a", "ok"), ("b", "fail")), ["a", "b"])
    assert failed.failed_present == ("b",) and not failed.valid
    stranger = check_sends(_history(("a", "ok")), ["a", "zz"])
    assert stranger.unexpected == ("zz",) and not stranger.valid


def test_a_send_without_an_outcome_is_pending_and_counts_as_unknown():
    ops = [Op("invoke", "send", "a", 0.0)]
    verdict = check_sends(ops, [])
    assert verdict.pending == 1 and verdict.valid and verdict.unknown_absent == 1


def test_malformed_histories_are_refused():
    with pytest.raises(ValueError, match="invoked twice"):
        check_sends([Op("invoke", "send", "a", 0), Op("ok", "send", "a", 1), Op("invoke", "send", "a", 2)], [])
    with pytest.raises(ValueError, match="without a pending invoke"):
        check_sends([Op("ok", "send", "a", 0)], [])
    with pytest.raises(ValueError, match="op type"):
        Op("done", "send", "a", 0)


def test_history_records_times_from_its_origin_and_serialises_as_json_lines():
    history = History()
    history.record("invoke", "k1", "127.0.0.1:1")
    history.record("ok", "k1", "127.0.0.1:1")
    assert [op.type for op in history.ops] == ["invoke", "ok"] and history.count("ok") == 1
    assert 0 <= history.ops[0].time_s <= history.ops[1].time_s < 5
    assert history.since(history.ops[1].time_s) == [history.ops[1]]
    lines = history.to_json_lines().splitlines()
    assert len(lines) == 2 and '"type": "ok"' in lines[1]


def test_nearest_rank_percentiles():
    values = list(range(1, 21))          # 20 rounds: p99 is the slowest, p50 the 10th
    assert percentile(values, 0.99) == 20 and percentile(values, 0.5) == 10
    assert percentile([7.5], 0.99) == 7.5 and percentile([], 0.5) is None
    with pytest.raises(ValueError):
        percentile(values, 0)
