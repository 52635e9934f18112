"""The chaos workload's consumers take their committed offsets only from a node that says it is
master: a slave answers from the records its last known confirm offset covers, which may lag
commits the master acked (the soak's offset regressions came from such answers, given by a
newly elected node before it took the role). Real controller-mode cluster."""

from __future__ import annotations

import pytest
import trio

from chaos.history import History
from chaos.workload import _committed_positions, _NotMasterYet
from node.client import open_admin

pytestmark = pytest.mark.integration   # real ZooKeeper, controller and node processes


def test_committed_offsets_are_read_from_the_master_only(controller_cluster):
    cluster = controller_cluster
    master = cluster.current_master("g1").node_id
    slave = next(spec.name for spec in cluster.nodes("g1") if spec.name != master)
    secret = cluster.topology.secret

    async def scenario():
        history = History()
        with trio.fail_after(60):
            async with open_admin(cluster.node(master).client_address, secret=secret) as admin:
                await admin.create_topic("cg-topic", queue_count=2)
                await admin.commit_offsets("cg", "cg-topic", {0: 7, 1: 9})
                positions = await _committed_positions(admin, "cg-topic", [0, 1], "cg", "m", "consumer-0", history)
            assert positions == {0: 7, 1: 9}
            assert [(op.f, op.queue_id, op.offset) for op in history.ops] == [("offsets", 0, 7), ("offsets", 1, 9)]
            async with open_admin(cluster.node(slave).client_address, secret=secret) as admin:
                with pytest.raises(_NotMasterYet):
                    await _committed_positions(admin, "cg-topic", [0, 1], "cg", "s", "consumer-0", history)
            assert len(history.ops) == 2, "a slave's answer was recorded as the group's committed offsets"
    trio.run(scenario)
