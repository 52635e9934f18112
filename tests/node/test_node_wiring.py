"""The node's parts get their collaborators through their constructors (issue 14): the
controller agent sees the node only through ``AgentBridge`` (a Registration and a channel of
decisions), the replication runtime takes the agent's write permit and the confirm offset
hook, and the status reply reads parts made before the handlers. In-process: no node
process, no ZooKeeper (the agent below is built, never started)."""

from __future__ import annotations

import pytest
import trio

from controller import AgentSettings, MasterRecord
from node.server.busy_poll import BusyPoll
from node.server.connections import ConnectionCounts
from node.server.controller_mode import AgentBridge, ControllerMode, Registration
from node.server.ha_roles import HaRuntime
from node.server.pull_waiters import PullWaiters
from node.server.node import StatusSources
from node.server.role import Role, RoleMachine
from node.server.sys_config import SysConfig
from replication import EpochFile
from replication.errors import ReplicationFenced
from store import Message, MessageStore

from node_helpers import small_config, wait_until

pytestmark = pytest.mark.trio


async def test_the_bridge_reads_only_its_registration_and_hands_decisions_over_in_order():
    readings = {"max_offset": 10, "epoch": 3}
    registration = Registration("127.0.0.1:1001", "127.0.0.1:1002", 5,
                                max_offset=lambda: readings["max_offset"], last_epoch=lambda: readings["epoch"])
    send, receive = trio.open_memory_channel(8)
    bridge = AgentBridge(registration, trio.lowlevel.current_trio_token(), send)
    master = MasterRecord("n2", 5, 0x1234, "127.0.0.1:2001", "127.0.0.1:2002", 0)

    def agent_worker() -> dict:
        info = bridge.node_info()
        bridge.on_become_master(4)
        bridge.on_fence("ZooKeeper session suspended")
        bridge.on_become_slave(5, master)
        return info

    assert await trio.to_thread.run_sync(agent_worker) == {
        "client_address": "127.0.0.1:1001", "ha_address": "127.0.0.1:1002", "max_offset": 10, "epoch": 3,
        "priority": 5}
    readings.update(max_offset=99, epoch=4)          # the readings are live, taken at each call
    assert (bridge.node_info()["max_offset"], bridge.node_info()["epoch"]) == (99, 4)
    assert [await receive.receive() for _ in range(3)] == [
        ("master", 4, None), ("fence", 0, "ZooKeeper session suspended"), ("slave", 5, master)]


async def test_the_status_reads_the_counters_busy_poll_replication_and_controller_made_before_the_handlers():
    counts = ConnectionCounts()
    busy_poll = BusyPoll(0)
    replication = {"role": "slave"}
    controller = ControllerMode(AgentSettings("127.0.0.1:1", "c1", "g1", "n1"),
                                Registration("127.0.0.1:1001", "127.0.0.1:1002", 0, max_offset=lambda: 0,
                                             last_epoch=lambda: 0))
    status = StatusSources("127.0.0.1:1001", "127.0.0.1:1002", "127.0.0.1:1003", 200, counts, busy_poll,
                           replication=lambda: replication, controller=controller.status)
    counts.open = 2
    reply = status()
    assert reply["connections"] == 2 and reply["busy_poll"] == {
        "window_us": 0, "reads": 0, "seconds": 0.0, "loop_polls": 0, "loop_polls_woken": 0, "loop_seconds": 0.0,
        "ready_taken": 0}
    assert (reply["client_address"], reply["ha_address"], reply["metrics_address"]) == (
        "127.0.0.1:1001", "127.0.0.1:1002", "127.0.0.1:1003")
    assert reply["replication"] is replication
    assert reply["controller"]["zk_hosts"] == "127.0.0.1:1" and reply["controller"]["registered"] is False
    assert reply["controller"]["may_ack"] is False   # an agent never started holds no permit
    alone = StatusSources("a:1", "a:2", "a:3", 0, counts, busy_poll, replication=dict, controller=None)
    assert alone()["controller"] is None


@pytest.fixture
def store(tmp_path):
    opened = MessageStore(small_config(tmp_path / "store").store_config())
    opened.start()
    yield opened
    opened.shutdown()


async def test_the_replication_runtime_checks_the_permit_and_tells_the_hook_it_was_built_with(tmp_path, store):
    config = small_config(tmp_path / "store", node_id="n1")
    sys_config = SysConfig(store)
    sys_config.replay()
    permit = {"epoch": None}
    waiters = PullWaiters()
    parked = waiters.event_for("t", 0)           # a long poll capped at the confirm offset
    ha_listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    ha = HaRuntime(config, store, RoleMachine(Role.SLAVE), sys_config, EpochFile(store.config.store_path),
                   ha_listeners, "127.0.0.1:0", "127.0.0.1:0",
                   write_permit=lambda epoch: permit["epoch"] == epoch, on_confirm_advanced=waiters.notify_all)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(ha.run)
            await ha.change_role(Role.MASTER, 1)
            with pytest.raises(ReplicationFenced, match="no write permit"):
                ha.check_for_put()                # no permit: refused before a byte is written
            assert not ha.may_ack(1)
            permit["epoch"] = 1
            ha.check_for_put()
            assert ha.may_ack(1) and not ha.may_ack(2)
            store.append([Message("t", b"body", queue_id=0)])
            ha.notify_appended()                  # the master alone is its sync-state set
            await wait_until(parked.is_set, "the confirm offset hook to wake the long poll")
            nursery.cancel_scope.cancel()
    finally:
        for listener in ha_listeners:
            await listener.aclose()
