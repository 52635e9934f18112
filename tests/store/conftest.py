"""Fixtures of the storage engine tests: stores under tmp_path, always stopped afterwards."""

from __future__ import annotations

import pytest

from store import MessageStore
from store.commit_log import now_ms
from store_helpers import make_config


@pytest.fixture
def open_store(tmp_path):
    """``open_store(**settings)`` -> a started MessageStore under tmp_path (one directory per
    call unless ``store_path`` is given), stamping store times from ``clock`` (default: the
    wall clock). Stores still running at teardown are shut down."""
    opened: list[MessageStore] = []
    counter = iter(range(1000))

    def factory(*, clock=now_ms, **overrides) -> MessageStore:
        path = overrides.pop("store_path", None) or str(tmp_path / f"store{next(counter)}")
        store = MessageStore(make_config(path, **overrides), clock=clock)
        store.start()
        opened.append(store)
        return store

    yield factory
    for store in opened:
        if store.running:
            store.shutdown()
