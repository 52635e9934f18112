"""Checkers: pure functions from a history (and what was read back) to a verdict.

``check_sends`` for a send workload, given every message key read from the store:

- lost: acknowledged (``ok``) but not read. Never allowed.
- duplicated: read more than once. Never allowed (the producer never retries an unknown
  outcome, so the store must not hold a message twice).
- failed_present: ``fail`` (surely refused before any write) but read. Never allowed.
- unknown_present / unknown_absent: ``info`` sends that were / were not stored; both fine.
- unexpected: read but never invoked by this history (another writer, or corruption).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Iterable

from .history import Op


@dataclass(frozen=True, slots=True)
class SendVerdict:
    """The outcome of check_sends; ``valid`` when nothing forbidden happened."""

    invoked: int
    acked: int
    failed: int
    unknown: int
    pending: int                      # invoked without an outcome (the history was cut short)
    lost: tuple[str, ...]
    duplicated: tuple[str, ...]
    failed_present: tuple[str, ...]
    unknown_present: int
    unknown_absent: int
    unexpected: tuple[str, ...]

    @property
    def valid(self) -> bool:
        return not (self.lost or self.duplicated or self.failed_present or self.unexpected)

    def to_json(self) -> dict:
        return {"valid": self.valid, "invoked": self.invoked, "acked": self.acked, "failed": self.failed,
                "unknown": self.unknown, "pending": self.pending, "lost": list(self.lost),
                "duplicated": list(self.duplicated), "failed_present": list(self.failed_present),
                "unknown_present": self.unknown_present, "unknown_absent": self.unknown_absent,
                "unexpected": list(self.unexpected)}


def check_sends(ops: Iterable[Op], read_keys: Iterable[str]) -> SendVerdict:
    """Check a send history against every key read back (one entry per stored message)."""
    outcome: dict[str, str] = {}
    invoked: list[str] = []
    for op in ops:
        if op.f != "send":
            continue
        if op.type == "invoke":
            if op.value in outcome:
                raise ValueError(f"key {op.value!r} is invoked twice: a send history needs unique keys")
            invoked.append(op.value)
            outcome[op.value] = "pending"
        else:
            if outcome.get(op.value) != "pending":
                raise ValueError(f"{op.type} for key {op.value!r} without a pending invoke")
            outcome[op.value] = op.type
    read = Counter(read_keys)
    by_type = Counter(outcome.values())
    lost = tuple(key for key in invoked if outcome[key] == "ok" and read[key] == 0)
    failed_present = tuple(key for key in invoked if outcome[key] == "fail" and read[key] > 0)
    unknown = [key for key in invoked if outcome[key] in ("info", "pending")]
    return SendVerdict(
        invoked=len(invoked), acked=by_type["ok"], failed=by_type["fail"], unknown=by_type["info"],
        pending=by_type["pending"], lost=lost, duplicated=tuple(sorted(k for k, n in read.items() if n > 1)),
        failed_present=failed_present, unknown_present=sum(1 for key in unknown if read[key] > 0),
        unknown_absent=sum(1 for key in unknown if read[key] == 0),
        unexpected=tuple(sorted(key for key in read if key not in outcome)))


def percentile(values: Iterable[float], fraction: float) -> float | None:
    """The nearest-rank percentile (``fraction`` in (0, 1]); None for no values."""
    ordered = sorted(values)
    if not ordered:
        return None
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], not {fraction}")
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]
