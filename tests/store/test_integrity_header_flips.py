"""A bit flipped in a running store's record, in any field (TOTALSIZE, MAGICCODE, QUEUEOFFSET,
PHYSICALOFFSET, body, properties): a pull names the record by queue offset and serves every
other one (no queue rebuild, which a damaged magic or offset field once set off and crashed),
the scrub names it, and an intact copy written back repairs it in place."""

from __future__ import annotations

import os

import pytest

from store import Message, MessageStore
from store.repair import overwrite_range
from store.scrub import Scrub
from store_helpers import make_config

SEGMENT_BYTES = 8192


@pytest.mark.parametrize("byte_at", [0, 2, 5, 9, 14, 22, 30, 60, 100, 250])
def test_a_flipped_header_or_body_bit_is_named_and_repaired(tmp_path, byte_at):
    store = MessageStore(make_config(tmp_path / "s", flush="sync", commitlog_segment_bytes=SEGMENT_BYTES))
    store.start()
    try:
        results = store.put_batch([Message(topic="S", body=b"s%03d" % i + b"." * 200) for i in range(60)])
        assert store.wait_dispatched()
        victim = results[37]
        intact = bytes(store.commit_log.read(victim.physical_offset, victim.wrote_bytes))
        segment = victim.physical_offset - victim.physical_offset % SEGMENT_BYTES
        fd = os.open(tmp_path / "s" / "commitlog" / f"{segment:020d}", os.O_RDWR)
        try:   # through the file, as a disk would: the store's mapping sees the same page
            at = victim.physical_offset - segment + byte_at
            os.pwrite(fd, bytes([os.pread(fd, 1, at)[0] ^ 0x10]), at)
        finally:
            os.close(fd)
        served, corrupt, offset = [], [], 0
        while offset < 60:
            result = store.pull("S", 0, offset, 16)
            served += [m.queue_offset for m in result.messages]
            corrupt += [(c.queue_offset, c.physical_offset) for c in result.corrupt]
            assert result.next_offset > offset
            offset = result.next_offset
        assert served == [q for q in range(60) if q != 37]
        assert corrupt == [(37, victim.physical_offset)]
        scrub = Scrub(store.commit_log, store.integrity, bytes_per_s=1 << 30)
        scrub.check(1 << 20)
        assert scrub.statistics().corrupt_records_found == 1
        assert overwrite_range(store.commit_log, store.integrity, victim.physical_offset, intact) == 1
        result = store.pull("S", 0, 0, 100)
        assert [m.queue_offset for m in result.messages] == list(range(60)) and not result.corrupt
        assert store.statistics().integrity.corrupt_records == ()
    finally:
        store.shutdown()
