"""Controller mode: the node takes its role from ZooKeeper through a ``controller.NodeAgent``.

    controller = ControllerMode(agent_settings(config), registration)   # before the HA runtime
    ha = HaRuntime(..., write_permit=controller.agent.may_ack,
                   on_sync_state_set_change=controller.persist_sync_state_set)
    await nursery.start(controller.serve, ha)       # a trio service, run in the node's nursery

The agent is built first, so that its write permit and the sync-state set persister reach
the replication runtime through its constructor. The agent sees the node only as
``controller.AgentNode``, implemented by ``AgentBridge``, which holds what the node's
znode needs (a ``Registration``: addresses, priority, the live max offset and last epoch)
and a channel for decisions, never the Node. The agent calls the bridge on its worker
thread, one call at a time, in decision order. The bridge hands each decision to one trio
task (``ControllerMode.serve``) through a bounded channel, so role changes run on the
node's trio thread, strictly in the order the agent made them, and never block the agent.

Fencing is layered so that no write is acked that the node cannot stand behind:

- the agent revokes its write permit inside kazoo's connection-state listener, the instant
  the session is SUSPENDED or LOST, or when the master znode names a newer epoch;
- the node's replication runtime consults ``agent.may_ack(epoch)`` before it writes a
  put and again at the moment it acknowledges one (``HaRuntime``'s ``write_permit``);
- ``on_fence`` then also fences the node's role state and its HAService (waiting sync
  puts fail), which status and metrics show.

The node starts as a fenced slave in its epoch file's last epoch and writes nothing until
the controller makes it master.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import trio

from controller import AgentSettings, MasterRecord, NodeAgent
from controller.errors import ControllerError

from .role import Role, RoleChangeRefused

if TYPE_CHECKING:
    from .ha_roles import HaRuntime

log = logging.getLogger(__name__)

DECISIONS_MAX = 256


@dataclass(frozen=True, slots=True)
class Registration:
    """What this node's znode holds: fixed addresses and priority, and two live readings
    (the store's max physical offset and the epoch file's last epoch), safe to take from the
    agent's worker thread (each reads one integer)."""

    client_address: str
    ha_address: str
    priority: int
    max_offset: Callable[[], int]
    last_epoch: Callable[[], int]

    def node_info(self) -> dict:
        """The ``AgentNode.node_info`` value."""
        return {"client_address": self.client_address, "ha_address": self.ha_address,
                "max_offset": self.max_offset(), "epoch": self.last_epoch(), "priority": self.priority}


class AgentBridge:
    """The node as the agent sees it (``controller.AgentNode``); called on the agent's worker thread."""

    def __init__(self, registration: Registration, token: trio.lowlevel.TrioToken,
                 send_channel: trio.MemorySendChannel) -> None:
        self._registration = registration
        self._token = token
        self._send = send_channel

    def node_info(self) -> dict:
        return self._registration.node_info()

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


class ControllerMode:
    """One node's controller agent, its bridge and the channel of its decisions. Build it in
    the node's trio run (it takes the run's token), before the replication runtime."""

    def __init__(self, settings: AgentSettings, registration: Registration) -> None:
        self.settings = settings
        self._send, self._receive = trio.open_memory_channel(DECISIONS_MAX)
        self.agent = NodeAgent(settings, AgentBridge(registration, trio.lowlevel.current_trio_token(), self._send))

    async def persist_sync_state_set(self, members: frozenset) -> None:
        """The master's sync-state set changes go to ZooKeeper before they count."""
        try:
            await trio.to_thread.run_sync(self.agent.update_sync_state_set, sorted(members))
        except ControllerError as error:
            log.warning("sync-state set %s not persisted: %s", sorted(members), error)
            raise

    def status(self) -> dict:
        """The ``controller`` section of a status reply."""
        stats = self.agent.statistics()
        return {"zk_hosts": self.settings.zk_hosts, "zk_state": stats.zk_state, "session_id": stats.session_id,
                "registered": stats.registered, "assignment": stats.assignment, "epoch": stats.epoch,
                "master_node_id": stats.master_node_id, "may_ack": stats.write_permit_epoch is not None,
                "fences": stats.fences, "waiting_reason": stats.waiting_reason}

    async def serve(self, ha: HaRuntime, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Start the agent and carry out its decisions on ``ha`` until cancelled; the node is
        fenced and the agent stopped (its znode gone at once) on the way out."""
        await trio.to_thread.run_sync(self.agent.start)
        try:
            task_status.started(self.agent)
            async with self._receive:
                async for kind, epoch, detail in self._receive:
                    await self._carry_out(ha, kind, epoch, detail)
        finally:
            with trio.CancelScope(shield=True):
                ha.fence("the controller agent stopped")
                await trio.to_thread.run_sync(self.agent.stop)

    async def _carry_out(self, ha: HaRuntime, kind: str, epoch: int, detail) -> None:
        node_id = self.settings.node_id
        try:
            if kind == "fence":
                log.warning("node %s fenced: %s", node_id, detail)
                ha.fence(detail)
            elif kind == "master":
                await ha.change_role(Role.MASTER, epoch)
            else:
                master: MasterRecord = detail
                await ha.change_role(Role.SLAVE, epoch, master_client_address=master.client_address,
                                     master_ha_address=master.ha_address)
        except RoleChangeRefused as error:
            # the agent keeps the permit only for an epoch this node really holds: refusing
            # here leaves the node fenced, which status shows; the controller elects again
            log.error("node %s refused the controller's %s assignment in epoch %d: %s", node_id, kind, epoch, error)
            ha.fence(f"refused {kind} assignment in epoch {epoch}: {error}")


def agent_settings(config) -> AgentSettings:
    """The agent settings of a node config in controller mode."""
    return AgentSettings(zk_hosts=config.zk_hosts, cluster=config.cluster, group=config.group,
                         node_id=config.node_id, session_timeout_ms=config.zk_session_timeout_ms,
                         refresh_interval_ms=config.zk_refresh_interval_ms)
