"""The scrub finds a flipped bit in a flushed record nobody reads, at a bounded rate, and
names it; an intact copy of the range written back (the replica repair hook) makes the
record readable again, and a copy that is not whole valid records is refused."""

from __future__ import annotations

import pytest

from store import Message, MessageStore
from store.repair import RepairError, overwrite_range
from store.scrub import Scrub
from store_helpers import make_config


def _damaged_store(tmp_path):
    path = tmp_path / "s"
    store = MessageStore(make_config(path, flush="sync", commitlog_segment_bytes=8192))
    store.start()
    results = store.put_batch([Message(topic="S", body=b"s%03d" % i + b"." * 200) for i in range(60)])
    victim = results[37]
    intact = bytes(store.commit_log.read(victim.physical_offset, victim.wrote_bytes))
    store.shutdown()
    segment = victim.physical_offset - victim.physical_offset % 8192
    with open(path / "commitlog" / f"{segment:020d}", "r+b") as handle:
        handle.seek(victim.physical_offset - segment + 100)
        byte = handle.read(1)
        handle.seek(-1, 1)
        handle.write(bytes([byte[0] ^ 0x10]))
    store = MessageStore(make_config(path, flush="sync", commitlog_segment_bytes=8192))
    store.start()
    return store, results, victim, intact


def test_scrub_finds_a_flipped_bit_at_a_bounded_rate_and_names_it(tmp_path):
    store, results, victim, _ = _damaged_store(tmp_path)
    try:
        scrub = Scrub(store.commit_log, store.integrity, bytes_per_s=10_000)
        assert scrub.step(100.0) == 0                  # the first step only starts the clock
        checked = scrub.step(100.5)                    # half a second: about 5,000 bytes
        assert 5_000 <= checked < 5_000 + 300
        assert scrub.step(100.5) == 0                  # nothing due
        while scrub.statistics().passes_completed == 0:
            scrub.step(scrub._last_step_s + 10)        # a long pause counts as one second at most
        stats = scrub.statistics()
        assert stats.corrupt_records_found == 1 and stats.records_checked == 60
        named = store.statistics().integrity.corrupt_records
        assert [r.physical_offset for r in named] == [victim.physical_offset]
    finally:
        store.shutdown()


def test_an_intact_copy_written_back_repairs_the_record(tmp_path):
    store, results, victim, intact = _damaged_store(tmp_path)
    try:
        assert [c.queue_offset for c in store.pull("S", 0, 37, 1).corrupt] == [37]
        with pytest.raises(RepairError):
            overwrite_range(store.commit_log, store.integrity, victim.physical_offset, b"\x00" * len(intact))
        with pytest.raises(RepairError):   # whole records, but not where they belong
            overwrite_range(store.commit_log, store.integrity, victim.physical_offset + 1, intact)
        assert overwrite_range(store.commit_log, store.integrity, victim.physical_offset, intact) == 1
        [message] = store.pull("S", 0, 37, 1).messages
        assert message.body == b"s037" + b"." * 200
        stats = store.statistics().integrity
        assert stats.ranges_repaired == 1 and stats.corrupt_records == ()
    finally:
        store.shutdown()


def test_after_a_walk_the_scrub_follows_new_bytes_and_goes_around_after_the_interval(tmp_path):
    store = MessageStore(make_config(tmp_path / "s", flush="sync", commitlog_segment_bytes=8192))
    store.start()
    try:
        store.put_batch([Message(topic="S", body=b"." * 200) for _ in range(20)])
        scrub = Scrub(store.commit_log, store.integrity, bytes_per_s=1 << 30, pass_interval_s=60.0)
        scrub.check(1 << 20, now_s=0.0)
        first_end = store.commit_log.flushed_offset
        assert scrub.statistics().passes_completed == 1 and scrub.position == first_end
        assert scrub.check(1 << 20, now_s=30.0) == 0          # nothing new, no walk yet
        assert scrub.position == first_end
        store.put_batch([Message(topic="S", body=b"." * 200) for _ in range(5)])
        checked = scrub.check(1 << 20, now_s=31.0)            # only what was flushed since
        assert checked == store.commit_log.flushed_offset - first_end
        assert scrub.statistics().records_checked == 25 and scrub.statistics().passes_completed == 1
        scrub.check(1 << 20, now_s=60.0)                      # the interval has passed: around again
        assert scrub.position == store.commit_log.min_offset
        scrub.check(1 << 20, now_s=60.5)
        assert scrub.statistics().records_checked == 50 and scrub.statistics().passes_completed == 2
    finally:
        store.shutdown()


def test_a_pass_interval_must_not_be_negative(tmp_path):
    store = MessageStore(make_config(tmp_path / "s"))
    store.start()
    try:
        with pytest.raises(ValueError):
            Scrub(store.commit_log, store.integrity, bytes_per_s=1, pass_interval_s=-1)
    finally:
        store.shutdown()


def test_a_busy_step_checks_at_the_busy_rate(tmp_path):
    store = MessageStore(make_config(tmp_path / "s", flush="sync", commitlog_segment_bytes=1 << 20))
    store.start()
    try:
        store.put_batch([Message(topic="S", body=b"." * 200) for _ in range(400)])
        scrub = Scrub(store.commit_log, store.integrity, bytes_per_s=40_000, busy_bytes_per_s=4_000)
        assert scrub.step(0.0) == 0
        busy = scrub.step(1.0, busy=True)              # one second at 4,000 bytes/s
        assert 4_000 <= busy < 4_000 + 300 and scrub.statistics().busy
        idle = scrub.step(2.0)                         # one second at 40,000
        assert 40_000 <= idle < 40_000 + 300 and not scrub.statistics().busy
        stats = scrub.statistics()
        assert (stats.bytes_per_s, stats.busy_bytes_per_s, stats.bytes_checked) == (40_000, 4_000, busy + idle)
        with pytest.raises(ValueError):
            Scrub(store.commit_log, store.integrity, bytes_per_s=1, busy_bytes_per_s=0)
    finally:
        store.shutdown()
