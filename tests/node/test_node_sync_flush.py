"""``flush: sync`` against a node in its own process: a send is answered only once its
messages are on disk (the node's flushed offset covers them), and FLUSH_DISK_TIMEOUT
when the disk does not confirm them within ``sync_flush_timeout_ms``."""

import time

import pytest

from node.client import OutgoingMessage
from node.client import SyncAdmin, SyncProducer

pytestmark = pytest.mark.integration   # node processes


def _send_then_flushed(address: str, messages: list[OutgoingMessage]) -> tuple[list, int]:
    with SyncProducer(address) as producer, SyncAdmin(address) as admin:
        results = producer.send_batch("durable", messages)
        return results, admin.status()["store"]["flushed_offset"]


def test_sync_flush_answers_only_once_on_disk(node_process):
    batch = [OutgoingMessage(b"x" * 4096, keys=[f"k{i}"]) for i in range(64)]
    # the control: async flush with a long interval answers before the disk has the messages
    lazy = node_process("lazy", flush="async", store={"flush_interval_ms": 600_000,
                                                      "commitlog_segment_bytes": 1 << 24,
                                                      "preallocate_next_segment": False})
    results, flushed = _send_then_flushed(lazy.client_address, batch)
    assert all(r.status == "PUT_OK" for r in results)
    assert flushed < max(r.physical_offset for r in results)  # the check below can tell the two apart
    durable = node_process("durable", flush="sync")
    for _ in range(3):
        results, flushed = _send_then_flushed(durable.client_address, batch)
        assert all(r.status == "PUT_OK" for r in results)
        end = max(r.physical_offset for r in results) + 4096
        assert flushed >= end, f"acknowledged up to about {end} but flushed only to {flushed}"


def test_flush_disk_timeout_is_reported_and_the_messages_are_still_stored(node_process):
    # 1 ms to confirm 4 MiB on a real disk: the fdatasync takes longer than that
    node = node_process("slow", flush="sync", store={"sync_flush_timeout_ms": 1, "commitlog_segment_bytes": 1 << 26,
                                                     "preallocate_next_segment": False})
    timed_out = []
    deadline = time.monotonic() + 30
    with SyncProducer(node.client_address) as producer:
        for attempt in range(20):
            if timed_out or time.monotonic() > deadline:
                break
            results = producer.send_batch("slow", [OutgoingMessage(b"%d" % attempt + b"y" * (16 * 1024))
                                                   for _ in range(256)])
            assert {r.status for r in results} <= {"PUT_OK", "FLUSH_DISK_TIMEOUT"}
            timed_out += [r for r in results if r.status == "FLUSH_DISK_TIMEOUT"]
    assert timed_out, "no send of 4 MiB was slower than 1 ms to reach the disk"
    assert all("sync_flush_timeout_ms" in r.reason for r in timed_out)
    with SyncAdmin(node.client_address) as admin:
        # written, only not confirmed on disk in time: the messages are there to read
        dispatched = time.monotonic() + 10
        while admin.status()["store"]["dispatched_offset"] <= timed_out[0].physical_offset:
            assert time.monotonic() < dispatched, "the timed-out messages were never dispatched"
            time.sleep(0.05)
        stored = admin.query_by_id(timed_out[0].message_id)
        assert stored.queue_offset == timed_out[0].queue_offset and len(stored.body) > 16 * 1024
        # and the flush goes on: the disk catches up with them a little later
        with_disk = time.monotonic() + 10
        while admin.status()["store"]["flushed_offset"] <= timed_out[-1].physical_offset:
            assert time.monotonic() < with_disk, "the flush never caught up with the timed-out messages"
            time.sleep(0.05)
