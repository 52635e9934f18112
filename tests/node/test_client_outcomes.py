"""No false unknowns: a request that never took effect is retried or failed, never reported
as an unknown outcome. Sends through a slave follow NOT_MASTER (pipelined sends on the
slave's connection included), a missing or wrong secret fails every message exactly, a
connection the node closes saying it read nothing makes its requests retryable, and
writes of an Admin opened on a slave reach the master. Nodes run in this trio run on
loopback sockets."""

from __future__ import annotations

import pytest
import trio

from node.client import connect_stream, open_admin, open_producer
from node.client.values import OutgoingMessage
from node.errors import AuthError, ConnectionLostError, UnsentError, UnknownOutcomeError
from node.server.node import serve_node
from node.wire.protocol import FrameDecoder, encode_frame

from node_helpers import small_config, start_master_and_slave, wait_until

pytestmark = pytest.mark.trio


async def _send_many(producer, topic: str, count: int) -> dict:
    outcome = {"ok": 0, "failed": 0, "unknown": 0, "errors": set()}

    async def one(i: int) -> None:
        try:
            (result,) = await producer.send_batch(topic, [OutgoingMessage(f"m{i}".encode())])
        except UnknownOutcomeError:
            outcome["unknown"] += 1
            return
        except Exception as error:  # noqa: BLE001 - every other error is a definite failure here
            outcome["failed"] += 1
            outcome["errors"].add(type(error).__name__)
            return
        outcome["ok" if result.ok else "failed"] += 1

    async with trio.open_nursery() as nursery:
        for i in range(count):
            nursery.start_soon(one, i)
    return outcome


async def test_pipelined_sends_through_a_slave_all_reach_the_master(tmp_path):
    async with trio.open_nursery() as nursery:
        master, slave = await start_master_and_slave(nursery, tmp_path)
        for _ in range(3):
            async with open_producer(slave.client_address, in_flight_max=8, batch_count_max=1) as producer:
                outcome = await _send_many(producer, "t", 10)
            assert outcome == {"ok": 10, "failed": 0, "unknown": 0, "errors": set()}
        # acked means written; the queue entries follow within a dispatch pass
        def total() -> int:
            return sum(master.store.max_offset("t", q) for q in range(4))
        with trio.move_on_after(10):
            while total() < 30:
                await trio.sleep(0.01)
        assert total() == 30
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("secret", [None, "wrong"])
async def test_a_missing_or_wrong_secret_fails_every_send_exactly(tmp_path, secret):
    async with trio.open_nursery() as nursery:
        node = await nursery.start(serve_node, small_config(tmp_path / "n", secret="right"))
        async with open_producer(node.client_address, secret=secret, in_flight_max=8, batch_count_max=1) as producer:
            outcome = await _send_many(producer, "t", 10)
        assert outcome == {"ok": 0, "failed": 10, "unknown": 0, "errors": {"AuthError"}}
        assert node.store.max_offset("t", 0) == 0
        nursery.cancel_scope.cancel()


async def test_admin_writes_through_a_slave_follow_not_master_and_reads_stay(tmp_path):
    async with trio.open_nursery() as nursery:
        master, slave = await start_master_and_slave(nursery, tmp_path)
        async with open_admin(slave.client_address) as admin:
            assert (await admin.create_topic("orders", queue_count=2))["queue_count"] == 2
            await admin.commit_offsets("billing", "orders", {0: 0})
            assert (await admin.status())["node_id"] == "s"   # reads stay on the slave
        assert "orders" in master.sys_config.topics
        nursery.cancel_scope.cancel()


class _RefusingNode:
    """Reads requests, then closes the connection with a connection-level error."""

    def __init__(self, stream, unread: bool) -> None:
        self.stream = stream
        self.unread = unread
        self.requests = 0

    async def serve(self, count: int) -> None:
        decoder = FrameDecoder()
        while self.requests < count:
            self.requests += len(decoder.feed(await self.stream.receive_some(65536)))
        await self.stream.send_all(encode_frame({"code": 2, "opaque": None, "flags": 1, "error": "shed",
                                                 **({"unread": True} if self.unread else {})}))
        await self.stream.aclose()


@pytest.mark.parametrize("unread", [True, False])
async def test_a_connection_closed_unread_makes_its_requests_unsent(unread):
    async with trio.open_nursery() as nursery:
        client_end, node_end = trio.testing.memory_stream_pair()
        node = _RefusingNode(node_end, unread)
        nursery.start_soon(node.serve, 2)
        connection = await connect_stream(client_end, "fake", nursery)
        first = await connection.submit(10, tag="a")
        second = await connection.submit(10, tag="b")
        for pending in (first, second):
            with pytest.raises(UnsentError if unread else Exception) as caught:
                await pending.wait(5_000)
            if not unread:
                assert not isinstance(caught.value, UnsentError)
        await connection.aclose()


async def test_the_client_pointed_at_the_ha_port_says_so(tmp_path):
    async with trio.open_nursery() as nursery:
        node = await nursery.start(serve_node, small_config(tmp_path / "n"))
        with pytest.raises((ConnectionLostError, AuthError)) as caught:
            with trio.fail_after(30):
                async with open_admin(node.ha_address) as admin:
                    await admin.status()
        assert "client port" in str(caught.value)
        nursery.cancel_scope.cancel()


async def test_a_retired_connection_closes_once_answered(tmp_path):
    async with trio.open_nursery() as nursery:
        node = await nursery.start(serve_node, small_config(tmp_path / "n"))
        async with open_admin(node.client_address) as admin:
            connection = admin.connection
            pending = await connection.submit(20)
            nursery.start_soon(connection.aclose_when_answered, 10_000)
            reply = await pending.wait(10_000)
            assert reply["node_id"] == "n1"
            connection.forget(pending)
            await wait_until(lambda: connection.closed, "the retired connection closes")
        nursery.cancel_scope.cancel()
