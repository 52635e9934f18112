"""The client's message values: the wire maps an OutgoingMessage makes (the node reads
them, so they must not change), UNIQ_KEYs (unique, 32 hex digits, a new prefix in a
forked child), and SendResults made from a reply's columns."""

import os
import re

import pytest

from node.client import OutgoingMessage, Producer, SendResult, new_uniq_key, send_fields
from node.client.producer import _Batch


def test_wire_maps_hold_what_was_set_and_nothing_else():
    plain = OutgoingMessage(b"body", uniq_key="K1")
    assert plain.to_wire() == {"body": b"body", "properties": {"UNIQ_KEY": "K1"}}
    full = OutgoingMessage(b"b", keys=("k1", "k2"), tags="t", properties={"a": "1"}, queue_id=0, uniq_key="K2")
    assert full.to_wire() == {"body": b"b", "properties": {"a": "1", "UNIQ_KEY": "K2"}, "keys": ["k1", "k2"],
                              "tags": "t", "queue_id": 0}
    assert list(full.to_wire()) == ["body", "properties", "keys", "tags", "queue_id"]
    # the message's own properties are not changed by to_wire
    assert full.properties == {"a": "1"}
    # empty keys and tags are left out, as before
    assert OutgoingMessage(b"", keys=[], tags="", uniq_key="K3").to_wire() == {"body": b"",
                                                                              "properties": {"UNIQ_KEY": "K3"}}


def test_each_message_gets_its_own_properties_and_a_fresh_uniq_key():
    first, second = OutgoingMessage(b"1"), OutgoingMessage(b"2")
    first.properties["x"] = "y"
    assert second.properties == {} and first.uniq_key != second.uniq_key
    assert OutgoingMessage(b"1", uniq_key="mine").uniq_key == "mine"
    assert first == OutgoingMessage(b"1", properties={"x": "y"}, uniq_key=first.uniq_key)
    assert "OutgoingMessage(body=b'1'" in repr(first)


def test_uniq_keys_are_32_hex_digits_and_never_repeat():
    keys = [new_uniq_key() for _ in range(10_000)] + [OutgoingMessage(b"").uniq_key for _ in range(10_000)]
    assert len(set(keys)) == len(keys)
    assert all(re.fullmatch(r"[0-9A-F]{32}", key) for key in keys)


@pytest.mark.integration   # forks a child process
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_makes_keys_of_its_own():
    read_end, write_end = os.pipe()
    parent_key = new_uniq_key()
    pid = os.fork()
    if pid == 0:  # the child: report one key and leave at once
        try:
            os.write(write_end, new_uniq_key().encode())
        finally:
            os._exit(0)
    os.close(write_end)
    child_key = os.read(read_end, 64).decode()
    os.close(read_end)
    os.waitpid(pid, 0)
    parent_next = new_uniq_key()
    assert len(child_key) == 32 and child_key[:16] != parent_key[:16]
    assert parent_next[:16] == parent_key[:16]


def test_send_results_from_columns_match_the_per_message_maps():
    messages = [OutgoingMessage(b"%d" % i, uniq_key=f"U{i}") for i in range(3)]
    columns = {"status": ["PUT_OK", "MESSAGE_ILLEGAL", "PUT_OK"], "queue_id": [0, 1, 2],
               "queue_offset": [5, -1, 6], "physical_offset": [100, -1, 200], "message_id": ["M0", "", "M2"],
               "reason": ["", "bad property", ""]}
    maps = [{name: columns[name][i] for name in columns} for i in range(3)]
    producer = Producer.__new__(Producer)   # _resolve needs only the counters
    producer._sent = producer._failed = 0
    by_columns, by_maps = _Batch("t", list(messages)), _Batch("t", list(messages))
    producer._resolve(by_columns, {"result_columns": columns})
    producer._resolve(by_maps, {"results": maps})
    assert by_columns.outcomes() == by_maps.outcomes() == [
        SendResult("PUT_OK", 0, 5, 100, "M0", "U0"), SendResult("MESSAGE_ILLEGAL", 1, -1, -1, "", "U1", "bad property"),
        SendResult("PUT_OK", 2, 6, 200, "M2", "U2")]
    result = by_columns.outcome(1)
    assert not result.ok and result.reason == "bad property" and result.uniq_key == "U1"
    assert by_columns.outcome(0).ok and producer._sent == 4 and producer._failed == 2


def test_a_reply_with_a_short_column_is_refused():
    producer = Producer.__new__(Producer)
    producer._sent = producer._failed = 0
    batch = _Batch("t", [OutgoingMessage(b"a"), OutgoingMessage(b"b")])
    columns = {"status": ["PUT_OK", "PUT_OK"], "queue_id": [0, 0], "queue_offset": [1, 2],
               "physical_offset": [1, 2], "message_id": ["m1"], "reason": ["", ""]}
    with pytest.raises(AssertionError):
        producer._resolve(batch, {"result_columns": columns})


def test_plain_messages_travel_as_columns_and_any_other_batch_as_maps():
    plain = [OutgoingMessage(b"a", uniq_key="K1"), OutgoingMessage(b"b", properties={"p": "v"}, uniq_key="K2")]
    assert send_fields(plain) == {"message_columns": {
        "body": [b"a", b"b"], "properties": [{"UNIQ_KEY": "K1"}, {"p": "v", "UNIQ_KEY": "K2"}]}}
    for odd in (OutgoingMessage(b"c", keys=["k"]), OutgoingMessage(b"c", tags="t"), OutgoingMessage(b"c", queue_id=0)):
        fields = send_fields([*plain, odd])
        assert list(fields) == ["messages"]
        assert fields["messages"] == [message.to_wire() for message in [*plain, odd]]
