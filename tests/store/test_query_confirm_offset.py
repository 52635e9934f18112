"""Queries under the confirm offset (store/reads.py): with reads limited to it, as on a master
or a slave under a controller, a key, message-id or time query never answers with a message
not wholly below the confirm offset (a later failover may cut it), exactly as a pull stops
there; without the limit they see every dispatched message."""

from __future__ import annotations

import pytest

from store import Message, MessageStore, PutStatus
from store.errors import MessageNotFound


def put_all(store: MessageStore, count: int, clock: list[int]) -> list:
    """``count`` messages on queue 0 of 't', key k<n>, stored 1 s apart from t=1000 s."""
    results = []
    for number in range(count):
        clock[0] = 1_000_000 + number * 1000
        results.append(store.put(Message("t", b"body-%d" % number, queue_id=0, keys=[f"k{number}"])))
    assert all(r.status is PutStatus.PUT_OK for r in results)
    assert store.wait_dispatched()
    return results


@pytest.fixture
def store_of_five(open_store):
    clock = [0]
    store = open_store(clock=lambda: clock[0])
    return store, put_all(store, 5, clock)


def test_key_queries_leave_out_messages_not_wholly_below_the_confirm_offset(store_of_five):
    store, results = store_of_five
    store.limit_reads_to_confirm_offset(True)
    assert store.query_by_key("t", "k0") == []                            # nothing confirmed yet
    store.replica_log.publish_confirm_offset(results[2].end_offset - 1)   # message 2 only partly below
    assert [m.keys for m in store.query_by_key("t", "k1")] == [["k1"]]
    assert store.query_by_key("t", "k2") == [] and store.query_by_key("t", "k4") == []
    store.replica_log.publish_confirm_offset(results[2].end_offset)
    assert [m.keys for m in store.query_by_key("t", "k2")] == [["k2"]]
    store.limit_reads_to_confirm_offset(False)
    assert [m.keys for m in store.query_by_key("t", "k4")] == [["k4"]]


def test_a_message_id_past_the_confirm_offset_is_not_found_yet(store_of_five):
    store, results = store_of_five
    store.limit_reads_to_confirm_offset(True)
    store.replica_log.publish_confirm_offset(results[3].end_offset)
    assert store.get_by_message_id(results[3].message_id).physical_offset == results[3].physical_offset
    with pytest.raises(MessageNotFound, match="yet"):
        store.get_by_message_id(results[4].message_id)
    store.replica_log.publish_confirm_offset(results[4].end_offset - 1)   # not wholly below: still not served
    with pytest.raises(MessageNotFound, match="yet"):
        store.get_by_message_id(results[4].message_id)
    store.limit_reads_to_confirm_offset(False)
    assert store.get_by_message_id(results[4].message_id).keys == ["k4"]


def test_a_time_query_answers_as_if_messages_past_the_confirm_offset_were_not_stored(store_of_five):
    store, results = store_of_five        # stored at 1000 s, 1001 s, ... 1004 s: queue offsets 0..4
    store.limit_reads_to_confirm_offset(True)
    assert store.confirm_offset == 0      # nothing confirmed yet: every time points at the start
    assert [store.offset_by_time("t", 0, ms) for ms in (1_000_000, 1_003_000, 1_009_000)] == [0, 0, 0]
    store.replica_log.publish_confirm_offset(results[2].end_offset)
    assert store.offset_by_time("t", 0, 1_001_000) == 1
    assert store.offset_by_time("t", 0, 1_002_000) == 2
    # messages 3 and 4 are past the limit: a time at or after them answers the readable end
    assert store.offset_by_time("t", 0, 1_003_000) == 3 and store.offset_by_time("t", 0, 1_004_000) == 3
    store.replica_log.publish_confirm_offset(results[4].end_offset - 1)   # message 4 only partly below
    assert store.offset_by_time("t", 0, 1_004_000) == 4 and store.offset_by_time("t", 0, 1_003_500) == 4
    assert store.offset_by_time("t", 0, 1_003_000) == 3
    store.limit_reads_to_confirm_offset(False)
    assert store.offset_by_time("t", 0, 1_004_000) == 4 and store.offset_by_time("t", 0, 1_005_000) == 5
