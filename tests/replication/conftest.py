"""Fixtures of the replication tests (helpers live in replication_helpers.py)."""

from __future__ import annotations

import pytest

from store import MessageStore
from replication_helpers import store_config


@pytest.fixture
def open_store(tmp_path):
    """``open_store(name)`` -> a started MessageStore in tmp_path/name; stopped at teardown."""
    opened: list[MessageStore] = []

    def factory(name: str, **overrides) -> MessageStore:
        store = MessageStore(store_config(tmp_path / name, **overrides))
        store.start()
        opened.append(store)
        return store

    yield factory
    for store in opened:
        if store.running:
            store.shutdown()
