"""Checkers of a chaos run: pure functions from the history (and what was read at the end) to
verdicts. No I/O: the runner gathers the final reads and the replicas' bytes and passes them in.

- ``check_queue_order``: within one queue, a message acked before another was invoked must sit
  at a lower queue offset (real-time order, as Jepsen's queue checkers read it).
- ``check_dirty_reads``: a read served a message that the final state does not hold (a later
  truncation, after a failover, cut it).
- ``check_committed_offsets``: a group's committed offset, as a node answered it, below an
  offset the group had committed with an ack before that query began (it went backwards,
  typically across a failover).
- ``check_replicas``: the CommitLog bytes of every caught-up node equal the master's, byte by
  byte, up to the master's confirm offset.
- ``fault_windows``: per fault, the time from the fault to the first acked write after it.
- ``check_run``: all of them, with ``checker.check_sends`` (lost, duplicated, failed-but-present).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable, Mapping

from .checker import SendVerdict, check_sends, percentile
from .history import Op


@dataclass(frozen=True, slots=True)
class FinalMessage:
    """A message as the final read found it: its key and place."""

    key: str
    queue_id: int
    queue_offset: int


@dataclass(frozen=True, slots=True)
class OrderViolation:
    """``later`` was invoked after ``earlier`` was acked, yet sits before it in ``queue_id``."""

    queue_id: int
    earlier: str
    earlier_offset: int
    later: str
    later_offset: int

    def to_json(self) -> dict:
        return {"queue_id": self.queue_id, "earlier": self.earlier, "earlier_offset": self.earlier_offset,
                "later": self.later, "later_offset": self.later_offset}


def check_queue_order(ops: Iterable[Op], final: Iterable[FinalMessage]) -> tuple[OrderViolation, ...]:
    """Order violations among acked sends, by their final queue positions."""
    invoked_s: dict[str, float] = {}
    acked_s: dict[str, float] = {}
    for op in ops:
        if op.f == "send" and op.type == "invoke":
            invoked_s[op.value] = op.time_s
        elif op.f == "send" and op.type == "ok":
            acked_s[op.value] = op.time_s
    by_queue: dict[int, list[FinalMessage]] = defaultdict(list)
    for message in final:
        if message.key in acked_s:
            by_queue[message.queue_id].append(message)
    violations = []
    for queue_id, messages in sorted(by_queue.items()):
        messages.sort(key=lambda m: m.queue_offset)
        # scanning from the end: the later-placed message acked earliest; a message placed
        # before it but invoked after that ack is out of order
        earliest_after: FinalMessage | None = None
        for message in reversed(messages):
            if earliest_after is not None and acked_s[earliest_after.key] < invoked_s[message.key]:
                violations.append(OrderViolation(queue_id, earliest_after.key, earliest_after.queue_offset,
                                                 message.key, message.queue_offset))
            if earliest_after is None or acked_s[message.key] < acked_s[earliest_after.key]:
                earliest_after = message
    return tuple(violations)


@dataclass(frozen=True, slots=True)
class DirtyRead:
    """A key a read served (at ``time_s``, from ``node``) that the final state does not hold."""

    key: str
    node: str | None
    time_s: float
    send_outcome: str        # ok | fail | info | pending | unknown (not sent by this history)

    def to_json(self) -> dict:
        return {"key": self.key, "node": self.node, "time_s": self.time_s, "send_outcome": self.send_outcome}


def check_dirty_reads(ops: Iterable[Op], final_keys: Iterable[str]) -> tuple[DirtyRead, ...]:
    """Every key served by a ``read`` op and absent from the final state (first read of each)."""
    present = set(final_keys)
    outcome: dict[str, str] = {}
    dirty: dict[str, DirtyRead] = {}
    reads = []
    for op in ops:
        if op.f == "send":
            outcome[op.value] = "pending" if op.type == "invoke" else op.type
        elif op.f == "read" and op.type == "ok":
            reads.append(op)
    for op in reads:
        for key in op.keys:
            if key not in present and key not in dirty:
                dirty[key] = DirtyRead(key, op.node, op.time_s, outcome.get(key, "unknown"))
    return tuple(dirty.values())


@dataclass(frozen=True, slots=True)
class OffsetRegression:
    """A committed offset answered below one the group had committed (acked) before the query."""

    group: str
    queue_id: int
    committed: int           # the highest acked commit before the query was made
    answered: int
    time_s: float
    node: str | None

    def to_json(self) -> dict:
        return {"group": self.group, "queue_id": self.queue_id, "committed": self.committed,
                "answered": self.answered, "time_s": self.time_s, "node": self.node}


def check_committed_offsets(ops: Iterable[Op],
                            final_offsets: Mapping[str, Mapping[int, int]] | None = None,
                            final_time_s: float = float("inf")) -> tuple[OffsetRegression, ...]:
    """Committed offsets going backwards: each ``offsets`` answer (and the final committed
    offsets, group -> queue -> offset, read at ``final_time_s``) against the acked commits
    that completed before it. An ``offsets`` op is stamped when its query was sent, a commit's
    ``ok`` when its ack came: a query must reflect every commit acked before it was sent."""
    commits: dict[tuple[str, int], list[tuple[float, int]]] = defaultdict(list)
    answers: list[Op] = []
    for op in ops:
        if op.f == "commit" and op.type == "ok":
            commits[(op.value, op.queue_id)].append((op.time_s, op.offset))
        elif op.f == "offsets" and op.type == "ok":
            answers.append(op)
    answers.extend(Op("ok", "offsets", group, final_time_s, "final", queue_id=queue_id, offset=offset)
                   for group, queues in (final_offsets or {}).items() for queue_id, offset in queues.items())
    regressions = []
    for answer in answers:
        earlier = [offset for time_s, offset in commits.get((answer.value, answer.queue_id), ())
                   if time_s < answer.time_s]
        if earlier and answer.offset < max(earlier):
            regressions.append(OffsetRegression(answer.value, answer.queue_id, max(earlier), answer.offset,
                                                answer.time_s, answer.node))
    return tuple(regressions)


@dataclass(frozen=True, slots=True)
class ReplicaDivergence:
    """Where ``node``'s CommitLog first differs from the master's (``short``: it holds fewer
    bytes than the confirm offset, so it is not caught up)."""

    node: str
    first_difference: int    # an absolute CommitLog offset
    short: bool

    def to_json(self) -> dict:
        return {"node": self.node, "first_difference": self.first_difference, "short": self.short}


def check_replicas(master: str, copies: Mapping[str, tuple[int, bytes]], confirm_offset: int
                   ) -> tuple[ReplicaDivergence, ...]:
    """Compare every copy with the master's byte by byte, from the highest start offset any copy
    has (retention may have deleted older segments) up to ``confirm_offset``. ``copies`` maps a
    node to (the CommitLog offset its bytes start at, the bytes)."""
    if master not in copies:
        raise ValueError(f"the master {master!r} is not among the copies {sorted(copies)}")
    start = max(base for base, _ in copies.values())
    reference = _window(*copies[master], start, confirm_offset)
    if len(reference) < confirm_offset - start:
        raise ValueError(f"the master's copy ends at {copies[master][0] + len(copies[master][1])}, before its own "
                         f"confirm offset {confirm_offset}")
    divergent = []
    for node, (base, data) in sorted(copies.items()):
        if node == master:
            continue
        mine = _window(base, data, start, confirm_offset)
        if mine == reference:
            continue
        index = next((i for i, (a, b) in enumerate(zip(mine, reference)) if a != b), None)
        if index is None:      # equal as far as it goes: shorter
            divergent.append(ReplicaDivergence(node, start + len(mine), True))
        else:
            divergent.append(ReplicaDivergence(node, start + index, False))
    return tuple(divergent)


def _window(base: int, data: bytes, start: int, end: int) -> bytes:
    return data[max(0, start - base):max(0, end - base)]


@dataclass(frozen=True, slots=True)
class FaultWindow:
    """One fault: when it began and healed, and the first acked write invoked after its start."""

    kind: str
    target: str
    start_s: float
    heal_s: float | None
    first_ack_s: float | None

    @property
    def unavailable_ms(self) -> float | None:
        """Fault -> first acked write after it; None when no write was acked after it."""
        return None if self.first_ack_s is None else round((self.first_ack_s - self.start_s) * 1000, 1)

    def to_json(self) -> dict:
        return {"kind": self.kind, "target": self.target, "start_s": self.start_s, "heal_s": self.heal_s,
                "first_ack_s": self.first_ack_s, "unavailable_ms": self.unavailable_ms}


def fault_windows(ops: Iterable[Op]) -> tuple[FaultWindow, ...]:
    """Per ``nemesis`` fault op (value the kind, error the target): its heal, and the first ack
    of a send invoked at or after the fault (an ack of a request already in flight when the
    fault began says nothing about the cluster after it)."""
    ops = list(ops)
    invoked_s: dict[str, float] = {}
    acks = []
    for op in ops:
        if op.f == "send" and op.type == "invoke":
            invoked_s[op.value] = op.time_s
        elif op.f == "send" and op.type == "ok":
            acks.append((invoked_s.get(op.value, op.time_s), op.time_s))
    acks.sort()
    invoked = [invoked for invoked, _ in acks]
    # first_ack[i]: the earliest ack among sends invoked at or after invoked[i]
    first_ack = [acked for _, acked in acks]
    for index in range(len(first_ack) - 2, -1, -1):
        first_ack[index] = min(first_ack[index], first_ack[index + 1])
    windows = []
    faults = [op for op in ops if op.f == "nemesis"]
    for index, op in enumerate(faults):
        if op.value.startswith("heal:"):
            continue
        heal = next((h for h in faults[index + 1:] if h.value == f"heal:{op.value}"), None)
        after = bisect.bisect_left(invoked, op.time_s)
        first = first_ack[after] if after < len(first_ack) else None
        windows.append(FaultWindow(op.value, op.error, op.time_s, heal.time_s if heal else None, first))
    return tuple(windows)


def unavailability(windows: Iterable[FaultWindow]) -> dict:
    """Over some faults: their count, the median, p99 (nearest rank) and max unavailability (ms)
    of those followed by an ack, and how many were never followed by one."""
    windows = list(windows)
    values = [w.unavailable_ms for w in windows if w.unavailable_ms is not None]
    return {"faults": len(windows), "p50_ms": percentile(values, 0.5), "p99_ms": percentile(values, 0.99),
            "max_ms": max(values, default=None), "no_ack_after": len(windows) - len(values)}


def unavailability_by_kind(windows: Iterable[FaultWindow]) -> dict[str, dict]:
    """``unavailability`` per fault kind, kinds in name order."""
    by_kind: dict[str, list[FaultWindow]] = defaultdict(list)
    for window in windows:
        by_kind[window.kind].append(window)
    return {kind: unavailability(items) for kind, items in sorted(by_kind.items())}


@dataclass(frozen=True, slots=True)
class RunVerdict:
    """Every checker's findings over one run; ``valid`` when no safety property broke."""

    sends: SendVerdict
    order: tuple[OrderViolation, ...]
    dirty_reads: tuple[DirtyRead, ...]
    offset_regressions: tuple[OffsetRegression, ...]
    divergence: tuple[ReplicaDivergence, ...]
    faults: tuple[FaultWindow, ...]

    @property
    def valid(self) -> bool:
        return (self.sends.valid and not self.order and not self.dirty_reads and not self.offset_regressions
                and not self.divergence)

    def violations(self) -> dict[str, int]:
        """Count of each kind of safety violation."""
        return {"lost": len(self.sends.lost), "duplicated": len(self.sends.duplicated),
                "failed_present": len(self.sends.failed_present), "unexpected": len(self.sends.unexpected),
                "order": len(self.order), "dirty_reads": len(self.dirty_reads),
                "offset_regressions": len(self.offset_regressions), "divergence": len(self.divergence)}

    def to_json(self, examples_max: int = 20) -> dict:
        return {"valid": self.valid, "violations": self.violations(), "sends": self.sends.to_json(),
                "order": [v.to_json() for v in self.order[:examples_max]],
                "dirty_reads": [v.to_json() for v in self.dirty_reads[:examples_max]],
                "offset_regressions": [v.to_json() for v in self.offset_regressions[:examples_max]],
                "divergence": [v.to_json() for v in self.divergence],
                "unavailability": unavailability_by_kind(self.faults)}


def check_run(ops: Iterable[Op], final: Iterable[FinalMessage], *,
              final_offsets: Mapping[str, Mapping[int, int]] | None = None, final_time_s: float = float("inf"),
              replicas: tuple[str, Mapping[str, tuple[int, bytes]], int] | None = None) -> RunVerdict:
    """Every checker at once. ``replicas``: (master, copies, confirm offset) for check_replicas."""
    ops, final = list(ops), list(final)
    keys = [message.key for message in final]
    sends = [op for op in ops if op.f == "send"]
    return RunVerdict(sends=check_sends(sends, keys), order=check_queue_order(sends, final),
                      dirty_reads=check_dirty_reads(ops, keys),
                      offset_regressions=check_committed_offsets(ops, final_offsets, final_time_s),
                      divergence=check_replicas(*replicas) if replicas is not None else (),
                      faults=fault_windows(ops))
