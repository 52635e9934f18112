"""A node over real loopback sockets: the client library against every request."""

import time

import pytest
import trio

from node.client import OutgoingMessage, open_admin, open_consumer, open_producer
from node.errors import AuthError, ConnectionLostError, NotMasterError, RequestError
from node.server.node import serve_node
from node.server.role import Role

from node_helpers import small_config, wait_until


@pytest.mark.trio
async def test_send_pull_query_offsets_and_status(node):
    address = node.client_address
    async with open_admin(address) as admin:
        await admin.create_topic("orders", queue_count=2)
        assert (await admin.list_topics())["orders"]["queue_count"] == 2
    async with open_producer(address, batch_count_max=8, linger_ms=1) as producer:
        single = await producer.send("orders", b"first", keys=["order-1"], tags="new", queue_id=0)
        assert single.ok and single.queue_offset == 0
        batch = await producer.send_batch("orders", [OutgoingMessage(b"m%d" % i, keys=[f"b-{i}"], queue_id=1)
                                                     for i in range(10)])
        assert [r.queue_offset for r in batch] == list(range(10))
        results = []
        async with trio.open_nursery() as nursery:
            async def one(i):
                results.append(await producer.send("orders", b"c%d" % i))
            for i in range(40):
                nursery.start_soon(one, i)
        assert len(results) == 40 and all(r.ok for r in results)
        assert producer.statistics().sent_messages == 51
    await wait_until(lambda: node.store.max_offset("orders", 1) >= 30, "queue 1 to be dispatched")
    async with open_admin(address) as admin:
        assert (await admin.queue_offsets("orders", 1))[1] >= 30
        found = await admin.query_by_key("orders", "order-1")
        assert [m.body for m in found] == [b"first"] and found[0].tags == "new"
        by_uniq = await admin.query_by_key("orders", batch[3].uniq_key)
        assert [m.body for m in by_uniq] == [b"m3"]
        message = await admin.query_by_id(batch[5].message_id)
        assert message.body == b"m5" and message.queue_offset == 5
        with pytest.raises(RequestError) as caught:
            await admin.query_by_id("00" * 16)
        assert caught.value.code == "MESSAGE_NOT_FOUND"
        assert await admin.query_by_time("orders", 1, 0) == 0
        assert await admin.query_by_time("orders", 1, int(time.time() * 1000) + 60_000) == \
            (await admin.queue_offsets("orders", 1))[1]
        await admin.commit_offsets("g1", "orders", {0: 3, 1: 7})
        assert await admin.query_offsets("g1", "orders") == {0: 3, 1: 7}
        status = await admin.status()
        assert status["role"] == "master" and status["store"]["put_messages"] >= 51
        assert status["connections"] >= 1


@pytest.mark.trio
async def test_consumer_reads_everything_and_resumes_from_committed_offsets(node):
    address = node.client_address
    async with open_admin(address) as admin:
        await admin.create_topic("feed", queue_count=3)
    async with open_producer(address) as producer:
        sent = await producer.send_batch("feed", [OutgoingMessage(b"%d" % i) for i in range(30)])
    async with open_consumer(address, "feed", "readers", from_beginning=True, long_poll_ms=200) as consumer:
        with trio.fail_after(10):
            seen = [await consumer.receive() for _ in range(20)]
        await consumer.commit()
    async with open_consumer(address, "feed", "readers", long_poll_ms=200) as consumer:
        with trio.fail_after(10):
            rest = [await consumer.receive() for _ in range(10)]
    assert sorted(m.body for m in seen + rest) == sorted(b"%d" % i for i in range(30))
    assert {m.message_id for m in seen + rest} == {r.message_id for r in sent}


@pytest.mark.trio
async def test_a_slave_refuses_writes_and_names_the_master(node):
    await node.change_role(Role.SLAVE, 1, "127.0.0.1:40911", master_ha_address="127.0.0.1:1")
    async with open_admin(node.client_address) as admin:
        with pytest.raises(NotMasterError) as caught:
            await admin.create_topic("t")
        assert caught.value.master_address == "127.0.0.1:40911"
        assert (await admin.status())["epoch"] == 1
    async with open_producer(node.client_address, retries_max=1, retry_backoff_ms=1) as producer:
        with pytest.raises((NotMasterError, ConnectionLostError)):
            await producer.send("t", b"x")  # retried against the named master, which is not there
    with pytest.raises(Exception):
        await node.change_role(Role.MASTER, 0)  # an older epoch never wins


@pytest.mark.trio
async def test_metrics_endpoint_serves_prometheus_text(node):
    async with open_producer(node.client_address) as producer:
        await producer.send("m", b"x" * 100)
    host, port = node.metrics_address.rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    await stream.send_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    text = b""
    while chunk := await stream.receive_some(65536):
        text += chunk
    assert text.startswith(b"HTTP/1.1 200")
    for name in (b"hastore_put_messages_total", b"hastore_put_bytes_total", b"hastore_put_latency_seconds_bucket",
                 b"hastore_pull_messages_total", b"hastore_store_max_physical_offset",
                 b"hastore_store_dispatch_lag_bytes", b"hastore_connections"):
        assert name in text
    assert b'hastore_put_messages_total{node="n1"} 1.0' in text


@pytest.mark.trio
async def test_auth_challenge(tmp_path):
    config = small_config(tmp_path / "store", secret="s3cret")
    async with trio.open_nursery() as nursery:
        node = await nursery.start(serve_node, config)
        async with open_admin(node.client_address, secret="s3cret") as admin:
            assert (await admin.status())["role"] == "master"
        with pytest.raises(AuthError):
            async with open_admin(node.client_address, secret="wrong") as admin:
                await admin.status()
        # no auth at all: the first request gets AUTH_REQUIRED (or the challenge is seen first),
        # the connection closes, and the client says a secret is needed (nothing took effect)
        with pytest.raises(AuthError) as caught:
            async with open_admin(node.client_address) as admin:
                await admin.status()
        assert "secret" in str(caught.value)
        await wait_until(lambda: node.server.statistics().auth_failures == 2, "both failures counted")
        nursery.cancel_scope.cancel()
