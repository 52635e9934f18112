"""A history of client operations, Jepsen style: every operation is an ``invoke`` followed by
exactly one outcome, ``ok`` (the store acknowledged it), ``fail`` (surely not done) or
``info`` (unknown: the request may or may not have taken effect).

For sends the value is the message's unique key; ``node`` is the client address the request
went to. Times are seconds on the monotonic clock, relative to the history's origin, so
they can be compared with the times a drill takes (kill, detection).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass

OP_TYPES = ("invoke", "ok", "fail", "info")


@dataclass(frozen=True, slots=True)
class Op:
    """One history record."""

    type: str            # invoke | ok | fail | info
    f: str               # the operation: "send"
    value: str           # the message key
    time_s: float        # monotonic seconds since the history's origin
    node: str | None = None
    error: str = ""

    def __post_init__(self) -> None:
        if self.type not in OP_TYPES:
            raise ValueError(f"op type must be one of {OP_TYPES}, not {self.type!r}")

    def to_json(self) -> dict:
        return asdict(self)


class History:
    """An append-only list of Ops with an origin on the monotonic clock."""

    def __init__(self, origin_s: float | None = None) -> None:
        self.origin_s = time.monotonic() if origin_s is None else origin_s
        self.ops: list[Op] = []

    def now_s(self) -> float:
        """Seconds since the origin."""
        return time.monotonic() - self.origin_s

    def record(self, type_: str, value: str, node: str | None = None, error: str = "", f: str = "send") -> Op:
        op = Op(type_, f, value, self.now_s(), node, error)
        self.ops.append(op)
        return op

    def since(self, time_s: float) -> list[Op]:
        """The ops recorded at or after ``time_s``."""
        return [op for op in self.ops if op.time_s >= time_s]

    def count(self, type_: str) -> int:
        return sum(1 for op in self.ops if op.type == type_)

    def to_json_lines(self) -> str:
        return "".join(json.dumps(op.to_json()) + "\n" for op in self.ops)
