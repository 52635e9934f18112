"""Expected operating failures of replication, each with a message a person can act on."""

from __future__ import annotations

from store.errors import exception_leaves


class ReplicationError(Exception):
    """Base of every error the replication package raises on purpose."""


class EpochFileError(ReplicationError):
    """The epoch file is unreadable (bad CRC or layout) or a change would break its order."""


class HaProtocolError(ReplicationError):
    """The peer broke the HA protocol (bad frame, wrong offset, bad CRC): drop the connection."""


class HaAuthError(ReplicationError):
    """The peer did not prove it holds the cluster secret: it gets nothing more."""


class HandshakeRefused(ReplicationError):
    """The master refused the slave's handshake (other group, log out of reach, ...)."""


class ReplicaWaitError(ReplicationError):
    """A sync put was written locally but not acknowledged by enough replicas.

    ``status`` is the PutStatus name a send reply carries. The message is in the master's
    log and may still reach the replicas, so the outcome for a reader is unknown.
    """

    status = "FLUSH_SLAVE_TIMEOUT"


class FlushSlaveTimeout(ReplicaWaitError):
    """Not enough replicas acknowledged the put within ``slave_timeout_ms``."""

    status = "FLUSH_SLAVE_TIMEOUT"


class InSyncReplicasNotEnough(ReplicaWaitError):
    """The sync-state set holds fewer members than ``min_in_sync_replicas``."""

    status = "IN_SYNC_REPLICAS_NOT_ENOUGH"


class ReplicationFenced(ReplicaWaitError):
    """The master was fenced or stepped down while the put waited: it acknowledges nothing."""

    status = "SERVICE_NOT_AVAILABLE"


def expected_failure(error: BaseException, expected: tuple[type, ...]) -> BaseException | None:
    """``error`` itself, or the first leaf of an exception group, when every leaf is one of
    ``expected``; None otherwise (a bug or a cancellation: the caller re-raises)."""
    leaves = exception_leaves(error)
    if leaves and all(isinstance(leaf, expected) for leaf in leaves):
        return leaves[0]
    return None
