"""Expected operating failures of the node and its client library, each with an actionable message.

Server side, a failure that concerns one request becomes a typed error reply (a
``ResponseCode`` and a message); the connection and the node keep serving. Client side,
the same codes come back as the exceptions below.
"""

from __future__ import annotations


class NodeError(Exception):
    """Base of every error the node package raises on purpose."""


class NodeConfigError(NodeError):
    """The node's YAML config has an unknown key or a bad value (the key is named)."""


class FrameError(NodeError):
    """The framing itself is broken (bad length, not msgpack, not a map): the connection closes."""


class RequestError(NodeError):
    """A request the node refuses; ``code`` is the protocol's ResponseCode name."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class NotMasterError(RequestError):
    """A write reached a node that is not the master; ``master_address`` names the master if known."""

    def __init__(self, message: str, master_address: str | None) -> None:
        super().__init__("NOT_MASTER", message)
        self.master_address = master_address


class AuthError(NodeError):
    """The HMAC challenge failed (wrong or missing secret). The node reads no request of a
    connection before it authenticates, so every request on it surely took no effect."""


class UnsentError(NodeError):
    """A request that surely took no effect: it was never written whole, or the node closed
    the connection saying it read no further request (busy, idle, shed). Safe to retry."""


class ConnectionLostError(NodeError):
    """The connection to a node closed or failed; requests in flight have an unknown outcome."""


class RequestTimeoutError(NodeError):
    """No reply within the client's deadline; the request's outcome is unknown."""


class UnknownOutcomeError(NodeError):
    """A send whose outcome cannot be known (the connection died after the request left).

    The messages may or may not be stored. ``uniq_keys`` are their client ids: query them
    by key to find out. The producer never retries these on its own, so a retry can never
    turn into a silent duplicate.
    """

    def __init__(self, message: str, uniq_keys: list[str]) -> None:
        super().__init__(message)
        self.uniq_keys = uniq_keys


class NodeProcessError(NodeError):
    """A node process (``hastore node start``) did not start, or did not stop cleanly."""


class ClientClosedError(NodeError):
    """A call on a blocking client (node/client/sync.py) that is closed or whose thread ended."""


class BenchPeerError(NodeError):
    """The peer a benchmark compares with (a Redis primary and its replicas) did not start,
    did not come online, or failed a workload; the message says which and what to check."""


class RouteError(NodeError):
    """A routed client cannot go on: the topic has no route, or no group of it can take a send now."""


class NoRouteError(RouteError):
    """The topic has no route in ZooKeeper (create it with ``hastore topic create T --zk HOSTS``)."""


class GroupUnavailableError(RouteError):
    """A group has no master that a client can reach now (it may be failing over); ``group`` names it."""

    def __init__(self, message: str, group: str) -> None:
        super().__init__(message)
        self.group = group


class CorruptRecordError(NodeError):
    """A message the node could not serve intact: its record fails its CRCs on the node and
    no replica gave an intact copy (yet). ``queue_offset`` and ``physical_offset`` name it;
    the consumer has moved past it, so the caller decides: re-read it later (the node keeps
    trying to repair it), take it from another replica, or record it as lost."""

    def __init__(self, topic: str, queue_id: int, queue_offset: int, physical_offset: int, reason: str) -> None:
        super().__init__(f"{topic}/{queue_id} queue offset {queue_offset} (commit log offset {physical_offset}) "
                         f"is corrupt on the node and was not served: {reason}")
        self.topic = topic
        self.queue_id = queue_id
        self.queue_offset = queue_offset
        self.physical_offset = physical_offset
        self.reason = reason
