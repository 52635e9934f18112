"""RoutedProducer and RoutedConsumer against two nodes served in this process (one static
master per group): sends alternate groups, each group holds only its queues, a consumer
reads every queue from its group and commits there, and a group that goes away is passed
over, then used again once a master answers for it."""

from __future__ import annotations

import pytest
import trio

from node.client import OutgoingMessage, open_admin
from node.client.routed_consumer import _group_down, open_routed_consumer
from node.client.routing import MessageQueue, NodeDirectory, open_routed_producer
from node.errors import ConnectionLostError, UnknownOutcomeError, UnsentError
from node.server.config import NodeConfig
from node.server.node import serve_node

pytestmark = pytest.mark.trio
ROUTE = {"g1": (0, 1), "g2": (0, 1)}


def small_config(path, **changes) -> NodeConfig:
    """A static master with a small store under ``path``, every address on a free loopback port."""
    store = {"commitlog_segment_bytes": 1 << 24, "index_hash_slots": 1024, "index_max_entries": 8192,
             "consume_queue_entries_per_file": 4096, "preallocate_next_segment": False}
    return NodeConfig(**{"store_path": str(path), "client_address": "127.0.0.1:0", "metrics_address": "127.0.0.1:0",
                         "ha_address": "127.0.0.1:0", "store": store, **changes})


async def _create(address: str, topic: str, queue_count: int) -> None:
    async with open_admin(address) as admin:
        await admin.create_topic(topic, queue_count)


async def _two_groups(nursery: trio.Nursery, tmp_path) -> tuple[NodeDirectory, list]:
    """A static master per group, g1 and g2, serving topic orders (ROUTE): their directory,
    and the two nodes."""
    nodes = [await nursery.start(serve_node, small_config(tmp_path / g, node_id=f"{g}-n1", group=g))
             for g in ("g1", "g2")]
    for node in nodes:
        await _create(node.client_address, "orders", 2)
    return _directory(nodes), nodes


def _directory(nodes) -> NodeDirectory:
    """A fresh directory of g1's and g2's masters (``nodes``), serving topic orders."""
    return NodeDirectory({"orders": ROUTE}, {"g1": [nodes[0].client_address], "g2": [nodes[1].client_address]})


async def test_sends_alternate_groups_and_a_consumer_reads_and_commits_per_group(tmp_path):
    async with trio.open_nursery() as nursery:
        directory, (g1, g2) = await _two_groups(nursery, tmp_path)
        with trio.fail_after(30):
            async with open_routed_producer(directory) as producer:
                outcomes = [await producer.send_routed("orders", [OutgoingMessage(b"m%d-%d" % (i, j))
                                                                  for j in range(5)]) for i in range(8)]
                single = await producer.send("orders", b"one more")
                stats = producer.statistics()
        assert [str(o.queue) for o in outcomes[:4]] == ["g1/0", "g2/0", "g1/1", "g2/1"]
        assert all(r.ok and r.queue_id == o.queue.queue_id for o in outcomes for r in o.results)
        assert single.ok and stats.acked_by_group == {"g1": 21, "g2": 20} and stats.rerouted_batches == 0
        async with open_admin(g2.client_address) as admin:
            assert await admin.queue_offsets("orders", 0) == (0, 10)
            assert await admin.queue_offsets("orders", 1) == (0, 10)

        directory = _directory((g1, g2))
        with trio.fail_after(30):
            async with open_routed_consumer(directory, "orders", "billing", from_beginning=True,
                                            long_poll_ms=200) as consumer:
                received = [await consumer.receive() for _ in range(41)]
                committed = await consumer.commit()
        assert sorted(m.body for m in received) == sorted([b"m%d-%d" % (i, j) for i in range(8) for j in range(5)]
                                                          + [b"one more"])
        assert {m.group for m in received} == {"g1", "g2"} and received[0].to_json()["group"] in ("g1", "g2")
        assert committed == {MessageQueue("g1", 0): 11, MessageQueue("g1", 1): 10,
                             MessageQueue("g2", 0): 10, MessageQueue("g2", 1): 10}
        async with open_admin(g1.client_address) as admin:
            assert await admin.query_offsets("billing", "orders") == {0: 11, 1: 10}
        nursery.cancel_scope.cancel()


async def test_a_group_that_goes_away_is_passed_over_and_used_again_when_it_is_back(tmp_path):
    async with trio.open_nursery() as nursery:
        g1 = await nursery.start(serve_node, small_config(tmp_path / "g1", node_id="g1-n1", group="g1"))
        g2_config = small_config(tmp_path / "g2", node_id="g2-n1", group="g2")
        g2_scope = trio.CancelScope()

        async def run_g2(config, task_status=trio.TASK_STATUS_IGNORED):
            with g2_scope:
                await serve_node(config, task_status=task_status)
        g2 = await nursery.start(run_g2, g2_config)
        g2_address = g2.client_address
        for address in (g1.client_address, g2_address):
            await _create(address, "orders", 2)
        directory = NodeDirectory({"orders": ROUTE}, {"g1": [g1.client_address], "g2": [g2_address]})
        acked = {"g1": 0, "g2": 0}
        unknown = 0
        with trio.fail_after(60):
            async with open_routed_producer(directory) as producer:
                async def send(count: int) -> None:
                    nonlocal unknown
                    for i in range(count):
                        try:
                            outcome = await producer.send_routed("orders", [OutgoingMessage(b"x%d" % i)])
                        except UnknownOutcomeError:
                            unknown += 1
                            continue
                        acked[outcome.queue.group] += outcome.results[0].ok
                await send(10)
                assert acked == {"g1": 5, "g2": 5}
                g2_scope.cancel()                                  # group g2 goes away
                await trio.sleep(0.1)
                await send(20)
                during = dict(acked)
                assert during["g1"] >= 5 + 19 and during["g2"] == 5  # one send may fail or be unknown on g2
                assert "g2" in producer.health.paused(trio.current_time())
                await nursery.start(serve_node, small_config(tmp_path / "g2", node_id="g2-n1", group="g2",
                                                             client_address=g2_address))
                while acked["g2"] == during["g2"]:                # the pause ends, its master answers again
                    await send(1)
                    await trio.sleep(0.05)
                assert producer.statistics().group_failures["g2"] >= 1
        nursery.cancel_scope.cancel()


async def test_sends_started_at_once_share_one_queue_order(tmp_path):
    async with trio.open_nursery() as nursery:
        directory, _ = await _two_groups(nursery, tmp_path)
        with trio.fail_after(30):
            async with open_routed_producer(directory) as producer:
                async with trio.open_nursery() as senders:
                    for _ in range(16):
                        senders.start_soon(producer.send_batch, "orders", [OutgoingMessage(b"x") for _ in range(4)])
                assert producer.statistics().acked_by_group == {"g1": 32, "g2": 32}
        nursery.cancel_scope.cancel()


async def test_a_batch_its_group_never_read_goes_to_the_next_group(tmp_path):
    # a master that died as the request was written (a broken pipe): UnsentError, surely no
    # effect, so the batch is rerouted as for a lost connection, not raised
    async with trio.open_nursery() as nursery:
        directory, _ = await _two_groups(nursery, tmp_path)
        with trio.fail_after(30):
            async with open_routed_producer(directory) as producer:
                first = await producer.send_routed("orders", [OutgoingMessage(b"a")])
                assert first.queue.group == "g1"
                await producer.send_routed("orders", [OutgoingMessage(b"b")])   # g2's producer opened too

                async def unsent(topic, messages):
                    raise UnsentError("connection to g1 lost before a request was written whole (Broken pipe)")
                producer._producers["g1"].send_batch = unsent
                outcome = await producer.send_routed("orders", [OutgoingMessage(b"c")])
                stats = producer.statistics()
        assert outcome.queue.group == "g2" and outcome.results[0].ok
        assert stats.rerouted_batches == 1 and stats.group_failures["g1"] == 1
        nursery.cancel_scope.cancel()


async def test_a_request_a_dying_master_never_read_sends_the_consumer_to_look_for_the_next_one():
    assert _group_down(UnsentError("connection lost before a request was written whole (Broken pipe)"))
    assert _group_down(ConnectionLostError("lost")) and not _group_down(ValueError("a bug"))
