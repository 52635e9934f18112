"""Controller mode: the node takes its role from ZooKeeper through a ``controller.NodeAgent``.

    serve_controller_agent(node, settings)     # a trio service, run in the node's nursery

The agent runs on its own threads (kazoo's and one worker) and calls the ``AgentNode``
methods of ``AgentBridge`` on its worker thread, one at a time, in decision order. The
bridge hands each decision to one trio task through a bounded channel, so role changes
run on the node's trio thread, strictly in the order the agent made them, and never block
the agent.

Fencing is layered so that no write is acked that the node cannot stand behind:

- the agent revokes its write permit inside kazoo's connection-state listener, the instant
  the session is SUSPENDED or LOST, or when the master znode names a newer epoch;
- the node's replication runtime consults ``agent.may_ack(epoch)`` before it writes a
  put and again at the moment it acknowledges one (``HaRuntime.external_permit``);
- ``on_fence`` then also fences the node's role state and its HAService (waiting sync
  puts fail), which status and metrics show.

The node starts as a fenced slave in its epoch file's last epoch and writes nothing until
the controller makes it master.
"""

from __future__ import annotations

import logging

import trio

from controller import AgentSettings, MasterRecord, NodeAgent
from controller.errors import ControllerError

from .role import Role, RoleChangeRefused

log = logging.getLogger(__name__)

DECISIONS_MAX = 256


class AgentBridge:
    """The node as the agent sees it (``controller.AgentNode``); called on the agent's worker thread."""

    def __init__(self, node, token: trio.lowlevel.TrioToken, send_channel: trio.MemorySendChannel) -> None:
        self._node = node
        self._token = token
        self._send = send_channel

    def node_info(self) -> dict:
        node = self._node
        return {"client_address": node.client_address, "ha_address": node.ha_address,
                "max_offset": node.store.max_physical_offset, "epoch": node.ha.epochs.last_epoch,
                "priority": node.config.priority}

    def on_become_master(self, epoch: int) -> None:
        self._hand_over(("master", epoch, None))

    def on_become_slave(self, epoch: int, master: MasterRecord) -> None:
        self._hand_over(("slave", epoch, master))

    def on_fence(self, reason: str) -> None:
        self._hand_over(("fence", 0, reason))

    def _hand_over(self, decision: tuple) -> None:
        try:
            self._token.run_sync_soon(self._send.send_nowait, decision)
        except trio.RunFinishedError:
            pass  # the node is shutting down: nothing left to change


async def serve_controller_agent(node, settings: AgentSettings, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Run the node's ZooKeeper agent and carry out its decisions until cancelled."""
    send_channel, receive_channel = trio.open_memory_channel(DECISIONS_MAX)
    bridge = AgentBridge(node, trio.lowlevel.current_trio_token(), send_channel)
    agent = NodeAgent(settings, bridge)
    node.ha.external_permit = agent.may_ack
    node.ha.on_sync_state_set_change = _persister(agent)
    node.agent = agent
    await trio.to_thread.run_sync(agent.start)
    try:
        task_status.started(agent)
        async with receive_channel:
            async for kind, epoch, detail in receive_channel:
                await _carry_out(node, kind, epoch, detail)
    finally:
        with trio.CancelScope(shield=True):
            node.ha.fence("the controller agent stopped")
            await trio.to_thread.run_sync(agent.stop)


async def _carry_out(node, kind: str, epoch: int, detail) -> None:
    try:
        if kind == "fence":
            log.warning("node %s fenced: %s", node.config.node_id, detail)
            node.fence(detail)
        elif kind == "master":
            await node.change_role(Role.MASTER, epoch)
        else:
            master: MasterRecord = detail
            await node.change_role(Role.SLAVE, epoch, master.client_address, master_ha_address=master.ha_address)
    except RoleChangeRefused as error:
        # the agent keeps the permit only for an epoch this node really holds: refusing
        # here leaves the node fenced, which status shows; the controller elects again
        log.error("node %s refused the controller's %s assignment in epoch %d: %s", node.config.node_id, kind,
                  epoch, error)
        node.fence(f"refused {kind} assignment in epoch {epoch}: {error}")


def _persister(agent: NodeAgent):
    """The master's sync-state set changes go to ZooKeeper before they count."""
    async def persist(members: frozenset) -> None:
        try:
            await trio.to_thread.run_sync(agent.update_sync_state_set, sorted(members))
        except ControllerError as error:
            log.warning("sync-state set %s not persisted: %s", sorted(members), error)
            raise
    return persist


def agent_settings(config) -> AgentSettings:
    """The agent settings of a node config in controller mode."""
    return AgentSettings(zk_hosts=config.zk_hosts, cluster=config.cluster, group=config.group,
                         node_id=config.node_id, session_timeout_ms=config.zk_session_timeout_ms,
                         refresh_interval_ms=config.zk_refresh_interval_ms)
