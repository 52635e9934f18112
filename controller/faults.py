"""ZooKeeper faults for tests and drills: expire a live session from the outside.

ZooKeeper lets a second client attach to a session with its id and password; the server
then drops the first client's connection, and closing the second client closes the session
for good: its ephemeral znodes go, and the first client, on reconnecting, is told the session
expired (kazoo: SUSPENDED, then LOST). That is what a real expiry after a partition looks like
to everyone involved, without waiting a session timeout.
"""

from __future__ import annotations

from kazoo.client import KazooClient
from kazoo.handlers.threading import KazooTimeoutError

from .errors import ZooKeeperUnavailableError


def expire_session(zk_hosts: str, client_id: tuple[int, bytes], timeout_s: float = 5.0) -> None:
    """Close the session ``client_id`` (``KazooClient.client_id``: session id and password).

    The owner of the session may win the race by reconnecting first, which leaves the
    session alive: callers check the outcome (the owner reports LOST) and try again."""
    intruder = KazooClient(hosts=zk_hosts, client_id=client_id, timeout=timeout_s)
    try:
        intruder.start(timeout=timeout_s)
    except KazooTimeoutError as error:
        raise ZooKeeperUnavailableError(f"could not attach to session {client_id[0]:#x} at {zk_hosts}") from error
    finally:
        intruder.stop()
        intruder.close()
