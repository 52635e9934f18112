"""Config changes (topic creation, consumer-offset commits) are acknowledged like puts:
under sync replication only once the replicas hold their %SYS%CONFIG record, refused before
a byte is logged without the controller's permit, and never acked by a master that lost
its role meanwhile. In-process: a real store and replication runtime, an HAClient as the
slave over loopback, no node process and no ZooKeeper."""

from __future__ import annotations

import pytest
import trio

from node.server.ha_roles import HaRuntime
from node.server.handlers import RequestHandlers
from node.server.metrics import NodeMetrics
from node.server.role import Role, RoleMachine
from node.server.sys_config import SYS_CONFIG_TOPIC, SysConfig
from node.wire.protocol import RequestCode, ResponseCode
from replication import EpochFile, HAClient, HaClientSettings, serve_ha_client
from store import MessageStore

from node_helpers import small_config, wait_until

pytestmark = pytest.mark.trio

COMMIT = {"code": int(RequestCode.COMMIT_OFFSETS), "opaque": 7, "group": "cg", "topic": "orders", "offsets": {0: 42}}
CREATE = {"code": int(RequestCode.TOPIC_CREATE), "opaque": 8, "topic": "orders", "queue_count": 2}


class Master:
    """A master's store, config, replication runtime and handlers (permit under the test's control)."""

    def __init__(self, tmp_path, **changes) -> None:
        self.config = small_config(tmp_path / "master", node_id="n1", replication="sync", **changes)
        self.store = MessageStore(self.config.store_config())
        self.store.start()
        self.sys_config = SysConfig(self.store)
        self.sys_config.replay()
        self.role = RoleMachine(Role.SLAVE)
        self.permit_epoch: int | None = 1
        self.listeners: list = []
        self.ha: HaRuntime | None = None
        self.handlers: RequestHandlers | None = None

    async def start(self, nursery, sync_state_set: frozenset) -> str:
        self.listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.ha = HaRuntime(self.config, self.store, self.role, self.sys_config, EpochFile(self.config.store_path),
                            self.listeners, "127.0.0.1:0", "127.0.0.1:0",
                            write_permit=lambda epoch: self.permit_epoch == epoch)
        self.handlers = RequestHandlers(self.config, self.store, self.role, self.sys_config,
                                        NodeMetrics("n1"), replicas=self.ha)
        await nursery.start(self.ha.run)
        await self.ha.change_role(Role.MASTER, 1, sync_state_set=sync_state_set)
        host, port = self.listeners[0].socket.getsockname()[:2]
        return f"{host}:{port}"

    async def request(self, payload: dict) -> dict:
        outcome = self.handlers.dispatch(dict(payload))
        return await outcome() if callable(outcome) else outcome

    def config_records(self) -> int:
        assert self.store.wait_dispatched()
        return self.store.max_offset(SYS_CONFIG_TOPIC, 0)

    async def close(self) -> None:
        for listener in self.listeners:
            await listener.aclose()
        self.store.shutdown()


@pytest.fixture
async def master(tmp_path):
    made: list[Master] = []

    def make(**changes) -> Master:
        made.append(Master(tmp_path, **changes))
        return made[-1]
    yield make
    for each in made:
        await each.close()


async def test_a_config_change_waits_for_the_in_sync_replica_and_is_not_acked_without_it(master):
    m = master(min_in_sync_replicas=2, all_ack_in_sync_state_set=True, slave_timeout_ms=1_500,
               ha_max_time_slave_not_catchup_ms=60_000)
    async with trio.open_nursery() as nursery:
        await m.start(nursery, frozenset({"n1", "n2"}))      # n2 is in the set but never connects
        started = trio.current_time()
        for payload in (COMMIT, CREATE):
            reply = await m.request(payload)
            assert reply["code"] == ResponseCode.SERVICE_NOT_AVAILABLE, reply
            assert "FLUSH_SLAVE_TIMEOUT" in reply["error"] and "not acknowledged" in reply["error"]
        assert trio.current_time() - started >= 2 * 1.5 * 0.9   # each waited for the replica
        assert m.config_records() == 2    # logged (it may survive a failover): an unknown outcome
        nursery.cancel_scope.cancel()


async def test_a_config_change_is_acked_once_the_slave_holds_its_record(master, tmp_path):
    m = master(min_in_sync_replicas=2, slave_timeout_ms=20_000, ha_max_time_slave_not_catchup_ms=60_000)
    slave_store = MessageStore(small_config(tmp_path / "slave").store_config())
    slave_store.start()
    try:
        async with trio.open_nursery() as nursery:
            address = await m.start(nursery, frozenset({"n1", "n2"}))
            reply_box: list[dict] = []

            async def commit() -> None:
                reply_box.append(await m.request(COMMIT))
            nursery.start_soon(commit)
            await trio.sleep(0.5)
            assert reply_box == [], "a commit was acked before any replica held it"
            assert m.config_records() == 1
            client = HAClient(slave_store.replica_log, EpochFile(slave_store.config.store_path),
                              HaClientSettings(node_id="n2", group="g1", cluster="hastore", master_ha_address=address,
                                               backoff_min_ms=20, backoff_max_ms=200))
            nursery.start_soon(serve_ha_client, client)
            await wait_until(lambda: bool(reply_box), "the commit's ack once the slave joined")
            assert reply_box[0]["code"] == ResponseCode.SUCCESS and reply_box[0]["committed"] == 1
            assert slave_store.max_physical_offset >= m.store.max_physical_offset   # it holds the record
            nursery.cancel_scope.cancel()
    finally:
        slave_store.shutdown()


async def test_without_the_permit_a_config_change_is_refused_before_it_is_logged(master):
    m = master()
    async with trio.open_nursery() as nursery:
        await m.start(nursery, frozenset({"n1"}))
        assert (await m.request(COMMIT))["code"] == ResponseCode.SUCCESS   # alone in its set: acked
        assert m.config_records() == 1
        m.permit_epoch = None                     # the agent's permit is revoked (session lost, lease out)
        for payload in (COMMIT, CREATE):
            reply = await m.request(payload)
            assert reply["code"] == ResponseCode.SERVICE_NOT_AVAILABLE and "nothing logged" in reply["error"]
        assert m.config_records() == 1
        nursery.cancel_scope.cancel()


async def test_without_the_permit_a_master_serves_no_read(master):
    """A master whose permit is gone (session lost, or a pause outlasted its lease) answers
    no pull and no offset query until ZooKeeper confirms it again: a new master may be
    cutting what it still holds. A long poll parked before that finds out when it wakes."""
    m = master()
    async with trio.open_nursery() as nursery:
        await m.start(nursery, frozenset({"n1"}))
        assert (await m.request(COMMIT))["code"] == ResponseCode.SUCCESS
        pull = {"code": int(RequestCode.PULL), "opaque": 9, "topic": "orders", "queue_id": 0, "offset": 0}
        query = {"code": int(RequestCode.QUERY_OFFSETS), "opaque": 10, "group": "cg", "topic": "orders"}
        assert (await m.request(pull))["code"] == ResponseCode.SUCCESS
        assert (await m.request(query))["offsets"] == {0: 42}
        m.permit_epoch = None
        for payload in (pull, query, {**pull, "timeout_ms": 1000}):
            reply = await m.request(payload)
            assert reply["code"] == ResponseCode.SERVICE_NOT_AVAILABLE and "no permit" in reply["error"], reply
        m.permit_epoch = 1                        # a fresh read of the master znode confirmed it
        assert (await m.request(query))["offsets"] == {0: 42}
        m.ha.fence("ZooKeeper session lost")     # the agent's on_fence
        assert (await m.request(pull))["code"] == ResponseCode.SERVICE_NOT_AVAILABLE
        nursery.cancel_scope.cancel()
