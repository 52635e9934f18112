"""The blocking client wrappers (node/client/sync.py) against a node in its own process."""

import os
import signal
import time

import pytest
import trio

from node.client import OutgoingMessage
from node.errors import ClientClosedError, ConnectionLostError, RequestError, RequestTimeoutError
from node.cluster.process import free_port
from node.client import SyncAdmin, SyncConsumer, SyncProducer

pytestmark = pytest.mark.integration   # node processes


def test_produce_consume_commit_and_query(node_process):
    node = node_process()
    address = node.client_address
    with SyncAdmin(address) as admin:
        admin.create_topic("orders", queue_count=2)
        assert admin.list_topics()["orders"]["queue_count"] == 2
    with SyncProducer(address) as producer:
        first = producer.send("orders", b"first", keys=["order-1"], tags="new", queue_id=0)
        assert first.ok and first.queue_id == 0 and first.queue_offset == 0
        batch = producer.send_batch("orders", [OutgoingMessage(b"m%d" % i, keys=[f"b-{i}"]) for i in range(50)])
        assert len(batch) == 50 and all(r.ok for r in batch)
        assert sorted({r.queue_id for r in batch}) == [0, 1]
    expected = {b"first"} | {b"m%d" % i for i in range(50)}
    with SyncConsumer(address, "orders", "g1", from_beginning=True, long_poll_ms=500) as consumer:
        received = []
        deadline = time.monotonic() + 20
        while len(received) < len(expected) and time.monotonic() < deadline:
            received += consumer.poll(max_count=16, timeout_ms=500)
        assert {m.body for m in received} == expected and len(received) == len(expected)
        for queue_id in (0, 1):  # per-queue order kept
            offsets = [m.queue_offset for m in received if m.queue_id == queue_id]
            assert offsets == sorted(offsets)
        committed = consumer.commit()
        assert consumer.poll(timeout_ms=200) == []  # nothing more: an empty list, not an error
    with SyncAdmin(address) as admin:
        assert admin.query_offsets("g1", "orders") == committed
        assert sum(committed.values()) == len(expected)
        found = admin.query_by_key("orders", "order-1")
        assert [m.body for m in found] == [b"first"] and found[0].tags == "new"
        assert admin.query_by_id(batch[7].message_id).body == b"m7"
        assert admin.status()["store"]["put_messages"] >= len(expected)
    # a new consumer of the group resumes after the committed offsets: nothing to read
    with SyncConsumer(address, "orders", "g1", long_poll_ms=200) as consumer:
        assert consumer.positions == committed
        assert consumer.poll(timeout_ms=300) == []


def test_typed_errors_and_the_client_stays_usable(node_process):
    node = node_process()
    with SyncProducer(node.client_address) as producer:
        with pytest.raises(RequestError) as caught:
            producer.send("bad topic!", b"x")
        assert caught.value.code == "TOPIC_ILLEGAL"
        assert producer.send("fine", b"x").ok
    with SyncAdmin(node.client_address) as admin:
        with pytest.raises(RequestError) as caught:
            admin.query_by_id("00" * 16)
        assert caught.value.code == "MESSAGE_NOT_FOUND"
        assert admin.status()["role"] == "master"


def test_nothing_listening_is_a_connection_error():
    started = time.monotonic()
    with pytest.raises(ConnectionLostError, match="cannot connect"):
        SyncAdmin(f"127.0.0.1:{free_port()}")
    assert time.monotonic() - started < 10


def test_calls_are_bounded_by_timeout_ms(node_process):
    node = node_process()
    admin = SyncAdmin(node.client_address, timeout_ms=300)
    try:
        assert admin.status()["node_id"] == "n1"
        os.kill(node.pid, signal.SIGSTOP)  # the node stops answering, the connection stays up
        try:
            started = time.monotonic()
            with pytest.raises(RequestTimeoutError, match="300 ms"):
                admin.status()
            assert 0.25 < time.monotonic() - started < 5
        finally:
            os.kill(node.pid, signal.SIGCONT)
        assert admin.status()["node_id"] == "n1"  # answers again once the node runs
    finally:
        admin.close()


def test_closed_clients_refuse_calls_and_do_not_block_a_trio_run(node_process):
    node = node_process()
    admin = SyncAdmin(node.client_address)
    admin.close()
    admin.close()  # idempotent
    with pytest.raises(ClientClosedError):
        admin.status()
    with SyncAdmin(node.client_address) as admin:
        async def inside_trio():
            with pytest.raises(RuntimeError, match="async client"):
                admin.status()
        trio.run(inside_trio)


def test_consumer_reports_a_node_that_died(node_process):
    node = node_process()
    with SyncProducer(node.client_address) as producer:
        assert producer.send("events", b"one").ok
    consumer = SyncConsumer(node.client_address, "events", "g", from_beginning=True, long_poll_ms=200)
    try:
        assert [m.body for m in consumer.poll(timeout_ms=5000)] == [b"one"]
        os.kill(node.pid, signal.SIGKILL)
        node.process.wait(10)
        with pytest.raises(ConnectionLostError):
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                consumer.poll(timeout_ms=200)
    finally:
        consumer.close()
