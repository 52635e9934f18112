"""A SEND's reply from the store's results: one map per message, or one list per field.

    end, transposed = end_of(results)           # where a written batch ends, for the waits
    reply = send_reply(queue_ids, results, failure, columns, tally, started, transposed)

``results`` is what ``MessageStore.append`` returned: a PutResult per message, or
PutColumns for a batch written column-wise whole (every message PUT_OK), which the
``result_columns`` reply takes as it is. A ``failure`` (the disk or the replicas did not
make the batch as durable as an ack promises, or the node lost its role) replaces PUT_OK as
every written message's status. The puts are counted in ``tally`` as the reply is built.
"""

from __future__ import annotations

import time
from typing import Callable

from store import PutColumns, PutResult, PutStatus

from .metrics import RequestTally

_PUT_OK = PutStatus.PUT_OK  # a module global: enum member lookups through the class cost on the hot path

Failure = tuple[PutStatus, str]


def end_of(results: list[PutResult]) -> tuple[int, tuple]:
    """The log offset past the last written message of ``results`` (0: none), and the
    results transposed (a tuple per PutResult field, in C: no frame per result)."""
    transposed = tuple(zip(*results))
    status_column, physical_offsets, _, _, _, wrote_bytes, _ = transposed
    if status_column.count(_PUT_OK) == len(results):
        # records do not overlap: the one that starts last ends last
        last = physical_offsets.index(max(physical_offsets))
        return physical_offsets[last] + wrote_bytes[last], transposed
    return max((r.end_offset for r in results if r.status is _PUT_OK), default=0), transposed


def send_reply(queue_ids: list[int], results: list[PutResult] | PutColumns, failure: Failure | None,
               columns: bool, tally: RequestTally, started: float, transposed: tuple | None = None) -> dict:
    """Per-message results, as one map each (``results``) or, when the request asked for
    ``result_columns``, as one list per field (status, queue_id, queue_offset,
    physical_offset, message_id, reason; reason "" for a message without one): a few lists
    instead of a map per message, on both ends. ``transposed``: ``tuple(zip(*results))``
    when the caller has it. ``started``: the request's ``perf_counter`` time, for the put
    latency counted."""
    if type(results) is PutColumns:
        if columns:
            return _column_reply(queue_ids, results, failure, tally, started)
        results = results.results()
    # the results transposed in one C-level pass: a tuple per PutResult field
    (status_column, physical_offsets, queue_offsets, message_ids, _, wrote_bytes,
     _) = transposed or zip(*results)
    statuses, reasons = _statuses(results, status_column, wrote_bytes, failure, tally, started)
    if columns:
        return {"result_columns": {
            "status": statuses, "queue_id": queue_ids, "queue_offset": list(queue_offsets),
            "physical_offset": list(physical_offsets), "message_id": list(message_ids), "reason": reasons}}
    return {"results": [
        {"status": status, "queue_id": queue_id, "queue_offset": result.queue_offset,
         "physical_offset": result.physical_offset, "message_id": result.message_id,
         **({"reason": reason} if reason else {})}
        for status, queue_id, result, reason in zip(statuses, queue_ids, results, reasons)]}


def _column_reply(queue_ids: list[int], written: PutColumns, failure: Failure | None, tally: RequestTally,
                  started: float) -> dict:
    """``send_reply`` of a batch written whole, from its columns."""
    count = len(written.sizes)
    if failure is None:
        tally.count_put(count, sum(written.sizes), 0, time.perf_counter() - started)
        statuses, reasons = ["PUT_OK"] * count, [""] * count
    else:
        tally.count_put(0, 0, count, time.perf_counter() - started)
        statuses, reasons = [failure[0].value] * count, [failure[1]] * count
    return {"result_columns": {
        "status": statuses, "queue_id": queue_ids, "queue_offset": written.queue_offsets,
        "physical_offset": written.physical_offsets, "message_id": written.message_ids(), "reason": reasons}}


def _statuses(results, status_column: tuple, wrote_bytes: tuple, failure: Failure | None, tally: RequestTally,
              started: float) -> tuple[list, list]:
    """Each result's status name and reason ("" for none) after ``failure``, with the puts
    counted. ``status_column``, ``wrote_bytes``: those fields of every result."""
    count = len(results)
    # tuple.count compares by identity first: no Enum.__hash__ (Python code) per result
    if failure is None and status_column.count(_PUT_OK) == count:
        tally.count_put(count, sum(wrote_bytes), 0, time.perf_counter() - started)
        return ["PUT_OK"] * count, [""] * count
    statuses, reasons = [], []
    ok_count = ok_bytes = 0
    for result in results:
        status, reason = result.status, result.reason
        if status is _PUT_OK and failure is None:
            ok_count += 1
            ok_bytes += result.wrote_bytes
        elif status is _PUT_OK:
            status, reason = failure[0], reason or failure[1]
        statuses.append(status.value)
        reasons.append(reason)
    tally.count_put(ok_count, ok_bytes, count - ok_count, time.perf_counter() - started)
    return statuses, reasons


class _HeldCount:
    """A tally that keeps the one count a reply's building makes, for later."""

    __slots__ = ("put",)

    def __init__(self) -> None:
        self.put: tuple[int, int, int, float] | None = None

    def count_put(self, ok_count: int, ok_bytes: int, failed: int, latency_s: float) -> None:
        self.put = (ok_count, ok_bytes, failed, latency_s)


def success_reply(queue_ids: list[int], results: list[PutResult] | PutColumns, columns: bool, tally: RequestTally,
                  started: float, transposed: tuple | None = None) -> tuple[dict, Callable[[], None]] | None:
    """``send_reply`` with no failure, built ahead of its outcome (a sync put's, while the
    replicas work), and a call that counts the puts in ``tally`` once it is the answer,
    with the latency of that moment; None when a message was refused (not worth it)."""
    held = _HeldCount()
    reply = send_reply(queue_ids, results, None, columns, held, started, transposed)
    ok_count, ok_bytes, failed, _ = held.put

    def count() -> None:
        tally.count_put(ok_count, ok_bytes, failed, time.perf_counter() - started)
    return (reply, count) if not failed else None
