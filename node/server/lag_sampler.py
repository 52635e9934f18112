"""The node's lag sampler: every second, what a master sees of its slaves goes into a bounded
LagHistory (replication/lag_history.py), and into a JSON lines file when ``lag_history_path``
is set.

    sampler = LagSampler(config.node_id, config.group, ha.status, LagHistory(time.time),
                         journal=LagJournal(config.lag_history_path) if config.lag_history_path else None)
    nursery.start_soon(serve_lag_sampler, sampler)
    sampler.replication_status()      # ha.status() with each slave's lag_status (status reply, metrics)
    sampler.lag_history_reply(fields) # the LAG_HISTORY request (samples since a time, statuses)

Only a master has slaves to sample; a node that is a slave records nothing (its history from
an earlier term stays, so samples of several masters can be merged into one timeline by whoever
asks each node). The file keeps samples across restarts of the node: a master killed in a drill
leaves its last samples there. It is rotated to ``PATH.1`` past JOURNAL_BYTES_MAX.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Callable

import trio

from replication.lag_history import LagHistory, LagSample, LagStatus, samples_from_status

from ..wire.protocol import Fields

log = logging.getLogger(__name__)

SAMPLE_INTERVAL_S = 1.0
JOURNAL_BYTES_MAX = 64 * 1024 * 1024
REPLY_SAMPLES_MAX = 20_000          # ~200 bytes each in msgpack: a reply stays far below a frame
SINCE_MS_MAX = 2**63 - 1


class LagJournal:
    """Appends samples to a JSON lines file (one object per sample, with the group), rotating it
    to ``PATH.1`` once it passes ``bytes_max``. Blocking: the sampler calls it in a thread."""

    def __init__(self, path: str, group: str, bytes_max: int = JOURNAL_BYTES_MAX) -> None:
        self.path = os.path.expanduser(path)
        self.group = group
        self.bytes_max = bytes_max

    def write(self, samples: list[LagSample]) -> None:
        lines = "".join(json.dumps({"group": self.group, **sample.to_dict()}) + "\n" for sample in samples)
        directory = os.path.dirname(self.path)
        if directory:
            os.makedirs(directory, exist_ok=True)
        try:
            if os.path.getsize(self.path) + len(lines) > self.bytes_max:
                os.replace(self.path, self.path + ".1")
        except FileNotFoundError:
            pass
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(lines)


class LagSampler:
    """Samples the replication status section into a LagHistory (and a LagJournal)."""

    def __init__(self, node_id: str, group: str, replication_status: Callable[[], dict], history: LagHistory, *,
                 journal: LagJournal | None = None) -> None:
        self.node_id = node_id
        self.group = group
        self._status = replication_status
        self.history = history
        self.journal = journal
        self.journal_failures = 0

    def sample(self) -> list[LagSample]:
        """Record one sample per slave when this node is master; the samples taken."""
        return self.history.record_status(self.node_id, self._status())

    def replication_status(self) -> dict:
        """The replication status section, each slave with its ``lag_status`` (what the status
        reply, ``hastore cluster status`` and the metrics show), judged beside this moment's
        view of the slave (``LagHistory.status_with``): it agrees with the connection and
        lag printed next to it, not only with the last sample (up to a second old)."""
        status = self._status()
        if "slaves" in status:
            now = {sample.slave: sample for sample in samples_from_status(self.node_id, status, self.history.clock())}
            status = {**status, "slaves": [{**slave, "lag_status": self._status_now(slave["node_id"], now).value}
                                           for slave in status["slaves"]]}
        return status

    def _status_now(self, slave: str, now: dict[str, LagSample]) -> LagStatus:
        sample = now.get(slave)
        return self.history.status(slave) if sample is None else self.history.status_with(sample)

    def lag_history_reply(self, f: Fields) -> dict:
        """The LAG_HISTORY request: samples taken at or after ``since_ms`` (ms since the epoch;
        0: all kept) of one ``slave`` or all, the newest ``max_count`` of them; the statuses now."""
        since_ms = f.int("since_ms", 0, SINCE_MS_MAX, default=0)
        slave = f.optional_str("slave", 255)
        max_count = f.int("max_count", 1, REPLY_SAMPLES_MAX, default=REPLY_SAMPLES_MAX)
        samples = self.history.since(since_ms / 1000 if since_ms else None, slave, limit=max_count + 1)
        return {"node_id": self.node_id, "group": self.group, "interval_s": self.history.interval_s,
                "truncated": len(samples) > max_count, "samples": [s.to_dict() for s in samples[-max_count:]],
                "statuses": {name: status.value for name, status in self.history.statuses().items()}}

    async def write_journal(self, samples: list[LagSample]) -> None:
        """Append ``samples`` to the journal, if any, in a worker thread. A full or missing disk
        costs the file its lines, never the node its sampling: the failure is logged."""
        if self.journal is None or not samples:
            return
        try:
            await trio.to_thread.run_sync(self.journal.write, samples)
        except OSError as error:
            self.journal_failures += 1
            if self.journal_failures == 1 or self.journal_failures % 600 == 0:
                log.warning("lag history: cannot append to %s (%s; %d failures so far): check lag_history_path",
                            self.journal.path, error, self.journal_failures)


async def serve_lag_sampler(sampler: LagSampler, interval_s: float = SAMPLE_INTERVAL_S, *,
                            task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Sample every ``interval_s`` until cancelled."""
    task_status.started(sampler)
    while True:
        await sampler.write_journal(sampler.sample())
        await trio.sleep(interval_s)
