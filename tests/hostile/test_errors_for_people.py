"""Errors for people: each way a node or a client command is commonly misused ends with one
clear line on stderr, no traceback, and a non-zero exit (real processes)."""

from __future__ import annotations

import socket

import pytest

from hostile_helpers import NodeProcess, run_hastore, write_config

pytestmark = pytest.mark.integration


def _one_clear_line(result, *words: str) -> str:
    assert result.returncode != 0, result
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, result.stderr
    for word in words:
        assert word in errors[0], errors[0]
    return errors[0]


def test_a_port_in_use(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = "127.0.0.1:%d" % taken.getsockname()[1]
        config = write_config(tmp_path, client_address=address)
        _one_clear_line(run_hastore("node", "start", "--config", str(config)), address, "in use")


def test_a_store_path_that_is_a_file(tmp_path):
    (tmp_path / "afile").write_text("x")
    config = write_config(tmp_path, store_path=str(tmp_path / "afile"))
    _one_clear_line(run_hastore("node", "start", "--config", str(config)), "is a file")


def test_a_store_path_that_cannot_be_written(tmp_path):
    config = write_config(tmp_path, store_path="/proc/hastore-store")
    _one_clear_line(run_hastore("node", "start", "--config", str(config)), "/proc/hastore-store", "cannot be written")


def test_zookeeper_unreachable(tmp_path):
    config = write_config(tmp_path, zk_hosts="127.0.0.1:1", zk_session_timeout_ms=2000)
    _one_clear_line(run_hastore("node", "start", "--config", str(config), timeout_s=120), "ZooKeeper", "zk_hosts")


def test_a_typo_in_an_address():
    for command in (["status"], ["topic", "list"], ["produce", "--topic", "t", "x"]):
        _one_clear_line(run_hastore(*command, "--bootstrap", "127.0.0.1"), "host:port")


def test_the_client_pointed_at_the_ha_port_and_the_help(tmp_path):
    node = NodeProcess(write_config(tmp_path))
    try:
        status = run_hastore("status", "--bootstrap", node.client_address, "--json")
        assert status.returncode == 0, status.stderr
        import json
        ha_address = json.loads(status.stdout)["ha_address"]
        line = _one_clear_line(run_hastore("status", "--bootstrap", ha_address), "client port")
        assert "CODE_None" not in line
        produced = run_hastore("produce", "--bootstrap", ha_address, "--topic", "t", "x")
        assert "0 unknown" in produced.stdout and "client port" in produced.stdout
    finally:
        node.stop()
    assert "commit log segments of 64 MiB" in node.stderr() and str(tmp_path / "store") in node.stderr()
    help_text = run_hastore("node", "start", "--help").stdout
    assert "connection_reply_bytes_max" in help_text and "idle_timeout_ms" in help_text
