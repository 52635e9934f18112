"""READ_LOG_RANGE and LOG_RANGE_CRCS on a node: whole CRC-checked records from a record
start, raw bytes, never past the confirm offset, a corrupt copy refused, CRCs per range
equal to the bytes' own, and both asked only over an authenticated connection."""

from __future__ import annotations

import zlib

import pytest
import trio

from node.client import open_connection
from node.errors import AuthError, RequestError
from node.wire.protocol import RequestCode
from store import codec

from integrity_helpers import BODY_AT, SECRET, flip_bit, flushed, produce, start_group, wait_until

pytestmark = pytest.mark.trio


async def test_whole_records_raw_bytes_and_crcs_below_the_confirm_offset(tmp_path):
    async with trio.open_nursery() as nursery:
        master, slave = await start_group(nursery, tmp_path, slaves=1)
        sent = await produce(master, 80)
        await flushed(master, sent)
        confirm = master.store.confirm_offset
        assert confirm == master.store.max_physical_offset
        async with open_connection(master.client_address, secret=SECRET) as connection:
            one = await connection.request(RequestCode.READ_LOG_RANGE, offset=sent[5].physical_offset, size=1)
            assert len(one["data"]) == sent[6].physical_offset - sent[5].physical_offset
            header = codec.check_record(one["data"], 0, len(one["data"]))
            assert header.total_size == len(one["data"])
            several = await connection.request(RequestCode.READ_LOG_RANGE, offset=sent[5].physical_offset,
                                               size=1000)
            assert 1 < len(several["data"]) <= 1000 and several["data"].startswith(one["data"])
            with pytest.raises(RequestError) as refused:
                await connection.request(RequestCode.READ_LOG_RANGE, offset=sent[5].physical_offset + 1, size=1)
            assert refused.value.code == "BAD_REQUEST" and "no record starts" in refused.value.message
            with pytest.raises(RequestError):
                await connection.request(RequestCode.READ_LOG_RANGE, offset=confirm, size=1)
            raw = await connection.request(RequestCode.READ_LOG_RANGE, offset=0, size=confirm + 5000, raw=True)
            assert len(raw["data"]) == confirm     # never past the confirm offset
            crcs = await connection.request(RequestCode.LOG_RANGE_CRCS, start=0, range_bytes=4096)
            assert crcs["end"] == confirm and len(crcs["crcs"]) == -(-confirm // 4096)
            assert crcs["crcs"] == [zlib.crc32(raw["data"][i:i + 4096]) for i in range(0, confirm, 4096)]
            flip_bit(master.store, sent[9].physical_offset, BODY_AT)
            with pytest.raises(RequestError) as corrupt:
                await connection.request(RequestCode.READ_LOG_RANGE, offset=sent[9].physical_offset, size=1)
            assert corrupt.value.code == "RECORD_CORRUPT"
            changed = await connection.request(RequestCode.LOG_RANGE_CRCS, start=0, range_bytes=4096)
            differing = [i for i, (x, y) in enumerate(zip(crcs["crcs"], changed["crcs"])) if x != y]
            assert differing == [(sent[9].physical_offset + BODY_AT) // 4096]
        with pytest.raises(AuthError):
            async with open_connection(master.client_address, secret="wrong") as connection:
                await connection.request(RequestCode.READ_LOG_RANGE, offset=0, size=1)
        # the slave's own copy stays intact and the master repairs from it
        await wait_until(lambda: master.handlers.integrity.repairer.statistics().repaired == 1, timeout_s=30,
                         what="the master to repair the flip from its slave")
        nursery.cancel_scope.cancel()
