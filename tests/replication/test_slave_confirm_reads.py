"""A slave under a controller serves reads only up to the confirm offset its master sent it
(CONFIRM frames), never further: a message past it may still be cut by a failover to
another member of the sync-state set. Real stores over loopback, in one trio run."""

from __future__ import annotations

import pytest
import trio

from replication import HAService, HaServiceSettings, SyncSettings, protocol, serve_ha

from replication_helpers import begin_term, epoch_file, put, start_slave, wait_until




def test_a_confirm_frame_is_a_heartbeat_to_a_slave_that_does_not_know_it():
    header = protocol.parse_data_header(protocol.confirm(1234))
    assert header.is_confirm and header.is_heartbeat and header.offset == 1234
    plain = protocol.parse_data_header(protocol.heartbeat(99))
    assert plain.is_heartbeat and not plain.is_confirm


def readable(store, count_max: int = 10_000) -> int:
    """Messages a consumer can pull from every queue of 'orders'."""
    total = 0
    for queue_id in range(4):
        offset = 0
        for _ in range(count_max):
            result = store.pull("orders", queue_id, offset, 32)
            if not result.messages:
                break
            total += len(result.messages)
            offset = result.next_offset
    return total


@pytest.mark.trio
async def test_the_slave_serves_up_to_the_confirm_offset_it_learned_and_follows_it(open_store):
    master, slave, other = open_store("master"), open_store("slave"), open_store("other")
    master_epochs = epoch_file(master)
    begin_term(master, master_epochs)
    slave.limit_reads_to_confirm_offset(True)          # what a slave under a controller does
    put(master, 200)
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    host, port = listeners[0].socket.getsockname()[:2]
    address = f"{host}:{port}"
    # s2 is in the sync-state set but not connected: the confirm offset cannot pass its ack
    service = HAService(master.replica_log, HaServiceSettings(
        node_id="m", group="g", cluster="c", secret="s3cret",
        sync=SyncSettings(min_in_sync_replicas=1, max_time_not_catchup_ms=600_000)),
        master_epochs.last_epoch, master_epochs.entries, sync_state_set=frozenset({"m", "s1", "s2"}))
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_ha, service, listeners)
        await start_slave(nursery, slave, address, node_id="s1")
        await wait_until(lambda: slave.max_physical_offset == master.max_physical_offset, what="catch-up")
        assert slave.wait_dispatched()
        assert service.statistics().confirm_offset == 0
        assert readable(slave) == 0, "a slave served messages past its master's confirm offset"
        await start_slave(nursery, other, address, node_id="s2")   # the last member catches up
        await wait_until(lambda: service.statistics().confirm_offset == master.max_physical_offset,
                         what="the confirm offset to reach the end")
        await wait_until(lambda: slave.confirm_offset == master.max_physical_offset,
                         what="the slave to learn it")
        assert readable(slave) == 200
        put(master, 50, prefix="later")                  # streamed, then confirmed by both
        service.notify_appended()
        await wait_until(lambda: slave.confirm_offset == master.max_physical_offset, what="the new confirm offset")
        assert slave.wait_dispatched() and readable(slave) == 250
        nursery.cancel_scope.cancel()
