"""Through a slave and with a wrong secret, with real node processes and the CLI: produce
gives exact counts (every message ok, or every one failed; never an unknown outcome for a
request that took no effect), topic create follows NOT_MASTER, and topic list, status and
consume are served by the slave."""

from __future__ import annotations

import json
import time

import pytest

from hostile_helpers import NodeProcess, run_hastore, write_config

pytestmark = pytest.mark.integration

SECRET = "hostile-secret"
AUTH = {"HASTORE_SECRET": SECRET}


@pytest.fixture
def master_and_slave(tmp_path):
    master = NodeProcess(write_config(tmp_path / "m", node_id="m", secret=SECRET))
    status = run_hastore("status", "--bootstrap", master.client_address, "--json", env=AUTH)
    ha_address = json.loads(status.stdout)["ha_address"]
    slave = NodeProcess(write_config(tmp_path / "s", node_id="s", secret=SECRET, role="slave",
                                     master_ha_address=ha_address, master_client_address=master.client_address))
    yield master, slave
    slave.stop()
    master.stop()


def _produce(address: str, count: int, env: dict) -> tuple[int, dict]:
    result = run_hastore("produce", "--bootstrap", address, "--topic", "orders", "--count", str(count), "--json",
                         env=env)
    return result.returncode, json.loads(result.stdout)


def _eventually(check, what: str, timeout_s: float = 20):
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def test_exact_counts_and_reads_through_a_slave(master_and_slave):
    master, slave = master_and_slave
    created = run_hastore("topic", "create", "orders", "--queues", "2", "--bootstrap", slave.client_address, env=AUTH)
    assert created.returncode == 0, created.stderr
    runs = [_produce(slave.client_address, 10, AUTH) for _ in range(4)]
    assert [(code, out["ok"], out["failed"], out["unknown"]) for code, out in runs] == [(0, 10, 0, 0)] * 4
    for env in ({"HASTORE_SECRET": "wrong"}, {"HASTORE_SECRET": ""}):
        code, out = _produce(slave.client_address, 10, env)
        assert (code, out["ok"], out["failed"], out["unknown"]) == (1, 0, 10, 0), out

    def listed():
        result = run_hastore("topic", "list", "--bootstrap", slave.client_address, "--json", env=AUTH)
        return "orders" in json.loads(result.stdout or "{}")
    _eventually(listed, "the topic listed by the slave")
    status = json.loads(run_hastore("status", "--bootstrap", slave.client_address, "--json", env=AUTH).stdout)
    assert status["role"] == "slave" and status["topics"] >= 1

    def consumed():
        result = run_hastore("consume", "--bootstrap", slave.client_address, "--topic", "orders", "--group", "g",
                             "--from-beginning", "--count", "40", "--idle-ms", "3000", env=AUTH)
        return result.returncode == 0 and "consumed 40 messages" in result.stderr
    _eventually(consumed, "40 messages consumed through the slave", timeout_s=60)
    # the group's offsets were committed (through NOT_MASTER, to the master): nothing is left to read
    again = run_hastore("consume", "--bootstrap", slave.client_address, "--topic", "orders", "--group", "g",
                        "--idle-ms", "1500", env=AUTH)
    assert again.returncode == 0 and "consumed 0 messages" in again.stderr, again.stderr
