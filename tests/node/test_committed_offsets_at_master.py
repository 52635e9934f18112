"""Committed offsets come from the master only. A slave's view of a group's offsets (or that
of a node elected but not yet in the master role) covers only the %SYS%CONFIG records it
has applied and may lag commits the master acked: the consumers ask with ``master_only``
and follow NOT_MASTER, so a consumer through a slave, or one whose directory names a node
before it is master, starts from the master's offsets. Messages still come from the slave.
A master and a slave in this trio run, loopback; the slave's replication is cut (it follows
a dead HA address) so its view stays behind while the master takes new commits."""

from __future__ import annotations

import pytest
import trio

from node.client import OutgoingMessage, open_admin, open_consumer, open_producer
from node.client.admin import Admin
from node.client.connection import connect
from node.client.routed_consumer import open_routed_consumer
from node.client.routing import NodeDirectory
from node.cluster.process import free_port
from node.errors import NotMasterError
from node.server.role import Role

from node_helpers import start_master_and_slave, wait_until

pytestmark = pytest.mark.trio

GROUP = "billing"
LAGGING = {0: 1, 1: 1}     # what the slave applied before its replication was cut
COMMITTED = {0: 3, 1: 3}   # what the master acked after


def _dead_ha_address() -> str:
    """A loopback address nothing listens on. Below the ephemeral range (``free_port``): a
    port from it (``bind(0)``) can be the local port of the slave's own connection attempt,
    which then connects to itself (TCP simultaneous open) instead of being refused."""
    return f"127.0.0.1:{free_port()}"


async def _master_and_lagging_slave(nursery, tmp_path):
    """A master holding 8 messages in 2 queues and COMMITTED for GROUP; a slave holding the
    messages but only LAGGING (its replication cut in between), naming the master."""
    master, slave = await start_master_and_slave(nursery, tmp_path)
    async with open_admin(master.client_address) as admin:
        await admin.create_topic("orders", queue_count=2)
        async with open_producer(master.client_address) as producer:
            await producer.send_batch("orders", [OutgoingMessage(b"m%d" % i, queue_id=i % 2) for i in range(8)])
        await admin.commit_offsets(GROUP, "orders", LAGGING)
        await wait_until(lambda: slave.sys_config.offsets(GROUP, "orders") == LAGGING
                         and sum(slave.store.max_offset("orders", q) for q in range(2)) == 8,
                         "the messages and the first commit reach the slave")
        await slave.change_role(Role.SLAVE, slave.role.state.epoch, master.client_address,
                                master_ha_address=_dead_ha_address())
        await admin.commit_offsets(GROUP, "orders", COMMITTED)
    assert master.sys_config.offsets(GROUP, "orders") == COMMITTED
    return master, slave


async def test_the_offset_query_answer_path(tmp_path):
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            master, slave = await _master_and_lagging_slave(nursery, tmp_path)
            async with open_admin(slave.client_address) as admin:
                assert await admin.query_offsets(GROUP, "orders") == LAGGING    # the slave's own view, still served
                assert await admin.committed_offsets(GROUP, "orders") == COMMITTED   # NOT_MASTER followed
            async with trio.open_nursery() as inner:
                bare = Admin(await connect(slave.client_address, inner))    # no nursery: NOT_MASTER is raised
                with pytest.raises(NotMasterError) as refused:
                    await bare.committed_offsets(GROUP, "orders")
                assert refused.value.master_address == master.client_address
                assert "committed offsets are answered by the master" in refused.value.message
                await bare.connection.aclose()
                on_master = Admin(await connect(master.client_address, inner))
                assert await on_master.committed_offsets(GROUP, "orders") == COMMITTED
                await on_master.connection.aclose()
            nursery.cancel_scope.cancel()


async def test_a_consumer_through_a_lagging_slave_starts_from_the_masters_offsets(tmp_path):
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            master, slave = await _master_and_lagging_slave(nursery, tmp_path)
            async with open_consumer(slave.client_address, "orders", GROUP, long_poll_ms=200) as consumer:
                assert consumer.positions == COMMITTED
                received = sorted((m.queue_id, m.queue_offset, m.body) for m in
                                  [await consumer.receive(), await consumer.receive()])
                assert await consumer.commit() == {0: 4, 1: 4}
            assert received == [(0, 3, b"m6"), (1, 3, b"m7")]     # pulled from the slave, nothing again
            assert master.sys_config.offsets(GROUP, "orders") == {0: 4, 1: 4}
            nursery.cancel_scope.cancel()


async def test_a_consumer_waits_out_a_node_that_names_no_master_yet(tmp_path, caplog):
    """The slave names no master (a failover's gap): the start asks again until it does; after
    ``master_wait_s`` it starts from the slave's own view (which may lag: messages come again,
    none is skipped), with a warning. Start offsets given for every queue ask nothing."""
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            master, slave = await _master_and_lagging_slave(nursery, tmp_path)
            dead = _dead_ha_address()
            epoch = slave.role.state.epoch
            await slave.change_role(Role.SLAVE, epoch, None, master_ha_address=dead)
            async with open_consumer(slave.client_address, "orders", GROUP, master_wait_s=0.3) as consumer:
                assert consumer.positions == LAGGING
            assert any("no master answered" in r.message for r in caplog.records)
            given = {0: 2, 1: 0}
            with trio.fail_after(5):        # asking would wait out master_wait_s (10 s): it does not ask
                async with open_consumer(slave.client_address, "orders", GROUP, master_wait_s=10,
                                         start_offsets=given) as consumer:
                    assert consumer.positions == given

            async def name_the_master_later():
                await trio.sleep(0.5)
                await slave.change_role(Role.SLAVE, epoch, master.client_address, master_ha_address=dead)
            nursery.start_soon(name_the_master_later)
            async with open_consumer(slave.client_address, "orders", GROUP, master_wait_s=10) as consumer:
                assert consumer.positions == COMMITTED
            assert slave.role.state.master_client_address == master.client_address
            nursery.cancel_scope.cancel()


class _ElectedFirstDirectory(NodeDirectory):
    """ZooKeeper in a failover's gap: the first lookup names a node that is not master yet;
    later ones name the master."""

    def __init__(self, first: str, then: str) -> None:
        super().__init__({"orders": {"g": (0, 1)}}, {"g": [then]})
        self.first = first
        self.lookups = 0

    async def master_address(self, group: str) -> str:
        self.lookups += 1
        return self.first if self.lookups == 1 else await super().master_address(group)


async def test_a_routed_consumer_does_not_take_offsets_from_a_node_not_master_yet(tmp_path):
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            master, slave = await _master_and_lagging_slave(nursery, tmp_path)
            directory = _ElectedFirstDirectory(slave.client_address, master.client_address)
            async with open_routed_consumer(directory, "orders", GROUP, long_poll_ms=200) as consumer:
                assert {queue.queue_id: offset for queue, offset in consumer.positions.items()} == COMMITTED
                message = await consumer.receive()
            assert message.queue_offset == 3 and directory.lookups == 2
            nursery.cancel_scope.cancel()
