"""The hastore source's and sink's pure parts: options, offsets JSON, limit sharing, the
retry bound, rows to Arrow (no Spark session, no cluster)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from node.client import ReceivedMessage
from pipeline.cluster_access import MasterUnavailableError, retrying, target_from_options
from pipeline.errors import OptionError
from pipeline.stream_reads import QueueRange, arrow_schema, messages_batch, pack_ranges, share_limit
from pipeline.stream_source import offsets_from_json, offsets_to_json, parse_starting_offsets, stream_settings


def test_starting_offsets_earliest_latest_and_json_per_queue():
    assert parse_starting_offsets("") == "earliest"
    assert parse_starting_offsets("LATEST") == "latest"
    assert parse_starting_offsets('{"orders": {"0": 12, "3": -2}, "audit": {"1": -1}}') == {
        "orders": {0: 12, 3: -2}, "audit": {1: -1}}
    for bad in ("newest", '{"orders": 3}', '{"orders": {"x": 1}}', '{"orders": {"0": -3}}', '{"o": {"0": true}}'):
        with pytest.raises(OptionError, match="startingOffsets"):
            parse_starting_offsets(bad)


def test_offsets_json_round_trip_is_sorted_with_string_queue_ids():
    offsets = {"b": {10: 5, 2: 7}, "a": {0: 0}}
    as_json = offsets_to_json(offsets)
    assert list(as_json) == ["a", "b"] and list(as_json["b"]) == ["2", "10"]
    assert offsets_from_json(as_json) == offsets


def test_target_needs_exactly_one_of_bootstrap_and_zk():
    with pytest.raises(OptionError, match="exactly one"):
        target_from_options({})
    with pytest.raises(OptionError, match="exactly one"):
        target_from_options({"bootstrap": "127.0.0.1:1", "zk": "127.0.0.1:2"})
    with pytest.raises(OptionError, match="host:port"):
        target_from_options({"bootstrap": "nohost"})
    target = target_from_options({"zk": "127.0.0.1:2181", "cluster": "c1", "group": "g2", "failoverTimeoutMs": "500"})
    assert (target.zk, target.cluster, target.group, target.failover_timeout_ms) == ("127.0.0.1:2181", "c1", "g2", 500)
    assert target_from_options({"bootstrap": "127.0.0.1:1, 127.0.0.1:2"}).bootstrap == ("127.0.0.1:1", "127.0.0.1:2")


def test_stream_settings_check_their_options():
    base = {"bootstrap": "127.0.0.1:1"}
    with pytest.raises(OptionError, match="topics"):
        stream_settings(base)
    with pytest.raises(OptionError, match="maxOffsetsPerTrigger"):
        stream_settings({**base, "topics": "t", "maxOffsetsPerTrigger": "0"})
    with pytest.raises(OptionError, match="failOnDataLoss"):
        stream_settings({**base, "topics": "t", "failOnDataLoss": "maybe"})
    settings = stream_settings({**base, "topics": "a, b", "maxOffsetsPerTrigger": "100", "failOnDataLoss": "false"})
    assert settings.topics == ("a", "b") and settings.max_per_trigger == 100 and not settings.fail_on_data_loss


def test_limit_is_shared_in_proportion_and_always_moves():
    starts = {("t", 0): 0, ("t", 1): 10, ("t", 2): 5}
    highs = {("t", 0): 100, ("t", 1): 40, ("t", 2): 5}
    assert share_limit(starts, highs, None) == highs
    assert share_limit(starts, highs, 1000) == highs
    ends = share_limit(starts, highs, 13)         # 100 and 30 waiting: 10 and 3
    assert ends == {("t", 0): 10, ("t", 1): 13, ("t", 2): 5}
    assert sum(ends[k] - starts[k] for k in ends) <= 13
    tiny = share_limit({("t", 0): 0, ("t", 1): 0}, {("t", 0): 3, ("t", 1): 5}, 1)
    assert tiny == {("t", 0): 0, ("t", 1): 1}


def test_retrying_gives_up_after_the_failover_timeout_with_the_last_error():
    target = target_from_options({"bootstrap": "127.0.0.1:1", "failoverTimeoutMs": "1000"})
    now = [0.0]
    calls = []

    def failing():
        calls.append(now[0])
        raise ConnectionError(f"down at {now[0]:.2f}")
    with pytest.raises(MasterUnavailableError, match="down at"):
        retrying(target, failing, (OSError,), "reading", clock=lambda: now[0],
                 sleep=lambda s: now.__setitem__(0, now[0] + s))
    assert len(calls) > 3 and now[0] == pytest.approx(1.0)
    answers = iter([OSError("once"), "ok"])

    def flaky():
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer
    assert retrying(target, flaky, (OSError,), "reading", sleep=lambda s: None) == "ok"


def test_messages_become_one_arrow_batch_without_the_store_crc_property():
    message = ReceivedMessage("orders", 2, 7, 4096, "ID", b"hello", {"KEYS": "a b", "TAGS": "red", "UNIQ_KEY": "U1",
                                                                     "__CRC32#": "123", "x": "y"},
                              1_700_000_000_000, 1_700_000_000_005, "127.0.0.1:1", "127.0.0.1:2", 3)
    batch = messages_batch("g1", [message])
    assert batch.schema == arrow_schema()
    row = batch.to_pylist()[0]
    assert (row["group"], row["topic"], row["queue_id"], row["queue_offset"], row["body"]) == ("g1", "orders", 2, 7,
                                                                                                 b"hello")
    assert row["keys"] == ["a", "b"] and row["tags"] == "red" and row["uniq_key"] == "U1"
    assert dict(row["properties"]) == {"KEYS": "a b", "TAGS": "red", "UNIQ_KEY": "U1", "x": "y"}
    assert batch.column("store_timestamp").cast(pa.int64())[0].as_py() == 1_700_000_000_005_000


def test_queue_ranges_are_packed_into_few_partitions_each_range_whole():
    ranges = [QueueRange("t", q, 0, size) for q, size in enumerate((5, 30, 10, 20))] + [QueueRange("a", 0, 7, 9)]
    assert pack_ranges([], None, 100) == []
    small = pack_ranges(ranges, None, 1000)            # 67 messages: one task reads every range
    assert small == [(QueueRange("a", 0, 7, 9),) + tuple(r for r in ranges if r.topic == "t")]
    for max_partitions, rows in ((None, 1), (3, 1), (2, 20), (None, 30)):
        packed = pack_ranges(ranges, max_partitions, rows)
        key = lambda r: (r.topic, r.queue_id)      # noqa: E731
        assert sorted((r for p in packed for r in p), key=key) == sorted(ranges, key=key)   # each once, whole
        assert len(packed) == min(len(ranges), -(-67 // rows), max_partitions or len(ranges))
        assert all(list(p) == sorted(p, key=key) for p in packed)
    loads = sorted(sum(r.end - r.start for r in p) for p in pack_ranges(ranges, 2, 1))
    assert loads == [32, 35]                          # the largest first, each to the lightest partition


def test_stream_settings_partition_options():
    base = {"bootstrap": "127.0.0.1:1", "topics": "t"}
    assert stream_settings(base).max_partitions is None
    settings = stream_settings({**base, "maxPartitions": "2", "rowsPerPartition": "500"})
    assert (settings.max_partitions, settings.rows_per_partition) == (2, 500)
    for name in ("maxPartitions", "rowsPerPartition"):
        with pytest.raises(OptionError, match=name):
            stream_settings({**base, name: "0"})


def test_zk_without_group_routes_topics_and_keys_offsets_by_group():
    routed = target_from_options({"zk": "127.0.0.1:2181"})
    assert routed.routed and routed.group is None and "routes" in routed.describe()
    assert routed.for_group("g2").group == "g2" and not routed.for_group("g2").routed
    assert not target_from_options({"zk": "127.0.0.1:2181", "group": "g3"}).routed
    assert target_from_options({"bootstrap": "127.0.0.1:1"}).group == "g1"
    offsets = {"orders": {("g2", 1): 7, ("g1", 0): 5, ("g1", 10): 2}}
    as_json = offsets_to_json(offsets)
    assert list(as_json["orders"]) == ["g1/0", "g1/10", "g2/1"]
    assert offsets_from_json(as_json) == offsets
    assert parse_starting_offsets('{"orders": {"g2/1": 4, "g1/0": -2}}') == {"orders": {("g2", 1): 4, ("g1", 0): -2}}
    with pytest.raises(OptionError, match="startingOffsets"):
        parse_starting_offsets('{"orders": {"g2/x": 4}}')
