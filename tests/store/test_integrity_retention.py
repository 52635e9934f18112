"""Retention that deletes messages a consumer group has not read warns, naming the
groups, queues and offsets lost, and counts them; the disk-full policy chooses between
deleting the oldest segments and keeping them (refusing writes once the disk is full)."""

from __future__ import annotations

import pytest

from store import Message

SEGMENT = 4096


def _store(open_store, **settings):
    settings = dict(commitlog_segment_bytes=SEGMENT, consume_queue_entries_per_file=4,
                    file_reserved_hours=1, disk_max_used_ratio=0.99, **settings)
    return open_store(**settings)


def test_deleting_unconsumed_messages_warns_names_groups_and_counts(open_store, caplog):
    store = _store(open_store)
    results = store.put_batch([Message(topic="R", queue_id=i % 2, body=b"x" * 500) for i in range(40)])
    assert store.wait_dispatched()
    store.configs["consumerOffset.json"].data.update({"R@slow": {"0": 1, "1": 0}, "R@done": {"0": 20, "1": 20}})
    store.flusher.flush_now()
    later = max(r.store_timestamp for r in results) + 2 * 3600 * 1000
    assert store.run_retention(later) > 0
    floor = store.min_physical_offset
    lost_0 = sum(1 for i, r in enumerate(results) if i % 2 == 0 and r.physical_offset < floor and i // 2 >= 1)
    lost_1 = sum(1 for i, r in enumerate(results) if i % 2 == 1 and r.physical_offset < floor)
    assert lost_0 and lost_1
    assert store.retention.unconsumed_messages_deleted == lost_0 + lost_1
    assert "group slow R/0 queue offsets [1, " in caplog.text and "group slow R/1 queue offsets [0, " in caplog.text
    assert "group done" not in caplog.text
    assert "had not read" in caplog.text


def test_consumed_messages_are_deleted_without_a_warning(open_store, caplog):
    store = _store(open_store)
    results = store.put_batch([Message(topic="R", body=b"y" * 500) for _ in range(30)])
    assert store.wait_dispatched()
    store.configs["consumerOffset.json"].data.update({"R@g": {"0": 30}})
    store.flusher.flush_now()
    assert store.run_retention(results[-1].store_timestamp + 2 * 3600 * 1000) > 0
    assert store.retention.unconsumed_messages_deleted == 0
    assert "had not read" not in caplog.text


@pytest.mark.parametrize("policy", ["delete_oldest", "refuse_writes"])
def test_disk_full_policy(open_store, policy):
    store = open_store(commitlog_segment_bytes=SEGMENT, consume_queue_entries_per_file=4, file_reserved_hours=1000,
                       disk_max_used_ratio=0.1, disk_full_policy=policy)
    if store.retention.disk_used_ratio() <= 0.1:
        pytest.skip("this disk is less than 10% used: the disk rule would not apply")
    store.put_batch([Message(topic="R", body=b"z" * 500) for _ in range(30)])
    assert store.wait_dispatched()
    store.flusher.flush_now()
    deleted = store.run_retention()
    if policy == "delete_oldest":
        assert deleted > 0
    else:
        assert deleted == 0 and store.min_physical_offset == 0
