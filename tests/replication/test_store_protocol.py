"""Replication sees the store only through ``ReplicaStore`` (replication/store_protocol.py).

The store's replica log satisfies the protocol, MessageStore itself holds no replica
operation, and a master and a slave that are each handed an object exposing nothing but the
protocol's members stream, cut and confirm as they do over the real replica log.
"""

from __future__ import annotations

import pytest
import trio

from replication.store_protocol import ReplicaStore
from store import MessageStore

from replication_helpers import begin_term, epoch_file, log_bytes, put, start_master, start_slave, wait_until

# the protocol's members, read from the class itself so that the test follows the protocol
PROTOCOL_MEMBERS = frozenset(name for name in vars(ReplicaStore) if not name.startswith("_"))


class OnlyTheProtocol:
    """A ReplicaStore over another one that lets through the protocol's members and nothing
    else (AttributeError otherwise), recording which were used."""

    def __init__(self, replica_store: ReplicaStore) -> None:
        self._inner = replica_store
        self.used: set[str] = set()

    def __getattr__(self, name: str):
        if name not in PROTOCOL_MEMBERS:
            raise AttributeError(f"{name} is not part of ReplicaStore")
        self.used.add(name)
        return getattr(self._inner, name)


def test_the_protocol_lists_what_replication_needs_and_nothing_more():
    assert PROTOCOL_MEMBERS == {"min_offset", "max_offset", "confirm_offset", "publish_confirm_offset", "read",
                                "append", "wake_dispatch", "dispatch_now", "cut", "reset", "store_timestamp_at"}


def test_the_store_hands_out_a_replica_store_and_holds_no_replica_operation(open_store):
    store = open_store("s")
    assert isinstance(store.replica_log, ReplicaStore)
    for name in ("read_for_replication", "append_replicated", "truncate_to", "reset", "catch_up_for_writes",
                 "publish_confirm_offset", "store_timestamp_at"):
        assert not hasattr(MessageStore, name), name
    with pytest.raises(AttributeError):
        store.confirm_offset = 10   # read-only: the confirm offset is published, never assigned


@pytest.mark.trio
async def test_replication_through_nothing_but_the_protocol_streams_cuts_and_confirms(open_store):
    """As test_streaming's divergent tail, each side given only the protocol: A (epoch 1)
    writes, B copies part of it, A writes a tail that never leaves it, B is master in epoch
    2, A follows B: A's tail is cut and both logs end identical."""
    a, b = open_store("a"), open_store("b")
    a_epochs = epoch_file(a)
    begin_term(a, a_epochs)
    put(a, 200, prefix="e1")
    a_master, b_slave = OnlyTheProtocol(a.replica_log), OnlyTheProtocol(b.replica_log)
    async with trio.open_nursery() as nursery:
        service, address = await start_master(nursery, a, a_epochs, node_id="a", replica_store=a_master)
        running = await start_slave(nursery, b, address, node_id="b", replica_store=b_slave)
        await wait_until(lambda: b.max_physical_offset == a.max_physical_offset, what="catch-up")
        await wait_until(lambda: "b" in service.statistics().sync_state_set, what="the slave joins the SSS")
        await wait_until(lambda: a.confirm_offset == a.max_physical_offset, what="the confirm offset")
        service.statistics()   # lag figures read store times
        await running.stop()
        nursery.cancel_scope.cancel()
    put(a, 150, prefix="lost")
    b_epochs = epoch_file(b)
    begin_term(b, b_epochs, 2)
    put(b, 50, prefix="e2")
    b_master, a_slave = OnlyTheProtocol(b.replica_log), OnlyTheProtocol(a.replica_log)
    async with trio.open_nursery() as nursery:
        service, address = await start_master(nursery, b, b_epochs, node_id="b", replica_store=b_master)
        running = await start_slave(nursery, a, address, node_id="a", replica_store=a_slave)
        await wait_until(lambda: a.max_physical_offset == b.max_physical_offset and
                         running.client.statistics().connected, what="the old master to follow")
        assert running.client.statistics().truncated_bytes > 0
        await running.stop()
        nursery.cancel_scope.cancel()
    assert log_bytes(a) == log_bytes(b)
    assert {"read", "max_offset", "min_offset", "confirm_offset", "publish_confirm_offset"} <= a_master.used
    assert {"append", "cut", "max_offset", "min_offset"} <= a_slave.used
    assert (a_master.used | b_master.used | a_slave.used | b_slave.used) <= PROTOCOL_MEMBERS
