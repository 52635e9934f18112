"""Fault injection and verification (after Jepsen): workload, nemesis, history, checker.

- ``History`` / ``Op``: what the clients did, as invoke / ok / fail / info records.
- ``check_sends`` / ``SendVerdict``: the pure checker of a send history against what was read.
- ``send_workload``: a producer sending unique messages, recording every outcome.
- ``run_failover_drill`` / ``DrillSettings`` / ``RoundRecord`` / ``DrillReport``: kill -9 the
  master of a group, measure detection and failover, check acked messages, bring it back.
- ``checkers``: queue order, dirty reads, committed offsets going back, replica bytes,
  unavailability per fault, ``check_run`` (all of them).
- ``nemesis``: faults with heals (kill, pause, partitions and HA-link toxics through proxies),
  a schedule from a seed. ``run_chaos`` / ``RunSettings`` / ``RunReport``: ``hastore chaos run``.
- ``proxied_cluster.open_proxies``: a running LocalCluster routed through Toxiproxy proxies.

chaos uses the client library and process control (``LocalCluster``), never store internals.
"""

from .checker import SendVerdict, check_sends, percentile
from .drill import DrillReport, DrillSettings, RoundRecord, run_failover_drill
from .errors import ChaosError, DrillError
from .history import History, Op
from .checkers import RunVerdict, check_run
from .nemesis import Fault, PlannedFault, plan_schedule
from .run import CycleRecord, RunReport, RunSettings, run_chaos
from .workload import LoadSettings, WorkloadSettings, run_load, send_workload

__all__ = ["SendVerdict", "check_sends", "percentile", "DrillReport", "DrillSettings", "RoundRecord",
           "run_failover_drill", "ChaosError", "DrillError", "History", "Op", "WorkloadSettings", "send_workload",
           "RunVerdict", "check_run", "Fault", "PlannedFault", "plan_schedule", "CycleRecord", "RunReport",
           "RunSettings", "run_chaos", "LoadSettings", "run_load"]
