"""``hastore lag`` history, chart and watch against a master and a slave in this process, and
the pieces of the command that need no node (--since, sparklines, files)."""

from __future__ import annotations

import json

import click
import pytest
import trio
from click.testing import CliRunner

from node.client import OutgoingMessage, open_admin, open_producer
from node.client.lag import lag_command, parse_since, sparkline
from node.server.node import serve_node
from replication.lag_history import LagSample

from replication_helpers import wait_until
from test_nodes import node_config

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_since_takes_durations_iso_times_and_all():
    assert parse_since("10m", 1_000.0) == 400.0
    assert parse_since("90s", 1_000.0) == 910.0 and parse_since("30", 1_000.0) == 970.0
    assert parse_since("1h", 10_000.0) == 6_400.0
    assert parse_since("all", 5.0) is None
    assert parse_since("1970-01-01T00:01:00", 0.0) == 60.0
    with pytest.raises(click.BadParameter, match="duration"):
        parse_since("yesterday", 0.0)


def test_a_sparkline_scales_to_its_maximum():
    assert sparkline([0, 4, 8]) == "▁▅█"
    assert sparkline([0, 0]) == "▁▁"
    assert len(sparkline(list(range(100)), width=30)) == 30


def test_chart_and_history_read_files_a_node_wrote(tmp_path):
    path = tmp_path / "n1.jsonl"
    lines = []
    for i in range(20):
        master, epoch = ("n1", 1) if i < 10 else ("n2", 2)
        slave = "n2" if master == "n1" else "n1"
        lines.append(json.dumps({"group": "g1", **LagSample(
            time_s=1_700_000_000.0 + i, slave=slave, master=master, epoch=epoch, ack_offset=i * 100,
            master_offset=i * 100 + (i % 10) * 50, lag_bytes=(i % 10) * 50, lag_s=(i % 10) / 10, in_sync=i % 10 < 5,
            connected=True, rate_bytes_per_s=100.0).to_dict()}))
    path.write_text("\n".join(lines) + "\n")
    runner = CliRunner()
    shown = runner.invoke(lag_command, ["history", "--from-file", str(path), "--since", "all", "--json"])
    assert shown.exit_code == 0, shown.output
    history = json.loads(shown.output)
    assert len(history["samples"]) == 20
    assert [e["kind"] for e in history["events"]] == ["out_of_sync", "failover", "out_of_sync"]
    out = tmp_path / "lag.png"
    drawn = runner.invoke(lag_command, ["chart", "--from-file", str(path), "--since", "all", "--out", str(out)])
    assert drawn.exit_code == 0, drawn.output
    assert out.read_bytes()[:8] == PNG_MAGIC and json.loads(drawn.output)["failovers"] == 1
    (tmp_path / "bad.jsonl").write_text('{"time_s": 1}\n')
    refused = runner.invoke(lag_command, ["history", "--from-file", str(tmp_path / "bad.jsonl")])
    assert refused.exit_code == 1 and "bad.jsonl:1: not a lag sample" in refused.output


@pytest.mark.trio
async def test_history_chart_and_watch_of_a_master_and_a_slave(tmp_path):
    changes = dict(replication="async", min_in_sync_replicas=1)
    async with trio.open_nursery() as nursery:
        master = await nursery.start(serve_node, node_config(tmp_path, "a", **changes))
        await nursery.start(serve_node, node_config(
            tmp_path, "b", role="slave", master_ha_address=master.ha_address,
            master_client_address=master.client_address, **changes))
        async with open_producer(master.client_address, secret="s3cret") as producer:
            for round_ in range(3):
                sent = await producer.send_batch("t", [OutgoingMessage(b"x" * 500) for _ in range(50)])
                assert all(r.ok for r in sent)
                await trio.sleep(1.1)
        async with open_admin(master.client_address, secret="s3cret") as admin:
            await wait_until(lambda: master.ha.status()["slaves"][0]["lag_bytes"] == 0, what="b caught up")
            with trio.fail_after(20):
                while len((await admin.lag_history())["samples"]) < 4:
                    await trio.sleep(0.2)
            status = await admin.status()
        (slave,) = status["replication"]["slaves"]
        assert slave["lag_status"] in ("OK", "CATCHING_UP")
        runner = CliRunner()
        base = ["--bootstrap", master.client_address, "--secret", "s3cret"]
        shown = await trio.to_thread.run_sync(runner.invoke, lag_command, ["history", *base, "--json"])
        assert shown.exit_code == 0, shown.output
        history = json.loads(shown.output)
        assert {s["slave"] for s in history["samples"]} == {"b"} and history["statuses"]["node"] == "a"
        out = tmp_path / "lag.png"
        drawn = await trio.to_thread.run_sync(runner.invoke, lag_command, ["chart", *base, "--out", str(out)])
        assert drawn.exit_code == 0, drawn.output
        assert out.read_bytes()[:8] == PNG_MAGIC
        table = await trio.to_thread.run_sync(runner.invoke, lag_command,
                                              [*base, "--watch", "--iterations", "2", "--interval-ms", "50"])
        assert table.exit_code == 0, table.output
        assert table.output.count("LAG (last 60 s)") == 2 and "▁" in table.output
        text = await trio.to_thread.run_sync(runner.invoke, lag_command, ["history", *base, "--since", "5m"])
        assert text.exit_code == 0 and "samples of 1 slaves" in text.output, text.output
        nursery.cancel_scope.cancel()
