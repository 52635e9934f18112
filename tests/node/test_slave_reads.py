"""Slaves serve reads: %SYS%CONFIG records apply on a slave as they replicate in, so topics
and consumer offsets are current there; topic list, status, consume (offsets committed
through NOT_MASTER to the master) work through a slave. Nodes in this trio run, loopback."""

from __future__ import annotations

import pytest
import trio

from node.client import OutgoingMessage, open_admin, open_consumer, open_producer

from node_helpers import start_master_and_slave, wait_until

pytestmark = pytest.mark.trio


async def test_topics_offsets_and_consume_through_a_slave(tmp_path):
    async with trio.open_nursery() as nursery:
        master, slave = await start_master_and_slave(nursery, tmp_path)
        async with open_admin(master.client_address) as admin:
            await admin.create_topic("orders", queue_count=2)
        async with open_producer(master.client_address) as producer:
            await producer.send_batch("orders", [OutgoingMessage(f"m{i}".encode(), queue_id=i % 2) for i in range(6)])
        await wait_until(lambda: "orders" in slave.sys_config.topics, "the topic reaches the slave's table")
        async with open_admin(slave.client_address) as admin:
            assert (await admin.list_topics())["orders"]["queue_count"] == 2
            assert (await admin.status())["topics"] >= 1
        await wait_until(lambda: sum(slave.store.max_offset("orders", q) for q in range(2)) == 6,
                         "the messages reach the slave")
        async with open_consumer(slave.client_address, "orders", "billing", from_beginning=True) as consumer:
            bodies = sorted([(await consumer.receive()).body for _ in range(6)])
            await consumer.commit()                  # a write: follows NOT_MASTER to the master
        assert bodies == sorted(f"m{i}".encode() for i in range(6))
        assert master.sys_config.offsets("billing", "orders") == {0: 3, 1: 3}
        await wait_until(lambda: slave.sys_config.offsets("billing", "orders") == {0: 3, 1: 3},
                         "the committed offsets reach the slave")
        async with open_admin(slave.client_address) as admin:
            assert await admin.query_offsets("billing", "orders") == {0: 3, 1: 3}
        nursery.cancel_scope.cancel()
