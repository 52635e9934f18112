"""Unit tests of a chaos run's unavailability statistics and per-cycle counts: pure functions of
the history (no process, no socket)."""

from __future__ import annotations

import json
import random

from chaos.checkers import FinalMessage, check_run, fault_windows, unavailability, unavailability_by_kind
from chaos.history import Op
from chaos.run import CycleRecord, RunReport, cycle_outcomes
from chaos.run_cli import cycle_row, summary_lines


def send(key: str, outcome: str, invoke_s: float, done_s: float) -> list[Op]:
    return [Op("invoke", "send", key, invoke_s), Op(outcome, "send", key, done_s)]


def fault(kind: str, start_s: float, heal_s: float | None = None, target: str = "g1-n1") -> list[Op]:
    ops = [Op("info", "nemesis", kind, start_s, error=target)]
    if heal_s is not None:
        ops.append(Op("info", "nemesis", f"heal:{kind}", heal_s, error=target))
    return ops


def by_time(ops: list[Op]) -> list[Op]:
    return sorted(ops, key=lambda op: op.time_s)


def test_per_kind_median_and_p99_are_nearest_rank_over_the_faults_of_that_kind():
    ops: list[Op] = []
    # 100 kill-master faults 10 s apart, unavailable 1..100 ms each (shuffled); a send invoked
    # 1 ms after each fault is acked at the given unavailability
    delays = list(range(1, 101))
    random.Random(5).shuffle(delays)
    for number, delay_ms in enumerate(delays):
        start = number * 10.0
        ops += fault("kill-master", start, start + 1.0)
        ops += send(f"k{number}", "ok", start + 0.0005, start + delay_ms / 1000)
    # two pause-slave faults after the last ack: never followed by an ack
    ops += fault("pause-slave", 2000.0, 2001.0) + fault("pause-slave", 2010.0)
    summary = unavailability_by_kind(fault_windows(by_time(ops)))
    assert list(summary) == ["kill-master", "pause-slave"]
    assert summary["kill-master"] == {"faults": 100, "p50_ms": 50.0, "p99_ms": 99.0, "max_ms": 100.0,
                                      "no_ack_after": 0}
    assert summary["pause-slave"] == {"faults": 2, "p50_ms": None, "p99_ms": None, "max_ms": None,
                                      "no_ack_after": 2}
    overall = unavailability(fault_windows(by_time(ops)))
    assert overall["faults"] == 102 and overall["no_ack_after"] == 2 and overall["p50_ms"] == 50.0


def test_only_sends_invoked_after_the_fault_end_its_unavailability():
    ops = fault("kill-master", 10.0, 12.0)
    ops += send("in-flight", "ok", 9.9, 10.5)       # invoked before the fault: says nothing after it
    ops += send("failed", "fail", 10.1, 10.2)       # not an ack
    ops += send("unknown", "info", 10.2, 11.0)      # not an ack
    ops += send("slow", "ok", 10.3, 14.0)           # invoked after, acked late
    ops += send("fast", "ok", 11.0, 12.5)           # invoked later, acked first: it ends the window
    (window,) = fault_windows(by_time(ops))
    assert (window.heal_s, window.first_ack_s, window.unavailable_ms) == (12.0, 12.5, 2500.0)


def test_fault_windows_equal_a_direct_scan_on_a_random_history():
    rng = random.Random(11)
    ops: list[Op] = []
    for number in range(2000):
        invoke = rng.uniform(0, 100)
        ops += send(f"k{number}", rng.choice(("ok", "ok", "ok", "info", "fail")), invoke, invoke + rng.expovariate(2))
    kinds = ("kill-master", "pause-slave", "ha-latency")
    for number in range(40):
        start = rng.uniform(0, 110)
        ops += fault(kinds[number % 3], start, start + rng.uniform(0.5, 3))
    ops += fault("kill-master", 150.0, 151.0)                 # after the last send
    ops = by_time(ops)
    invoked = {op.value: op.time_s for op in ops if op.f == "send" and op.type == "invoke"}
    acks = [(invoked[op.value], op.time_s) for op in ops if op.f == "send" and op.type == "ok"]
    windows = fault_windows(ops)
    assert len(windows) == 41
    for window in windows:
        expected = min((acked for started, acked in acks if started >= window.start_s), default=None)
        assert window.first_ack_s == expected
    assert windows[-1].first_ack_s is None and windows[-1].unavailable_ms is None


def test_each_cycle_counts_the_outcomes_from_its_fault_to_the_next_and_its_lost_acks():
    ops = send("warm", "ok", 0.0, 0.5)                       # before the first fault: counts in cycle 1
    ops += fault("kill-master", 1.0, 2.0)
    ops += send("a", "ok", 1.1, 3.0) + send("b", "info", 1.2, 3.1) + send("c", "fail", 1.3, 1.4)
    ops += fault("pause-slave", 5.0, 6.0)
    ops += send("d", "ok", 4.9, 5.5) + send("e", "ok", 5.1, 5.2)   # d acked after the second fault began
    ops = by_time(ops)
    verdict = check_run(ops, [FinalMessage(key, 0, n) for n, key in enumerate(("warm", "a", "d"))])
    assert verdict.sends.lost == ("e",)
    cycles = [CycleRecord(1, "kill-master", "g1-n1", 1.0, 1.0), CycleRecord(2, "pause-slave", "g1-n2", 1.0, 5.0)]
    first, second = cycle_outcomes(cycles, ops, verdict)
    assert (first.acked, first.info, first.failed, first.lost) == (2, 1, 1, 0)
    assert (second.acked, second.info, second.failed, second.lost) == (2, 0, 0, 1)


def test_the_summary_and_table_give_each_kind_and_each_cycle():
    ops = send("warm", "ok", 0.0, 0.2)
    ops += fault("kill-master", 1.0, 3.5) + send("a", "ok", 1.5, 2.7)
    ops += fault("kill-master", 5.0, 6.0) + send("b", "ok", 5.5, 5.9)
    ops += fault("ha-latency", 8.0, 9.0) + send("c", "ok", 8.0, 8.1)
    ops = by_time(ops)
    verdict = check_run(ops, [FinalMessage(key, 0, n) for n, key in enumerate("abc")] + [FinalMessage("warm", 1, 0)])
    cycles = [CycleRecord(1, "kill-master", "g1-n1", 2.0, 1.0, duration_s=2.5, unavailable_ms=1700.0, recovered=True),
              CycleRecord(2, "kill-master", "g1-n2", 1.0, 5.0, duration_s=1.0, unavailable_ms=900.0, recovered=True),
              CycleRecord(3, "ha-latency", "g1-n2", 1.0, 8.0, duration_s=1.0, unavailable_ms=100.0, recovered=True)]
    cycles = cycle_outcomes(cycles, ops, verdict)
    report = RunReport("r1", 3, (), tuple(cycles), verdict, "/h.jsonl", "g1-n2", True)
    summary = report.summary()
    assert summary["unavailability_by_kind"]["kill-master"] == {"faults": 2, "p50_ms": 900.0, "p99_ms": 1700.0,
                                                                "max_ms": 1700.0, "no_ack_after": 0}
    assert summary["unavailability"]["faults"] == 3 and summary["unavailable_ms_p50"] == 900.0
    assert json.loads(json.dumps(report.to_json()))["cycles"][0]["duration_s"] == 2.5
    assert cycle_row(cycles[0]) == (1, "kill-master", "g1-n1", "2.5", 2, 0, 0, "1700", "yes")
    text = summary_lines(report)
    rows = {line.split()[0]: line.split()[1:] for line in text if line.split() and line.split()[0] in
            ("kill-master", "ha-latency", "all")}
    assert rows == {"kill-master": ["2", "900", "1700", "1700", "0"], "ha-latency": ["1", "100", "100", "100", "0"],
                    "all": ["3", "900", "1700", "1700", "0"]}
    assert "safety: lost 0" in "\n".join(text) and text[-1] == "history: /h.jsonl"
