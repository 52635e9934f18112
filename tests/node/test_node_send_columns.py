"""SEND with ``message_columns`` (a list per field) against SEND with ``messages`` (a map per
message): the same records, results and refusals, over a real node's store."""

import re

import pytest
import trio

from node.errors import RequestError
from node.wire.protocol import BATCH_COUNT_MAX, BODY_BYTES_MAX, RequestCode


def _plain(count: int, tag: str) -> list[dict]:
    return [{"body": f"{tag}-{i}".encode() * (i % 3 + 1), "properties": {"UNIQ_KEY": f"{tag}{i:030X}"}}
            for i in range(count)]


def _columns_of(messages: list[dict]) -> dict:
    return {"body": [m["body"] for m in messages], "properties": [m["properties"] for m in messages]}


async def _connect_with_topics(memory_node, nursery, *topics: str):
    """A connection to ``memory_node`` with ``topics`` created, three queues each."""
    connection = await memory_node.connect(nursery)
    for topic in topics:
        await connection.request(RequestCode.TOPIC_CREATE, topic=topic, queue_count=3)
    return connection


def _stored(store, topics, queue_id: int, beside_body) -> dict:
    """Each topic's messages in ``queue_id``: (body, ``beside_body(message)``) in order."""
    return {topic: [(m.body, beside_body(m)) for m in store.get(topic, queue_id, 0, 100)] for topic in topics}


@pytest.mark.trio
@pytest.mark.parametrize("count", [1, 3, 40])  # under and over the store's column-path minimum
async def test_columns_store_what_maps_store(memory_node, count):
    async with trio.open_nursery() as nursery:
        connection = await _connect_with_topics(memory_node, nursery, "as-maps", "as-columns")
        messages = _plain(count, "m")
        maps = (await connection.request(RequestCode.SEND, topic="as-maps", messages=messages,
                                         result_columns=True))["result_columns"]
        columns = (await connection.request(RequestCode.SEND, topic="as-columns", message_columns=_columns_of(messages),
                                            result_columns=True))["result_columns"]
        assert columns["status"] == ["PUT_OK"] * count and columns["reason"] == [""] * count
        for field in ("queue_id", "queue_offset"):
            assert columns[field] == maps[field]
        # round robin carries on from one batch to the next, as for maps
        again = (await connection.request(RequestCode.SEND, topic="as-columns",
                                          message_columns={"body": [b"next"]}))["results"]
        assert again[0]["queue_id"] == count % 3
        memory_node.store.wait_dispatched()
        for queue_id in range(3):
            stored = _stored(memory_node.store, ("as-maps", "as-columns"), queue_id,
                             lambda m: m.properties.get("UNIQ_KEY"))
            assert stored["as-columns"][:len(stored["as-maps"])] == stored["as-maps"]
        nursery.cancel_scope.cancel()


@pytest.mark.trio
@pytest.mark.parametrize("count", [1, 3, 40])
async def test_uniq_keys_as_a_column_store_what_uniq_key_properties_store(memory_node, count):
    async with trio.open_nursery() as nursery:
        connection = await _connect_with_topics(memory_node, nursery, "as-properties", "as-uniq-keys")
        messages = _plain(count, "u")
        replies = {}
        for topic, columns in (("as-properties", _columns_of(messages)),
                               ("as-uniq-keys", {"body": [m["body"] for m in messages],
                                                 "uniq_key": [m["properties"]["UNIQ_KEY"] for m in messages]})):
            replies[topic] = (await connection.request(RequestCode.SEND, topic=topic, message_columns=columns,
                                                       result_columns=True))["result_columns"]
        for field in ("status", "queue_id", "queue_offset", "reason"):
            assert replies["as-uniq-keys"][field] == replies["as-properties"][field]
        memory_node.store.wait_dispatched()
        for queue_id in range(3):
            stored = _stored(memory_node.store, replies, queue_id, lambda m: m.user_properties)
            assert stored["as-uniq-keys"] == stored["as-properties"]
        nursery.cancel_scope.cancel()


@pytest.mark.trio
async def test_a_new_topic_and_odd_properties_take_the_per_message_path_with_the_same_outcome(memory_node):
    async with trio.open_nursery() as nursery:
        connection = await memory_node.connect(nursery)
        columns = _columns_of(_plain(8, "n"))
        columns["properties"][4] = {"HCRC": "x"}  # a store-owned name: refused by the store, in place
        reply = (await connection.request(RequestCode.SEND, topic="first-time", message_columns=columns,
                                          result_columns=True))["result_columns"]
        assert reply["status"] == ["PUT_OK"] * 4 + ["MESSAGE_ILLEGAL"] + ["PUT_OK"] * 3
        assert "HCRC" in reply["reason"][4]
        nursery.cancel_scope.cancel()


@pytest.mark.trio
@pytest.mark.parametrize("columns, error", [
    ({"body": [b"a", "text", b"c"]}, "BAD_REQUEST: field message_columns.body[1] must be binary"),
    ({"body": [b"a", b"x" * (BODY_BYTES_MAX + 1)]}, "BODY_TOO_LARGE: field message_columns.body[1]"),
    ({"body": [b"a", b"b"], "properties": [{}, {"n": 5}]}, "BAD_REQUEST: field message_columns[1].properties"),
    ({"body": [b"a", b"b"], "properties": [{}, {7: "v"}]}, "BAD_REQUEST: field message_columns[1].properties"),
    ({"body": [b"a", b"b"], "properties": [{}, None]}, "BAD_REQUEST: field message_columns.properties[1]"),
    ({"body": [b"a"], "properties": [{f"p{i}": "v" for i in range(257)}]},
     "BAD_REQUEST: field message_columns[0].properties"),
    ({"body": [b"a", b"b"], "properties": [{}]}, "BAD_REQUEST: field message_columns.properties must be a list as long"),
    ({"body": []}, "BAD_REQUEST: field message_columns.body must be a list of 1 to"),
    ({"body": [b"a"] * (BATCH_COUNT_MAX + 1)}, "BAD_REQUEST: field message_columns.body must be a list of 1 to"),
    ({"body": [b"a"], "keys": [["k"]]}, "BAD_REQUEST: field message_columns must be a map of the lists"),
    ({"body": [b"a", b"b"], "uniq_key": ["k"]}, "BAD_REQUEST: field message_columns.uniq_key must be a list as long"),
    ({"body": [b"a", b"b"], "uniq_key": "kk"}, "BAD_REQUEST: field message_columns.uniq_key must be a list as long"),
    ({"body": [b"a", b"b"], "uniq_key": ["k", 7]}, "BAD_REQUEST: field message_columns.uniq_key[1] must be a string"),
    ([b"a"], "BAD_REQUEST: field message_columns must be a map of the lists"),
])
async def test_bad_columns_are_refused_whole_naming_the_message(memory_node, columns, error):
    async with trio.open_nursery() as nursery:
        connection = await memory_node.connect(nursery)
        await connection.request(RequestCode.TOPIC_CREATE, topic="bad", queue_count=2)
        before = memory_node.store.commit_log.max_offset
        with pytest.raises(RequestError, match=re.escape(error)):
            await connection.request(RequestCode.SEND, topic="bad", message_columns=columns)
        assert memory_node.store.commit_log.max_offset == before  # nothing of the batch written
        nursery.cancel_scope.cancel()


@pytest.mark.trio
async def test_messages_and_columns_together_are_refused(memory_node):
    async with trio.open_nursery() as nursery:
        connection = await memory_node.connect(nursery)
        with pytest.raises(RequestError, match="BAD_REQUEST: a send carries messages or message_columns"):
            await connection.request(RequestCode.SEND, topic="both", messages=[{"body": b"a"}],
                                     message_columns={"body": [b"b"]})
        nursery.cancel_scope.cancel()
