"""A slave under a controller answers key, message-id and time queries only up to the confirm
offset its master sent it, as it does pulls: a query never returns a message that a failover
to another member of the sync-state set may cut. Real stores over loopback, in one trio run."""

from __future__ import annotations

import pytest
import trio

from replication import HAService, HaServiceSettings, SyncSettings, serve_ha
from store.errors import MessageNotFound

from replication_helpers import begin_term, epoch_file, put, start_slave, wait_until


def answers(store, results) -> dict:
    """What a client querying ``store`` finds of the messages put as ``results`` (keys m-0, m-1, ...)."""
    by_key = sum(len(store.query_by_key("orders", f"m-{number}")) for number in range(len(results)))
    by_id = 0
    for result in results:
        try:
            store.get_by_message_id(result.message_id)
            by_id += 1
        except MessageNotFound:
            pass
    # a time after every message: the offset just past the last one the store lets be read
    by_time = sum(store.offset_by_time("orders", queue_id, 2**62) for queue_id in range(4))
    return {"by_key": by_key, "by_id": by_id, "by_time": by_time}


@pytest.mark.trio
async def test_slave_queries_stop_at_the_confirm_offset_it_learned(open_store):
    master, slave, other = open_store("master"), open_store("slave"), open_store("other")
    master_epochs = epoch_file(master)
    begin_term(master, master_epochs)
    slave.limit_reads_to_confirm_offset(True)          # what a slave under a controller does
    results = put(master, 120)
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    host, port = listeners[0].socket.getsockname()[:2]
    # s2 is in the sync-state set but not connected: the confirm offset cannot pass its ack
    service = HAService(master.replica_log, HaServiceSettings(
        node_id="m", group="g", cluster="c", secret="s3cret",
        sync=SyncSettings(min_in_sync_replicas=1, max_time_not_catchup_ms=600_000)),
        master_epochs.last_epoch, master_epochs.entries, sync_state_set=frozenset({"m", "s1", "s2"}))
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_ha, service, listeners)
        await start_slave(nursery, slave, f"{host}:{port}", node_id="s1")
        await wait_until(lambda: slave.max_physical_offset == master.max_physical_offset, what="catch-up")
        assert slave.wait_dispatched() and service.statistics().confirm_offset == 0
        assert answers(slave, results) == {"by_key": 0, "by_id": 0, "by_time": 0}, \
            "a slave answered a query with messages past its master's confirm offset"
        slave.limit_reads_to_confirm_offset(False)     # the messages are there: only the limit hid them
        assert answers(slave, results) == {"by_key": 120, "by_id": 120, "by_time": 120}
        slave.limit_reads_to_confirm_offset(True)
        await start_slave(nursery, other, f"{host}:{port}", node_id="s2")   # the last member catches up
        await wait_until(lambda: slave.confirm_offset == master.max_physical_offset, what="the slave to learn it")
        assert answers(slave, results) == {"by_key": 120, "by_id": 120, "by_time": 120}
        nursery.cancel_scope.cancel()
