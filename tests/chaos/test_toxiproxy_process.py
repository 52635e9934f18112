"""``hastore chaos toxiproxy serve`` and ``hastore bench toxiproxy`` as processes: the server
reports its port, serves the toxiproxy-python wrapper, stops cleanly on SIGTERM and SIGINT,
and says what to do when its port is taken; the bench runs small and reports its figures."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from chaos.toxiproxy import ToxiproxyClient, toxiproxy_in_thread, toxiproxy_subprocess

pytestmark = pytest.mark.integration
HASTORE = [sys.executable, "-c", "from node.cli import main; main()"]


def start_serve(*arguments: str) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen([*HASTORE, "chaos", "toxiproxy", "serve", "--port", "0", *arguments],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = process.stdout.readline()
    assert "listening on http://127.0.0.1:" in line, (line, process.stderr.read() if process.poll() else "")
    return process, line.split()[-1]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_serve_stops_cleanly_on_signal(signum):
    process, url = start_serve()
    try:
        client = ToxiproxyClient(url, timeout_s=5)
        assert client.version().startswith("2.")
        client.create_proxy("p", "127.0.0.1:9", listen="127.0.0.1:0")
        process.send_signal(signum)
        assert process.wait(15) == 0
        assert "stopping" in process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stdout.close()
        process.stderr.close()


def test_serve_on_a_taken_port_says_so():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run([*HASTORE, "chaos", "toxiproxy", "serve", "--port", str(port)],
                                capture_output=True, text=True, timeout=30)
    assert result.returncode == 1
    assert "pick another --port" in result.stderr


def test_serve_help_explains():
    result = subprocess.run([*HASTORE, "chaos", "toxiproxy", "serve", "--help"], capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 0 and "--port" in result.stdout and "SIGTERM" in result.stdout


def test_subprocess_and_thread_runners_give_working_servers():
    with toxiproxy_subprocess() as url:
        assert ToxiproxyClient(url).version().startswith("2.")
    with pytest.raises(Exception):
        ToxiproxyClient(url, timeout_s=1).version()  # stopped with the block
    with toxiproxy_in_thread() as url:
        assert ToxiproxyClient(url).proxies() == {}


@pytest.mark.skipif(bool(os.environ.get("TOXIPROXY_URL")), reason="the bench would use the real server")
def test_bench_runs_small():
    result = subprocess.run([*HASTORE, "bench", "toxiproxy", "--runs", "1", "--samples", "200", "--transfer-mb", "2",
                             "--json"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["runs"] == 1
    assert report["round_trip_us"]["proxy"]["p50"] > 0 and report["round_trip_us"]["direct"]["p50"] > 0
    assert report["throughput_mb_s"]["proxy"] > 0 and report["throughput_mb_s"]["ratio"] > 0
