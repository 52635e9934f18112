"""The lag history and its per-slave status (replication/lag_history.py): pure, clock passed in."""

from __future__ import annotations

import pytest

from replication.lag_history import (MIN_TREND_SAMPLES, OFFLINE_AFTER_INTERVALS, STALL_SAMPLES, WINDOW_SAMPLES,
                                     LagEvent, LagHistory, LagHistoryError, LagSample, LagStatus, evaluate,
                                     lag_events, samples_from_status)

from replication_helpers import ManualClock


def sample(time_s: float, ack: int, master_offset: int, *, slave: str = "n2", master: str = "n1", epoch: int = 1,
           connected: bool = True, in_sync: bool = True) -> LagSample:
    return LagSample(time_s=time_s, slave=slave, master=master, epoch=epoch, ack_offset=ack,
                     master_offset=master_offset, lag_bytes=max(0, master_offset - ack), lag_s=0.5,
                     in_sync=in_sync, connected=connected, rate_bytes_per_s=0.0)


def series(acks: list[int], masters: list[int], start: float = 0.0, **kw) -> list[LagSample]:
    return [sample(start + i, ack, m, **kw) for i, (ack, m) in enumerate(zip(acks, masters))]


def status_of(samples: list[LagSample]) -> LagStatus:
    return evaluate(samples, samples[-1].time_s if samples else 0.0, 1.0)


# --- the rules ---------------------------------------------------------------------------
def test_no_sample_is_offline():
    assert evaluate([], 10.0, 1.0) is LagStatus.OFFLINE


def test_a_disconnected_slave_is_offline_whatever_its_lag():
    samples = series([100] * 5, [100] * 5)
    samples.append(sample(5, 100, 100, connected=False))
    assert status_of(samples) is LagStatus.OFFLINE


def test_no_recent_sample_is_offline():
    samples = series([100] * 5, [100] * 5)
    newest = samples[-1].time_s
    assert evaluate(samples, newest + OFFLINE_AFTER_INTERVALS, 1.0) is LagStatus.OK
    assert evaluate(samples, newest + OFFLINE_AFTER_INTERVALS + 0.1, 1.0) is LagStatus.OFFLINE


def test_a_slave_at_the_master_offset_is_ok():
    assert status_of(series([100, 200, 300], [100, 200, 300])) is LagStatus.OK


def test_ack_still_while_the_master_writes_is_stalled():
    acks = [100, 200, 300, 300, 300]
    masters = [100, 200, 400, 500, 600]
    assert status_of(series(acks, masters)) is LagStatus.STALLED


def test_ack_still_with_a_fixed_lag_is_stalled_too():
    # the master has bytes the slave does not take, even though nothing new arrives
    assert status_of(series([100] * 4, [500] * 4)) is LagStatus.STALLED


def test_stall_needs_as_many_samples_as_stall_samples():
    acks = [100, 200] + [300] * (STALL_SAMPLES - 1)
    masters = [100, 200] + [400 + i for i in range(STALL_SAMPLES - 1)]
    assert status_of(series(acks, masters)) is not LagStatus.STALLED


def test_lag_growing_at_every_step_while_acks_move_is_falling_behind():
    acks = [i * 100 for i in range(WINDOW_SAMPLES)]
    masters = [i * 150 + 10 for i in range(WINDOW_SAMPLES)]
    assert status_of(series(acks, masters)) is LagStatus.FALLING_BEHIND


def test_lag_that_fell_once_in_the_window_is_not_falling_behind():
    acks = [i * 100 for i in range(WINDOW_SAMPLES)]
    masters = [i * 150 + 10 for i in range(WINDOW_SAMPLES)]
    masters[5] = acks[5] + 1   # one dip
    assert status_of(series(acks, masters)) is not LagStatus.FALLING_BEHIND


def test_lag_shrinking_is_catching_up():
    acks = [i * 300 for i in range(6)]
    masters = [2_000 + i * 100 for i in range(6)]
    assert status_of(series(acks, masters)) is LagStatus.CATCHING_UP


def test_a_zero_lag_in_the_window_is_ok_even_if_rising_since():
    acks = [0, 100, 200, 300, 400, 500]
    masters = [0, 120, 240, 360, 480, 600]
    assert status_of(series(acks, masters)) is LagStatus.OK


def test_a_steady_lag_with_moving_acks_keeps_pace_and_is_ok():
    acks = [i * 100 for i in range(8)]
    masters = [ack + (50 if i % 2 else 60) for i, ack in enumerate(acks)]
    masters[-1] = acks[-1] + 60
    assert status_of(series(acks, masters)) is LagStatus.OK


def test_a_new_connection_with_lag_is_catching_up_before_a_trend_exists():
    samples = series([100] * 5, [100] * 5)   # an old term, caught up
    samples += [sample(5 + i, 50 + i * 10, 500, epoch=2) for i in range(MIN_TREND_SAMPLES - 1)]
    assert status_of(samples) is LagStatus.CATCHING_UP


def test_the_window_holds_only_the_current_term():
    # stalled under master n1, then n3 took over: the old stall does not count
    samples = series([100] * 5, [400] * 5)
    samples += [sample(5 + i, 200 + i * 50, 600, master="n3", epoch=2) for i in range(MIN_TREND_SAMPLES)]
    assert status_of(samples) is LagStatus.CATCHING_UP


def test_after_a_reconnection_the_stall_before_it_does_not_count():
    samples = series([100] * 4, [400] * 4)
    samples.append(sample(4, 100, 400, connected=False))
    samples += [sample(5 + i, 100 + i * 100, 400) for i in range(2)]
    assert status_of(samples) is LagStatus.CATCHING_UP


# --- the history -------------------------------------------------------------------------
def master_status(slaves: list[dict], epoch: int = 3, max_offset: int = 1_000) -> dict:
    return {"role": "master", "epoch": epoch, "max_offset": max_offset, "slaves": slaves}


def slave_entry(node_id: str, ack: int, *, connected: bool = True) -> dict:
    return {"node_id": node_id, "address": "127.0.0.1:1", "connected": connected, "ack_offset": ack,
            "lag_bytes": 1_000 - ack, "lag_ms": 250, "in_sync": ack == 1_000, "rate_bytes_per_s": 12.5,
            "last_ack_age_ms": 3}


def test_samples_from_a_master_status_section():
    (taken,) = samples_from_status("n1", master_status([slave_entry("n2", 400)]), 7.0)
    assert taken == LagSample(time_s=7.0, slave="n2", master="n1", epoch=3, ack_offset=400, master_offset=1_000,
                              lag_bytes=600, lag_s=0.25, in_sync=False, connected=True, rate_bytes_per_s=12.5)
    assert samples_from_status("n2", {"role": "slave", "epoch": 3, "max_offset": 5}, 7.0) == []


def test_the_history_records_what_a_status_says_at_the_clock_time():
    clock = ManualClock(100.0)
    history = LagHistory(clock)
    for step in range(4):
        clock.now = 100.0 + step
        history.record_status("n1", master_status([slave_entry("n2", 1_000), slave_entry("n3", 200)]))
    assert history.slaves() == ["n2", "n3"]
    assert [s.time_s for s in history.samples("n3")] == [100.0, 101.0, 102.0, 103.0]
    assert history.statuses() == {"n2": LagStatus.OK, "n3": LagStatus.STALLED}
    clock.now = 103.0 + OFFLINE_AFTER_INTERVALS + 1
    assert history.statuses() == {"n2": LagStatus.OFFLINE, "n3": LagStatus.OFFLINE}
    assert history.status("never-seen") is LagStatus.OFFLINE


def test_a_status_judged_now_agrees_with_the_moments_connection_and_lag():
    clock = ManualClock(100.0)
    history = LagHistory(clock)
    for step in range(3):   # sampled while the slave was away
        clock.now = 100.0 + step
        history.record_status("n1", master_status([slave_entry("n2", 400, connected=False)]))
    clock.now = 102.5
    assert history.status("n2") is LagStatus.OFFLINE
    # it reconnected and caught up since the last sample: the reply's columns say so, and so does its status
    (back,) = samples_from_status("n1", master_status([slave_entry("n2", 1_000)]), clock.now)
    assert history.status_with(back) is LagStatus.OK
    (behind,) = samples_from_status("n1", master_status([slave_entry("n2", 600)]), clock.now)
    assert history.status_with(behind) is LagStatus.CATCHING_UP   # a new connection, no trend yet
    (gone,) = samples_from_status("n1", master_status([slave_entry("n2", 1_000, connected=False)]), clock.now)
    assert history.status_with(gone) is LagStatus.OFFLINE
    assert history.status_with(sample(clock.now, 5, 9, slave="never-seen")) is LagStatus.CATCHING_UP
    assert len(history.samples("n2")) == 3   # nothing recorded by judging


def test_a_status_judged_now_keeps_the_recorded_trend():
    clock = ManualClock(0.0)
    history = LagHistory(clock)
    for step in range(WINDOW_SAMPLES + 5):   # acks stop at 100 while the master grows
        clock.now = float(step)
        history.record(sample(clock.now, 100, 400 + step))
    now = sample(clock.now + 0.4, 100, 400 + WINDOW_SAMPLES + 5)
    assert history.status("n2") is LagStatus.STALLED and history.status_with(now) is LagStatus.STALLED
    caught_up = sample(clock.now + 0.4, 500, 500)   # no lag this moment: what the columns show wins
    assert history.status_with(caught_up) is LagStatus.OK


def test_the_history_is_bounded_per_slave_and_in_slaves():
    clock = ManualClock(1_000.0)
    history = LagHistory(clock, samples_per_slave_max=WINDOW_SAMPLES, slaves_max=2)
    for i in range(WINDOW_SAMPLES * 3):
        history.record(sample(float(i), i, i))
    assert len(history.samples("n2")) == WINDOW_SAMPLES
    assert history.samples("n2")[0].time_s == WINDOW_SAMPLES * 2
    history.record(sample(100.0, 1, 1, slave="n3"))
    history.record(sample(101.0, 1, 1, slave="n2"))   # n2 heard of again: n3 is now the oldest
    history.record(sample(102.0, 1, 1, slave="n4"))
    assert history.slaves() == ["n2", "n4"]


def test_since_returns_samples_in_time_order_bounded_by_limit():
    history = LagHistory(ManualClock(1_000.0))
    for i in range(5):
        history.record(sample(float(i), i, i, slave="n2"))
        history.record(sample(i + 0.5, i, i, slave="n3"))
    assert [(s.time_s, s.slave) for s in history.since(3.0)] == [(3.0, "n2"), (3.5, "n3"), (4.0, "n2"),
                                                                  (4.5, "n3")]
    assert [s.time_s for s in history.since(None, slave="n3", limit=2)] == [3.5, 4.5]
    assert len(history.since()) == 10


def test_a_sample_round_trips_through_its_dict_and_bad_ones_are_named():
    original = sample(1.5, 10, 30)
    assert LagSample.from_dict(original.to_dict()) == original
    with pytest.raises(LagHistoryError, match="without 'epoch'"):
        LagSample.from_dict({k: v for k, v in original.to_dict().items() if k != "epoch"})
    with pytest.raises(LagHistoryError, match="bad value"):
        LagSample.from_dict({**original.to_dict(), "ack_offset": "many"})
    with pytest.raises(LagHistoryError):
        LagSample.from_dict([1, 2])


# --- events ------------------------------------------------------------------------------
def test_events_mark_failovers_and_sync_state_changes():
    samples = [sample(0, 100, 100, in_sync=True), sample(1, 100, 300, in_sync=False),
               sample(2, 300, 300, in_sync=True),
               # n1 dies; n2 is master in epoch 2 and n3 its slave
               sample(5, 300, 300, slave="n3", master="n2", epoch=2, in_sync=False),
               sample(6, 300, 300, slave="n3", master="n2", epoch=2, in_sync=True),
               sample(2.5, 300, 300, slave="n3", in_sync=True)]   # n1's, before it died, given out of order
    assert lag_events(samples) == [
        LagEvent(1, "out_of_sync", "n2"), LagEvent(2, "in_sync", "n2"),
        LagEvent(5, "failover", "n1 (epoch 1) -> n2 (epoch 2)"), LagEvent(6, "in_sync", "n3")]


def test_a_deposed_masters_late_samples_are_not_events():
    samples = [sample(0, 1, 1, master="n2", epoch=2), sample(1, 1, 1, master="n1", epoch=1, in_sync=False),
               sample(2, 1, 1, master="n2", epoch=2)]
    assert lag_events(samples) == []
