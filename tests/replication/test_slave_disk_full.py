"""A slave whose disk fills up: the session ends with the store's error, the node's log says
so as a warning (the master's puts wait for this slave's acks meanwhile), the slave keeps
what it wrote, and it follows on once there is room."""

from __future__ import annotations

import logging
import os
import subprocess

import pytest
import trio

from replication_helpers import (SEGMENT_BYTES, begin_term, epoch_file, log_bytes, put, start_master, start_slave,
                                 wait_until)

pytestmark = [pytest.mark.trio, pytest.mark.integration]


async def test_a_full_disk_on_a_slave_is_a_warning_and_replication_resumes_once_there_is_room(tmpfs, open_store,
                                                                                              caplog):
    disk = tmpfs("450k")   # the slave's first segment and its small queues fit, a second segment does not
    master = open_store("master")
    slave = open_store(os.path.join(disk, "slave"), consume_queue_entries_per_file=256, index_hash_slots=64,
                       index_max_entries=512)
    master_epochs = epoch_file(master)
    begin_term(master, master_epochs)
    put(master, 2 * SEGMENT_BYTES // 300)   # past the first segment
    caplog.set_level(logging.INFO, logger="replication.ha_client")
    async with trio.open_nursery() as nursery:
        _, address = await start_master(nursery, master, master_epochs)
        running = await start_slave(nursery, slave, address)
        await wait_until(lambda: "no room on disk" in (running.client.statistics().last_error or ""),
                         what="the slave's session ended by a full disk")
        warnings = [record for record in caplog.records
                    if record.levelno == logging.WARNING and "no room on disk" in record.getMessage()]
        assert warnings, [record.getMessage() for record in caplog.records]
        assert 0 < slave.max_physical_offset <= SEGMENT_BYTES   # what fitted stays
        assert log_bytes(slave) == log_bytes(master)[:slave.max_physical_offset]
        grown = subprocess.run(["mount", "-o", "remount,size=4m", str(disk)], capture_output=True, text=True)
        assert grown.returncode == 0, grown.stderr
        await wait_until(lambda: slave.max_physical_offset == master.max_physical_offset,
                         what="the slave following on once there is room")
        assert log_bytes(slave) == log_bytes(master)
        await running.stop()
        nursery.cancel_scope.cancel()
