"""Under a controller, a slave serves reads only up to the confirm offset its master sent
it, and so applies a ``%SYS%CONFIG`` record only once that offset covers it. A topic
created through the master must reach every slave's topic list and reads at once, not at
the next put: the master tells its slaves the confirm offset as soon as the record's ack
moves it, and a slave applies the records the new offset covers. Real ZooKeeper,
controllers and node processes; no put follows the topic's creation."""

from __future__ import annotations

import pytest
import trio

from node.client import open_admin
from node.cluster.cli import LocalCluster, topology_from_mapping

pytestmark = pytest.mark.integration   # ZooKeeper, controllers and node processes

SMALL_STORE = {"commitlog_segment_bytes": 1 << 20, "consume_queue_entries_per_file": 4096,
               "index_hash_slots": 1024, "index_max_entries": 8192}
TOPOLOGY = {"cluster": "cfg", "store": SMALL_STORE, "startup_timeout_s": 30,
            "controller": {"session_timeout_ms": 1500, "zookeeper": {"tick_ms": 250}}}
# what "at once" means here: a few confirm frames and one catch-up, with the machine busy
SEEN_WITHIN_S = 3.0


@pytest.fixture
def controller_cluster(tmp_path):
    cluster = LocalCluster(str(tmp_path / "cluster"), topology_from_mapping(TOPOLOGY))
    try:
        cluster.up()
        yield cluster
    finally:
        cluster.down()


async def _in_sync(master_address: str, members: int, timeout_s: float = 30) -> None:
    """Until the master's sync-state set holds ``members`` nodes (the slaves caught up)."""
    with trio.fail_after(timeout_s):
        async with open_admin(master_address) as admin:
            while len(((await admin.status()).get("replication") or {}).get("sync_state_set") or []) < members:
                await trio.sleep(0.05)


async def _seen_by_slave(address: str, topic: str) -> dict:
    """How long ``topic`` takes to be listed and readable through the slave at ``address``."""
    started = trio.current_time()
    async with open_admin(address) as admin:
        while topic not in await admin.list_topics():
            await trio.sleep(0.02)
        listed_s = trio.current_time() - started
        pulled = await admin.pull(topic, 0, 0, max_count=1)   # TOPIC_NOT_EXIST before the record applies
        status = await admin.status()
    return {"listed_s": listed_s, "pull_status": pulled["status"], "role": status["role"]}


def test_a_topic_created_through_the_master_reaches_the_slaves_without_another_put(controller_cluster):
    master = controller_cluster.master("g1")
    slaves = [spec for spec in controller_cluster.nodes("g1") if spec.name != master.name]

    async def run() -> list[dict]:
        await _in_sync(master.client_address, 1 + len(slaves))
        for round_number in range(3):   # more than once: each record on its own, with nothing behind it
            topic = f"fresh{round_number}"
            async with open_admin(master.client_address) as admin:
                await admin.create_topic(topic, queue_count=2)
            with trio.fail_after(SEEN_WITHIN_S):
                seen = [await _seen_by_slave(slave.client_address, topic) for slave in slaves]
            assert all(item["role"] == "slave" for item in seen), seen
            assert all(item["pull_status"] != "TOPIC_NOT_EXIST" for item in seen), seen
            print({"topic": topic, "seen": seen})
        return seen

    trio.run(run)
