"""Fault injection and verification (after Jepsen): workload, nemesis, history, checker.

- ``History`` / ``Op``: what the clients did, as invoke / ok / fail / info records.
- ``check_sends`` / ``SendVerdict``: the pure checker of a send history against what was read.
- ``send_workload``: a producer sending unique messages, recording every outcome.
- ``run_failover_drill`` / ``DrillSettings`` / ``RoundRecord`` / ``DrillReport``: kill -9 the
  master of a group, measure detection and failover, check acked messages, bring it back.

chaos uses the client library and process control (``LocalCluster``), never store internals.
"""

from .checker import SendVerdict, check_sends, percentile
from .drill import DrillReport, DrillSettings, RoundRecord, run_failover_drill
from .errors import ChaosError, DrillError
from .history import History, Op
from .workload import WorkloadSettings, send_workload

__all__ = ["SendVerdict", "check_sends", "percentile", "DrillReport", "DrillSettings", "RoundRecord",
           "run_failover_drill", "ChaosError", "DrillError", "History", "Op", "WorkloadSettings", "send_workload"]
