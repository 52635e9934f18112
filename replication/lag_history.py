"""Replication lag over time: a bounded history of samples per slave, and a status per slave
with no threshold to configure. Pure: time is an input (a clock passed in), no I/O.

    history = LagHistory(clock=time.time)
    history.record_status("n1", ha_status)      # the master's replication status section
    history.since(time.time() - 600)            # samples of the last ten minutes, oldest first
    history.statuses()                          # {"n2": LagStatus.OK, "n3": LagStatus.STALLED}

A sample is what the master saw of one slave at one moment: its ack offset, the master's max
offset, lag in bytes and in seconds, in-sync, connected, transfer rate, and which master in
which epoch saw it (so samples of several masters merge into one timeline, and a change of
master or epoch between two of them marks a failover).

The status judges the trend over the newest WINDOW_SAMPLES samples of the current term, the
way Burrow judges a Kafka consumer's committed offsets (no lag number to tune; each rule
asks only whether lag or offsets move, and which way). The rules, first match wins:

    OFFLINE         no sample at all, or the newest is older than OFFLINE_AFTER_INTERVALS
                    sampling intervals, or the slave is not connected;
    OK              the newest lag is zero;
    STALLED         over the newest STALL_SAMPLES samples the ack offset did not move while
                    lag stayed above zero (the master had bytes it was not taking);
    OK              lag was zero somewhere in the window (it caught up recently: a blip);
    FALLING_BEHIND  lag never fell from one sample to the next across the window, and is
                    higher at its end than at its start (it takes bytes, but fewer than arrive);
    CATCHING_UP     lag is lower at the window's end than at its start;
    OK              otherwise (a steady lag: it keeps pace).

With fewer than MIN_TREND_SAMPLES samples in the term there is no trend yet: a slave with
lag is CATCHING_UP (it has just connected), one without is OK.
"""

from __future__ import annotations

import collections
import enum
import itertools
import math
from dataclasses import asdict, dataclass
from typing import Callable, Iterable, Sequence

from .errors import ReplicationError

WINDOW_SAMPLES = 10
STALL_SAMPLES = 3
MIN_TREND_SAMPLES = 3
OFFLINE_AFTER_INTERVALS = 5
SAMPLES_PER_SLAVE_MAX = 3_600        # an hour at one sample a second
SLAVES_MAX = 64
SINCE_SAMPLES_MAX = 100_000          # one ``since`` answer at most (callers page by time)


class LagHistoryError(ReplicationError):
    """A lag sample that cannot be read (a history file or a reply written by something else)."""


class LagStatus(str, enum.Enum):
    OK = "OK"
    CATCHING_UP = "CATCHING_UP"
    FALLING_BEHIND = "FALLING_BEHIND"
    STALLED = "STALLED"
    OFFLINE = "OFFLINE"


@dataclass(frozen=True, slots=True)
class LagSample:
    """One slave as one master saw it at ``time_s`` (seconds since the epoch)."""

    time_s: float
    slave: str
    master: str
    epoch: int
    ack_offset: int
    master_offset: int
    lag_bytes: int
    lag_s: float
    in_sync: bool
    connected: bool
    rate_bytes_per_s: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.time_s) and self.lag_bytes >= 0 and self.lag_s >= 0 and self.slave
                and self.master):
            raise LagHistoryError(f"not a lag sample: {self!r}")

    def to_dict(self) -> dict:
        """A JSON- and msgpack-friendly mapping (what the wire and history files carry)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, mapping: object) -> "LagSample":
        """The sample a ``to_dict`` mapping describes; LagHistoryError naming what is wrong."""
        if not isinstance(mapping, dict):
            raise LagHistoryError(f"a lag sample must be a mapping, not {type(mapping).__name__}")
        try:
            return cls(time_s=float(mapping["time_s"]), slave=str(mapping["slave"]), master=str(mapping["master"]),
                       epoch=int(mapping["epoch"]), ack_offset=int(mapping["ack_offset"]),
                       master_offset=int(mapping["master_offset"]), lag_bytes=int(mapping["lag_bytes"]),
                       lag_s=float(mapping["lag_s"]), in_sync=bool(mapping["in_sync"]),
                       connected=bool(mapping["connected"]), rate_bytes_per_s=float(mapping["rate_bytes_per_s"]))
        except KeyError as error:
            raise LagHistoryError(f"lag sample without {error.args[0]!r}: {mapping!r}") from None
        except (TypeError, ValueError) as error:
            raise LagHistoryError(f"lag sample with a bad value ({error}): {mapping!r}") from None


def samples_from_status(master: str, status: dict, time_s: float) -> list[LagSample]:
    """One sample per slave of a master's replication status section (node/server/ha_roles.py
    ``HaRuntime.status``); none when the section is not a master's."""
    if status.get("role") != "master" or "slaves" not in status:
        return []
    master_offset = int(status["max_offset"])
    return [LagSample(time_s=time_s, slave=slave["node_id"], master=master, epoch=int(status["epoch"]),
                      ack_offset=int(slave["ack_offset"]), master_offset=master_offset,
                      lag_bytes=int(slave["lag_bytes"]), lag_s=int(slave["lag_ms"]) / 1000,
                      in_sync=bool(slave["in_sync"]), connected=bool(slave["connected"]),
                      rate_bytes_per_s=float(slave["rate_bytes_per_s"]))
            for slave in status["slaves"]]


def evaluate(samples: Sequence[LagSample], now_s: float, interval_s: float) -> LagStatus:
    """The status of one slave from its samples (oldest first) at ``now_s``; see the module
    docstring for the rules. ``interval_s``: how often samples are taken."""
    if not samples:
        return LagStatus.OFFLINE
    newest = samples[-1]
    if now_s - newest.time_s > OFFLINE_AFTER_INTERVALS * interval_s or not newest.connected:
        return LagStatus.OFFLINE
    if newest.lag_bytes == 0:
        return LagStatus.OK
    recent = list(itertools.islice(reversed(samples), WINDOW_SAMPLES))[::-1]   # a deque does not slice
    window = _current_term(recent)
    if len(window) < MIN_TREND_SAMPLES:
        return LagStatus.CATCHING_UP
    tail = window[-STALL_SAMPLES:]
    if len({s.ack_offset for s in tail}) == 1 and all(s.lag_bytes > 0 for s in tail):
        return LagStatus.STALLED
    lags = [s.lag_bytes for s in window]
    if 0 in lags:
        return LagStatus.OK
    if lags[-1] > lags[0] and all(after >= before for before, after in zip(lags, lags[1:])):
        return LagStatus.FALLING_BEHIND
    if lags[-1] < lags[0]:
        return LagStatus.CATCHING_UP
    return LagStatus.OK


def _current_term(samples: Sequence[LagSample]) -> Sequence[LagSample]:
    """The newest run of samples taken by one master in one epoch over one connection."""
    newest = samples[-1]
    start = len(samples) - 1
    while start > 0:
        before = samples[start - 1]
        if before.master != newest.master or before.epoch != newest.epoch or not before.connected:
            break
        start -= 1
    return samples[start:]


class LagHistory:
    """Samples per slave, at most ``samples_per_slave_max`` each (the oldest go first) and at
    most ``slaves_max`` slaves (the one heard of least recently goes first)."""

    def __init__(self, clock: Callable[[], float], *, interval_s: float = 1.0,
                 samples_per_slave_max: int = SAMPLES_PER_SLAVE_MAX, slaves_max: int = SLAVES_MAX) -> None:
        if interval_s <= 0 or samples_per_slave_max < WINDOW_SAMPLES or slaves_max < 1:
            raise ValueError("interval_s must be positive, samples_per_slave_max at least WINDOW_SAMPLES, "
                             "slaves_max at least 1")
        self.clock = clock
        self.interval_s = interval_s
        self.samples_per_slave_max = samples_per_slave_max
        self.slaves_max = slaves_max
        self._slaves: dict[str, collections.deque[LagSample]] = {}

    def record(self, sample: LagSample) -> None:
        """Add ``sample`` to its slave's history."""
        samples = self._slaves.pop(sample.slave, None)
        if samples is None:
            samples = collections.deque(maxlen=self.samples_per_slave_max)
            while len(self._slaves) >= self.slaves_max:
                del self._slaves[next(iter(self._slaves))]   # insertion order: least recently heard of
        samples.append(sample)
        self._slaves[sample.slave] = samples   # re-inserted: now the most recently heard of

    def record_status(self, master: str, status: dict) -> list[LagSample]:
        """Sample every slave in a master's replication status section now; the samples taken."""
        taken = samples_from_status(master, status, self.clock())
        for sample in taken:
            self.record(sample)
        return taken

    def slaves(self) -> list[str]:
        return sorted(self._slaves)

    def samples(self, slave: str) -> list[LagSample]:
        """``slave``'s samples, oldest first (none for a slave never sampled)."""
        return list(self._slaves.get(slave, ()))

    def since(self, since_s: float | None = None, slave: str | None = None,
              limit: int = SINCE_SAMPLES_MAX) -> list[LagSample]:
        """Samples taken at or after ``since_s`` (all when None), of one slave or all, in time
        order; the newest ``limit`` when there are more."""
        slaves = [slave] if slave is not None else list(self._slaves)
        picked = [s for name in slaves for s in self._slaves.get(name, ())
                  if since_s is None or s.time_s >= since_s]
        picked.sort(key=lambda s: (s.time_s, s.slave))
        return picked[-limit:] if limit > 0 else []

    def status(self, slave: str) -> LagStatus:
        """``slave``'s status now (OFFLINE for a slave never sampled)."""
        return evaluate(self._slaves.get(slave, ()), self.clock(), self.interval_s)

    def status_with(self, sample: LagSample) -> LagStatus:
        """``sample.slave``'s status beside ``sample``, its view at this moment (not
        recorded), as a status reply shows them together: what the moment itself shows
        decides (not connected: OFFLINE; no lag: OK), so the status never contradicts the
        connection and lag printed next to it; a trend (STALLED, FALLING_BEHIND,
        CATCHING_UP) is judged on the recorded samples, a second apart, with ``sample`` as
        the newest only where they alone would say OFFLINE (it reconnected since the last)."""
        if not sample.connected:
            return LagStatus.OFFLINE
        if sample.lag_bytes == 0:
            return LagStatus.OK
        recorded = self._slaves.get(sample.slave, ())
        status = evaluate(recorded, sample.time_s, self.interval_s)
        if status is not LagStatus.OFFLINE:
            return status
        recent = list(itertools.islice(reversed(recorded), WINDOW_SAMPLES - 1))[::-1]
        return evaluate(recent + [sample], sample.time_s, self.interval_s)

    def statuses(self) -> dict[str, LagStatus]:
        return {slave: self.status(slave) for slave in sorted(self._slaves)}


@dataclass(frozen=True, slots=True)
class LagEvent:
    """A moment worth marking on a lag chart: ``kind`` is "failover" (another master or epoch
    took over) or "in_sync" / "out_of_sync" (a slave joined or left the sync-state set)."""

    time_s: float
    kind: str
    detail: str


def lag_events(samples: Iterable[LagSample]) -> list[LagEvent]:
    """Failovers and sync-state set changes found in ``samples`` (of any masters, any order)."""
    ordered = sorted(samples, key=lambda s: (s.time_s, s.slave))
    events: list[LagEvent] = []
    term: tuple[str, int] | None = None
    in_sync: dict[str, bool] = {}
    for sample in ordered:
        if term is not None and (sample.master, sample.epoch) != term and sample.epoch >= term[1]:
            events.append(LagEvent(sample.time_s, "failover",
                                   f"{term[0]} (epoch {term[1]}) -> {sample.master} (epoch {sample.epoch})"))
            in_sync.clear()   # a new master starts its own sync-state set
        if term is None or sample.epoch >= term[1]:
            term = (sample.master, sample.epoch)
        elif (sample.master, sample.epoch) != term:
            continue   # a deposed master's late sample: not a change of the set that counts
        before = in_sync.get(sample.slave)
        if before is not None and before != sample.in_sync:
            events.append(LagEvent(sample.time_s, "in_sync" if sample.in_sync else "out_of_sync", sample.slave))
        in_sync[sample.slave] = sample.in_sync
    return events
