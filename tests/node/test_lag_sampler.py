"""The node's lag sampler (node/server/lag_sampler.py): samples a master's replication status
every interval into the history and a JSON lines file, answers LAG_HISTORY, adds each
slave's lag status to the status section and the metrics. Autojump clock, a fake status."""

from __future__ import annotations

import json

import pytest
import trio

from node.errors import RequestError
from node.server.lag_sampler import LagJournal, LagSampler, serve_lag_sampler
from node.server.metrics import NodeMetrics
from node.wire.protocol import Fields
from replication.lag_history import LagHistory, LagSample


class FakeMaster:
    """A replication status section whose slave "s" stops acking at ``stall_at_s``."""

    def __init__(self, stall_at_s: float) -> None:
        self.stall_at_s = stall_at_s
        self.role = "master"

    def __call__(self) -> dict:
        now = trio.current_time()
        master_offset = int(now * 1_000)
        ack = master_offset if now < self.stall_at_s else int(self.stall_at_s * 1_000)
        if self.role != "master":
            return {"role": "slave", "epoch": 1, "max_offset": master_offset}
        return {"role": "master", "epoch": 1, "max_offset": master_offset, "confirm_offset": ack,
                "sync_state_set": ["m", "s"], "slaves": [
                    {"node_id": "s", "address": "127.0.0.1:1", "connected": True, "ack_offset": ack,
                     "lag_bytes": master_offset - ack, "lag_ms": 0 if ack == master_offset else 800,
                     "in_sync": True, "rate_bytes_per_s": 1_000.0, "last_ack_age_ms": 0}]}


@pytest.mark.trio
async def test_samples_go_to_the_history_the_reply_the_status_and_metrics(autojump_clock):
    status = FakeMaster(stall_at_s=6.0)
    sampler = LagSampler("m", "g1", status, LagHistory(trio.current_time))
    metrics = NodeMetrics("m")
    metrics.watch_replication(sampler.replication_status)
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_lag_sampler, sampler)
        await trio.sleep(4.5)
        assert sampler.replication_status()["slaves"][0]["lag_status"] == "OK"
        await trio.sleep(5)   # stalled at 6 s: its ack stays while the master's offset grows
        section = sampler.replication_status()
        assert section["slaves"][0]["lag_status"] == "STALLED"
        rendered = metrics.render().decode()
        assert 'hastore_replication_slave_status{node="m",slave="s",status="STALLED"} 1.0' in rendered
        assert 'hastore_replication_slave_status{node="m",slave="s",status="OK"} 0.0' in rendered
        assert 'hastore_replication_slave_lag_seconds{node="m",slave="s"} 0.8' in rendered
        reply = sampler.lag_history_reply(Fields({"since_ms": 7_000}))
        status.role = "slave"   # stepped down: nothing more is sampled
        await trio.sleep(3)
        nursery.cancel_scope.cancel()
    assert reply["node_id"] == "m" and reply["group"] == "g1" and reply["statuses"] == {"s": "STALLED"}
    times = [s["time_s"] for s in reply["samples"]]
    assert times == sorted(times) and times[0] >= 7.0 and len(times) == 3 and not reply["truncated"]
    assert len(sampler.history.samples("s")) == 10   # 0..9 s, none after the step down


@pytest.mark.trio
async def test_the_status_section_judges_each_slave_with_its_view_now(autojump_clock):
    status = FakeMaster(stall_at_s=1_000.0)
    connected = {"now": False}

    def view() -> dict:
        section = status()
        section["slaves"][0]["connected"] = connected["now"]
        return section
    sampler = LagSampler("m", "g1", view, LagHistory(trio.current_time))
    for _ in range(3):   # sampled while the slave was away
        sampler.sample()
        await trio.sleep(1)
    connected["now"] = True   # back, caught up, between two samples
    assert sampler.history.status("s").value == "OFFLINE"
    assert sampler.replication_status()["slaves"][0]["lag_status"] == "OK"
    connected["now"] = False
    assert sampler.replication_status()["slaves"][0]["lag_status"] == "OFFLINE"


@pytest.mark.trio
async def test_a_master_appends_its_samples_to_the_journal(tmp_path):
    # no autojump clock here: the journal is written in a worker thread, while which an
    # autojump clock would move on
    path = tmp_path / "lag" / "history.jsonl"
    status = FakeMaster(stall_at_s=100.0)
    sampler = LagSampler("m", "g1", status, LagHistory(trio.current_time), journal=LagJournal(str(path), "g1"))
    for _ in range(3):
        await sampler.write_journal(sampler.sample())
    status.role = "slave"
    await sampler.write_journal(sampler.sample())
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [LagSample.from_dict(line) for line in lines] == sampler.history.samples("s")
    assert len(lines) == 3 and {line["group"] for line in lines} == {"g1"}


@pytest.mark.trio
async def test_the_reply_is_bounded_and_checks_its_fields(autojump_clock):
    sampler = LagSampler("m", "g1", FakeMaster(stall_at_s=100.0), LagHistory(trio.current_time))
    for _ in range(30):
        sampler.sample()
        await trio.sleep(1)
    reply = sampler.lag_history_reply(Fields({"max_count": 5, "slave": "s"}))
    assert reply["truncated"] and [s["time_s"] for s in reply["samples"]] == [25.0, 26.0, 27.0, 28.0, 29.0]
    assert sampler.lag_history_reply(Fields({"slave": "nobody"}))["samples"] == []
    with pytest.raises(RequestError, match="since_ms"):
        sampler.lag_history_reply(Fields({"since_ms": -1}))


def test_the_journal_rotates_past_its_size(tmp_path):
    path = tmp_path / "h.jsonl"
    journal = LagJournal(str(path), "g1", bytes_max=1_000)
    sample = LagSample(time_s=1.0, slave="s", master="m", epoch=1, ack_offset=1, master_offset=2, lag_bytes=1,
                       lag_s=0.0, in_sync=True, connected=True, rate_bytes_per_s=0.0)
    for _ in range(12):
        journal.write([sample])
    assert (tmp_path / "h.jsonl.1").exists()
    assert path.stat().st_size <= 1_000 and (tmp_path / "h.jsonl.1").stat().st_size <= 1_000
