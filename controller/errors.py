"""Expected operating failures of the controller package, each with a message a person can act on."""

from __future__ import annotations


class ControllerError(Exception):
    """Base of every error the controller package raises on purpose."""


class ZooKeeperServerError(ControllerError):
    """A local ZooKeeper server could not be started or did not start serving (its log tail is in the message)."""


class ZooKeeperUnavailableError(ControllerError):
    """ZooKeeper did not answer within the deadline (connection lost, session suspended, server down)."""


class NoMasterError(ControllerError):
    """A group has no master that may accept writes; ``reason`` says why (writes fail closed)."""

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason


class DeposedMasterError(ControllerError):
    """A node acted as master but the master znode no longer names it in the epoch it holds.

    Raised by the sync-state set update when its version check on the master znode fails:
    another master has been elected and this node must stop acking writes.
    """


class FencedError(ControllerError):
    """The node agent does not currently hold the write permit (session suspended/lost, or not master)."""


class ZnodeValueError(ControllerError):
    """A znode holds a value that is not the documented JSON object (its path is named)."""


class RouteError(ControllerError):
    """A topic route cannot be written or read as asked (a shrink, an unknown group, a bad znode value)."""
