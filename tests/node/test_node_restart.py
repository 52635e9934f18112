"""A node process killed with SIGKILL and restarted keeps every acked message and consumer offset."""

import json
import os
import signal
import subprocess
import sys

import pytest
import trio
import yaml

from node.client import OutgoingMessage, open_admin, open_producer
from node.cluster.process import free_port

from node_helpers import SMALL_STORE

pytestmark = pytest.mark.integration   # node processes killed and restarted


def _start(config_path: str) -> tuple[subprocess.Popen, dict]:
    process = subprocess.Popen([sys.executable, "-m", "node.cli", "node", "start", "--config", config_path],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = process.stdout.readline()
    if not line:
        process.kill()
        raise AssertionError(f"node did not start: {process.stderr.read()}")
    return process, json.loads(line)


def test_sigkill_then_restart_keeps_acked_messages_and_offsets(tmp_path):
    store_path = tmp_path / "store"
    config = {"node_id": "r1", "store_path": str(store_path), "client_address": f"127.0.0.1:{free_port()}",
              "metrics_address": "127.0.0.1:0", "ha_address": "127.0.0.1:0", "config_persist_interval_ms": 3_600_000, "store": SMALL_STORE}
    config_path = tmp_path / "node.yaml"
    config_path.write_text(yaml.safe_dump(config))
    process, ready = _start(str(config_path))
    address = ready["client_address"]
    try:
        async def write():
            async with open_admin(address) as admin:
                await admin.create_topic("durable", queue_count=2)
            async with open_producer(address, batch_count_max=32) as producer:
                results = []
                for start in range(0, 600, 50):
                    results += await producer.send_batch("durable", [OutgoingMessage(b"msg-%d" % i, keys=[f"k{i}"])
                                                                     for i in range(start, start + 50)])
            async with open_admin(address) as admin:
                await admin.commit_offsets("g", "durable", {0: 123, 1: 77})
                await admin.create_topic("later", queue_count=3)
            return results
        acked = trio.run(write)
        assert all(r.ok for r in acked)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(10)
    assert os.path.exists(store_path / "abort")  # left to recovery
    process, ready = _start(str(config_path))
    try:
        async def read():
            async with open_admin(ready["client_address"]) as admin:
                bodies = {}
                for queue_id in (0, 1):
                    offset = 0
                    while True:
                        reply = await admin.pull("durable", queue_id, offset, 256)
                        if not reply["messages"]:
                            break
                        for m in reply["messages"]:
                            bodies[m.message_id] = m.body
                        offset = reply["next_offset"]
                return bodies, await admin.query_offsets("g", "durable"), await admin.list_topics(), \
                    await admin.status()
        bodies, offsets, topics, status = trio.run(read)
        assert {r.message_id: b"msg-%d" % i for i, r in enumerate(acked)} == bodies
        assert offsets == {0: 123, 1: 77}
        assert topics["later"]["queue_count"] == 3
        assert status["sys_config_replayed"] >= 3
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    assert not os.path.exists(store_path / "abort")  # clean shutdown
