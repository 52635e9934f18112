"""Unit tests of the chaos run's checkers and history format (pure: no process, no socket)."""

from __future__ import annotations

import io
import json

import pytest

from chaos.checkers import (FinalMessage, check_committed_offsets, check_dirty_reads, check_queue_order,
                            check_replicas, check_run, fault_windows, unavailability_by_kind)
from chaos.history import History, Op


def sends(*spec):
    """(key, outcome, invoke_s, outcome_s[, queue, offset]) -> ops."""
    ops = []
    for key, outcome, invoke_s, done_s, *place in spec:
        ops.append(Op("invoke", "send", key, invoke_s))
        queue_id, offset = place if place else (None, None)
        ops.append(Op(outcome, "send", key, done_s, queue_id=queue_id, offset=offset))
    return sorted(ops, key=lambda op: op.time_s)


def test_history_round_trips_through_json_lines_and_streams_to_a_sink():
    sink = io.StringIO()
    now = iter([10.0, 11.0, 12.5, 13.0])
    history = History(clock=lambda: next(now), sink=sink)
    history.record("invoke", "k1", "n1", process="producer-0")
    history.record("ok", "k1", "n1", process="producer-0", queue_id=2, offset=7)
    history.record("ok", "", "n2", f="read", keys=("k1", "k0"), queue_id=2, offset=6)
    assert [op.time_s for op in history.ops] == [1.0, 2.5, 3.0]
    assert sink.getvalue() == history.to_json_lines()
    back = History.from_json_lines(io.StringIO(sink.getvalue()))
    assert back.ops == history.ops
    # the first format (sends only, no f on some readers' files) still reads
    old = json.dumps({"type": "ok", "f": "send", "value": "a", "time_s": 1.0, "node": None, "error": ""})
    assert History.from_json_lines([old, ""]).ops == [Op("ok", "send", "a", 1.0)]
    with pytest.raises(ValueError, match="line 1"):
        History.from_json_lines(['{"type": "ok"}'])
    with pytest.raises(ValueError):
        Op("ok", "dance", "a", 0)


def test_queue_order_holds_real_time_order_and_allows_concurrent_sends_either_way():
    ops = sends(("a", "ok", 0, 1, 0, 0), ("b", "ok", 2, 3, 0, 1),
                ("c", "ok", 4, 6, 1, 0), ("d", "ok", 5, 7, 1, 1))   # c, d concurrent
    final = [FinalMessage("a", 0, 0), FinalMessage("b", 0, 1), FinalMessage("d", 1, 0), FinalMessage("c", 1, 1)]
    assert check_queue_order(ops, final) == ()
    swapped = [FinalMessage("b", 0, 0), FinalMessage("a", 0, 1)]
    [violation] = check_queue_order(ops, swapped)
    assert (violation.earlier, violation.later, violation.queue_id) == ("a", "b", 0)


def test_dirty_read_is_a_served_message_missing_from_the_final_state():
    ops = sends(("a", "ok", 0, 1), ("b", "info", 0, 2))
    ops.append(Op("ok", "read", "", 3, "slave:1", keys=("a", "b")))
    [dirty] = check_dirty_reads(ops, ["a"])
    assert (dirty.key, dirty.node, dirty.send_outcome) == ("b", "slave:1", "info")
    assert check_dirty_reads(ops, ["a", "b"]) == ()


def test_committed_offset_going_backwards_is_found_in_answers_and_in_the_final_offsets():
    ops = [Op("invoke", "commit", "cg", 0, queue_id=0, offset=10), Op("ok", "commit", "cg", 1, queue_id=0, offset=10),
           Op("ok", "offsets", "cg", 0.5, "n1", queue_id=0, offset=4),    # sent before the ack: fine
           Op("ok", "offsets", "cg", 2, "n2", queue_id=0, offset=10),
           Op("ok", "offsets", "cg", 3, "n3", queue_id=0, offset=7)]
    [regression] = check_committed_offsets(ops)
    assert (regression.node, regression.committed, regression.answered) == ("n3", 10, 7)
    assert len(check_committed_offsets(ops[:4], {"cg": {0: 9}})) == 1
    assert check_committed_offsets(ops[:4], {"cg": {0: 12}}) == ()


def test_replicas_compare_bytes_up_to_the_confirm_offset():
    master = bytes(range(200))
    copies = {"m": (0, master), "s1": (0, master[:150] + b"\xff" * 50), "s2": (100, master[100:120])}
    assert check_replicas("m", {"m": copies["m"], "s1": copies["s1"]}, 150) == ()
    found = {d.node: d for d in check_replicas("m", copies, 160)}
    assert found["s1"].first_difference == 150 and not found["s1"].short
    assert found["s2"].first_difference == 120 and found["s2"].short
    # a byte flipped below the confirm offset, with the same length: found by bytes, not counts
    flipped = bytearray(master)
    flipped[42] ^= 1
    [one] = check_replicas("m", {"m": (0, master), "s": (0, bytes(flipped))}, 100)
    assert one.first_difference == 42
    with pytest.raises(ValueError, match="confirm offset"):
        check_replicas("m", {"m": (0, master[:10])}, 100)


def test_unavailability_per_fault_is_fault_to_first_ack_after_it():
    # "e" was in flight when the fault began: its ack does not end the unavailability
    ops = sends(("a", "ok", 0, 1), ("e", "ok", 1.5, 2.5), ("b", "info", 2, 3), ("c", "ok", 4, 5.5), ("d", "ok", 8, 9))
    ops += [Op("info", "nemesis", "kill-master", 2.0, error="g1-n1"),
            Op("info", "nemesis", "heal:kill-master", 4.0, error="g1-n1"),
            Op("info", "nemesis", "pause-slave", 9.5, error="g1-n2")]
    ops.sort(key=lambda op: op.time_s)
    first, second = fault_windows(ops)
    assert (first.kind, first.target, first.heal_s, first.unavailable_ms) == ("kill-master", "g1-n1", 4.0, 3500.0)
    assert second.unavailable_ms is None and second.heal_s is None
    summary = unavailability_by_kind([first, second])
    assert summary["kill-master"]["p50_ms"] == 3500.0 and summary["pause-slave"]["no_ack_after"] == 1


def test_check_run_counts_every_violation():
    ops = sends(("a", "ok", 0, 1, 0, 0), ("b", "fail", 1, 2), ("c", "ok", 2, 3, 0, 1))
    ops.append(Op("ok", "read", "", 4, "s", keys=("x",)))
    final = [FinalMessage("b", 0, 0), FinalMessage("c", 0, 1), FinalMessage("c", 0, 2)]
    verdict = check_run(ops, final)
    assert not verdict.valid
    assert verdict.violations() == {"lost": 1, "duplicated": 1, "failed_present": 1, "unexpected": 0, "order": 0,
                                    "dirty_reads": 1, "offset_regressions": 0, "divergence": 0}
    clean = check_run(ops[:-1], [FinalMessage("a", 0, 0), FinalMessage("c", 0, 1)])
    assert clean.valid and json.dumps(clean.to_json())
