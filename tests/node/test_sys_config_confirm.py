"""A slave under a controller reads its %SYS%CONFIG queue only up to the confirm offset its
master sent it. A record that replicated in before that offset covered it is applied once
the offset moves past it (``SysConfig.confirm_advanced``), without waiting for another
record or a promotion."""

from __future__ import annotations

import msgpack
import pytest
import trio
import trio.testing

from node.server.sys_config import SYS_CONFIG_TOPIC, SysConfig, topic_record
from store import Message, MessageStore

from node_helpers import small_config


@pytest.fixture
def capped_store(tmp_path):
    """A store that serves reads only up to its confirm offset, as a controller's slave does."""
    store = MessageStore(small_config(tmp_path / "store").store_config())
    store.start()
    store.limit_reads_to_confirm_offset(True)
    yield store
    store.shutdown()


def _replicated_record(store: MessageStore, topic: str) -> int:
    """A topic record written as replication lands it (not through ``SysConfig.record``);
    its end offset."""
    (result,) = store.append([Message(SYS_CONFIG_TOPIC, msgpack.packb(topic_record(topic, 2)), queue_id=0)])
    store.wait_dispatched()
    return result.end_offset


@pytest.mark.trio
async def test_a_record_past_the_confirm_offset_applies_once_the_offset_covers_it(capped_store):
    sys_config = SysConfig(capped_store)
    first_end = _replicated_record(capped_store, "first")
    second_end = _replicated_record(capped_store, "second")
    sys_config.catch_up()                    # what the dispatch pass asked for: nothing is confirmed yet
    assert sys_config.topics == {}

    capped_store.replica_log.publish_confirm_offset(first_end)
    sys_config.confirm_advanced()
    await trio.testing.wait_all_tasks_blocked()
    assert set(sys_config.topics) == {"first"}   # only what the offset covers

    capped_store.replica_log.publish_confirm_offset(second_end)
    sys_config.confirm_advanced()
    await trio.testing.wait_all_tasks_blocked()
    assert set(sys_config.topics) == {"first", "second"}
    assert sys_config.applied_queue_offset == 2


def test_a_confirm_offset_with_nothing_new_to_apply_schedules_nothing(capped_store):
    # outside a trio run: scheduling a catch-up here would raise (no trio token), so this
    # shows that a master's confirm offset moving (its own records applied) asks for none
    sys_config = SysConfig(capped_store)
    end = _replicated_record(capped_store, "only")
    capped_store.replica_log.publish_confirm_offset(end)
    assert sys_config.catch_up() == 1
    sys_config.confirm_advanced()
    with pytest.raises(RuntimeError):        # the same call with a record pending does schedule
        _replicated_record(capped_store, "next")
        sys_config.confirm_advanced()
