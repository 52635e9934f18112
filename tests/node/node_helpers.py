"""Helpers shared by the node tests: small store settings and a node configuration on
loopback ports. A module of its own (not conftest.py), so that importing it by name does
not collide with another folder's conftest when several test folders run together."""

from __future__ import annotations

from node.server.config import NodeConfig

SMALL_STORE = {"commitlog_segment_bytes": 1 << 24, "index_hash_slots": 1024, "index_max_entries": 8192,
               "consume_queue_entries_per_file": 4096, "preallocate_next_segment": False}


def small_config(path, **changes) -> NodeConfig:
    """A node configuration with a small store under ``path``, every address on port 0."""
    base = dict(store_path=str(path), client_address="127.0.0.1:0", metrics_address="127.0.0.1:0",
                ha_address="127.0.0.1:0",
                store=dict(SMALL_STORE))
    base.update(changes)
    return NodeConfig(**base)
