"""ZooKeeperServer: start, serve, stop, restart with data kept, logs."""

from __future__ import annotations

import os

import pytest
from kazoo.client import KazooClient

from controller import ZooKeeperServer, ZooKeeperServerError

pytestmark = pytest.mark.integration   # starts ZooKeeper servers


def test_start_stop_restart_keeps_data_and_port(tmp_path):
    server = ZooKeeperServer(tmp_path / "zk", tick_ms=200, die_with_parent=True)
    with server:
        assert server.running and server.hosts.startswith("127.0.0.1:")
        assert "Mode: standalone" in server.four_letter_word("srvr")
        assert server.four_letter_word("ruok") == "imok"
        client = KazooClient(hosts=server.hosts, timeout=5)
        client.start(timeout=10)
        client.create("/kept", b"value", makepath=True)
        client.stop()
        client.close()
        port, pid = server.port, server.pid
        server.stop()
        assert not server.running and server.pid is None
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        server.start()
        assert server.port == port
        client = KazooClient(hosts=server.hosts, timeout=5)
        client.start(timeout=10)
        assert client.get("/kept")[0] == b"value"
        client.stop()
        client.close()
        assert "binding to port" in server.log_tail(500).lower() or "clientPortAddress" in server.log_tail(500)
    assert not server.running


def test_a_server_that_cannot_start_says_why(tmp_path, zk_server):
    taken = ZooKeeperServer(tmp_path / "zk", port=zk_server.port, tick_ms=200, start_timeout_s=10,
                            die_with_parent=True)
    with pytest.raises(ZooKeeperServerError, match="exited|did not serve") as raised:
        taken.start()
    assert not taken.running
    assert "zookeeper.log" in str(raised.value) or "stdout.log" in str(raised.value)
