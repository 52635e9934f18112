"""The node's role as a first-class state: master or slave, with the epoch it holds it in.

    SLAVE --change(MASTER, epoch)--> MASTER --change(SLAVE, epoch)--> SLAVE

``RoleMachine`` holds the state; ``Node.change_role`` (node/server/ha_roles.py) is the one entry
point that moves a node between roles, doing the replication side of the change and then
calling ``RoleMachine.change``. Epochs never go backwards: a change naming an older epoch
is refused, so a stale instruction cannot demote a newer master. A fence (the controller
agent lost its ZooKeeper session) refuses writes at once, in any role; a role change or
``unfence`` lifts it. Only a master accepts writes; ``check_writable`` raises
NotMasterError carrying the master's client address when it is known, which clients use
to find the master.
"""

from __future__ import annotations

import dataclasses
import enum
import time
from dataclasses import dataclass

from ..errors import NodeError, NotMasterError, RequestError


class Role(enum.Enum):
    MASTER = "master"
    SLAVE = "slave"


class RoleChangeRefused(NodeError):
    """A role change named an epoch older than the node's current one."""


@dataclass(frozen=True, slots=True)
class RoleState:
    """The role, its epoch, where the master is, and since when (ms since the epoch)."""

    role: Role
    epoch: int
    master_client_address: str | None
    since_ms: int
    changes: int
    fenced: str | None = None      # why the node acknowledges no write right now


class RoleMachine:
    """Holds the node's RoleState and tells listeners about every change."""

    def __init__(self, role: Role, epoch: int = 0, master_client_address: str | None = None) -> None:
        self._state = RoleState(role, epoch, master_client_address, _now_ms(), 0)
        self._listeners: list = []

    @property
    def state(self) -> RoleState:
        return self._state

    @property
    def is_master(self) -> bool:
        return self._state.role is Role.MASTER

    def add_listener(self, listener) -> None:
        """``listener(old_state, new_state)`` after each change."""
        self._listeners.append(listener)

    def change(self, role: Role, epoch: int, master_client_address: str | None = None) -> RoleState:
        """Move to ``role`` in ``epoch``. Refused if ``epoch`` is older than the current one."""
        old = self._state
        if epoch < old.epoch:
            raise RoleChangeRefused(f"role change to {role.value} in epoch {epoch} refused: "
                                    f"the node is already in epoch {old.epoch}")
        self._state = RoleState(role, epoch, master_client_address, _now_ms(), old.changes + 1)
        for listener in list(self._listeners):
            listener(old, self._state)
        return self._state

    def fence(self, reason: str) -> None:
        """Refuse every write from now on, whatever the role, until ``unfence`` or a role change."""
        old = self._state
        self._state = dataclasses.replace(old, fenced=reason)
        for listener in list(self._listeners):
            listener(old, self._state)

    def unfence(self) -> None:
        old = self._state
        if old.fenced is not None:
            self._state = dataclasses.replace(old, fenced=None)
            for listener in list(self._listeners):
                listener(old, self._state)

    def check_writable(self) -> None:
        """Raise NotMasterError unless this node is the master; RequestError
        SERVICE_NOT_AVAILABLE while it is fenced (it fails closed)."""
        state = self._state
        if state.fenced is not None:
            raise RequestError("SERVICE_NOT_AVAILABLE", f"this node is fenced ({state.fenced}): it accepts no "
                                                        "write until its role is confirmed")
        if state.role is not Role.MASTER:
            raise NotMasterError(f"this node is a {state.role.value} in epoch {state.epoch}; send writes to "
                                 f"the master{' at ' + state.master_client_address if state.master_client_address else ''}",
                                 state.master_client_address)

    def statistics(self) -> RoleState:
        return self._state


def _now_ms() -> int:
    return int(time.time() * 1000)
