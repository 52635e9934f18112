"""verify_group (what `hastore cluster verify` runs): the same log on every node of a group
is reported whole, a flipped bit on one node is reported by its exact offset, and a node
that cannot be asked is an error, never agreement."""

from __future__ import annotations

import dataclasses

import pytest
import trio

from node.cluster.verify import verify_group

from integrity_helpers import BODY_AT, SECRET, SMALL_STORE, flip_bit, flushed, produce, start_group, wait_until

pytestmark = pytest.mark.trio


async def test_verify_finds_a_flipped_bit_by_offset(tmp_path, monkeypatch):
    # a scrub of one byte per second: the flip stays unrepaired while verify looks
    monkeypatch.setitem(SMALL_STORE, "scrub_bytes_per_s", 1)
    async with trio.open_nursery() as nursery:
        nodes = await start_group(nursery, tmp_path, slaves=2)
        master = nodes[0]
        sent = await produce(master, 300)
        await wait_until(lambda: all(n.store.confirm_offset == master.store.max_physical_offset for n in nodes),
                         what="every node to learn the confirm offset")
        members = {n.config.node_id: (n.client_address, SECRET) for n in nodes}
        same = await verify_group("g", members, range_bytes=4096)
        assert same.ok and same.start == 0 and same.end == master.store.max_physical_offset
        assert same.ranges_compared == -(-same.end // 4096)
        slave = nodes[2]
        await flushed(slave, sent)
        flip_bit(slave.store, sent[123].physical_offset, BODY_AT, bit=6)
        report = await verify_group("g", members, range_bytes=4096)
        assert not report.ok
        [divergence] = report.divergences
        assert dataclasses.astuple(divergence)[2:] == (sent[123].physical_offset + BODY_AT, 1, ("c",), "a")
        assert divergence.range_start <= divergence.first_offset < divergence.range_end
        gone = await verify_group("g", {**members, "x": ("127.0.0.1:1", SECRET)})
        assert not gone.ok and gone.errors and "x" in gone.errors[0]
        nursery.cancel_scope.cancel()
