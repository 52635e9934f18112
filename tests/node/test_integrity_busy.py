"""The node's scrub yields to writes: a step after the log grew checks at the busy rate, a
step after none at the full rate (node/server/integrity.py)."""

from __future__ import annotations

import pytest

from node.server.integrity import IntegrityGuard
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
        await guard.step()                       # starts the scrub's clock; nothing written: idle
        assert not guard.scrub.busy
        store.put_batch([Message(topic="S", body=b"." * 100) for _ in range(50)])
        await guard.step()
        assert guard.scrub.busy
        await guard.step()                       # nothing written since the last step
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
