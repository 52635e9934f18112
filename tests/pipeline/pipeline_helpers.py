"""Stores for the pipeline tests, written by the real storage engine."""

from __future__ import annotations

import os

import yaml

from node.client import SyncAdmin
from store import Message, MessageStore, StoreConfig

SEGMENT_BYTES = 256 * 1024


def write_store(root: str, messages: list[Message], *, segment_bytes: int = SEGMENT_BYTES, clock=None,
                node: str | None = None, group: str | None = None) -> str:
    """A store at ``root``/store holding ``messages`` (put in batches of 200); with ``node``, a
    node.yaml beside it as ``hastore cluster up`` writes one. Returns the store path."""
    store_path = os.path.join(root, "store")
    config = StoreConfig(store_path=store_path, commitlog_segment_bytes=segment_bytes,
                         preallocate_next_segment=False, consume_queue_entries_per_file=4096,
                         index_hash_slots=1024, index_max_entries=65536)
    store = MessageStore(config, clock=clock) if clock is not None else MessageStore(config)
    store.start()
    try:
        for first in range(0, len(messages), 200):
            results = store.put_batch(messages[first:first + 200])
            assert all(result.status.ok for result in results), results[0]
    finally:
        store.shutdown()
    if node is not None:
        with open(os.path.join(root, "node.yaml"), "w", encoding="utf-8") as handle:
            yaml.safe_dump({"node_id": node, "group": group or "", "store_path": store_path}, handle)
    return store_path


def sample_messages(count: int, topics: tuple[str, ...] = ("orders", "payments", "audit")) -> list[Message]:
    """Varied messages: topics, queues, keys (none, one, two), tags, extra properties, bodies."""
    messages = []
    for index in range(count):
        keys = [] if index % 5 == 0 else [f"k{index}"] if index % 5 < 3 else [f"k{index}", f"alt-{index % 7}"]
        messages.append(Message(topic=topics[index % len(topics)], body=b"body-%d-" % index + b"x" * (index % 300),
                                queue_id=index % 4, keys=keys, tags="red" if index % 3 == 0 else None,
                                properties={"trace": f"t{index}", "UNIQ_KEY": f"u{index}"} if index % 4 == 0 else {}))
    return messages


class SteppedClock:
    """Store time in ms that moves ``step_ms`` on every read, from ``start_ms``."""

    def __init__(self, start_ms: int, step_ms: int) -> None:
        self.now_ms = start_ms
        self.step_ms = step_ms

    def __call__(self) -> int:
        self.now_ms += self.step_ms
        return self.now_ms


def pull_every_message(master_address: str, topic: str, queues: int) -> list:
    """Every message of ``topic``'s queues 0..queues-1 on the node at ``master_address``."""
    messages = []
    with SyncAdmin(master_address, timeout_ms=10_000) as admin:
        for queue_id in range(queues):
            offset = 0
            while True:
                reply = admin.pull(topic, queue_id, offset, 256, 0)
                if not reply["messages"]:
                    break
                messages.extend(reply["messages"])
                offset = reply["next_offset"]
    return messages
