"""The start check of an index file's slot table, for tables of every size (a table over
65,536 slots was read wrongly and every clean restart rebuilt the whole index)."""

from __future__ import annotations

import pytest

from store import Message, MessageStore, StoreConfig


@pytest.mark.parametrize("hash_slots", [1024, (1 << 16) + 1, 1 << 18])
def test_a_clean_restart_rebuilds_no_index(tmp_path, hash_slots):
    config = StoreConfig(store_path=str(tmp_path / "s"), flush="async", index_hash_slots=hash_slots,
                         index_max_entries=4096, commitlog_segment_bytes=1 << 20)
    store = MessageStore(config)
    store.start()
    store.put_batch([Message(topic="t", queue_id=0, body=b"x", keys=[f"k{i}"]) for i in range(500)])
    assert store.wait_dispatched()
    store.shutdown()
    store = MessageStore(config)
    store.start()
    try:
        assert [index.slots_consistent() for index in store.index.files] == [True]
        assert store.integrity.repairs == []
        assert [m.body for m in store.query_by_key("t", "k7", 0, 2**63 - 1, 8)] == [b"x"]
    finally:
        store.shutdown()


def test_a_slot_past_the_last_entry_is_found(tmp_path):
    config = StoreConfig(store_path=str(tmp_path / "s"), flush="async", index_hash_slots=1 << 17,
                         index_max_entries=4096, commitlog_segment_bytes=1 << 20)
    store = MessageStore(config)
    store.start()
    store.put_batch([Message(topic="t", queue_id=0, body=b"x", keys=[f"k{i}"]) for i in range(50)])
    assert store.wait_dispatched()
    (index,) = store.index.files
    index.mm[40 + 4 * 77:40 + 4 * 78] = (4000).to_bytes(4, "big")   # slot 77 names entry 4000 of ~101
    try:
        assert not index.slots_consistent()
    finally:
        store.shutdown()
