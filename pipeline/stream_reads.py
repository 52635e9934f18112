"""The reading half of the ``hastore`` streaming source, without Spark: where a queue's
readable messages end, how a micro-batch's limit is shared over queues, and one queue range
read with pulls into Arrow record batches, following the master across a failover.

Everything here is idempotent reads by queue offset, so any failed pull is simply asked
again (of the master found again), bounded by the target's failover timeout.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Iterator

import pyarrow as pa

from store import codec

from .cluster_access import ClusterTarget, MasterUnavailableError, find_master_once, retrying
from .errors import StreamSourceError

log = logging.getLogger(__name__)

EARLIEST, LATEST = -2, -1
PULL_COUNT = 512                 # messages per pull (the node caps a pull at 1,024 and 8 MiB)
LONG_POLL_MS = 500               # a pull waiting for a planned message that is not readable yet
PROBES_MAX = 20                  # binary search steps for a queue's readable end (ranges < 2**20)
HIDDEN_PROPERTIES = codec.STORE_PROPERTY_NAMES

TIMESTAMP = pa.timestamp("us", tz="UTC")
STREAM_COLUMNS = (
    ("group", pa.string()), ("topic", pa.string()), ("queue_id", pa.int32()), ("queue_offset", pa.int64()),
    ("physical_offset", pa.int64()), ("message_id", pa.string()), ("keys", pa.list_(pa.string())),
    ("tags", pa.string()), ("uniq_key", pa.string()), ("properties", pa.map_(pa.string(), pa.string())),
    ("body", pa.binary()), ("born_timestamp", TIMESTAMP), ("store_timestamp", TIMESTAMP),
    ("born_host", pa.string()), ("store_host", pa.string()), ("flag", pa.int32()),
)


def arrow_schema() -> pa.Schema:
    """The Arrow schema of the stream's rows."""
    return pa.schema(list(STREAM_COLUMNS))


@dataclass(frozen=True, slots=True)
class QueueRange:
    """A queue's offsets ``[start, end)`` in a micro-batch (``group``: the group that holds it,
    for routed topics; None: the source's one group)."""

    topic: str
    queue_id: int
    start: int
    end: int
    group: str | None = None


def open_reader_admin(target: ClusterTarget, read_from: str = "master"):
    """A SyncAdmin on the group's master; with ``read_from="any"``, on the first node of
    ``bootstrap`` that answers when no master can be reached."""
    from node.client import SyncAdmin
    from node.errors import NodeError
    try:
        address = find_master_once(target)
        return SyncAdmin(address, secret=target.secret, timeout_ms=target.request_timeout_ms)
    except (MasterUnavailableError, NodeError, OSError) as error:
        if read_from != "any" or not target.bootstrap:
            raise
        for address in target.bootstrap:
            try:
                return SyncAdmin(address, secret=target.secret, timeout_ms=target.request_timeout_ms)
            except (NodeError, OSError):
                continue
        raise MasterUnavailableError(f"no node of {target.describe()} answers: {error}") from error


def _readable(reply: dict) -> bool:
    """Whether a pull of one message found the offset (or found it gone, or damaged): so
    everything below it is readable too."""
    return bool(reply["messages"]) or bool(reply.get("corrupt")) or reply["status"] == "OFFSET_TOO_SMALL"


def probe_readable_end(admin, topic: str, queue_id: int, start: int, candidate: int) -> int:
    """The highest end in ``[start, candidate]`` whose messages can all be read now.

    A master under a controller serves only below its confirm offset, so the newest messages
    of a queue may exist but not be readable yet; planning them into a micro-batch would
    promise what a failover may take back. One pull of the last message answers the usual
    case; otherwise a bounded binary search finds the boundary (a lower bound if it gives up)."""
    if candidate <= start:
        return start
    if _readable(admin.pull(topic, queue_id, candidate - 1, 1, 0)):
        return candidate
    low, high = start, candidate - 1          # offsets < low readable, offset high not
    for _ in range(PROBES_MAX):
        if low >= high:
            break
        middle = (low + high) // 2
        if _readable(admin.pull(topic, queue_id, middle, 1, 0)):
            low = middle + 1
        else:
            high = middle
    return low


def share_limit(starts: dict, highs: dict, max_rows: int | None) -> dict:
    """Per queue, where a micro-batch ends: every queue's high, or, when more than
    ``max_rows`` wait, shares of ``max_rows`` in proportion to what each has waiting (at
    least one message overall, so the stream always moves)."""
    waiting = {key: highs[key] - starts[key] for key in highs}
    total = sum(waiting.values())
    if max_rows is None or total <= max_rows:
        return dict(highs)
    shares = {key: (count * max_rows) // total for key, count in waiting.items()}
    if not any(shares.values()):
        busiest = max(sorted(waiting), key=lambda key: waiting[key])
        shares[busiest] = 1
    return {key: starts[key] + shares[key] for key in highs}


def pack_ranges(ranges: list[QueueRange], max_partitions: int | None, rows_per_partition: int) -> list[tuple]:
    """Queue ranges grouped into partitions (tuples read in turn by one task): as many as the
    messages call for at ``rows_per_partition`` each (at least one), never more than
    ``max_partitions`` nor than the ranges. Each range goes whole to the partition holding
    fewest messages so far, largest ranges first; inside a partition ranges keep queue order."""
    if not ranges:
        return []
    total = sum(r.end - r.start for r in ranges)
    wanted = max(1, -(-total // rows_per_partition))
    count = min(len(ranges), wanted, max_partitions or len(ranges))
    bins: list[list[QueueRange]] = [[] for _ in range(count)]
    loads = [0] * count
    def order(r: QueueRange) -> tuple:
        return r.topic, r.group or "", r.queue_id
    for piece in sorted(ranges, key=lambda r: (-(r.end - r.start), order(r))):
        lightest = loads.index(min(loads))
        bins[lightest].append(piece)
        loads[lightest] += piece.end - piece.start
    return [tuple(sorted(b, key=order)) for b in bins if b]


def messages_batch(group: str, messages: list) -> pa.RecordBatch:
    """ReceivedMessages as one record batch of the stream's columns."""
    def props(message):
        return [(k, v) for k, v in message.properties.items() if k not in HIDDEN_PROPERTIES]
    columns = [
        [group] * len(messages), [m.topic for m in messages], [m.queue_id for m in messages],
        [m.queue_offset for m in messages], [m.physical_offset for m in messages],
        [m.message_id for m in messages], [m.keys for m in messages], [m.tags for m in messages],
        [m.uniq_key for m in messages], [props(m) for m in messages], [m.body for m in messages],
        [m.born_timestamp * 1000 for m in messages], [m.store_timestamp * 1000 for m in messages],
        [m.born_host for m in messages], [m.store_host for m in messages], [m.flag for m in messages],
    ]
    arrays = [pa.array(values, kind) for values, (_, kind) in zip(columns, STREAM_COLUMNS)]
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema())


def read_queue_range(target: ClusterTarget, piece: QueueRange, *, fail_on_data_loss: bool = True,
                     read_from: str = "master", open_admin: Callable = open_reader_admin,
                     clock: Callable[[], float] = time.monotonic) -> Iterator[pa.RecordBatch]:
    """The messages of ``piece``, in queue order, as record batches (one per pull).

    Lost offsets (retention cut them: OFFSET_TOO_SMALL; the queue ends before them:
    OFFSET_OVERFLOW; a record no replica holds intact) raise StreamSourceError, or are
    skipped with ``fail_on_data_loss=False``. A range still not readable after the failover
    timeout raises StreamSourceError."""
    from node.errors import AuthError, NodeError
    key = (target, read_from)
    state = {"admin": _ADMINS.pop(key, None) if open_admin is open_reader_admin else None}
    offset = piece.start
    where = f"{piece.topic}/{piece.queue_id}" + (f" of group {piece.group}" if piece.group else "")
    stalled_since: float | None = None

    def drop(error: BaseException) -> None:
        if isinstance(error, AuthError):
            raise error
        log.info("hastore source: pull of %s at %d failed (%s); finding the master again", where, offset, error)
        _close(state)

    def pull() -> dict:
        if state["admin"] is None:
            state["admin"] = open_admin(target, read_from)
        return state["admin"].pull(piece.topic, piece.queue_id, offset, min(PULL_COUNT, piece.end - offset),
                                   LONG_POLL_MS)

    def lost(problem: str) -> None:
        if fail_on_data_loss:
            raise StreamSourceError(f"hastore source: {where}: {problem}; the micro-batch needs offsets "
                                    f"[{piece.start}, {piece.end}) (set failOnDataLoss=false to skip lost ones)")
        log.warning("hastore source: %s: %s (failOnDataLoss=false: skipped)", where, problem)
    try:
        while offset < piece.end:
            reply = retrying(target, pull, (NodeError, OSError, MasterUnavailableError), f"pulling {where}",
                             on_retry=drop)
            messages = [m for m in reply["messages"] if offset <= m.queue_offset < piece.end]
            corrupt = sorted(item["queue_offset"] for item in reply.get("corrupt") or ()
                             if offset <= item["queue_offset"] < piece.end)
            if corrupt:
                lost(f"records at queue offsets {corrupt} are corrupt on every replica")
            if messages or corrupt:
                if messages:
                    yield messages_batch(target.group, messages)
                last = max([m.queue_offset for m in messages] + corrupt)
                offset = min(max(last + 1, int(reply.get("next_offset") or 0)), piece.end)
                stalled_since = None
                continue
            status = reply["status"]
            if status == "OFFSET_TOO_SMALL":
                first = int(reply["min_offset"])
                lost(f"offsets [{offset}, {first}) were removed by retention")
                offset = min(max(first, offset + 1), piece.end)
            elif status == "OFFSET_OVERFLOW":
                lost(f"the queue ends at offset {reply['max_offset']}, before offset {offset}")
                offset = piece.end
            else:   # planned but not readable here yet (a node catching up after a failover)
                now = clock()
                stalled_since = now if stalled_since is None else stalled_since
                if now - stalled_since > target.failover_timeout_ms / 1000:
                    raise StreamSourceError(f"hastore source: {where}: offset {offset} (planned up to {piece.end}) "
                                            f"was not readable within {target.failover_timeout_ms} ms "
                                            f"(status {status}, queue ends at {reply.get('max_offset')})")
    except BaseException:
        _close(state)
        raise
    if open_admin is open_reader_admin and state["admin"] is not None:
        _keep(key, state["admin"])      # Spark reuses Python workers: the next task skips the connect


# One idle admin connection per target (a group) kept in a Python worker between tasks
# (workers are reused); a task takes it out while it reads, so no two tasks share one.
# Bounded: past ADMINS_KEPT_MAX targets the one kept longest is closed.
ADMINS_KEPT_MAX = 16
_ADMINS: dict = {}


def _keep(key, admin) -> None:
    previous = _ADMINS.pop(key, None)
    if previous is not None:
        _close({"admin": previous})
    while len(_ADMINS) >= ADMINS_KEPT_MAX:
        _close({"admin": _ADMINS.pop(next(iter(_ADMINS)))})
    _ADMINS[key] = admin


def _close(state: dict) -> None:
    admin, state["admin"] = state["admin"], None
    if admin is not None:
        try:
            admin.close()
        except Exception as error:   # a connection already dead: nothing left to release
            log.debug("closing the admin connection: %s", error)
