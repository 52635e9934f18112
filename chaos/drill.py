"""The failover drill: kill -9 a group's master under a sync-replicated send workload, measure
how long failover takes, check every acknowledged message, bring the old master back.

Each round:

1. Find the master in ZooKeeper; wait until its sync-state set has another member (a
   successor the controller may elect) and the workload has some acked sends.
2. kill -9 the master (the nemesis). Time 0 of the round.
3. detection: the master znode names another node or a newer epoch (polled every 10 ms).
4. failover: the first send acknowledged by the new master, measured from the kill.
5. A few more acked sends on the new master, then the workload stops.
6. The old master is started again; it must report role slave and reach the new master's
   max CommitLog offset (truncating anything it had that was never acked by the set).
7. Every message of the drill topic is read back from the new master (all queues), and the
   whole history so far is checked (chaos.checker.check_sends): nothing acked is lost.

A round ``recovered`` when 3-6 happened within their bounds; the drill is ``ok`` when every
round recovered and lost nothing. It drives processes through LocalCluster, reads the
cluster's state through LocalCluster.records() (master records with their epochs, the
sync-state set, waits for a new master) and messages with the client library; it reads no
znode itself.
"""

from __future__ import annotations

import functools
import time
import uuid
from dataclasses import asdict, dataclass, field

import trio

from controller import MasterRecord, NoMasterError
from node.client import open_admin
from node.cluster import ClusterError, ClusterRecords, LocalCluster
from node.errors import NodeError

from .checker import SendVerdict, check_sends, percentile
from .control import read_final
from .errors import DrillError
from .history import History
from .workload import WorkloadSettings, send_workload

ZK_POLL_INTERVAL_S = 0.01
STATUS_POLL_INTERVAL_S = 0.1
ZK_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class DrillSettings:
    """Bounds of a drill round (seconds) and its workload."""

    group: str = "g1"
    topic: str = "drill"
    queue_count: int = 4
    warmup_acks: int = 20               # acked sends before the kill
    after_acks: int = 20                # acked sends on the new master before the workload stops
    ready_timeout_s: float = 30.0       # for the sync-state set to hold a successor, and warm-up
    failover_timeout_s: float = 30.0    # kill -> first acked write on the new master
    rejoin_timeout_s: float = 60.0      # restart -> old master caught up as a slave
    read_timeout_s: float = 30.0
    workload: WorkloadSettings = field(default_factory=WorkloadSettings)


@dataclass(frozen=True, slots=True)
class RoundRecord:
    """What one round measured. Times in ms from the kill unless named otherwise."""

    round: int
    killed: str
    old_epoch: int
    kill_wall_ms: int
    new_master: str | None = None
    new_epoch: int | None = None
    detection_ms: float | None = None       # master znode names another node / a newer epoch
    failover_ms: float | None = None        # first acked write on the new master
    acked: int = 0                          # acked sends in this round
    failed: int = 0
    unknown: int = 0
    lost: int = 0                           # acked, in this round or before, and not readable now
    duplicates: int = 0
    failed_present: int = 0
    rejoined_as_slave: bool = False
    caught_up: bool = False
    rejoin_ms: float | None = None          # from the restart to caught up
    recovered: bool = False
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.recovered and self.lost == 0 and self.duplicates == 0 and self.failed_present == 0

    def to_json(self) -> dict:
        return {**asdict(self), "ok": self.ok}


@dataclass(frozen=True, slots=True)
class DrillReport:
    """Every round and the summary over them."""

    rounds: tuple[RoundRecord, ...]
    session_timeout_ms: int
    verdict: SendVerdict | None

    @property
    def ok(self) -> bool:
        return bool(self.rounds) and all(r.ok for r in self.rounds) and (self.verdict is None or self.verdict.valid)

    @property
    def target_ms(self) -> int:
        """The failover target: ZooKeeper session timeout + 1 s."""
        return self.session_timeout_ms + 1000

    def summary(self) -> dict:
        failovers = [r.failover_ms for r in self.rounds if r.failover_ms is not None]
        detections = [r.detection_ms for r in self.rounds if r.detection_ms is not None]
        p99 = percentile(failovers, 0.99)
        return {"rounds": len(self.rounds), "rounds_ok": sum(r.ok for r in self.rounds),
                "rounds_recovered": sum(r.recovered for r in self.rounds),
                "acked": sum(r.acked for r in self.rounds), "lost": sum(r.lost for r in self.rounds),
                "lost_total_now": len(self.verdict.lost) if self.verdict else None,
                "duplicates": len(self.verdict.duplicated) if self.verdict else None,
                "detection_ms_p50": percentile(detections, 0.5), "detection_ms_p99": percentile(detections, 0.99),
                "failover_ms_p50": percentile(failovers, 0.5), "failover_ms_p99": p99,
                "failover_ms_max": max(failovers, default=None),
                "session_timeout_ms": self.session_timeout_ms, "target_ms": self.target_ms,
                "target_met": p99 is not None and len(failovers) == len(self.rounds) and p99 <= self.target_ms,
                "ok": self.ok}

    def to_json(self) -> dict:
        return {"rounds": [r.to_json() for r in self.rounds], "summary": self.summary(),
                "verdict": self.verdict.to_json() if self.verdict else None}


def run_failover_drill(cluster: LocalCluster, rounds: int, settings: DrillSettings = DrillSettings(),
                       on_round=None) -> DrillReport:
    """Run ``rounds`` failover rounds on a running controller-mode cluster; ``on_round(record)``
    is called after each. Raises DrillError when the drill cannot start at all."""
    if not cluster.topology.controller.enabled:
        raise DrillError(f"the cluster in {cluster.directory} has static roles: a failover drill needs "
                         f"controller mode (`controller: {{mode: controller}}` in cluster.yaml)")
    nodes = cluster.nodes(settings.group)
    if not nodes:
        raise DrillError(f"the cluster in {cluster.directory} has no group {settings.group!r}")
    down = [spec.name for spec in nodes if cluster.pid(spec.name) is None]
    if down or cluster.pid("zookeeper") is None:
        raise DrillError(f"the cluster in {cluster.directory} is not fully running (down: "
                         f"{', '.join(down or ['zookeeper'])}); start it with `hastore cluster up --dir "
                         f"{cluster.directory}`")
    if len(nodes) < 2:
        raise DrillError(f"group {settings.group} has one node: nothing to fail over to")
    return trio.run(_drill, cluster, rounds, settings, on_round)


async def _drill(cluster: LocalCluster, rounds: int, settings: DrillSettings, on_round) -> DrillReport:
    run_id = uuid.uuid4().hex[:8]
    history = History()
    records: list[RoundRecord] = []
    try:
        cluster_records = await trio.to_thread.run_sync(cluster.records, ZK_TIMEOUT_S)
    except ClusterError as error:
        raise DrillError(f"cannot connect to ZooKeeper at {cluster.zk_hosts}: {error}") from None
    verdict = None
    try:
        drill = _Drill(cluster, settings, history, cluster_records, run_id)
        await drill.create_topic()
        for number in range(1, rounds + 1):
            record = await drill.round(number)
            records.append(record)
            if on_round is not None:
                on_round(record)
            if not record.recovered:
                break      # the cluster is not in a state to kill its master again
        verdict = drill.last_verdict
    finally:
        await trio.to_thread.run_sync(cluster_records.close)
    return DrillReport(tuple(records), cluster.topology.controller.session_timeout_ms, verdict)


class _Drill:
    def __init__(self, cluster: LocalCluster, settings: DrillSettings, history: History, records: ClusterRecords,
                 run_id: str) -> None:
        self.cluster = cluster
        self.settings = settings
        self.history = history
        self.records = records
        self.topic = f"{settings.topic}-{run_id}"
        self.run_id = run_id
        self.secret = cluster.topology.secret
        self.last_verdict: SendVerdict | None = None

    # --- the cluster's records (LocalCluster.records) ------------------------------------
    async def live_master(self) -> MasterRecord | None:
        try:
            return await trio.to_thread.run_sync(self.records.live_master, self.settings.group)
        except (NoMasterError, ClusterError):
            return None

    async def locate(self) -> str | None:
        master = await self.live_master()
        return master.client_address if master is not None else None

    async def wait_master(self, timeout_s: float) -> MasterRecord:
        with trio.move_on_after(timeout_s):
            while True:
                master = await self.live_master()
                if master is not None:
                    return master
                await trio.sleep(STATUS_POLL_INTERVAL_S)
        raise DrillError(f"group {self.settings.group} has no live master after {timeout_s:g} s")

    async def wait_successor(self, master: MasterRecord, timeout_s: float) -> None:
        """Until the sync-state set holds a live member besides the master."""
        with trio.move_on_after(timeout_s):
            while True:
                group = await trio.to_thread.run_sync(self.records.group, self.settings.group)
                if group.successors(master.node_id):
                    return
                await trio.sleep(STATUS_POLL_INTERVAL_S)
        raise DrillError(f"the sync-state set of group {self.settings.group} holds no live member besides "
                         f"{master.node_id} after {timeout_s:g} s: killing it would leave no master")

    # --- the round -------------------------------------------------------------------------
    async def create_topic(self) -> None:
        master = await self.wait_master(self.settings.ready_timeout_s)
        async with open_admin(master.client_address, secret=self.secret) as admin:
            await admin.create_topic(self.topic, queue_count=self.settings.queue_count)

    async def round(self, number: int) -> RoundRecord:
        settings = self.settings
        master = await self.wait_master(settings.ready_timeout_s)
        await self.wait_successor(master, settings.ready_timeout_s)
        start_index = len(self.history.ops)
        stop = trio.Event()
        fields: dict = {"round": number, "killed": master.node_id, "old_epoch": master.epoch}
        async with trio.open_nursery() as nursery:
            nursery.start_soon(functools.partial(send_workload, self.topic, f"{self.run_id}-r{number}",
                                                 self.history, stop, self.locate, settings.workload,
                                                 secret=self.secret))
            try:
                fields.update(await self._kill_and_fail_over(master, start_index))
            finally:
                stop.set()
        round_ops = self.history.ops[start_index:]
        fields.update(acked=sum(op.type == "ok" for op in round_ops),
                      failed=sum(op.type == "fail" for op in round_ops),
                      unknown=sum(op.type == "info" for op in round_ops))
        if fields.get("error"):
            return RoundRecord(**fields)
        try:
            fields.update(await self._rejoin(master.node_id, fields["new_master"]))
            verdict = await self._check(fields["new_master"])
        except (DrillError, NodeError, ClusterError, OSError, trio.TooSlowError) as error:
            return RoundRecord(**fields, error=f"{type(error).__name__}: {error}")
        self.last_verdict = verdict
        prefix = f"{self.run_id}-r{number}-"
        fields.update(lost=sum(key.startswith(prefix) for key in verdict.lost),
                      duplicates=len(verdict.duplicated), failed_present=len(verdict.failed_present))
        error = "" if not verdict.lost else f"acked messages lost (all rounds): {list(verdict.lost)[:5]}"
        return RoundRecord(**fields, recovered=True, error=error)

    async def _acks_since(self, start_index: int, node: str | None = None, after_s: float = 0.0) -> list:
        return [op for op in self.history.ops[start_index:]
                if op.type == "ok" and op.time_s >= after_s and (node is None or op.node == node)]

    async def _wait_for(self, predicate, timeout_s: float, interval_s: float = ZK_POLL_INTERVAL_S):
        with trio.move_on_after(timeout_s):
            while True:
                value = await predicate()
                if value:
                    return value
                await trio.sleep(interval_s)
        return None

    async def _kill_and_fail_over(self, master: MasterRecord, start_index: int) -> dict:
        settings = self.settings

        async def warmed_up():
            return len(await self._acks_since(start_index)) >= settings.warmup_acks
        if not await self._wait_for(warmed_up, settings.ready_timeout_s):
            return {"kill_wall_ms": int(time.time() * 1000),
                    "error": f"the workload got fewer than {settings.warmup_acks} acks in {settings.ready_timeout_s:g} s "
                             f"before the kill"}
        kill_wall_ms = int(time.time() * 1000)
        kill_s = self.history.now_s()
        await trio.to_thread.run_sync(self.cluster.kill, master.node_id)
        result: dict = {"kill_wall_ms": kill_wall_ms}

        try:
            record = await trio.to_thread.run_sync(self.records.wait_for_new_master, settings.group, master,
                                                   settings.failover_timeout_s, ZK_POLL_INTERVAL_S,
                                                   abandon_on_cancel=True)
        except ClusterError:
            result["error"] = f"ZooKeeper still names {master.node_id} master {settings.failover_timeout_s:g} s after the kill"
            return result
        result.update(detection_ms=round((self.history.now_s() - kill_s) * 1000, 1), new_master=record.node_id,
                      new_epoch=record.epoch)
        remaining_s = max(0.1, settings.failover_timeout_s - (self.history.now_s() - kill_s))

        async def first_ack():
            return (await self._acks_since(start_index, record.client_address, kill_s))[:1]
        acks = await self._wait_for(first_ack, remaining_s)
        if not acks:
            result["error"] = f"no acked write on the new master {record.node_id} within {settings.failover_timeout_s:g} s"
            return result
        result["failover_ms"] = round((acks[0].time_s - kill_s) * 1000, 1)

        async def enough_after():
            return len(await self._acks_since(start_index, record.client_address, kill_s)) >= settings.after_acks
        await self._wait_for(enough_after, settings.ready_timeout_s)
        return result

    async def _rejoin(self, old: str, new_master: str) -> dict:
        """Start the killed node; it must come back as a slave at the new master's max offset."""
        started_s = self.history.now_s()
        await trio.to_thread.run_sync(self.cluster.start, old)
        old_spec, master_spec = self.cluster.node(old), self.cluster.node(new_master)
        state = {"rejoined_as_slave": False, "caught_up": False}

        async def caught_up():
            async with open_admin(old_spec.client_address, secret=self.secret) as admin:
                mine = await admin.status()
            async with open_admin(master_spec.client_address, secret=self.secret) as admin:
                theirs = await admin.status()
            state["rejoined_as_slave"] = mine.get("role") == "slave"
            state["caught_up"] = (mine["store"]["max_physical_offset"] == theirs["store"]["max_physical_offset"]
                                  and theirs.get("role") == "master")
            return state["rejoined_as_slave"] and state["caught_up"]
        done = await self._wait_for(caught_up, self.settings.rejoin_timeout_s, STATUS_POLL_INTERVAL_S)
        if not done:
            raise DrillError(f"{old} did not rejoin as a caught-up slave of {new_master} within "
                             f"{self.settings.rejoin_timeout_s:g} s (slave: {state['rejoined_as_slave']}, "
                             f"caught up: {state['caught_up']})")
        return {**state, "rejoin_ms": round((self.history.now_s() - started_s) * 1000, 1)}

    async def _check(self, master_node: str) -> SendVerdict:
        address = self.cluster.node(master_node).client_address
        with trio.fail_after(self.settings.read_timeout_s):
            keys = await read_topic_keys(address, self.topic, self.settings.queue_count, secret=self.secret)
        return check_sends(self.history.ops, keys)


async def read_topic_keys(address: str, topic: str, queue_count: int, *, secret: str | None = None) -> list[str]:
    """The first key of every message of ``topic`` stored at ``address``, all queues, from each
    queue's min offset to its max offset (chaos.control.read_final: it waits, bounded by the
    caller's cancel scope, for messages not yet readable under the confirm offset)."""
    messages, _ = await read_final(address, topic, queue_count, secret=secret)
    return [message.key for message in messages]
