"""The send workload: one producer sending small unique messages one at a time, recording
each as invoke then ok / fail / info in a History, and following the master when it moves.

Classification (never guessed):

- ok: the reply said PUT_OK for the message.
- fail: refused before anything was written (NOT_MASTER, no connection could be opened,
  or a per-message status that writes nothing: MESSAGE_ILLEGAL, PROPERTIES_SIZE_EXCEEDED).
- info: the request left and no answer came (UnknownOutcomeError), or the master wrote the
  message but could not get it acknowledged (FLUSH_SLAVE_TIMEOUT, IN_SYNC_REPLICAS_NOT_ENOUGH,
  SERVICE_NOT_AVAILABLE, ...): it may or may not survive a failover.

After a fail or an info the producer finds the master again: from NOT_MASTER's
``master_address`` when the node knows it, else with ``locate()`` (ZooKeeper).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Awaitable, Callable

import trio

from node.client import OutgoingMessage, open_producer
from node.errors import ConnectionLostError, NotMasterError, RequestError, UnknownOutcomeError

from .history import History

# Per-message statuses that write nothing; every other non-PUT_OK status was written on the master.
NOT_WRITTEN_STATUSES = ("MESSAGE_ILLEGAL", "PROPERTIES_SIZE_EXCEEDED")


@dataclass(frozen=True, slots=True)
class WorkloadSettings:
    """Bounds and pacing of a send workload."""

    send_interval_ms: float = 5.0      # pause after each outcome
    retry_interval_ms: float = 50.0    # pause before finding the master again
    count_max: int = 20_000            # invocations at most
    duration_max_s: float = 120.0      # wall time at most
    request_timeout_ms: int = 5_000    # a send without a reply by then is `info`
    body_padding_bytes: int = 64


async def send_workload(topic: str, key_prefix: str, history: History, stop: trio.Event,
                        locate: Callable[[], Awaitable[str | None]], settings: WorkloadSettings = WorkloadSettings(),
                        *, secret: str | None = None) -> None:
    """Send ``{key_prefix}-{n}`` messages to the master until ``stop`` is set (or a bound is hit)."""
    deadline = trio.current_time() + settings.duration_max_s
    sequence = 0
    address: str | None = None
    while sequence < settings.count_max and not stop.is_set() and trio.current_time() < deadline:
        if address is None:
            address = await locate()
            if address is None:
                await trio.sleep(settings.retry_interval_ms / 1000)
                continue
        async with open_producer(address, secret=secret, batch_count_max=1, linger_ms=0, retries_max=0,
                                 in_flight_max=1, request_timeout_ms=settings.request_timeout_ms) as producer:
            while sequence < settings.count_max and not stop.is_set() and trio.current_time() < deadline:
                key = f"{key_prefix}-{sequence}"
                sequence += 1
                moved, next_address = await _send_one(producer, topic, key, address, history, settings)
                if moved:
                    address = next_address
                    break
                await trio.sleep(settings.send_interval_ms / 1000)
        if address is None:
            await trio.sleep(settings.retry_interval_ms / 1000)


async def _send_one(producer, topic: str, key: str, address: str, history: History,
                    settings: WorkloadSettings) -> tuple[bool, str | None]:
    """Send one message and record it; (whether to find the master again, where it is if known)."""
    body = (key + " " + "x" * settings.body_padding_bytes).encode()
    history.record("invoke", key, address)
    try:
        [result] = await producer.send_batch(topic, [OutgoingMessage(body, keys=(key,))])
    except NotMasterError as error:
        history.record("fail", key, address, f"NOT_MASTER (master: {error.master_address or 'unknown'})")
        return True, error.master_address if error.master_address != address else None
    except UnknownOutcomeError as error:
        history.record("info", key, address, str(error))
        return True, None
    except ConnectionLostError as error:     # raised only when no connection could be opened
        history.record("fail", key, address, str(error))
        return True, None
    except RequestError as error:
        history.record("fail", key, address, str(error))
        return True, None
    if result.ok:
        history.record("ok", key, address)
        return False, None
    if result.status in NOT_WRITTEN_STATUSES:
        history.record("fail", key, address, result.status)
        return False, None
    history.record("info", key, address, f"{result.status}: {result.reason}")
    return True, None
