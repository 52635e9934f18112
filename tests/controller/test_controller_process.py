"""The controller and an agent as real processes: ``hastore controller start|status`` and kill -9."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner
from controller_fakes import SESSION_TIMEOUT_MS, Harness, wait_until

from controller.cli import controller_group

pytestmark = pytest.mark.integration   # ZooKeeper, controller and agent processes

HERE = os.path.dirname(os.path.abspath(__file__))
HASTORE = os.path.join(os.path.dirname(sys.executable), "hastore")


@pytest.fixture
def harness(zk_server, cluster):
    h = Harness(zk_server.hosts, cluster, SESSION_TIMEOUT_MS)
    yield h
    h.close()


def spawn(args) -> subprocess.Popen:
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(process: subprocess.Popen) -> tuple[str, str]:
    if process.poll() is None:
        process.kill()
    return process.communicate(timeout=10)


def test_controller_command_runs_until_sigterm_and_status_reports(harness, zk_server, cluster):
    process = spawn([HASTORE, "controller", "start", "--zk", zk_server.hosts, "--cluster", cluster,
                     "--session-timeout-ms", str(SESSION_TIMEOUT_MS), "--id", "proc-controller"])
    try:
        a = harness.node("a", max_offset=10)
        a.wait_for(lambda n: n.role == "master" and n.epoch == 1, 20, "master, elected by the process")
        b = harness.node("b", max_offset=5, epoch=1)
        b.wait_for(lambda n: n.master_id == "a", 10, "a's slave")
        result = CliRunner().invoke(controller_group, ["status", "--zk", zk_server.hosts, "--cluster", cluster,
                                                       "--json"])
        assert result.exit_code == 0, result.output
        report = json.loads(result.output)
        assert report["active_controller"] == "proc-controller"
        group = report["groups"]["g1"]
        assert group["has_master"] and group["master"]["node_id"] == "a" and group["epoch"] == 1
        assert group["sync_state_set"] == ["a"] and sorted(group["live_nodes"]) == ["a", "b"]
        harness.stop(a)               # b is not in the sync-state set: no master, and status says why
        wait_until(lambda: "no live member" in (CliRunner().invoke(controller_group, [
            "status", "--zk", zk_server.hosts, "--cluster", cluster]).output), 10, "no-master status")
        text = CliRunner().invoke(controller_group, ["status", "--zk", zk_server.hosts, "--cluster", cluster]).output
        assert "group g1: NO MASTER: master a of epoch 1 is not live" in text
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=15) == 0
    finally:
        out, err = finish(process)
    assert "stopped" in err, err


def test_kill_9_of_the_master_to_first_acked_write_within_session_timeout_plus_1s(harness, zk_server, cluster):
    harness.controller()
    process = spawn([sys.executable, os.path.join(HERE, "agent_process.py"), zk_server.hosts, cluster, "g1", "a",
                     str(SESSION_TIMEOUT_MS), "a,b"])
    try:
        line = process.stdout.readline()
        assert line.startswith("MASTER 1"), (line, finish(process))
        b = harness.node("b", max_offset=10, epoch=1)
        b.wait_for(lambda n: n.master_id == "a", 10, "a's slave")
        killed = time.monotonic()
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=5)
        wait_until(b.write, SESSION_TIMEOUT_MS / 1000 + 1.0, "first acked write on the new master")
        took = time.monotonic() - killed
        assert b.epoch == 2
        # the session expires after its timeout, not before: the old master had all that time to fence
        assert took > SESSION_TIMEOUT_MS / 1000 * 0.5, took
    finally:
        finish(process)
