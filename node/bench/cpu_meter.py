"""CPU seconds of processes from /proc, summed over measured windows: what the benches
that compare hastore with a peer (sync_compare.py, batch_costs.py) charge each process of a
side, this client process included.

    meter = CpuMeter({"master": pid, "slave0": pid0})   # "client" (this process) is added
    meter.begin(); ...workload...; meter.end()          # any number of windows
    meter.per_message_us(acked)                         # each process's and the "total"

utime + stime of the process and of its reaped children, at the kernel's clock tick
(``SC_CLK_TCK``, 10 ms here): a window must be long against a tick to mean anything.
"""

from __future__ import annotations

import os

TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime + cutime + cstime of ``pid`` in seconds (/proc/PID/stat fields 14-17)."""
    with open(f"/proc/{pid}/stat", "rb") as handle:
        fields = handle.read().rsplit(b")", 1)[1].split()
    # fields[0] is the state (field 3); utime is field 14
    return sum(int(value) for value in fields[11:15]) / TICKS_PER_S


class CpuMeter:
    """CPU seconds of named processes (this client process among them) over measured windows."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = {**pids, "client": os.getpid()}
        self.spent = dict.fromkeys(self.pids, 0.0)
        self._start: dict[str, float] | None = None

    def begin(self) -> None:
        self._start = {name: cpu_seconds(pid) for name, pid in self.pids.items()}

    def end(self) -> None:
        if self._start is None:
            raise RuntimeError("CpuMeter.end without begin")
        for name, pid in self.pids.items():
            self.spent[name] += cpu_seconds(pid) - self._start[name]
        self._start = None

    def per_message_us(self, messages: int) -> dict[str, float]:
        """Each process's CPU per message (µs) and the side's ``total``."""
        spent = {**self.spent, "total": sum(self.spent.values())}
        return {name: round(seconds * 1e6 / max(1, messages), 1) for name, seconds in spent.items()}

    def messages_per_cpu_s(self, messages: int) -> float:
        return round(messages / max(1e-9, sum(self.spent.values())), 1)
