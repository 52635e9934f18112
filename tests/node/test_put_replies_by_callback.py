"""A sync put's reply with no task of its own (node/server/put_waits.py): the HA service
answers it from the task that learns the outcome and the connection writes it from there.
Deterministic: trio's autojump clock, a real store, real handlers, client server and
HAService in one trio run; the client and the slave's ack stream are real socket pairs."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from node.server import connections
from node.server.connections import ClientServer
from node.server.ha_roles import HaRuntime
from node.server.handlers import RequestHandlers
from node.server.metrics import NodeMetrics
from node.server.put_waits import REPLICA_FAILURE_REASONS
from node.server.role import Role, RoleMachine
from node.server.sys_config import SysConfig
from node.wire import protocol
from node.wire.protocol import FrameDecoder, RequestCode
from replication import EpochFile, HAService, protocol as ha_protocol
from replication.ha_service import serve_ha
from replication.transport import StreamReader
from store import MessageStore

from node_helpers import small_config

pytestmark = pytest.mark.trio

SLAVE_TIMEOUT_MS = 1_000


class SyncMaster:
    """A master's request path over a real store, with sync replication to one slave, s1,
    whose acks the test sends itself on a socket pair into the service's ack reader."""

    def __init__(self, tmp_path, **changes) -> None:
        self.config = small_config(tmp_path / "store", node_id="m", replication="sync", min_in_sync_replicas=2,
                                   slave_timeout_ms=SLAVE_TIMEOUT_MS, **changes)
        self.store = MessageStore(self.config.store_config())
        self.store.start()
        sys_config = SysConfig(self.store)
        sys_config.replay()
        self.epochs = EpochFile(self.config.store_config().store_path)
        self.epochs.load(self.store.max_physical_offset)
        self.epochs.append(1, self.store.max_physical_offset)
        self.role = RoleMachine(Role.MASTER, 1, "127.0.0.1:10911")
        self.runtime = HaRuntime(self.config, self.store, self.role, sys_config, self.epochs, [], "127.0.0.1:1",
                                 "127.0.0.1:10911")
        metrics = self.metrics = NodeMetrics("m")
        self.handlers = RequestHandlers(self.config, self.store, self.role, sys_config, metrics,
                                        replicas=self.runtime)
        self.server = ClientServer(self.config, self.handlers, metrics)
        self.service: HAService | None = None
        self._slave_end: trio.SocketStream | None = None

    async def start(self, nursery: trio.Nursery) -> None:
        service = HAService(self.store.replica_log, self.runtime._service_settings(), 1, self.epochs.entries)
        await nursery.start(serve_ha, service, [])
        self.runtime.ha_service = self.service = service
        # slave s1 is connected and in the sync-state set; its acks come from the test
        left, right = trio.socket.socketpair()
        self._slave_end = trio.SocketStream(right)
        service.tracker.connected("s1", "pair", self.store.max_physical_offset, 0)
        service.tracker.apply_sync_state_set(frozenset({"m", "s1"}))
        replica = service.tracker.replicas["s1"]
        nursery.start_soon(service._read_acks, StreamReader(trio.SocketStream(left)), replica, nursery.cancel_scope)

    async def ack(self, offset: int) -> None:
        self.service.tracker.replicas["s1"].sent_offset = offset   # what the senders would have sent
        await self._slave_end.send_all(ha_protocol.ack(offset))

    def connect(self, nursery: trio.Nursery) -> trio.SocketStream:
        left, right = trio.socket.socketpair()
        nursery.start_soon(self.server.handle_connection, trio.SocketStream(right))
        return trio.SocketStream(left)

    def close(self) -> None:
        self.store.shutdown()


@pytest.fixture
def sync_master(tmp_path):
    made = []

    def make(**changes) -> SyncMaster:
        master = SyncMaster(tmp_path, **changes)
        made.append(master)
        return master
    yield make
    for master in made:
        master.close()


def _send(opaque: int, body: bytes = b"x" * 100) -> bytes:
    return protocol.encode_frame({"code": int(RequestCode.SEND), "opaque": opaque, "topic": "t",
                                  "messages": [{"body": body}]})


async def _replies(stream: trio.SocketStream, count: int, decoder: FrameDecoder) -> list[tuple[float, dict]]:
    """The next ``count`` reply frames, each with the time it arrived."""
    got: list[tuple[float, dict]] = []
    while len(got) < count:
        data = await stream.receive_some(1 << 16)
        assert data, "the node closed the connection"
        got += [(trio.current_time(), frame) for frame in decoder.feed(data)]
    return got


async def test_many_waiting_puts_are_answered_in_order_at_the_ack(sync_master, autojump_clock):
    master = sync_master()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await master.start(nursery)
            client = master.connect(nursery)
            await client.send_all(b"".join(_send(opaque) for opaque in range(1, 9)))
            await trio.sleep(0.3)   # appended, and waiting: no reply yet
            assert master.service.statistics().waiting_puts == 8
            acked_at = trio.current_time()
            await master.ack(master.store.max_physical_offset)
            replies = await _replies(client, 8, FrameDecoder())
            assert [frame["opaque"] for _, frame in replies] == list(range(1, 9))
            assert all(frame["results"][0]["status"] == "PUT_OK" for _, frame in replies)
            assert all(at == acked_at for at, _ in replies)
            offsets = [frame["results"][0]["physical_offset"] for _, frame in replies]
            assert offsets == sorted(offsets)
            nursery.cancel_scope.cancel()


async def test_a_put_acked_in_part_waits_for_the_ack_that_covers_it(sync_master, autojump_clock):
    master = sync_master()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await master.start(nursery)
            client = master.connect(nursery)
            decoder = FrameDecoder()
            await client.send_all(_send(1))
            await trio.sleep(0.1)
            first_end = master.store.max_physical_offset
            await client.send_all(_send(2))
            await trio.sleep(0.1)
            await master.ack(first_end)
            ((_, first),) = await _replies(client, 1, decoder)
            assert first["opaque"] == 1
            with trio.move_on_after(0.5):
                await _replies(client, 1, decoder)
                pytest.fail("the second put was answered before its bytes were acked")
            await master.ack(master.store.max_physical_offset)
            ((_, second),) = await _replies(client, 1, decoder)
            assert second["opaque"] == 2 and second["results"][0]["status"] == "PUT_OK"
            nursery.cancel_scope.cancel()


async def test_a_put_no_replica_acks_times_out_at_slave_timeout_ms(sync_master, autojump_clock):
    master = sync_master()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await master.start(nursery)
            client = master.connect(nursery)
            sent_at = trio.current_time()
            await client.send_all(_send(7))
            ((at, reply),) = await _replies(client, 1, FrameDecoder())
            assert at - sent_at == pytest.approx(SLAVE_TIMEOUT_MS / 1000, abs=1e-6)
            (result,) = reply["results"]
            assert reply["opaque"] == 7
            assert (result["status"], result["reason"]) == ("FLUSH_SLAVE_TIMEOUT",
                                                            REPLICA_FAILURE_REASONS["FLUSH_SLAVE_TIMEOUT"])
            assert master.service.statistics().waiting_puts == 0
            nursery.cancel_scope.cancel()


def _send_columns(opaque: int, count: int) -> bytes:
    """A producer's batch: bodies and UNIQ_KEYs as columns, results asked as columns."""
    return protocol.encode_frame({"code": int(RequestCode.SEND), "opaque": opaque, "topic": "t",
                                  "message_columns": {"body": [b"c%d" % i * 50 for i in range(count)],
                                                      "properties": [{"UNIQ_KEY": f"{opaque:08X}{i:024X}"}
                                                                     for i in range(count)]},
                                  "result_columns": True})


async def test_a_batch_written_as_columns_is_answered_in_columns_at_the_ack_or_the_timeout(sync_master,
                                                                                           autojump_clock):
    master = sync_master()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await master.start(nursery)
            client = master.connect(nursery)
            decoder = FrameDecoder()
            await client.send_all(_send(1))   # the topic's first message: the store knows it from now on
            await trio.sleep(0.1)
            await master.ack(master.store.max_physical_offset)
            await _replies(client, 1, decoder)
            start = master.store.max_physical_offset
            await client.send_all(_send_columns(2, 8))
            await trio.sleep(0.1)
            await master.ack(master.store.max_physical_offset)
            ((_, acked),) = await _replies(client, 1, decoder)
            columns = acked["result_columns"]
            assert columns["status"] == ["PUT_OK"] * 8 and columns["reason"] == [""] * 8
            offsets = columns["physical_offset"]
            assert offsets[0] == start and offsets == sorted(offsets)
            assert [message_id[-16:] for message_id in columns["message_id"]] == [f"{o:016X}" for o in offsets]
            master.store.wait_dispatched()
            stored = [master.store.get_by_message_id(message_id) for message_id in columns["message_id"]]
            assert [(m.body, m.physical_offset, m.queue_id, m.queue_offset) for m in stored] == [
                (b"c%d" % i * 50, offsets[i], columns["queue_id"][i], columns["queue_offset"][i]) for i in range(8)]
            sent_at = trio.current_time()
            await client.send_all(_send_columns(3, 8))   # never acked
            ((at, timed_out),) = await _replies(client, 1, decoder)
            assert at - sent_at == pytest.approx(SLAVE_TIMEOUT_MS / 1000, abs=1e-6)
            columns = timed_out["result_columns"]
            assert columns["status"] == ["FLUSH_SLAVE_TIMEOUT"] * 8
            assert columns["reason"] == [REPLICA_FAILURE_REASONS["FLUSH_SLAVE_TIMEOUT"]] * 8
            assert columns["physical_offset"][0] > offsets[-1]   # written, then not acknowledged
            nursery.cancel_scope.cancel()


async def test_waiting_puts_fail_when_the_sync_state_set_shrinks(sync_master, autojump_clock):
    master = sync_master(ha_max_time_slave_not_catchup_ms=300)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await master.start(nursery)
            client = master.connect(nursery)
            await client.send_all(_send(1) + _send(2))
            await trio.sleep(0.05)
            master.service.tracker.disconnected("s1", int(trio.current_time() * 1000))
            replies = await _replies(client, 2, FrameDecoder())
            assert [frame["opaque"] for _, frame in replies] == [1, 2]
            for at, frame in replies:
                assert at < SLAVE_TIMEOUT_MS / 1000   # the shrink, not the timeout
                (result,) = frame["results"]
                assert (result["status"], result["reason"]) == (
                    "IN_SYNC_REPLICAS_NOT_ENOUGH", REPLICA_FAILURE_REASONS["IN_SYNC_REPLICAS_NOT_ENOUGH"])
            assert master.service.tracker.sync_state_set == frozenset({"m"})
            nursery.cancel_scope.cancel()


async def test_a_fenced_master_answers_its_waiting_puts_with_no_ack(sync_master, autojump_clock):
    master = sync_master()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await master.start(nursery)
            client = master.connect(nursery)
            await client.send_all(_send(3))
            await trio.sleep(0.2)
            master.service.fence("a newer master was elected")
            ((at, reply),) = await _replies(client, 1, FrameDecoder())
            assert at == pytest.approx(0.2, abs=1e-6)
            assert reply["results"][0]["status"] == "SERVICE_NOT_AVAILABLE"
            nursery.cancel_scope.cancel()


async def test_a_connection_closed_while_its_put_waits_ends_and_the_ack_still_comes(sync_master, autojump_clock):
    master = sync_master()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await master.start(nursery)
            client = master.connect(nursery)
            await client.send_all(_send(1))
            await trio.sleep(0.1)
            await client.aclose()
            await trio.sleep(0.1)
            assert master.server.statistics().connections == 1   # waits for its put's reply, as before
            await master.ack(master.store.max_physical_offset)
            await trio.sleep(0.1)
            assert master.server.statistics().connections == 0
            assert master.service.statistics().waiting_puts == 0
            # the node serves on: a new connection's put is answered at its ack
            other = master.connect(nursery)
            await other.send_all(_send(2))
            await trio.sleep(0.1)
            await master.ack(master.store.max_physical_offset)
            ((_, reply),) = await _replies(other, 1, FrameDecoder())
            assert reply["opaque"] == 2 and reply["results"][0]["status"] == "PUT_OK"
            nursery.cancel_scope.cancel()


async def test_the_success_reply_built_ahead_is_counted_at_the_ack_after_its_write(sync_master, autojump_clock,
                                                                                  monkeypatch):
    master = sync_master()
    counted_at_write = []
    real_write_now = connections.write_now

    def write_now(stream, data):
        counted_at_write.append(master.metrics.tally.put_messages)
        return real_write_now(stream, data)

    monkeypatch.setattr(connections, "write_now", write_now)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await master.start(nursery)
            client = master.connect(nursery)
            await client.send_all(_send(5))
            await trio.sleep(0.25)
            assert master.metrics.tally.put_messages == 0   # built, not counted: no ack yet
            await master.ack(master.store.max_physical_offset)
            ((_, reply),) = await _replies(client, 1, FrameDecoder())
            assert reply["opaque"] == 5 and reply["results"][0]["status"] == "PUT_OK"
            # counted once written: the counts are not on the send's path, the reply's write is
            assert counted_at_write == [0]
            tally = master.metrics.tally
            assert tally.put_messages == 1 and sum(tally.put_latency_counts) == 1   # once
            nursery.cancel_scope.cancel()


async def test_a_master_of_an_older_epoch_at_the_ack_answers_no_ack_not_the_reply_built_ahead(sync_master,
                                                                                            autojump_clock):
    master = sync_master()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await master.start(nursery)
            client = master.connect(nursery)
            await client.send_all(_send(6))
            await trio.sleep(0.2)
            master.role.change(Role.MASTER, 2)   # a new term: what the put's term wrote is not acked by it
            await master.ack(master.store.max_physical_offset)
            ((_, reply),) = await _replies(client, 1, FrameDecoder())
            assert reply["results"][0]["status"] == "SERVICE_NOT_AVAILABLE"
            assert master.metrics.tally.put_messages == 0
            nursery.cancel_scope.cancel()
