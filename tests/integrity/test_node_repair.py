"""Corruption through whole nodes (in this trio run, on loopback): a pull names what it
cannot serve and the consumer raises it per offset; a slave repairs a record from its
master and a master from its sync-state set before serving it; a record no replica holds
intact is reported lost by offset in status and metrics; the scrub finds flips nobody reads."""

from __future__ import annotations

import pytest
import trio

from node.client import open_admin, open_consumer
from node.errors import CorruptRecordError

from integrity_helpers import BODY_AT, SECRET, flip_bit, flushed, produce, start_group, wait_until

pytestmark = pytest.mark.trio
async def test_a_record_no_replica_holds_is_raised_per_offset_and_reported_lost(tmp_path):
    async with trio.open_nursery() as nursery:
        [master] = await start_group(nursery, tmp_path, slaves=0)
        sent = await produce(master, 40)
        await flushed(master, sent)
        victim = next(r for r in sent if r.queue_id == 1 and r.queue_offset == 3)
        flip_bit(master.store, victim.physical_offset, BODY_AT)
        received, corrupt = [], []
        async with open_consumer(master.client_address, "t", "g1", secret=SECRET, from_beginning=True) as consumer:
            with trio.fail_after(20):
                while len(received) + len(corrupt) < 40:
                    try:
                        received.append(await consumer.receive())
                    except CorruptRecordError as error:
                        corrupt.append(error)
            positions = dict(consumer.positions)
        assert [(e.queue_id, e.queue_offset, e.physical_offset) for e in corrupt] == \
            [(1, 3, victim.physical_offset)]
        assert "CRC" in corrupt[0].reason
        assert positions[1] == max(r.queue_offset for r in sent if r.queue_id == 1) + 1   # moved past it, knowingly
        assert sorted(m.body for m in received) == sorted(b"m%04d-" % i + b"x" * 150 for i in range(40)
                                                          if sent[i] is not victim)
        async with open_admin(master.client_address, secret=SECRET) as admin:
            status = await admin.status()
        lost = status["integrity"]["repair"]["lost"]
        assert [item["physical_offset"] for item in lost] == [victim.physical_offset]
        assert "no replica" in lost[0]["reason"]
        named = status["store"]["integrity"]["corrupt_records"]
        assert victim.physical_offset in [item["physical_offset"] for item in named]
        metrics = master.metrics.render().decode()
        assert 'hastore_integrity_records_lost{node="a"} 1.0' in metrics
        assert 'hastore_scrub_rate_bytes_per_s{node="a"}' in metrics
        nursery.cancel_scope.cancel()


async def test_a_slave_repairs_a_record_from_its_master_before_serving_it(tmp_path):
    async with trio.open_nursery() as nursery:
        master, slave = await start_group(nursery, tmp_path, slaves=1)
        sent = await produce(master, 60)
        await wait_until(lambda: slave.store.max_physical_offset == master.store.max_physical_offset)
        await flushed(slave, sent)
        victim = sent[17]
        flip_bit(slave.store, victim.physical_offset, BODY_AT, bit=3)
        async with open_admin(slave.client_address, secret=SECRET) as admin:
            reply = await admin.pull("t", victim.queue_id, victim.queue_offset, max_count=1)
            status = await admin.status()
        [message] = reply["messages"]
        assert message.physical_offset == victim.physical_offset and message.body.startswith(b"m0017-")
        assert "corrupt" not in reply
        repair = status["integrity"]["repair"]
        assert repair["repaired"] == 1 and repair["lost"] == []
        assert status["store"]["integrity"]["ranges_repaired"] == 1
        assert status["store"]["integrity"]["corrupt_records"] == []
        nursery.cancel_scope.cancel()


async def test_a_master_repairs_from_its_sync_state_set_what_the_scrub_finds(tmp_path):
    async with trio.open_nursery() as nursery:
        master, slave, third = await start_group(nursery, tmp_path, slaves=2)
        sent = await produce(master, 60)
        await flushed(master, sent)
        before = master.handlers.integrity.scrub.statistics().passes_completed
        flip_bit(master.store, sent[42].physical_offset, 5)    # the record's magic: its header
        flip_bit(master.store, sent[43].physical_offset, BODY_AT)
        await wait_until(lambda: master.handlers.integrity.repairer.statistics().repaired == 2, timeout_s=30,
                         what="the scrub to find both records and the master to repair them")
        assert master.handlers.integrity.scrub.statistics().passes_completed >= before
        assert master.store.statistics().integrity.corrupt_records == ()
        for victim in sent[42:44]:
            message = master.store.commit_log.read_message(victim.physical_offset)
            assert message.queue_offset == victim.queue_offset
        assert master.ha.repair_peers() and set(master.ha.repair_peers()) == {slave.client_address,
                                                                               third.client_address}
        nursery.cancel_scope.cancel()
