"""A master paused (SIGSTOP) for longer than its ZooKeeper session timeout, then resumed,
under the concurrent workload, for each combination of min_in_sync_replicas and
all_ack_in_sync_state_set that README presents as durable: it acks nothing (sends, offset
commits) that the new master does not hold, serves no dirty read, and rejoins as a slave
without crashing (its handshake cuts its divergent tail)."""

from __future__ import annotations

import pytest
from chaos_helpers import DRILL_TOPOLOGY

from chaos.run import RunSettings, run_chaos
from chaos.workload import LoadSettings
from node.cluster.cli import LocalCluster, topology_from_mapping

pytestmark = pytest.mark.integration   # real ZooKeeper, controller and node processes

# README: "Durability by setting" lists these two as keeping every acked write across a failover
DURABLE = [pytest.param(1, True, id="min1-all_ack"), pytest.param(2, True, id="min2-all_ack")]


@pytest.mark.parametrize("min_in_sync_replicas, all_ack", DURABLE)
def test_a_master_paused_past_its_session_acks_and_serves_nothing_the_new_master_lacks(
        tmp_path, min_in_sync_replicas, all_ack):
    topology = {**DRILL_TOPOLOGY, "min_in_sync_replicas": min_in_sync_replicas,
                "all_ack_in_sync_state_set": all_ack}
    cluster = LocalCluster(str(tmp_path / "cluster"), topology_from_mapping(topology))
    try:
        cluster.up()
        settings = RunSettings(nemesis="pause-master-long", cycles=1, seed=9, hold_s=(1.0, 2.0), rest_s=(0.5, 1.0),
                               time_limit_s=90.0, load=LoadSettings(producers=2, send_interval_ms=10.0))
        report = run_chaos(cluster, settings)
        verdict = report.verdict
        assert [c.kind for c in report.cycles] == ["pause-master-long"]
        assert verdict.sends.valid, verdict.to_json()              # no acked send lost, no failed one present
        assert not verdict.dirty_reads, verdict.to_json()
        assert not verdict.offset_regressions, verdict.to_json()   # no acked commit the new master lacks
        assert not verdict.divergence and not verdict.order, verdict.to_json()
        assert report.caught_up and all(c.recovered for c in report.cycles), report.to_json()
        assert verdict.sends.acked > 20
        for spec in [s for s in cluster.specs if s.name.startswith("g1-")]:   # no node exited on its cut
            assert "Traceback" not in cluster.log_tail(spec.name, 400), cluster.log_tail(spec.name, 80)
    finally:
        cluster.down()
