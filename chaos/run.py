"""``hastore chaos run``: the workload, a seeded schedule of nemeses, and every checker, on a
local controller-mode cluster.

Per cycle of the schedule (chaos.nemesis.plan_schedule):

1. rest: the workload runs undisturbed for the planned quiet time;
2. ready: every process of the cluster runs, the group has a master and its sync-state set
   holds every node of the group (bounded; a cycle that finds the cluster not back is
   ``unrecovered`` and the run stops faulting);
3. fault: the nemesis starts (recorded in the history as a ``nemesis`` op once the fault is
   in force), holds for its planned time, and heals;
4. recovery: the first acked write after the fault (bounded); unavailable ms = fault -> it.

Then the workload stops, every process is running again, the group is waited on until all
its nodes hold the master's max offset, the topic is read back from the master with the
group's committed offsets, the CommitLog bytes of the caught-up nodes are read up to the
master's confirm offset, and chaos.checkers.check_run judges the whole history. The history
is written as JSON lines to DIR/chaos/history-RUN.jsonl while the run goes.
"""

from __future__ import annotations

import bisect
import functools
import os
import uuid
from dataclasses import asdict, dataclass, field

import trio

from node.client import open_admin
from node.errors import RequestError
from node.cluster import LocalCluster

from .checkers import RunVerdict, check_run, unavailability, unavailability_by_kind
from .control import ClusterLocator, LocalControl, commitlog_bytes, read_final, wait_caught_up
from .errors import NemesisError, RunError
from .history import History, Op
from .nemesis import PlannedFault, expand_kinds, heal, needs_proxies, plan_schedule, start_fault
from .workload import Budget, LoadSettings, run_load

POLL_INTERVAL_S = 0.1
FINAL_READ_TRIES_MAX = 100   # refused final reads (a fenced master), each after a fresh look


@dataclass(frozen=True, slots=True)
class RunSettings:
    """What a chaos run does and its bounds (seconds)."""

    nemesis: str = "kill,pause"
    cycles: int = 3
    seed: int = 0
    time_limit_s: float = 300.0          # the faulting part; the final checks have their own bounds
    group: str = "g1"
    topic: str = "chaos"
    queue_count: int = 4
    hold_s: tuple[float, float] = (1.0, 4.0)
    rest_s: tuple[float, float] = (1.0, 3.0)
    warmup_acks: int = 20
    ready_timeout_s: float = 60.0        # cluster back (processes, master) before a fault
    recovery_timeout_s: float = 60.0     # fault -> first acked write
    catch_up_timeout_s: float = 60.0
    read_timeout_s: float = 60.0
    load: LoadSettings = field(default_factory=LoadSettings)


@dataclass(frozen=True, slots=True)
class CycleRecord:
    """One cycle: the fault and what the workload saw from its start to the next cycle's."""

    cycle: int
    kind: str
    target: str
    hold_s: float
    start_s: float
    duration_s: float | None = None      # fault in force -> healed (the heal's restarts included)
    acked: int = 0
    info: int = 0
    failed: int = 0
    lost: int = 0
    unavailable_ms: float | None = None
    recovered: bool = False
    error: str = ""

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class RunReport:
    """Every cycle, the verdict and where the history is."""

    run_id: str
    seed: int
    schedule: tuple[PlannedFault, ...]
    cycles: tuple[CycleRecord, ...]
    verdict: RunVerdict
    history_path: str
    final_master: str | None
    caught_up: bool

    @property
    def safe(self) -> bool:
        return self.verdict.valid

    @property
    def ok(self) -> bool:
        return self.safe and self.caught_up and all(c.recovered for c in self.cycles) \
            and len(self.cycles) == len(self.schedule)

    def summary(self) -> dict:
        sends = self.verdict.sends
        overall = unavailability(self.verdict.faults)
        return {"run_id": self.run_id, "seed": self.seed, "cycles_planned": len(self.schedule),
                "cycles_run": len(self.cycles), "cycles_recovered": sum(c.recovered for c in self.cycles),
                "invoked": sends.invoked, "acked": sends.acked, "failed": sends.failed, "info": sends.unknown,
                "info_present": sends.unknown_present, **self.verdict.violations(),
                "unavailable_ms_p50": overall["p50_ms"], "unavailable_ms_p99": overall["p99_ms"],
                "unavailability": overall, "unavailability_by_kind": unavailability_by_kind(self.verdict.faults),
                "final_master": self.final_master, "caught_up": self.caught_up, "safe": self.safe, "ok": self.ok,
                "history": self.history_path}

    def to_json(self) -> dict:
        return {"summary": self.summary(), "cycles": [c.to_json() for c in self.cycles],
                "schedule": [p.to_json() for p in self.schedule], "verdict": self.verdict.to_json()}


def run_chaos(cluster: LocalCluster, settings: RunSettings, *, proxies=None, address_of=None,
              on_cycle=None) -> RunReport:
    """Run the schedule on a running controller-mode cluster. ``proxies`` (a ToxiproxyClient)
    and ``address_of`` (node id -> the client address to use) for a proxied cluster.
    Raises RunError when the run cannot start; NemesisError for a bad --nemesis."""
    kinds = expand_kinds(settings.nemesis)
    if proxies is None and any(needs_proxies(kind) for kind in kinds):
        wanted = ", ".join(kind for kind in kinds if needs_proxies(kind))
        raise RunError(f"the faults {wanted} need a proxied cluster: pass --proxied (or leave them out of --nemesis)")
    if not cluster.topology.controller.enabled:
        raise RunError(f"the cluster in {cluster.directory} has static roles: a chaos run needs controller mode")
    down = [spec.name for spec in cluster.specs if cluster.pid(spec.name) is None]
    if not cluster.specs or down:
        raise RunError(f"the cluster in {cluster.directory} is not fully running (down: {', '.join(down) or 'all'}); "
                       f"start it with `hastore cluster up --dir {cluster.directory}`, or pass --up")
    schedule = plan_schedule(settings.seed, kinds, settings.cycles, hold_s=settings.hold_s, rest_s=settings.rest_s,
                             session_timeout_ms=cluster.topology.controller.session_timeout_ms)
    run_id = uuid.uuid4().hex[:8]
    directory = os.path.join(cluster.directory, "chaos")
    os.makedirs(directory, exist_ok=True)
    history_path = os.path.join(directory, f"history-{run_id}.jsonl")
    control = LocalControl(cluster, proxies)
    with open(history_path, "w", encoding="utf-8") as sink:
        history = History(sink=sink)
        runner = _Runner(cluster, control, settings, history, run_id, address_of)
        return trio.run(runner.run, schedule, history_path, on_cycle)


class _Runner:
    def __init__(self, cluster: LocalCluster, control: LocalControl, settings: RunSettings, history: History,
                 run_id: str, address_of) -> None:
        self.cluster = cluster
        self.control = control
        self.settings = settings
        self.history = history
        self.run_id = run_id
        self.topic = f"{settings.topic}-{run_id}"
        self.secret = cluster.topology.secret
        self.locator = ClusterLocator(cluster, settings.group, address_of)
        self.budget = Budget(settings.load.messages_max)

    async def run(self, schedule: tuple[PlannedFault, ...], history_path: str, on_cycle) -> RunReport:
        await self.locator.open()
        try:
            await self._create_topic()
            cycles: list[CycleRecord] = []
            stop = trio.Event()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(functools.partial(run_load, self.topic, self.settings.queue_count, self.run_id,
                                                     self.history, stop, self.locator, self.settings.load,
                                                     secret=self.secret, budget=self.budget))
                try:
                    await self._cycles(schedule, cycles, on_cycle)
                finally:
                    stop.set()
            final_master, caught_up, verdict = await self._check()
        finally:
            await self.locator.aclose()
        cycles = cycle_outcomes(cycles, self.history.ops, verdict)
        return RunReport(self.run_id, self.settings.seed, schedule, tuple(cycles), verdict, history_path,
                         final_master, caught_up)

    async def _create_topic(self) -> None:
        with trio.move_on_after(self.settings.ready_timeout_s):
            while True:
                address = await self.locator.master()
                if address is not None:
                    try:
                        async with open_admin(address, secret=self.secret) as admin:
                            await admin.create_topic(self.topic, queue_count=self.settings.queue_count)
                        return
                    except Exception:   # a master that is not ready yet: ask again
                        pass
                await trio.sleep(POLL_INTERVAL_S)
        raise RunError(f"group {self.settings.group} has no master to create topic {self.topic} on within "
                       f"{self.settings.ready_timeout_s:g} s")

    async def _cycles(self, schedule, cycles: list[CycleRecord], on_cycle) -> None:
        settings = self.settings
        if not await self._first_ack_after(0.0, settings.ready_timeout_s, settings.warmup_acks):
            raise RunError(f"the workload got fewer than {settings.warmup_acks} acks in {settings.ready_timeout_s:g} s "
                           f"before any fault")
        deadline = trio.current_time() + settings.time_limit_s
        for planned in schedule:
            if trio.current_time() >= deadline or self.budget.left <= 0:
                break   # out of time, or the workload has sent all it may: no write left to judge a fault by
            await trio.sleep(planned.rest_s)
            record = await self._cycle(planned)
            cycles.append(record)
            if on_cycle is not None:
                on_cycle(record)
            if not record.recovered:
                break   # the cluster is not in a state to fault again

    async def _cycle(self, planned: PlannedFault) -> CycleRecord:
        base = {"cycle": planned.cycle, "kind": planned.kind, "hold_s": planned.hold_s}
        problem = await self._wait_ready()
        if problem:
            return CycleRecord(**base, target="-", start_s=self.history.now_s(), error=f"before the fault: {problem}")
        try:
            fault = await trio.to_thread.run_sync(start_fault, self.control, planned.kind, self.settings.group,
                                                  planned.pick)
        except NemesisError as error:
            return CycleRecord(**base, target="-", start_s=self.history.now_s(), recovered=True,
                               error=f"skipped: {error}")
        # stamped once the fault is in force (a killed process has exited, a proxy is down):
        # finding the target takes a ZooKeeper read, during which the cluster is still whole
        start_s = self.history.now_s()
        self.history.append(Op("info", "nemesis", planned.kind, start_s, error=fault.target, process="nemesis"))
        await trio.sleep(planned.hold_s)
        errors = await trio.to_thread.run_sync(heal, self.control, fault)
        healed = self.history.record("info", f"heal:{planned.kind}", f="nemesis", error=fault.target,
                                     process="nemesis")
        first = await self._first_ack_after(start_s, self.settings.recovery_timeout_s)
        unavailable_ms = round((first - start_s) * 1000, 1) if first is not None else None
        error = "; ".join(errors) if errors else ("" if first is not None else
                                                  f"no acked write within {self.settings.recovery_timeout_s:g} s")
        if first is None and self.budget.left <= 0:
            error += (f" (the workload had sent its {self.settings.load.messages_max} messages: nothing was "
                      f"left to ack; raise --messages-max)")
        return CycleRecord(**base, target=fault.target, start_s=start_s, duration_s=round(healed.time_s - start_s, 3),
                           unavailable_ms=unavailable_ms, recovered=first is not None and not errors, error=error)

    async def _wait_ready(self) -> str:
        """'' once every process runs and the group has a master; else why not, after the bound."""
        problem = "not checked"
        with trio.move_on_after(self.settings.ready_timeout_s):
            while True:
                down = await trio.to_thread.run_sync(self.control.down_processes)
                if down:
                    problem = f"not running: {', '.join(down)}"
                elif (master := await self.locator.master_id()) is None:
                    problem = f"group {self.settings.group} has no master"
                elif not await self._all_in_sync(master):
                    problem = f"the sync-state set of {master} does not hold every node of {self.settings.group}"
                else:
                    return ""
                await trio.sleep(POLL_INTERVAL_S)
        return problem

    async def _all_in_sync(self, master: str) -> bool:
        """Whether ``master``'s sync-state set holds every node of the group (so that a fault
        meets a fully replicated group, not one whose master acks alone)."""
        try:
            with trio.fail_after(5):
                replication = (await _status(self.cluster.node(master).client_address, self.secret))["replication"]
        except Exception:   # not answering yet: not ready
            return False
        return set(replication.get("sync_state_set", ())) >= {s.name for s in self.cluster.nodes(self.settings.group)}

    async def _first_ack_after(self, time_s: float, timeout_s: float, count: int = 1) -> float | None:
        """When the ``count``-th send invoked at or after ``time_s`` was acked (waiting up to
        ``timeout_s``); as chaos.checkers.fault_windows counts it."""
        # ops are appended in time order: sends invoked before time_s are skipped, not scanned
        index = bisect.bisect_left(self.history.ops, time_s, key=lambda op: op.time_s)
        invoked_s: dict[str, float] = {}
        acked: list[float] = []
        with trio.move_on_after(timeout_s):
            while True:
                ops = self.history.ops
                for op in ops[index:]:
                    if op.f == "send" and op.type == "invoke":
                        invoked_s[op.value] = op.time_s
                    elif op.f == "send" and op.type == "ok" and invoked_s.get(op.value, -1.0) >= time_s:
                        acked.append(op.time_s)
                index = len(ops)
                if len(acked) >= count:
                    return sorted(acked)[count - 1]
                await trio.sleep(0.02)
        return None

    async def _check(self) -> tuple[str | None, bool, RunVerdict]:
        settings = self.settings
        await trio.to_thread.run_sync(self._restore)
        master, states = await self._caught_up_master()
        final_time_s = self.history.now_s()
        with trio.fail_after(settings.read_timeout_s):
            for _ in range(FINAL_READ_TRIES_MAX):
                try:
                    final, offsets = await read_final(self.cluster.node(master).client_address, self.topic,
                                                      settings.queue_count, secret=self.secret,
                                                      group=settings.load.consumer_group)
                    confirm = (await _status(self.cluster.node(master).client_address, self.secret))["replication"] \
                        .get("confirm_offset", states[master].max_offset)
                    break
                except RequestError as refused:
                    # the last fault may leave the master fenced until its role is confirmed
                    # (a ZooKeeper pause suspends its session), or another node elected: the
                    # read is refused, not failed; find the master again and read it all again
                    if refused.code not in ("SERVICE_NOT_AVAILABLE", "NOT_MASTER"):
                        raise
                    await trio.sleep(POLL_INTERVAL_S)
                    master, states = await self._caught_up_master()
            else:
                raise RunError(f"group {settings.group}'s master refused the final read {FINAL_READ_TRIES_MAX} "
                               f"times; the history is kept for inspection")
        caught_up = len(states) == len(self.cluster.nodes(settings.group)) and all(
            s.max_offset == states[master].max_offset for s in states.values())
        copies = {name: commitlog_bytes(self.cluster.node(name).data_path, confirm)
                  for name, state in states.items() if state.max_offset >= confirm}
        verdict = check_run(self.history.ops, final, final_offsets={settings.load.consumer_group: offsets},
                            final_time_s=final_time_s, replicas=(master, copies, confirm))
        return master, caught_up, verdict

    async def _caught_up_master(self) -> tuple[str, dict]:
        """The group's one master once every node holds its max offset (bounded), and the states."""
        master, states = await wait_caught_up(self.cluster, self.settings.group, self.secret,
                                              self.settings.catch_up_timeout_s)
        if master is None:
            raise RunError(f"group {self.settings.group} has no single master answering after the run; the history "
                           f"is kept for inspection")
        return master, states

    def _restore(self) -> None:
        """Start every process that is down (a heal that failed), in start order."""
        for name in self.control.down_processes():
            try:
                self.cluster.start(name)
            except Exception:   # reported by the caught-up check that follows
                pass


async def _status(address: str, secret: str | None) -> dict:
    async with open_admin(address, secret=secret) as admin:
        return await admin.status()


def cycle_outcomes(cycles: list[CycleRecord], ops: list[Op], verdict: RunVerdict) -> list[CycleRecord]:
    """Each cycle's acked / info / failed sends (outcomes from its fault to the next cycle's)
    and lost keys (acked in that span); what came before the first fault counts in the first."""
    if not cycles:
        return cycles
    starts = [c.start_s for c in cycles]
    lost = set(verdict.sends.lost)
    counts = [{"acked": 0, "info": 0, "failed": 0, "lost": 0} for _ in cycles]
    for op in ops:
        if op.f != "send" or op.type == "invoke":
            continue
        tally = counts[max(0, bisect.bisect_right(starts, op.time_s) - 1)]
        tally[{"ok": "acked", "info": "info", "fail": "failed"}[op.type]] += 1
        if op.type == "ok" and op.value in lost:
            tally["lost"] += 1
    return [CycleRecord(**{**asdict(c), **tally}) for c, tally in zip(cycles, counts)]
