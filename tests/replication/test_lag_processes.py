"""Lag status between node processes: a SIGSTOPped slave is judged STALLED (or FALLING_BEHIND)
while the master takes writes, and OK or CATCHING_UP after SIGCONT; the samples reach the
master's lag_history_path file, ``hastore lag history --json`` and a ``lag chart`` PNG."""

from __future__ import annotations

import json
import os
import signal

import pytest
import trio
from click.testing import CliRunner

from node.client import OutgoingMessage, open_producer
from node.client.lag import lag_command
from node.cluster.process import NodeProcess, free_port

from test_node_processes import SECRET, settings, status_of

pytestmark = [pytest.mark.trio, pytest.mark.integration]   # node processes replicating over real sockets

LOAD_SECONDS_MAX = 120
PAUSED = {"STALLED", "FALLING_BEHIND"}
RECOVERED = {"OK", "CATCHING_UP"}


async def keep_writing(address: str, stop: trio.Event, sent: list[int]) -> None:
    """A batch every 100 ms until ``stop`` (at most LOAD_SECONDS_MAX)."""
    with trio.move_on_after(LOAD_SECONDS_MAX):
        async with open_producer(address, secret=SECRET) as producer:
            while not stop.is_set():
                results = await producer.send_batch("lag", [OutgoingMessage(b"y" * 300) for _ in range(20)])
                assert all(r.ok for r in results), {r.status for r in results}
                sent[0] += len(results)
                await trio.sleep(0.1)


async def wait_lag_status(address: str, wanted: set[str], timeout_s: float = 40) -> list[str]:
    """The slave's lag statuses seen until one in ``wanted`` (every half second; none
    before the slave has connected)."""
    seen: list[str] = []
    with trio.move_on_after(timeout_s):
        while True:
            slaves = (await status_of(address))["replication"]["slaves"]
            assert len(slaves) <= 1, slaves
            if slaves:   # none until the slave process has connected
                seen.append(slaves[0]["lag_status"])
                if seen[-1] in wanted:
                    return seen
            await trio.sleep(0.5)
    raise AssertionError(f"no lag status in {sorted(wanted)} within {timeout_s} s; seen {seen}")


async def test_a_paused_slave_stalls_and_recovers_and_the_history_shows_it(tmp_path):
    history_path = tmp_path / "a-lag.jsonl"
    # async replication, so the master keeps taking writes while the slave is stopped; a long
    # HA timeout keeps the stopped slave connected (else it is dropped and judged OFFLINE)
    common = dict(replication="async", min_in_sync_replicas=1, ha_connection_timeout_ms=60_000,
                  ha_max_time_slave_not_catchup_ms=3_000)
    master_ha = free_port()
    with NodeProcess.start(str(tmp_path / "a"), settings("a", master_ha, lag_history_path=str(history_path),
                                                         **common)) as master:
        with NodeProcess.start(str(tmp_path / "b"), settings(
                "b", free_port(), role="slave", master_ha_address=f"127.0.0.1:{master_ha}",
                master_client_address=master.client_address, **common)) as slave:
            stop, sent = trio.Event(), [0]
            async with trio.open_nursery() as nursery:
                nursery.start_soon(keep_writing, master.client_address, stop, sent)
                await wait_lag_status(master.client_address, {"OK"})
                os.kill(slave.pid, signal.SIGSTOP)
                try:
                    paused = await wait_lag_status(master.client_address, PAUSED)
                finally:
                    os.kill(slave.pid, signal.SIGCONT)
                recovered = await wait_lag_status(master.client_address, RECOVERED)
                stop.set()
            assert sent[0] > 0 and paused[-1] in PAUSED and recovered[-1] in RECOVERED, (paused, recovered)
            metrics = await trio.to_thread.run_sync(_scrape, master)
            assert 'hastore_replication_slave_status{node="a",slave="b",status="OFFLINE"} 0.0' in metrics
            assert 'hastore_replication_slave_lag_seconds{node="a",slave="b"}' in metrics

            runner = CliRunner()
            base = ["--bootstrap", master.client_address, "--secret", SECRET, "--since", "5m"]
            shown = await trio.to_thread.run_sync(runner.invoke, lag_command, ["history", *base, "--json"])
            assert shown.exit_code == 0, shown.output
            samples = json.loads(shown.output)["samples"]
            acks = [s["ack_offset"] for s in samples]
            # the pause shows as an ack offset that stood still over several samples with lag
            assert any(a == b == c and s["lag_bytes"] > 0 for a, b, c, s in zip(acks, acks[1:], acks[2:], samples[2:]))
            out = tmp_path / "lag.png"
            drawn = await trio.to_thread.run_sync(runner.invoke, lag_command, ["chart", *base, "--out", str(out)])
            assert drawn.exit_code == 0, drawn.output
            assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    written = [json.loads(line) for line in history_path.read_text().splitlines()]
    assert len(written) >= len(samples) - 2 and {line["slave"] for line in written} == {"b"}


def _scrape(node: NodeProcess) -> str:
    import urllib.request
    with urllib.request.urlopen(f"http://{node.ready['metrics_address']}/metrics", timeout=10) as response:
        return response.read().decode()
