"""hastore pipeline lag reads the JSON lines a node writes with lag_history_path (pure: no Spark)."""

from __future__ import annotations

import json

from pipeline.history_jobs import lag_samples
from replication.lag_history import LagSample


def test_a_lag_history_line_is_one_sample_of_its_slave():
    sample = LagSample(time_s=12.5, slave="g1-n2", master="g1-n1", epoch=3, ack_offset=100, master_offset=400,
                       lag_bytes=300, lag_s=0.25, in_sync=True, connected=True, rate_bytes_per_s=10.0)
    line = json.dumps({"group": "g1", **sample.to_dict()})
    assert lag_samples(line, 0, 1000) == [(12.5, "g1-n2", 300, 250, None)]


def test_a_lag_json_status_without_slaves_still_gives_no_sample():
    assert lag_samples(json.dumps({"node": "n1", "replication": {"role": "master", "slaves": []},
                                   "master": None}), 0, 1000) == []
