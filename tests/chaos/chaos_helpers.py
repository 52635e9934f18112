"""Settings shared by the drill and chaos tests. A module of its own (not conftest.py), so
that importing it by name does not collide with another folder's conftest when several
test folders run together."""

from __future__ import annotations

SMALL_STORE = {"commitlog_segment_bytes": 1 << 20, "consume_queue_entries_per_file": 4096,
               "index_hash_slots": 1024, "index_max_entries": 8192}
# Short sessions keep each round to a few seconds: a dead master is noticed after ~1.5 s.
DRILL_TOPOLOGY = {"cluster": "drill", "store": SMALL_STORE, "startup_timeout_s": 30,
                  "controller": {"session_timeout_ms": 1500, "zookeeper": {"tick_ms": 250}}}
