"""Helpers of the integrity tests: nodes in this trio run on loopback (a master and its
slaves, static roles, small stores), a bit flipped in a flushed record through the
segment file (as a disk would: the node's mapping sees the same page), and a bounded wait.
A module of its own, not conftest: other test folders have a conftest too."""

from __future__ import annotations

import os

import trio
import trio.testing

from node.client import OutgoingMessage, open_producer
from node.server.config import NodeConfig
from node.server.node import serve_node

SECRET = "s3cret"
SMALL_STORE = {"commitlog_segment_bytes": 256 * 1024, "index_hash_slots": 1024, "index_max_entries": 16384,
               "consume_queue_entries_per_file": 4096, "preallocate_next_segment": False,
               "scrub_bytes_per_s": 4 * 1024 * 1024,
               "scrub_busy_bytes_per_s": 4 * 1024 * 1024,   # a flip is found as fast while the log grows
               "scrub_pass_interval_ms": 0}   # flips land behind the walk: go around at once

BODY_AT = 100    # a byte inside the body of a record of the messages ``produce`` sends


async def produce(node, count: int, topic: str = "t") -> list:
    """Send ``count`` messages to ``node`` and check each was acked; their SendResults."""
    async with open_producer(node.client_address, secret=SECRET, batch_count_max=50) as producer:
        sent = await producer.send_batch(topic, [OutgoingMessage(b"m%04d-" % i + b"x" * 150, keys=[f"k{i}"])
                                                 for i in range(count)])
    assert all(r.ok for r in sent), {r.status for r in sent}
    return sent


async def flushed(node, sent) -> None:
    """Until ``node`` has flushed every record of ``sent``."""
    end = max(r.physical_offset for r in sent) + 200
    await wait_until(lambda: node.store.commit_log.flushed_offset >= end, what="the log flushed")


def node_config(tmp_path, node_id: str, **changes) -> NodeConfig:
    settings = dict(node_id=node_id, group="g", store_path=str(tmp_path / node_id), client_address="127.0.0.1:0",
                    metrics_address="127.0.0.1:0", ha_address="127.0.0.1:0", secret=SECRET,
                    replication="sync", min_in_sync_replicas=1, all_ack_in_sync_state_set=True,
                    slave_timeout_ms=3_000, ha_heartbeat_interval_ms=100, ha_connection_timeout_ms=2_000,
                    store=dict(SMALL_STORE))
    settings.update(changes)
    return NodeConfig(**settings)


async def start_group(nursery, tmp_path, slaves: int = 1) -> list:
    """A static master "a" and ``slaves`` slaves ("b", "c", ...), every slave in the sync-state set."""
    master = await nursery.start(serve_node, node_config(tmp_path, "a"))
    nodes = [master]
    for index in range(slaves):
        name = "bcdefg"[index]
        nodes.append(await nursery.start(serve_node, node_config(
            tmp_path, name, role="slave", master_ha_address=master.ha_address,
            master_client_address=master.client_address)))
        await wait_until(lambda: name in master.ha.status().get("sync_state_set", ()), what=f"{name} in the SSS")
    return nodes


def flip_bit(store, physical_offset: int, byte_in_record: int, bit: int = 0) -> None:
    """Flip one bit of the record at ``physical_offset`` in its segment file."""
    segment = store.commit_log.segments.find(physical_offset)
    at = physical_offset - segment.start_offset + byte_in_record
    fd = os.open(segment.path, os.O_RDWR)
    try:
        os.pwrite(fd, bytes([os.pread(fd, 1, at)[0] ^ (1 << bit)]), at)
    finally:
        os.close(fd)


async def wait_until(predicate, timeout_s: float = 20.0, what: str = "condition") -> None:
    """Until ``predicate()`` holds, looked at every 10 ms, bounded by ``timeout_s``."""
    with trio.move_on_after(timeout_s):
        while not predicate():
            await trio.sleep(0.01)
        return
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
