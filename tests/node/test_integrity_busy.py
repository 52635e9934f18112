"""The node's scrub yields to writes: a step after the log grew checks at the busy rate, a
step after none at the full rate, and steps come further apart while the log grows
(node/server/integrity.py)."""

from __future__ import annotations

import pytest
import trio

from node.server.integrity import BUSY_STEP_INTERVAL_S, STEP_INTERVAL_S, IntegrityGuard, serve_integrity
from node.server.repair import Repairer
from store import Message, MessageStore, StoreConfig
from store.errors import StoreConfigError


@pytest.mark.trio
async def test_a_step_is_busy_when_the_log_grew_since_the_last(tmp_path):
    config = StoreConfig(store_path=str(tmp_path / "s"), flush="sync", commitlog_segment_bytes=1 << 20,
                         store_host="127.0.0.1:1", scrub_bytes_per_s=1 << 20, scrub_busy_bytes_per_s=1000)
    store = MessageStore(config)
    store.start()
    try:
        guard = IntegrityGuard(store, Repairer(store, lambda: [], secret=None))
        assert (guard.scrub.bytes_per_s, guard.scrub.busy_bytes_per_s) == (1 << 20, 1000)
        assert await guard.step() is False       # starts the scrub's clock; nothing written: idle
        assert not guard.scrub.busy
        store.put_batch([Message(topic="S", body=b"." * 100) for _ in range(50)])
        assert await guard.step() is True
        assert guard.scrub.busy
        assert await guard.step() is False       # nothing written since the last step
        assert not guard.scrub.busy
        assert guard.status()["scrub"]["busy_bytes_per_s"] == 1000
    finally:
        store.shutdown()


def test_the_busy_rate_never_exceeds_the_scrub_rate(tmp_path):
    config = StoreConfig(store_path=str(tmp_path / "s"), store_host="127.0.0.1:1", scrub_bytes_per_s=1)
    store = MessageStore(config)
    store.start()
    try:
        guard = IntegrityGuard(store, Repairer(store, lambda: [], secret=None))
        assert guard.scrub.busy_bytes_per_s == 1
    finally:
        store.shutdown()


def test_a_busy_rate_that_is_not_positive_is_refused(tmp_path):
    with pytest.raises(StoreConfigError, match="scrub_busy_bytes_per_s must be positive"):
        StoreConfig(store_path=str(tmp_path / "s"), store_host="127.0.0.1:1", scrub_busy_bytes_per_s=0)


class _StepTimes:
    """What serve_integrity asks of a guard: ``step`` says whether the log had grown; here the
    answers are scripted and the loop's clock is recorded at each step."""

    def __init__(self, answers: list[bool]) -> None:
        self.answers = answers
        self.times: list[float] = []

    async def step(self) -> bool:
        self.times.append(trio.current_time())
        return self.answers[len(self.times) - 1]


@pytest.mark.trio
async def test_steps_come_further_apart_while_the_log_grows(autojump_clock):
    guard = _StepTimes([False, True, True, False, False, False])
    async with trio.open_nursery() as nursery:
        started = trio.current_time()
        await nursery.start(serve_integrity, guard)
        while len(guard.times) < 6:
            await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    gaps = [round(after - before, 6) for before, after in zip([started] + guard.times, guard.times)]
    # the first from the start, each other one after a step that was idle, busy, busy, idle, idle
    assert gaps == [STEP_INTERVAL_S, STEP_INTERVAL_S, BUSY_STEP_INTERVAL_S, BUSY_STEP_INTERVAL_S,
                    STEP_INTERVAL_S, STEP_INTERVAL_S]
