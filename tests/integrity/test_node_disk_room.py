"""A full disk through a real node (in this trio run, on loopback): the node's store is on
a small tmpfs (mounted here; skipped, saying why, where mounting is not permitted). With
its segment reserved but no room for the next ConsumeQueue file, a producer's batch is
refused per message with SERVICE_NOT_AVAILABLE "no room on disk", never acked; once space
is freed the same producer's sends are acked, and everything acked is served."""

from __future__ import annotations

import os

import pytest
import trio

from node.client import OutgoingMessage, open_admin, open_producer

from node.server.node import serve_node

from integrity_helpers import SECRET, node_config, produce, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.trio]   # mounts a tmpfs (a process)


@pytest.fixture
def small_disk(tmpfs):
    return tmpfs("8m")


async def test_a_node_on_a_full_disk_refuses_sends_it_could_not_serve_and_takes_them_once_freed(small_disk):
    async with trio.open_nursery() as nursery:
        node = await nursery.start(serve_node, node_config(small_disk, "a"))
        before = await produce(node, 20)              # queues 0..3 of t have their files
        await wait_until(lambda: node.store.dispatcher.dispatched_offset >= node.store.commit_log.max_offset,
                         what="dispatch")
        assert node.store.room.headroom_bytes() > 16 * 1024
        filler = small_disk.fill(16 * 1024)
        end = node.store.commit_log.max_offset
        async with open_producer(node.client_address, secret=SECRET, batch_count_max=10) as producer:
            refused = await producer.send_batch("t", [OutgoingMessage(b"full-%d" % i) for i in range(10)])
            assert {r.status for r in refused} == {"SERVICE_NOT_AVAILABLE"}, refused
            assert all("no room on disk" in r.reason for r in refused), refused[0].reason
            assert node.store.commit_log.max_offset == end       # nothing written
            os.unlink(filler)
            after = await producer.send_batch("t", [OutgoingMessage(b"freed-%d" % i) for i in range(10)])
            assert all(r.ok for r in after), {r.status for r in after}
        served = set()
        async with open_admin(node.client_address, secret=SECRET) as admin:
            with trio.fail_after(20):
                for queue_id in range(4):
                    offset = 0
                    while True:
                        reply = await admin.pull("t", queue_id, offset, max_count=64)
                        served.update((queue_id, m.queue_offset) for m in reply["messages"])
                        if reply["next_offset"] <= offset:
                            break
                        offset = reply["next_offset"]
        assert {(r.queue_id, r.queue_offset) for r in before + after} <= served
        nursery.cancel_scope.cancel()
