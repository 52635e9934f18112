"""HAService.wait_for_replicas_then: a waiting put answered by a callback, timed out by one
task. Deterministic: trio's autojump clock and a real store in one trio run."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from replication import HAService, HaServiceSettings, SyncSettings
from replication.errors import FlushSlaveTimeout, InSyncReplicasNotEnough

from replication_helpers import begin_term, epoch_file, put

pytestmark = pytest.mark.trio

SLAVE_TIMEOUT_MS = 1_000


def _service(store, min_in_sync_replicas: int = 2) -> HAService:
    epochs = epoch_file(store)
    begin_term(store, epochs)
    settings = HaServiceSettings(node_id="m", group="g", cluster="c", slave_timeout_ms=SLAVE_TIMEOUT_MS,
                                 sync=SyncSettings(min_in_sync_replicas=min_in_sync_replicas,
                                                   max_time_not_catchup_ms=60_000))
    service = HAService(store.replica_log, settings, epochs.last_epoch, epochs.entries)
    service.tracker.connected("s1", "test", store.max_physical_offset, 0)
    service.tracker.apply_sync_state_set(frozenset({"m", "s1"}))
    return service


async def test_each_waiting_put_times_out_at_its_own_deadline_unless_acked(open_store, autojump_clock):
    store = open_store("m")
    service = _service(store)
    outcomes: list[tuple[str, float, object]] = []

    def recorder(name: str):
        return lambda error: outcomes.append((name, trio.current_time() - started, error))
    started = trio.current_time()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(service._expire_waiters)
            await trio.testing.wait_all_tasks_blocked()
            assert service.answers_waiting_puts
            ends = {}
            for name, at in (("a", 0.0), ("b", 0.4), ("c", 0.7)):
                await trio.sleep_until(started + at)
                (result,) = put(store, 1, prefix=name)
                ends[name] = result.end_offset
                assert service.wait_for_replicas_then(result.end_offset, recorder(name))
            await trio.sleep_until(started + 0.9)
            service.tracker.acked("s1", ends["a"], 900)    # a is acked before its deadline
            service._release_waiters()
            await trio.sleep_until(started + 3)
            nursery.cancel_scope.cancel()
    assert [(name, at) for name, at, _ in outcomes] == [("a", pytest.approx(0.9)), ("b", pytest.approx(1.4)),
                                                        ("c", pytest.approx(1.7))]
    assert outcomes[0][2] is None
    for name, _, error in outcomes[1:]:
        assert isinstance(error, FlushSlaveTimeout)
        assert str(error) == f"replicas did not acknowledge offset {ends[name]} within slave_timeout_ms=1000"
    assert service.statistics().waiting_puts == 0


async def test_a_put_acked_already_or_refused_gets_no_callback(open_store, autojump_clock):
    store = open_store("m")
    called = []
    alone = _service(store, min_in_sync_replicas=1)
    alone.tracker.apply_sync_state_set(frozenset({"m"}))
    (result,) = put(store, 1)
    assert alone.wait_for_replicas_then(result.end_offset, called.append) is False   # the master alone holds it
    short = _service(store, min_in_sync_replicas=3)
    with pytest.raises(InSyncReplicasNotEnough):
        short.wait_for_replicas_then(result.end_offset, called.append)
    assert called == []


async def test_callbacks_are_called_in_offset_order_once_each(open_store, autojump_clock):
    store = open_store("m")
    service = _service(store)
    order = []
    results = put(store, 5)
    for index, result in reversed(list(enumerate(results))):   # registered last first
        assert service.wait_for_replicas_then(result.end_offset, lambda error, i=index: order.append((i, error)))
    service.fence("a test")
    service.fence("again")   # a second failure finds nobody waiting
    assert [i for i, _ in order] == [0, 1, 2, 3, 4]
    assert all(type(error).__name__ == "ReplicationFenced" for _, error in order)
