"""The node's side of integrity: the background scrub, repairs it and pulls trigger, and
what status and metrics show of them.

    guard = IntegrityGuard(store, repairer)                      # scrub at store.config.scrub_bytes_per_s
    await nursery.start(serve_integrity, guard)                  # steps: see STEP_INTERVAL_S
    metrics.registry.register(IntegrityCollector(node_id, guard))

Each step runs ``store.scrub.Scrub.step`` in a worker thread (it reads mmapped segments:
blocking), bounded by the scrub's own rate, then hands the corrupt records the store names
(``StoreStatistics.integrity.corrupt_records``: found by the scrub or by reads) to the
repairer (node/server/repair.py), at most ``REPAIRS_PER_STEP_MAX`` per step; a record the
repairer could not repair waits for its retry time. A pull that met corrupt records waits
for their repair (``repair_before_serving``, bounded by ``PULL_REPAIR_TIMEOUT_S``) and reads
again, so a repaired record is served intact; one still corrupt is named in the reply.

A step is busy when the log grew since the step before (puts on a master, replicated appends
on a slave): it checks at ``scrub_busy_bytes_per_s`` (512 KiB/s) instead of
``scrub_bytes_per_s`` (4 MiB/s). The checks are Python code in a thread, so every record
checked takes the GIL from the node's loop; under load that costs the loop far more than
the checks themselves. ``hastore bench replicate --peer redis`` (one round a run, alternated,
on the 2-core machine), one-at-a-time sync sends, CPU a message over client and group:
- the scrub at 4 MiB/s throughout: 2,050 and 1,820 µs (p50 1,150 and 1,081 µs); nearly off
  (1 byte/s): 1,640 and 1,550 µs (p50 996 and 906), though its CRC work is ~8 µs a record;
- the busy rate against 4 MiB/s throughout: 1,870 and 1,700 µs against 2,350 and 1,780
  (p50 1,122 and 962 against 1,447 and 1,054; each slave 300-340 against 320-430).
An idle node walks at the full rate, and a node written without pause still walks, slower,
in steps ``BUSY_STEP_INTERVAL_S`` apart instead of ``STEP_INTERVAL_S``: the same busy rate in a
tenth of the hops to the worker thread. The same command, two alternated pairs, 20 hops a
second against 2: batched, the group's CPU a message 59.3 and 59.0 against 52.3 and 53.6 µs
(each slave 8.0 against 6.8-7.0), 24.1k and 24.6k against 27.2k and 26.2k msgs/s; one at a
time the same within the noise (p50 1,033 and 1,001 against 879 and 1,003 µs).
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from functools import partial

import trio
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from store import MessageStore
from store.scrub import Scrub

from .repair import Repairer

log = logging.getLogger(__name__)

# Each step holds the GIL in its worker thread for what the rate allows since the last (at
# 4 MiB/s, 200 KiB: about 0.8 ms of CRC work): short steps keep a request from waiting out a
# long one (at 0.2 s and 8 MiB/s a step took 7 ms, the p99 of a one-at-a-time sync send).
STEP_INTERVAL_S = 0.05
# While the log grows, steps come this far apart (the same busy rate, in fewer, larger steps:
# 256 KiB at 512 KiB/s). A step is a hop to a worker thread and back whatever it checks, the
# GIL changing hands twice, and on a loaded node 20 hops a second cost more than the checks
# (batched sync sends: each slave 8.0 µs of CPU a message against 6.8-7.0 with 2 a second).
BUSY_STEP_INTERVAL_S = 0.5
REPAIRS_PER_STEP_MAX = 16
PULL_REPAIR_TIMEOUT_S = 10.0


class IntegrityGuard:
    """The scrub and the repairer of one node's store."""

    def __init__(self, store: MessageStore, repairer: Repairer, *, scrub_bytes_per_s: int | None = None) -> None:
        self.store = store
        self.repairer = repairer
        config = store.config
        rate = scrub_bytes_per_s or config.scrub_bytes_per_s
        self.scrub = Scrub(store.commit_log, store.integrity, bytes_per_s=rate,
                           busy_bytes_per_s=min(rate, config.scrub_busy_bytes_per_s),
                           pass_interval_s=config.scrub_pass_interval_ms / 1000)
        self.scrub_errors = 0
        self._log_end = store.commit_log.max_offset   # at the last step: busy if it moved

    async def step(self) -> bool:
        """One scrub step (what its rate allows: the busy rate if the log grew since the
        last step), then repairs of the corrupt records known; whether it was busy."""
        log_end = self.store.commit_log.max_offset
        busy, self._log_end = log_end != self._log_end, log_end
        try:
            await trio.to_thread.run_sync(partial(self.scrub.step, busy=busy))
        except (ValueError, IndexError, OSError) as error:
            # a segment deleted or cut under the walk (retention, a replica's cut): start over
            self.scrub_errors += 1
            log.info("scrub step stopped (%s: %s); it goes on from the log's start", type(error).__name__, error)
            self.scrub.position = self.store.commit_log.min_offset
        await self.repair_known()
        return busy

    def corrupt_offsets(self) -> list[int]:
        """Physical offsets of the corrupt records the store names now."""
        stats = self.store.integrity.statistics()
        return [record.physical_offset for record in stats.corrupt_records]

    async def repair_known(self) -> None:
        due = self.repairer.due(self.corrupt_offsets())[:REPAIRS_PER_STEP_MAX]
        if due:
            await self.repairer.repair_all(due)

    async def repair_before_serving(self, physical_offsets: list[int]) -> None:
        """Repair the records a pull met, waiting at most PULL_REPAIR_TIMEOUT_S."""
        with trio.move_on_after(PULL_REPAIR_TIMEOUT_S):
            await self.repairer.repair_all(physical_offsets)

    def status(self) -> dict:
        """The ``integrity`` section of a status reply (the store's own counts are in ``store``)."""
        scrub = asdict(self.scrub.statistics())
        scrub["flushed_offset"] = self.store.commit_log.flushed_offset
        scrub["errors"] = self.scrub_errors
        repair = asdict(self.repairer.statistics())
        repair["lost"] = [{"physical_offset": r.physical_offset, "reason": r.reason, "since_ms": r.since_ms}
                          for r in self.repairer.statistics().lost]
        return {"scrub": scrub, "repair": repair}


async def serve_integrity(guard: IntegrityGuard, *, interval_s: float = STEP_INTERVAL_S,
                          busy_interval_s: float = BUSY_STEP_INTERVAL_S,
                          task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Scrub and repair every ``interval_s`` until cancelled, every ``busy_interval_s``
    after a step that found the log grown."""
    task_status.started()
    busy = False
    while True:
        await trio.sleep(busy_interval_s if busy else interval_s)
        busy = await guard.step()


def corrupt_to_wire(record) -> dict:
    """A store.integrity.CorruptRecord as a pull reply names it."""
    return {"queue_offset": record.queue_offset, "physical_offset": record.physical_offset, "reason": record.reason}


class IntegrityCollector:
    """Prometheus collector: the store's integrity counts, the scrub's progress, repairs."""

    def __init__(self, node_id: str, guard: IntegrityGuard) -> None:
        self._node = node_id
        self._guard = guard

    def describe(self):
        return []

    def collect(self):
        node = self._node
        store_stats = self._guard.store.integrity.statistics()
        scrub = self._guard.scrub.statistics()
        repair = self._guard.repairer.statistics()
        gauges = (
            ("hastore_integrity_corrupt_records", "Corrupt CommitLog records known and not repaired",
             store_stats.corrupt_records_found),
            ("hastore_integrity_records_lost", "Corrupt records no replica could repair (reported by offset)",
             len(repair.lost)),
            ("hastore_scrub_position_bytes", "CommitLog offset the scrub checks next", scrub.position),
            ("hastore_scrub_flushed_offset_bytes", "End of the flushed CommitLog the scrub walks up to",
             self._guard.store.commit_log.flushed_offset),
            ("hastore_scrub_rate_bytes_per_s", "Configured scrub rate", scrub.bytes_per_s),
            ("hastore_scrub_busy_rate_bytes_per_s", "Configured scrub rate while the log grows",
             scrub.busy_bytes_per_s),
            ("hastore_scrub_busy", "1 while the scrub yields to writes (the last step ran at the busy rate)",
             int(scrub.busy)),
            ("hastore_repair_ms_max", "Longest repair of a record from a replica", repair.repair_ms_max),
        )
        for name, help_text, value in gauges:
            family = GaugeMetricFamily(name, help_text, labels=["node"])
            family.add_metric([node], value)
            yield family
        counters = (
            ("hastore_integrity_ranges_repaired", "CommitLog ranges written back from an intact copy",
             store_stats.ranges_repaired),
            ("hastore_integrity_consume_queues_rebuilt", "ConsumeQueues rebuilt from the log",
             store_stats.consume_queues_rebuilt),
            ("hastore_integrity_index_rebuilds", "IndexFile rebuilds from the log", store_stats.index_rebuilds),
            ("hastore_integrity_config_files_rebuilt", "Config files rebuilt from the log",
             store_stats.config_files_rebuilt),
            ("hastore_scrub_passes", "Whole walks of the scrub over the flushed log", scrub.passes_completed),
            ("hastore_scrub_bytes_checked", "CommitLog bytes the scrub checked", scrub.bytes_checked),
            ("hastore_scrub_records_checked", "Records the scrub checked", scrub.records_checked),
            ("hastore_scrub_corrupt_found", "Corrupt records the scrub found", scrub.corrupt_records_found),
            ("hastore_repair_attempts", "Repairs of corrupt records started", repair.attempts),
            ("hastore_repairs", "Records repaired from a replica", repair.repaired),
            ("hastore_repair_failures", "Repairs that found no intact copy", repair.failed_attempts),
        )
        for name, help_text, value in counters:
            family = CounterMetricFamily(name, help_text, labels=["node"])
            family.add_metric([node], value)
            yield family
