"""A full disk is an error, never a crash: on a small tmpfs (mounted here; the test is
skipped, saying why, where mounting is not permitted) a writer with keys fills the disk,
gets SERVICE_NOT_AVAILABLE "no room on disk", and is never killed by SIGBUS; neither is
``store verify``. Once space is freed the store starts and serves every acknowledged
message."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

from store import Message, MessageStore, PutStatus
from store_helpers import make_config, pull_all

pytestmark = pytest.mark.integration

SETTINGS = dict(commitlog_segment_bytes=256 * 1024, flush="sync", consume_queue_entries_per_file=512,
                index_hash_slots=64, index_max_entries=2000)

WRITER = textwrap.dedent("""
    import sys
    from store import Message, MessageStore, PutStatus, StoreConfig
    settings = dict(commitlog_segment_bytes=256 * 1024, flush="sync", consume_queue_entries_per_file=512,
                    index_hash_slots=64, index_max_entries=2000)
    store = MessageStore(StoreConfig(store_path=sys.argv[1], **settings))
    store.start()
    refused = 0
    for i in range(20_000):
        result = store.put(Message(topic="Full", queue_id=i % 4, body=b"m%d" % i + b"." * 500,
                                   keys=["k%d" % i, "u%d" % i]))
        if result.status is PutStatus.PUT_OK:
            print("ACK", i, result.queue_offset, flush=True)
        else:
            print("REFUSED", result.status.value, result.reason.replace(" ", "_"), flush=True)
            refused += 1
            if refused >= 20:
                break
    store.shutdown()
    print("DONE", flush=True)
""")


@pytest.fixture
def small_disk(tmpfs):
    return tmpfs("3m")


def test_full_disk_refuses_writes_without_sigbus_and_recovers_after_space_is_freed(small_disk):
    store_path = str(small_disk / "store")
    os.makedirs(store_path)
    filler = small_disk.fill(900 * 1024)
    done = subprocess.run([sys.executable, "-c", WRITER, store_path], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"writer died (exit {done.returncode}): {done.stderr[-2000:]}"
    acked = [tuple(map(int, line.split()[1:])) for line in done.stdout.splitlines() if line.startswith("ACK")]
    refusals = [line.split() for line in done.stdout.splitlines() if line.startswith("REFUSED")]
    assert acked and refusals, done.stdout[-500:]
    assert all(status == "SERVICE_NOT_AVAILABLE" and "no_room_on_disk" in reason for _, status, reason in refusals)
    verify = subprocess.run([sys.executable, "-c", "import sys; from store import offline; "
                             "problems, summary = offline.verify(sys.argv[1]); print(summary)", store_path],
                            capture_output=True, text=True, timeout=120)
    assert verify.returncode == 0, f"verify died (exit {verify.returncode}): {verify.stderr[-2000:]}"
    os.unlink(filler)
    store = MessageStore(make_config(store_path, **SETTINGS))
    store.start()
    try:
        assert store.wait_dispatched()
        by_queue = {q: {m.queue_offset: m.body for m in pull_all(store, "Full", q)} for q in range(4)}
        for i, queue_offset in acked:
            assert by_queue[i % 4][queue_offset] == b"m%d" % i + b"." * 500
        last = acked[-1][0]
        assert [m.body[:8] for m in store.query_by_key("Full", f"k{last}")] == [(b"m%d" % last + b"." * 8)[:8]]
    finally:
        store.shutdown()


ROOM_SETTINGS = dict(SETTINGS, preallocate_next_segment=False)   # nothing reserved behind the test's back


def _put(store, queue_id: int, i: int):
    return store.put(Message(topic="Room", queue_id=queue_id, body=b"r%d" % i + b"." * 200, keys=[f"r{i}"]))


def test_a_put_is_refused_not_acked_when_its_consume_queue_file_would_not_fit(small_disk):
    """The segment is reserved, but a new queue's ConsumeQueue file would not fit: before,
    the put was acked and the dispatcher waited for room; now it is refused, writes nothing,
    and is accepted once space is freed."""
    store = MessageStore(make_config(str(small_disk / "store"), **ROOM_SETTINGS))
    store.start()
    try:
        assert _put(store, 0, 0).status is PutStatus.PUT_OK
        assert store.wait_dispatched()
        headroom = store.room.headroom_bytes()
        assert headroom == store.config.consume_queue_file_bytes   # the index file has room for 1,999 more keys
        filler = small_disk.fill(4096)
        assert store.room.free_bytes() < headroom
        end = store.commit_log.max_offset
        for queue_id in (1, 0):   # a new queue, and one whose file has room: the rule does not guess which
            refused = _put(store, queue_id, 1)
            assert refused.status is PutStatus.SERVICE_NOT_AVAILABLE and refused.reason.startswith("no room on disk")
        assert store.commit_log.max_offset == end and store.room.refused_puts == 2
        os.unlink(filler)
        assert _put(store, 1, 2).status is PutStatus.PUT_OK
        assert store.wait_dispatched()
        assert [m.body[:2] for m in pull_all(store, "Room", 1)] == [b"r2"]
        assert store.dispatcher.room_wait is None
    finally:
        store.shutdown()


def test_puts_are_refused_while_dispatch_waits_for_room_and_accepted_once_it_has_it(small_disk):
    """Room for one ConsumeQueue file passes the headroom check, but a batch opening three
    queues needs three: the dispatcher waits for room, and every put is refused until a
    pass succeeds. The messages acked before are in the log and served once space is freed."""
    store = MessageStore(make_config(str(small_disk / "store"), **ROOM_SETTINGS))
    store.start()
    try:
        assert _put(store, 0, 0).status is PutStatus.PUT_OK
        assert store.wait_dispatched()
        filler = small_disk.fill(16 * 1024)   # one 10 KiB ConsumeQueue file fits, two do not
        batch = [Message(topic="Room", queue_id=q, body=b"b%d" % q + b"." * 200) for q in (1, 2, 3)]
        assert [r.status for r in store.put_batch(batch)] == [PutStatus.PUT_OK] * 3
        deadline = time.monotonic() + 10
        while store.dispatcher.room_wait is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert store.dispatcher.room_wait is not None, "dispatch never ran out of room"
        refused = _put(store, 0, 1)
        assert refused.status is PutStatus.SERVICE_NOT_AVAILABLE
        assert refused.reason.startswith("no room on disk: dispatch waits for room"), refused.reason
        os.unlink(filler)
        deadline = time.monotonic() + 10   # the refused put woke the dispatcher: its retry finds room
        while store.dispatcher.room_wait is not None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert store.dispatcher.room_wait is None
        assert _put(store, 0, 2).status is PutStatus.PUT_OK
        assert store.wait_dispatched()
        assert [m.body[:2] for q in (1, 2, 3) for m in pull_all(store, "Room", q)] == [b"b1", b"b2", b"b3"]
        assert [m.body[:2] for m in pull_all(store, "Room", 0)] == [b"r0", b"r2"]
    finally:
        store.shutdown()
