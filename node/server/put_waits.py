"""A sync put's reply with no task of its own: under sync replication and async flush the
HA service calls it from the task that learns the outcome (replication/ha_service.py,
``wait_for_replicas_then``), and the server writes it from there (connections.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import trio

from replication.errors import ReplicaWaitError
from store import PutStatus

from ..errors import FrameError
from ..wire import protocol
from ..wire.protocol import RequestCode

if TYPE_CHECKING:
    from .handlers import RequestHandlers

ROLE_FAILURE = (PutStatus.SERVICE_NOT_AVAILABLE, "the node stopped being master in this epoch (or was fenced) "
                 "before the put was acknowledged; it may or may not survive")
REPLICA_FAILURE_REASONS = {
    "FLUSH_SLAVE_TIMEOUT": "written on the master, not acknowledged by enough in-sync replicas within "
                           "slave_timeout_ms; it may or may not survive a failover",
    "IN_SYNC_REPLICAS_NOT_ENOUGH": "written on the master, but the sync-state set shrank below "
                                   "min_in_sync_replicas; it may or may not survive a failover",
    "SERVICE_NOT_AVAILABLE": "written on the master, which was fenced or stepped down before enough replicas "
                             "acknowledged it; it may or may not survive",
}


def when_replicated(end: int, service, replicas, epoch: int,
                    reply: Callable[[tuple[PutStatus, str] | None], dict],
                    success: Callable[[], tuple[dict, Callable[[], None]] | None] | None = None) -> dict | PendingReply:
    """``reply(failure)`` once ``service`` has enough in-sync replicas holding the log up to
    ``end`` (failure None) or the wait failed, and the node still master in ``epoch`` (else
    ROLE_FAILURE): the reply itself when that is known now, else a PendingReply.
    ``replicas``: the node's replication runtime (may_ack). ``success()``, when given: what
    ``reply(None)`` would give, built ahead while the replicas work, and a call that counts
    it once it is the answer (None: not built ahead)."""

    def fields(error: ReplicaWaitError | None) -> dict:
        failure = None if error is None else (PutStatus(error.status), REPLICA_FAILURE_REASONS[error.status])
        if not replicas.may_ack(epoch):
            failure = ROLE_FAILURE
        return reply(failure)
    pending = PendingReply(fields, success, lambda: replicas.may_ack(epoch))
    try:
        if service.wait_for_replicas_then(end, pending.finish):
            return pending
        error = None
    except ReplicaWaitError as raised:
        error = raised
    return fields(error)


class PendingReply:
    """A send's reply that waits for the replicas with no task of its own (sync replication,
    async flush). The server calls ``start(deliver)``; ``deliver(reply)`` is then called
    once, from the task that learns the outcome (the HA service's ack reader, its timeout
    task, whoever shrinks the sync-state set or fences), or from ``start`` when that came
    first. Awaiting it (``await pending()``) gives the reply too, as a Deferred would.

    Built ahead: a server that starts it with ``encoded=True`` (it then delivers frames as
    bytes too) has the success reply built and encoded at once, while the replicas work,
    when the put gave a ``success``; the last ack then only checks the role and hands the
    bytes over, and counts the put after. One send at a time to a master with two slaves:
    from the ack that completes a put to its reply written, about 6 us of the ~25 sooner."""

    __slots__ = ("_fields", "_handlers", "_opaque", "_request_code", "_deliver", "_reply", "_success", "_may_ack",
                 "_encoded", "_count_success")

    def __init__(self, fields: Callable[[ReplicaWaitError | None], dict],
                 success: Callable[[], tuple[dict, Callable[[], None]] | None] | None = None,
                 may_ack: Callable[[], bool] | None = None) -> None:
        self._fields = fields
        self._handlers: RequestHandlers | None = None
        self._opaque = 0
        self._request_code = RequestCode.SEND
        self._deliver: Callable[[dict | bytes], None] | None = None
        self._reply: dict | bytes | None = None
        self._success = success
        self._may_ack = may_ack
        self._encoded: bytes | None = None     # the success reply's frame, built ahead
        self._count_success: Callable[[], None] | None = None

    def bind(self, handlers: RequestHandlers, opaque: int, request_code: RequestCode) -> None:
        self._handlers, self._opaque, self._request_code = handlers, opaque, request_code

    def finish(self, error: ReplicaWaitError | None) -> None:
        """The wait's outcome (the HA service's callback)."""
        handlers = self._handlers
        reply: dict | bytes
        count_success = None
        if error is None and self._encoded is not None and self._may_ack():
            count_success = self._count_success
            reply = self._encoded
        else:
            try:
                fields = self._fields(error)
            except Exception as raised:
                reply = handlers._failed(self._opaque, self._request_code, raised)
            else:
                handlers._count(self._request_code.name, "SUCCESS")
                reply = protocol.reply(self._opaque, **fields)
        self._fields = self._success = self._encoded = self._count_success = None
        deliver = self._deliver
        try:
            if deliver is None:
                self._reply = reply
            else:
                self._deliver = None
                deliver(reply)
        finally:
            if count_success is not None:
                # counted once the reply is handed over (its latency then includes that):
                # the counts are not on the send's path, the reply's write is
                count_success()
                handlers._count(self._request_code.name, "SUCCESS")

    def start(self, deliver: Callable[[dict | bytes], None], *, encoded: bool = False) -> None:
        """``deliver(reply)`` once the outcome is known (now, if it is); with ``encoded`` the
        reply may come as its encoded frame, and the success reply is built ahead."""
        reply = self._reply
        if reply is not None:
            self._reply = None
            deliver(reply)
            return
        self._deliver = deliver
        if encoded and self._success is not None and self._may_ack is not None:
            self._build_ahead()

    def _build_ahead(self) -> None:
        built = self._success()
        if built is None:
            return
        fields, count = built
        try:
            self._encoded = protocol.encode_frame(protocol.reply(self._opaque, **fields))
        except FrameError:
            return   # answered the usual way, which says why
        self._count_success = count

    async def __call__(self) -> dict:
        done = trio.Event()
        box: list[dict] = []
        self.start(lambda reply: (box.append(reply), done.set()))
        await done.wait()
        return box[0]
