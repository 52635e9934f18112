"""A history of client operations, Jepsen style: every operation is an ``invoke`` followed by
exactly one outcome, ``ok`` (the store acknowledged it), ``fail`` (surely not done) or
``info`` (unknown: the request may or may not have taken effect).

Operations (``f``) and what their fields hold:

- ``send``: ``value`` is the message's unique key; an ``ok`` carries ``queue_id`` and
  ``offset`` (the queue offset the store gave it).
- ``read``: one pull that served messages (``ok`` only, no invoke: a read changes nothing);
  ``keys`` are the keys served, in order, ``queue_id`` and ``offset`` the first one's queue
  offset, ``node`` the address that served them (a slave's, for reads through slaves).
- ``commit``: a consumer group's offset commit; ``value`` the group, ``queue_id``/``offset``.
- ``offsets``: a consumer group's committed offset as a node answered it (``ok`` only).
- ``nemesis``: a fault (``info``; ``value`` the fault kind, ``error`` its target) and its heal
  (``value`` ``heal:KIND``). Jepsen records its nemesis in the history the same way.

``node`` is the client address a request went to, ``process`` the client (``producer-0``,
``consumer-1``, ``nemesis``). Times are seconds on the monotonic clock, relative to the
history's origin, so they compare with the times a drill or run measures.

The history is written as JSON lines (``to_json_lines``, or streamed to a file with
``HistoryFile``) and read back with ``History.from_json_lines``.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from typing import IO, Iterable

OP_TYPES = ("invoke", "ok", "fail", "info")
OP_FUNCTIONS = ("send", "read", "commit", "offsets", "nemesis")


@dataclass(frozen=True, slots=True)
class Op:
    """One history record."""

    type: str            # invoke | ok | fail | info
    f: str               # send | read | commit | offsets | nemesis
    value: str           # the message key (send), group (commit, offsets), fault kind (nemesis)
    time_s: float        # monotonic seconds since the history's origin
    node: str | None = None
    error: str = ""
    process: str | None = None
    queue_id: int | None = None
    offset: int | None = None
    keys: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.type not in OP_TYPES:
            raise ValueError(f"op type must be one of {OP_TYPES}, not {self.type!r}")
        if self.f not in OP_FUNCTIONS:
            raise ValueError(f"op f must be one of {OP_FUNCTIONS}, not {self.f!r}")

    def to_json(self) -> dict:
        """The record as JSON; fields still at their defaults are left out (except node and error,
        which every record of the first format had)."""
        fields = asdict(self)
        fields["keys"] = list(self.keys)
        return {name: value for name, value in fields.items()
                if name in ("type", "f", "value", "time_s", "node", "error") or value not in (None, [])}

    @classmethod
    def from_json(cls, item: dict) -> "Op":
        """The inverse of ``to_json`` (records of the first format, sends only, read too)."""
        return cls(type=item["type"], f=item.get("f", "send"), value=item["value"], time_s=float(item["time_s"]),
                   node=item.get("node"), error=item.get("error", ""), process=item.get("process"),
                   queue_id=item.get("queue_id"), offset=item.get("offset"), keys=tuple(item.get("keys", ())))


class History:
    """An append-only list of Ops with an origin on the monotonic clock; ``sink`` (an open text
    file) receives each op as a JSON line when it is recorded."""

    def __init__(self, origin_s: float | None = None, *, clock=time.monotonic, sink: IO[str] | None = None) -> None:
        self._clock = clock
        self.origin_s = clock() if origin_s is None else origin_s
        self.ops: list[Op] = []
        self.sink = sink

    def now_s(self) -> float:
        """Seconds since the origin."""
        return self._clock() - self.origin_s

    def record(self, type_: str, value: str, node: str | None = None, error: str = "", f: str = "send",
               **fields) -> Op:
        """Append an op stamped now (``fields``: process, queue_id, offset, keys)."""
        op = Op(type_, f, value, self.now_s(), node, error, **fields)
        self.append(op)
        return op

    def append(self, op: Op) -> None:
        self.ops.append(op)
        if self.sink is not None:
            self.sink.write(json.dumps(op.to_json()) + "\n")

    def since(self, time_s: float) -> list[Op]:
        """The ops recorded at or after ``time_s``."""
        return [op for op in self.ops if op.time_s >= time_s]

    def count(self, type_: str, f: str | None = None) -> int:
        return sum(1 for op in self.ops if op.type == type_ and f in (None, op.f))

    def to_json_lines(self) -> str:
        return "".join(json.dumps(op.to_json()) + "\n" for op in self.ops)

    @classmethod
    def from_json_lines(cls, lines: Iterable[str]) -> "History":
        """A history read back from JSON lines (blank lines skipped); its origin is 0."""
        history = cls(origin_s=0.0)
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                history.ops.append(Op.from_json(json.loads(line)))
            except (ValueError, KeyError, TypeError) as error:
                raise ValueError(f"history line {number} is not an op: {error}") from None
        return history
