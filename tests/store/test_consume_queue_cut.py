"""Cutting a ConsumeQueue at a commit log offset (``truncate_physical``), as a slave's
handshake does when it drops a divergent tail: queues whose first entry lies past the cut,
queues that start past 0 behind RocketMQ's filler, filler standing for a lost record, and a
queue whose files a rebuild took away while the cut ran. None of them may crash the node
(the chaos run's paused master did: "queue offset inside the queue"), and each must keep
exactly the entries that point below the cut."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from store.consume_queue import FILLER, FILLER_SIZE, ConsumeQueue
from store_helpers import CQ_ENTRY

ENTRIES_PER_FILE = 8
SIZE = 50


def entry(physical: int) -> bytes:
    return CQ_ENTRY.pack(physical, SIZE, 0)


def open_queue(tmp_path, name: str = "q") -> ConsumeQueue:
    queue = ConsumeQueue(str(tmp_path / name), "T", 0, ENTRIES_PER_FILE)
    queue.load()
    return queue


def kept_physicals(queue: ConsumeQueue) -> list[int]:
    """Commit log offsets of the queue's real entries (``entries`` stops at a file's end)."""
    found, at = [], queue.min_offset
    while at < queue.max_offset:
        batch = queue.entries(at, 10_000)
        assert batch, f"no entry at {at} below the queue's end {queue.max_offset}"
        found += [e.physical_offset for e in batch if e.size != FILLER_SIZE]
        at = batch[-1].queue_offset + 1
    return found


def test_a_queue_whose_first_entry_is_past_the_cut_becomes_empty_there(tmp_path):
    queue = open_queue(tmp_path)
    queue.append_entries(5, b"".join(entry(1000 + SIZE * i) for i in range(6)))  # filler before 5
    assert queue.files.files[0].mm[:20] == FILLER
    queue.truncate_physical(900)
    assert (queue.min_offset, queue.max_offset) == (5, 5)
    queue.append_entries(5, entry(900))  # the new master's record at the same queue offset
    assert kept_physicals(queue) == [900]
    queue.close()


def test_a_queue_starting_in_a_later_file_cut_before_it(tmp_path):
    queue = open_queue(tmp_path)
    queue.append_entries(19, b"".join(entry(5000 + SIZE * i) for i in range(10)))  # files 2 and 3
    assert [m.start_offset // 20 for m in queue.files.files] == [16, 24]
    queue.truncate_physical(5000 + SIZE * 7)
    assert (queue.min_offset, queue.max_offset) == (19, 26)
    queue.truncate_physical(10)
    assert (queue.min_offset, queue.max_offset) == (19, 19)
    assert kept_physicals(queue) == []
    queue.close()


def test_filler_for_a_lost_record_goes_with_the_entry_after_it(tmp_path):
    queue = open_queue(tmp_path)
    queue.append_entries(0, entry(0) + entry(50) + FILLER * 3 + entry(300) + entry(350))
    queue.truncate_physical(300)          # the lost records' offsets are unknown: dropped with 300
    assert (queue.min_offset, queue.max_offset) == (0, 2)
    queue.close()
    queue = open_queue(tmp_path, "r")
    queue.append_entries(0, entry(0) + entry(50) + FILLER * 3 + entry(300) + entry(350))
    queue.truncate_physical(301)
    assert queue.max_offset == 6 and kept_physicals(queue) == [0, 50, 300]
    queue.close()


def test_a_queue_whose_files_a_rebuild_took_away_is_cut_without_raising(tmp_path):
    queue = open_queue(tmp_path)
    queue.append_entries(0, b"".join(entry(SIZE * i) for i in range(20)))
    for mapped in reversed(queue.files.files):  # what Integrity._replace_queue does to the old object
        mapped.destroy()
    queue.files.files = []
    queue.truncate_physical(SIZE * 3)
    assert queue.max_offset == queue.min_offset
    queue.close()


@settings(max_examples=150, deadline=None)
@given(first=st.integers(0, 20), kinds=st.lists(st.sampled_from("eeeef"), min_size=1, max_size=40),
       cut_at=st.integers(0, 45))
def test_the_cut_keeps_exactly_the_entries_below_it(tmp_path_factory, first, kinds, cut_at):
    """Against a plain reference: keep the longest prefix whose next real entry (each filler
    goes with the one after it) points below the cut."""
    tmp_path = tmp_path_factory.mktemp("cut")
    physicals = []
    raw = b""
    for number, kind in enumerate(kinds):
        if kind == "e":
            physicals.append(SIZE * number)
            raw += entry(SIZE * number)
        else:
            physicals.append(None)
            raw += FILLER
    cut = SIZE * cut_at
    keep = len(kinds)
    while keep > 0:
        following = next((p for p in physicals[keep - 1:] if p is not None), None)
        if following is not None and following < cut:
            break
        keep -= 1
    # a prefix kept must end with a real entry below the cut, filler after it goes
    while keep > 0 and physicals[keep - 1] is None:
        keep -= 1
    queue = open_queue(tmp_path)
    queue.append_entries(first, raw)
    queue.truncate_physical(cut)
    assert queue.max_offset == first + keep
    assert queue.min_offset == first
    assert kept_physicals(queue) == [p for p in physicals[:keep] if p is not None]
    queue.close()
    reloaded = open_queue(tmp_path)
    assert reloaded.max_offset == (first + keep if keep else reloaded.min_offset)
    reloaded.close()


def test_a_pull_in_the_middle_of_a_cut_stops_at_the_log_end_without_a_rebuild(open_store):
    """Half way through ``ReplicaLog.cut`` the log already ends at the cut while the queues
    still point past it. A pull then must stop there: not report damage and rebuild the
    queue under the cut (that rebuild emptied the queue object the cut was working on), and
    not skip the missing records as if retention had deleted them."""
    from store import Message
    store = open_store(consume_queue_entries_per_file=ENTRIES_PER_FILE)
    results = [store.put(Message(topic="T", queue_id=0, body=b"m%d" % i)) for i in range(12)]
    assert store.wait_dispatched()
    cut = results[9].physical_offset
    rebuilt = store.integrity.consume_queues_rebuilt
    store.commit_log.set_end(cut)                      # the cut's first step, queues not yet cut
    got = store.pull("T", 0, 8, 32)
    assert [m.queue_offset for m in got.messages] == [8]
    assert got.next_offset == 9
    assert store.pull("T", 0, 9, 32).messages == []
    assert store.integrity.consume_queues_rebuilt == rebuilt
