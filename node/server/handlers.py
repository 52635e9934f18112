"""Request handlers: one method per RequestCode, from a decoded request map to a reply map.

``RequestHandlers.dispatch`` answers at once when it can (a reply map) and otherwise
returns a ``Deferred``: an async function the server runs in the connection's nursery
(a long-polling pull, a send waiting for the disk). A send's append always happens inside
``dispatch``, in the order the frames arrived, so one connection's pipelined sends keep
their order in each queue.

A handler's refusal is a RequestError (typed reply); a bug is logged and answered with
SYSTEM_ERROR, so no request can bring the node down.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from itertools import cycle, islice
from typing import TYPE_CHECKING, Awaitable, Callable

import trio

from replication.errors import ReplicaWaitError
from store import GetStatus, Message, MessageStore, PlainBatch, PutColumns, PutResult, PutStatus
from store.errors import MessageNotFound, StoreClosedError, StoreCorruptError, StoreError

from ..wire import protocol
from .config import NodeConfig
from ..errors import NotMasterError, RequestError
from .integrity import IntegrityGuard, corrupt_to_wire
from .log_ranges import LogRangeHandlers
from .message_forms import (BODY_AND_PROPERTIES, check_message_columns, message_columns, message_to_wire,
                            plain_properties)
from .metrics import NodeMetrics
from .pull_waiters import PullWaiters
from .put_waits import REPLICA_FAILURE_REASONS, ROLE_FAILURE, PendingReply, when_replicated
from .send_replies import end_of, send_reply, success_reply
from ..wire.protocol import Fields, RequestCode
from .role import RoleMachine
from .sys_config import SysConfig

if TYPE_CHECKING:
    from .ha_roles import HaRuntime

log = logging.getLogger(__name__)

Deferred = Callable[[], Awaitable[dict]]
QUEUE_COUNT_MAX = 1024
GROUP_BYTES_MAX = 255
KEY_BYTES_MAX = 255
LONG_POLLS_MAX = 10_000


@dataclass(frozen=True, slots=True)
class HandlerStatistics:
    requests: int
    errors: int
    long_polls_waiting: int


class RequestHandlers:
    """Answers requests against one store, under the node's role."""

    def __init__(self, config: NodeConfig, store: MessageStore, role: RoleMachine, sys_config: SysConfig,
                 metrics: NodeMetrics, status_extra: Callable[[], dict] | None = None, *,
                 waiters: PullWaiters | None = None, replicas: HaRuntime | None = None,
                 lag_history: Callable[[Fields], dict] | None = None, log_ranges: LogRangeHandlers | None = None,
                 integrity: IntegrityGuard | None = None) -> None:
        """``status_extra``: more sections of a status reply (the node's transport, replication,
        controller). ``waiters``: the long polls' table, shared with whoever wakes them (a new
        one by default). ``replicas``: the node's replication runtime (node/server/ha_roles.py);
        None: no replication (bare handlers). ``lag_history``: answers LAG_HISTORY (the node's
        lag sampler, node/server/lag_sampler.py); None: that code is not supported. ``log_ranges``:
        answers READ_LOG_RANGE and LOG_RANGE_CRCS (node/server/log_ranges.py). ``integrity``: a
        pull that meets corrupt records waits for their repair from a replica, then reads again
        (node/server/integrity.py); records still corrupt are named in the reply's ``corrupt``."""
        self.config = config
        self.store = store
        self.role = role
        self.sys_config = sys_config
        self.metrics = metrics
        self.waiters = waiters if waiters is not None else PullWaiters()
        self.status_extra = status_extra or (lambda: {})
        self._round_robin: dict[str, int] = {}
        self._requests = 0
        self._errors = 0
        self._tally = metrics.tally
        self._sync_flush = config.flush == "sync"
        self.replicas = replicas
        self.integrity = integrity
        # by the code's int value (not RequestCode(code)): an enum lookup by value costs
        # more than a dict lookup on every request
        self._table = {int(code): (code, handler) for code, handler in {
            RequestCode.SEND: self.send,
            RequestCode.PULL: self.pull,
            RequestCode.QUERY_BY_KEY: self.query_by_key,
            RequestCode.QUERY_BY_TIME: self.query_by_time,
            RequestCode.QUERY_BY_ID: self.query_by_id,
            RequestCode.QUEUE_OFFSETS: self.queue_offsets,
            RequestCode.COMMIT_OFFSETS: self.commit_offsets,
            RequestCode.QUERY_OFFSETS: self.query_offsets,
            RequestCode.TOPIC_CREATE: self.topic_create,
            RequestCode.TOPIC_LIST: self.topic_list,
            RequestCode.STATUS: self.status,
        }.items()}
        if lag_history is not None:
            self._table[int(RequestCode.LAG_HISTORY)] = (RequestCode.LAG_HISTORY, lag_history)
        if log_ranges is not None:
            self._table[int(RequestCode.READ_LOG_RANGE)] = (RequestCode.READ_LOG_RANGE, log_ranges.read_log_range)
            self._table[int(RequestCode.LOG_RANGE_CRCS)] = (RequestCode.LOG_RANGE_CRCS, log_ranges.log_range_crcs)

    def statistics(self) -> HandlerStatistics:
        return HandlerStatistics(self._requests, self._errors, self.waiters.waiting)

    # --- dispatch ------------------------------------------------------------------------
    def dispatch(self, payload: object) -> dict | Deferred:
        """The reply to one decoded frame, or a Deferred producing it."""
        self._requests += 1
        opaque = protocol.opaque_of(payload)
        if not isinstance(payload, dict):
            return self._error(None, "BAD_REQUEST", f"a request must be a map, not {type(payload).__name__}")
        if opaque is None:
            return self._error(None, "BAD_REQUEST", "field opaque must be an integer in [0, 2^63)")
        code = payload.get("code")
        entry = self._table.get(code) if type(code) is int else None  # type(): a bool is no code
        if entry is None:
            return self._error(opaque, "REQUEST_CODE_NOT_SUPPORTED", f"unknown request code {code!r}")
        request_code, handler = entry
        try:
            outcome = handler(Fields(payload))
        except RequestError as error:
            return self._error(opaque, error.code, error.message, request_code, error)
        except StoreClosedError as error:
            return self._error(opaque, "SERVICE_NOT_AVAILABLE", str(error), request_code)
        except Exception as error:  # a bug: answer it, log it, keep serving everyone else
            log.exception("request %s failed", request_code.name)
            return self._error(opaque, "SYSTEM_ERROR", f"{type(error).__name__}: {error}", request_code)
        if type(outcome) is PendingReply:
            outcome.bind(self, opaque, request_code)
            return outcome
        if callable(outcome):
            return self._guard(opaque, request_code, outcome)
        self._count(request_code.name, "SUCCESS")
        return protocol.reply(opaque, **outcome)

    def _guard(self, opaque: int, request_code: RequestCode, deferred: Deferred) -> Deferred:
        async def run() -> dict:
            try:
                fields = await deferred()
            except Exception as error:
                return self._failed(opaque, request_code, error)
            self._count(request_code.name, "SUCCESS")
            return protocol.reply(opaque, **fields)
        return run

    def _failed(self, opaque: int, request_code: RequestCode, error: Exception) -> dict:
        """The reply to a request whose deferred part raised ``error``."""
        if isinstance(error, RequestError):
            return self._error(opaque, error.code, error.message, request_code, error)
        if isinstance(error, StoreError):
            return self._error(opaque, "SERVICE_NOT_AVAILABLE", str(error), request_code)
        log.error("request %s failed", request_code.name, exc_info=error)
        return self._error(opaque, "SYSTEM_ERROR", f"{type(error).__name__}: {error}", request_code)

    def _count(self, request: str, response: str) -> None:
        self._tally.count_request(request, response)

    def _error(self, opaque, code: str, message: str, request_code: RequestCode | None = None,
               error: RequestError | None = None) -> dict:
        self._errors += 1
        self._count(request_code.name if request_code else "UNKNOWN", code)
        extra = {}
        if isinstance(error, NotMasterError):
            extra["master_address"] = error.master_address
        return protocol.error_reply(opaque, code, message, **extra)

    # --- send ----------------------------------------------------------------------------
    def send(self, f: Fields) -> dict | Deferred:
        """Messages either as ``messages`` (a map each) or as ``message_columns`` (a list per
        field: ``body``, and optionally ``properties`` and ``uniq_key``; what a producer's
        batch of plain messages carries, without a map per message on either end)."""
        started = time.perf_counter()
        self.role.check_writable()
        topic = f.topic()
        payload = f.payload
        if payload.get("message_columns") is not None:
            if payload.get("messages") is not None:
                raise protocol.bad_request("a send carries messages or message_columns, not both")
            bodies, properties, uniq_keys = message_columns(payload["message_columns"])
            columns = f.bool("result_columns", False)
            queue_count = self._writable_queue_count(topic)
            check_message_columns(bodies, properties)
            queue_ids = self._next_queue_ids(topic, len(bodies), queue_count)

            def append():
                return self.store.append(PlainBatch(topic, queue_ids, bodies, properties, uniq_keys),
                                         as_columns=columns)
        else:
            raw_messages = f.list("messages", protocol.BATCH_COUNT_MAX)
            if not raw_messages:
                raise protocol.bad_request("field messages must hold at least one message")
            columns = f.bool("result_columns", False)
            queue_count = self._writable_queue_count(topic)
            messages = self._plain_messages(topic, raw_messages, queue_count)
            if messages is None:
                messages = [self._message(topic, raw, index, queue_count) for index, raw in enumerate(raw_messages)]
            queue_ids = [message.queue_id for message in messages]

            def append():
                return self.store.append(messages)
        replicas = self.replicas
        if replicas is not None:
            try:
                replicas.check_for_put()  # sync replication: refused before a byte is written
            except ReplicaWaitError as error:
                return self._send_reply(queue_ids, [PutResult(PutStatus(error.status), reason=str(error))
                                                    for _ in queue_ids], started, None, columns)
        results = append()
        if replicas is None:
            if self._sync_flush:
                return self._wait_then_reply(queue_ids, results, started, None, 0, columns)
            return self._send_reply(queue_ids, results, started, None, columns)
        replicas.notify_appended()
        if self._sync_flush or replicas.sync_replication:
            return self._wait_then_reply(queue_ids, results, started, replicas, self.role.state.epoch, columns)
        return self._send_reply(queue_ids, results, started, None, columns)

    def _wait_then_reply(self, queue_ids, results, started: float, replicas, epoch: int,
                         columns: bool) -> dict | Deferred | PendingReply:
        """The reply once the disk (sync flush) and the replicas (sync replication) hold the
        batch, at once and together; the first failure that applies becomes every written
        message's status. A node that lost its role or was fenced meanwhile acks nothing."""
        if type(results) is PutColumns:   # every message written
            end = results.end_offset
            transposed = None
        else:
            end, transposed = end_of(results)

        def reply(failure: tuple[PutStatus, str] | None) -> dict:
            return self._send_reply(queue_ids, results, started, failure, columns, transposed)

        def success() -> tuple[dict, Callable[[], None]] | None:
            return success_reply(queue_ids, results, columns, self._tally, started, transposed)
        if end and replicas is not None and not self._sync_flush and replicas.sync_replication:
            service = replicas.ha_service
            if service is not None and service.answers_waiting_puts:
                return when_replicated(end, service, replicas, epoch, reply, success)
        return self._when_durable(end, replicas, epoch, reply)

    def _when_durable(self, end: int, replicas, epoch: int,
                      reply: Callable[[tuple[PutStatus, str] | None], dict]) -> Deferred:
        """``reply(failure)`` once the log up to ``end`` is as durable as an ack promises: on
        disk (sync flush) and on enough replicas (sync replication), waited for at once, and
        the node still master in ``epoch``; ``failure`` is the first of those that failed, or
        None. Puts and config changes (%SYS%CONFIG records) are acknowledged through it."""

        async def wait() -> dict:
            failures: dict[str, tuple[PutStatus, str]] = {}
            if end:
                async def disk() -> None:
                    if self._sync_flush and not await trio.to_thread.run_sync(self.store.wait_flushed, end):
                        failures["disk"] = (PutStatus.FLUSH_DISK_TIMEOUT, "not on disk within sync_flush_timeout_ms")

                async def replication() -> None:
                    status = await replicas.wait_for_replicas(end) if replicas is not None else None
                    if status is not None:
                        failures["replicas"] = (PutStatus(status), REPLICA_FAILURE_REASONS[status])

                if not self._sync_flush:
                    await replication()  # one wait: no nursery and no task of its own per put
                else:
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(disk)
                        nursery.start_soon(replication)
            if replicas is not None and end and not replicas.may_ack(epoch):
                failures["role"] = ROLE_FAILURE
            failure = failures.get("role") or failures.get("replicas") or failures.get("disk")
            return reply(failure)
        return wait

    def _send_reply(self, queue_ids: list[int], results, started: float, failure: tuple[PutStatus, str] | None,
                    columns: bool = False, transposed: tuple | None = None) -> dict:
        """The SEND reply (send_replies.py), the puts counted."""
        return send_reply(queue_ids, results, failure, columns, self._tally, started, transposed)

    def _writable_queue_count(self, topic: str) -> int:
        config = self.sys_config.topic(topic)
        if config is None:
            if not self.config.auto_create_topics:
                raise RequestError("TOPIC_NOT_EXIST", f"topic {topic!r} does not exist; create it first")
            self.sys_config.record(_topic_change(topic, self.config.default_queue_count))
            config = self.sys_config.topic(topic)
        return config["writeQueueNums"]

    def _plain_messages(self, topic: str, raw_messages: list, queue_count: int) -> list[Message] | None:
        """The batch's Messages when every one is what a producer sends most (a body and
        plain properties, nothing else to check), queues assigned round robin; None when
        any is not, and nothing assigned (``_message`` then checks each and names the
        faulty one)."""
        body_bytes_max = protocol.BODY_BYTES_MAX
        allowed = BODY_AND_PROPERTIES
        for raw in raw_messages:
            if type(raw) is not dict:
                return None
            body = raw.get("body")
            if type(body) is not bytes or len(body) > body_bytes_max or not raw.keys() <= allowed \
                    or not plain_properties(raw.get("properties")):
                return None
        queue_ids = self._next_queue_ids(topic, len(raw_messages), queue_count)
        # positional: topic, body, queue_id, keys, tags, properties (keyword arguments cost more)
        return [Message(topic, raw["body"], queue_id, (), None, raw.get("properties") or {})
                for queue_id, raw in zip(queue_ids, raw_messages)]

    def _next_queue_ids(self, topic: str, count: int, queue_count: int) -> list[int]:
        """The write queues of the topic's next ``count`` messages, round robin."""
        first = self._round_robin.get(topic, 0)
        self._round_robin[topic] = (first + count - 1) % queue_count + 1
        start = first % queue_count
        return list(islice(cycle(range(queue_count)), start, start + count))  # no Python frame per message

    def _message(self, topic: str, raw: object, index: int, queue_count: int) -> Message:
        if not isinstance(raw, dict):
            raise protocol.bad_request(f"messages[{index}] must be a map")
        body = raw.get("body")
        m = Fields(raw, prefix=f"messages[{index}].")
        if raw.get("queue_id") is None:
            queue_id = self._round_robin.get(topic, 0) % queue_count
            self._round_robin[topic] = queue_id + 1
        else:
            queue_id = m.int("queue_id", 0, 2**31 - 1)
            if queue_id >= queue_count:
                raise RequestError("QUEUE_ILLEGAL", f"messages[{index}].queue_id {queue_id} is not below the "
                                                    f"{queue_count} write queues of {topic!r}")
        return Message(topic, m.bytes("body", protocol.BODY_BYTES_MAX), queue_id=queue_id,
                       keys=m.str_list("keys", 64, KEY_BYTES_MAX), tags=m.optional_str("tags", 255),
                       properties=m.str_map("properties"), flag=m.int("flag", -2**31, 2**31 - 1, 0),
                       born_timestamp=m.int("born_timestamp", 0, 2**63 - 1, 0))

    # --- pull ----------------------------------------------------------------------------
    def pull(self, f: Fields) -> dict | Deferred:
        topic = f.topic(allow_system=True)
        queue_id = f.int("queue_id", 0, 2**31 - 1)
        offset = f.int("offset", 0, 2**63 - 1)
        max_count = f.int("max_count", 1, protocol.PULL_COUNT_MAX, 32)
        max_bytes = f.int("max_bytes", 1, protocol.PULL_BYTES_MAX, 4 * 1024 * 1024)
        timeout_ms = f.int("timeout_ms", 0, 2**31 - 1, 0)
        timeout_ms = min(timeout_ms, self.config.long_polling_timeout_ms_max)
        fields = self._pull_once(topic, queue_id, offset, max_count, max_bytes)
        if "corrupt" in fields and self.integrity is not None:
            return self._repair_then_pull(fields, topic, queue_id, offset, max_count, max_bytes)
        if fields["messages"] or "corrupt" in fields or timeout_ms == 0 or fields["status"] not in (
                GetStatus.NO_NEW_MESSAGE.value, GetStatus.NO_MATCHED_LOGIC_QUEUE.value) \
                or self.waiters.waiting >= LONG_POLLS_MAX:
            return fields

        async def long_poll() -> dict:
            self.waiters.waiting += 1
            self.metrics.long_polls.inc()
            try:
                with trio.move_on_after(timeout_ms / 1000):
                    while True:
                        # park first, then look: a message dispatched in between is either
                        # seen here or wakes the event (the dispatcher checks for waiters)
                        event = self.waiters.event_for(topic, queue_id)
                        result = self._pull_once(topic, queue_id, offset, max_count, max_bytes)
                        if "corrupt" in result and self.integrity is not None:
                            return await self._repair_then_pull(result, topic, queue_id, offset, max_count,
                                                                max_bytes)()
                        if result["messages"] or "corrupt" in result:
                            return result
                        await event.wait()
                return self._pull_once(topic, queue_id, offset, max_count, max_bytes)
            finally:
                self.waiters.waiting -= 1
                self.metrics.long_polls.dec()
        return long_poll

    def _pull_once(self, topic: str, queue_id: int, offset: int, max_count: int, max_bytes: int) -> dict:
        self._check_readable()  # a long poll looks again each time it wakes
        try:
            result = self.store.pull(topic, queue_id, offset, max_count, max_bytes)
        except StoreCorruptError as error:
            raise RequestError("SYSTEM_ERROR", f"corrupt message in {topic}/{queue_id} at {offset}: {error}")
        messages = [message_to_wire(message) for message in result.messages]
        self.metrics.pull_messages.inc(len(messages))
        self.metrics.pull_bytes.inc(sum(len(m.body) for m in result.messages))
        fields = {"status": result.status.value, "messages": messages, "next_offset": result.next_offset,
                  "min_offset": result.min_offset, "max_offset": result.max_offset}
        if result.corrupt:   # never skipped silently: each named by queue offset (the consumer raises it)
            fields["corrupt"] = [corrupt_to_wire(record) for record in result.corrupt]
        return fields

    def _repair_then_pull(self, fields: dict, topic: str, queue_id: int, offset: int, max_count: int,
                          max_bytes: int) -> Deferred:
        """A pull that met corrupt records: repair them from a replica first (bounded), then
        read again, so what was repaired is served and only what is still corrupt is named."""
        offsets = [record["physical_offset"] for record in fields["corrupt"]]

        async def repair_and_read() -> dict:
            await self.integrity.repair_before_serving(offsets)
            return self._pull_once(topic, queue_id, offset, max_count, max_bytes)
        return repair_and_read

    # --- queries -------------------------------------------------------------------------
    def _check_readable(self) -> None:
        """SERVICE_NOT_AVAILABLE while this node may not serve reads: a master under a
        controller without its permit (session lost, lease run out after a pause, fenced)
        must not serve what a new master may not hold (node/server/ha_roles.py)."""
        if self.replicas is not None:
            refusal = self.replicas.read_refusal()
            if refusal is not None:
                raise RequestError("SERVICE_NOT_AVAILABLE", refusal)

    def query_by_key(self, f: Fields) -> dict:
        self._check_readable()
        topic = f.topic(allow_system=True)
        key = f.str("key", KEY_BYTES_MAX)
        begin_ms = f.int("begin_ms", 0, 2**63 - 1, 0)
        end_ms = f.int("end_ms", 0, 2**63 - 1, 2**63 - 1)
        max_count = f.int("max_count", 1, protocol.QUERY_COUNT_MAX, 32)
        found = self.store.query_by_key(topic, key, begin_ms, end_ms, max_count)
        return {"messages": [message_to_wire(message) for message in found]}

    def query_by_time(self, f: Fields) -> dict:
        self._check_readable()
        topic = f.topic(allow_system=True)
        queue_id = f.int("queue_id", 0, 2**31 - 1)
        timestamp_ms = f.int("timestamp_ms", 0, 2**63 - 1)
        return {"offset": self.store.offset_by_time(topic, queue_id, timestamp_ms)}

    def query_by_id(self, f: Fields) -> dict:
        self._check_readable()
        message_id = f.str("message_id", 64)
        try:
            message = self.store.get_by_message_id(message_id)
        except MessageNotFound as error:
            raise RequestError("MESSAGE_NOT_FOUND", str(error)) from None
        return {"message": message_to_wire(message)}

    def queue_offsets(self, f: Fields) -> dict:
        topic = f.topic(allow_system=True)
        queue_id = f.int("queue_id", 0, 2**31 - 1)
        return {"min_offset": self.store.min_offset(topic, queue_id),
                "max_offset": self.store.max_offset(topic, queue_id)}

    # --- consumer offsets ----------------------------------------------------------------
    def commit_offsets(self, f: Fields) -> dict | Deferred:
        self.role.check_writable()
        group = f.str("group", GROUP_BYTES_MAX)
        topic = f.topic()
        raw = f._get("offsets", None)
        if not isinstance(raw, dict) or not 1 <= len(raw) <= QUEUE_COUNT_MAX:
            raise protocol.bad_request(f"field offsets must map queue ids to offsets (1 to {QUEUE_COUNT_MAX})")
        offsets = {}
        for queue_id, offset in raw.items():
            for value in (queue_id, offset):
                if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**63:
                    raise protocol.bad_request("field offsets must map queue ids to offsets, both integers >= 0")
            offsets[queue_id] = offset
        if not group:
            raise protocol.bad_request("field group must not be empty")
        return self._log_config_change({"type": "offsets", "group": group, "topic": topic, "offsets": offsets},
                                       {"committed": len(offsets)})

    def query_offsets(self, f: Fields) -> dict:
        """The node's view of a group's committed offsets. ``master_only``: only an active master
        answers (NOT_MASTER elsewhere): a slave's view, or that of a node elected but not yet in
        the role, covers only its last known confirm offset and may lag commits already acked."""
        self._check_readable()
        group = f.str("group", GROUP_BYTES_MAX)
        topic = f.topic()
        state = self.role.state
        if f.bool("master_only", False) and not self.role.is_master:
            at = f" at {state.master_client_address}" if state.master_client_address else ""
            raise NotMasterError(f"this node is a {state.role.value} in epoch {state.epoch}; the group's committed "
                                 f"offsets are answered by the master{at}", state.master_client_address)
        return {"offsets": self.sys_config.offsets(group, topic)}

    # --- topics --------------------------------------------------------------------------
    def topic_create(self, f: Fields) -> dict | Deferred:
        self.role.check_writable()
        topic = f.topic()
        queue_count = f.int("queue_count", 1, QUEUE_COUNT_MAX, self.config.default_queue_count)
        return self._log_config_change(_topic_change(topic, queue_count), {"topic": topic, "queue_count": queue_count})

    def _log_config_change(self, change: dict, fields: dict) -> dict | Deferred:
        """Log a config change as a %SYS%CONFIG record and answer ``fields`` when it is as
        durable as a put would be: the same checks before it is written (the controller's
        permit, enough in-sync replicas) and the same wait before the ack (``_when_durable``).
        A change that was logged but not acknowledged answers SERVICE_NOT_AVAILABLE: it may or
        may not survive a failover, like a put's FLUSH_SLAVE_TIMEOUT."""
        replicas = self.replicas
        if replicas is not None:
            try:
                replicas.check_for_put()
            except ReplicaWaitError as error:
                raise RequestError("SERVICE_NOT_AVAILABLE", f"config change refused, nothing logged: "
                                                            f"{error.status}: {error}") from None
        _, end = self.sys_config.record(change)
        if replicas is not None:
            replicas.notify_appended()
        if not self._sync_flush and (replicas is None or not replicas.sync_replication):
            return fields

        def reply(failure: tuple[PutStatus, str] | None) -> dict:
            if failure is not None:
                raise RequestError("SERVICE_NOT_AVAILABLE", f"the config change is logged but not acknowledged "
                                                            f"({failure[0].value}: {failure[1]})")
            return fields
        return self._when_durable(end, replicas, self.role.state.epoch, reply)

    def topic_list(self, f: Fields) -> dict:
        include_system = f.bool("include_system", False)
        queues = self.store.topics()
        topics = {}
        for name, config in self.sys_config.topics.items():
            if name.startswith(protocol.SYS_TOPIC_PREFIX) and not include_system:
                continue
            topics[name] = {"queue_count": config["writeQueueNums"], "perm": config["perm"],
                            "queues_with_messages": sorted(queues.get(name, []))}
        return {"topics": topics}

    # --- status --------------------------------------------------------------------------
    def status(self, f: Fields) -> dict:
        role = self.role.state
        store = asdict(self.store.statistics())
        store.pop("recovery", None)
        recovery = self.store.recovery
        return {"node_id": self.config.node_id, "cluster": self.config.cluster, "group": self.config.group,
                "role": role.role.value, "epoch": role.epoch, "master_address": role.master_client_address,
                "store": store, "recovery": repr(recovery) if recovery else None,
                "topics": len(self.sys_config.topics), "sys_config_replayed": self.sys_config.replayed_records,
                "long_polls_waiting": self.waiters.waiting, **self.status_extra()}


def _topic_change(topic: str, queue_count: int) -> dict:
    return {"type": "topic", "topic": topic, "queue_count": queue_count, "perm": 6}
