"""Helpers of the replication tests: small real stores, and an HAService and an HAClient run
over real loopback sockets in the test's own trio run. (A module of its own, not conftest:
tests/node has a conftest too, and both are imported by that name.)"""

from __future__ import annotations

import os

import pytest
import trio
import trio.testing

from replication import EpochFile, HAClient, HaClientSettings, HAService, HaServiceSettings, SyncSettings, protocol
from replication.ha_client import serve_ha_client
from replication.ha_service import serve_ha
from store import Message, MessageStore, StoreConfig

SEGMENT_BYTES = 256 * 1024
SMALL_STORE = {"commitlog_segment_bytes": SEGMENT_BYTES, "index_hash_slots": 1024, "index_max_entries": 16384,
               "consume_queue_entries_per_file": 4096, "preallocate_next_segment": False}


def store_config(path, **overrides) -> StoreConfig:
    settings = dict(store_path=str(path), flush="async", flush_interval_ms=20, checkpoint_interval_ms=50,
                    retention_check_interval_ms=3_600_000, **SMALL_STORE)
    settings.update(overrides)
    return StoreConfig(**settings)


def put(store: MessageStore, count: int, *, topic: str = "orders", prefix: str = "m", body_bytes: int = 200,
        queues: int = 4) -> list:
    """Store ``count`` keyed messages (batches of 64); returns their PutResults."""
    results = []
    for first in range(0, count, 64):
        batch = [Message(topic, (f"{prefix}-{i}-".encode() * (body_bytes // 8 + 1))[:body_bytes],
                         queue_id=i % queues, keys=[f"{prefix}-{i}"], tags=f"t{i % 3}")
                 for i in range(first, min(first + 64, count))]
        results += store.put_batch(batch)
    assert all(r.status.ok for r in results)
    return results


def log_bytes(store: MessageStore) -> bytes:
    """The whole CommitLog [min, max) as replication reads it."""
    pieces = []
    offset = store.min_physical_offset
    for _ in range(1_000_000):
        if offset >= store.max_physical_offset:
            break
        chunk = store.replica_log.read(offset, 1 << 20)
        pieces.append(chunk)
        offset += len(chunk)
    return b"".join(pieces)


def epoch_file(store: MessageStore) -> EpochFile:
    epochs = EpochFile(store.config.store_path)
    epochs.load(store.max_physical_offset)
    return epochs


def begin_term(store: MessageStore, epochs: EpochFile, epoch: int | None = None) -> int:
    """What a node does when it becomes master: record (epoch, max offset)."""
    epoch = epochs.last_epoch + 1 if epoch is None else epoch
    epochs.append(epoch, store.max_physical_offset)
    return epoch


async def start_master(nursery, store: MessageStore, epochs: EpochFile, *, node_id: str = "m",
                       secret: str | None = "s3cret", on_confirm_advanced=None, replica_store=None,
                       **settings) -> tuple[HAService, str]:
    """An HAService on a free loopback port over ``store``'s replica log (or ``replica_store``)."""
    sync = settings.pop("sync", SyncSettings())
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    service = HAService(replica_store or store.replica_log,
                        HaServiceSettings(node_id=node_id, group="g", cluster="c", secret=secret, sync=sync, **settings),
                        epochs.last_epoch, epochs.entries, on_confirm_advanced=on_confirm_advanced)
    await nursery.start(serve_ha, service, listeners)
    host, port = listeners[0].socket.getsockname()[:2]
    return service, f"{host}:{port}"


class ManualClock:
    """A clock (seconds) that moves only when the test sets ``now``."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class RunningClient:
    """An HAClient in its own cancel scope, so a test can stop and restart it."""

    def __init__(self, client: HAClient, scope: trio.CancelScope, done: trio.Event) -> None:
        self.client = client
        self.scope = scope
        self.done = done

    async def stop(self) -> None:
        self.scope.cancel()
        await self.done.wait()


async def start_slave(nursery, store: MessageStore, address: str, *, node_id: str = "s1",
                      secret: str | None = "s3cret", replica_store=None, **settings) -> RunningClient:
    """An HAClient following ``address`` into ``store``'s replica log (or ``replica_store``)."""
    epochs = epoch_file(store)
    client = HAClient(replica_store or store.replica_log, epochs, HaClientSettings(node_id=node_id, group="g", cluster="c",
                                                      master_ha_address=address, secret=secret,
                                                      backoff_min_ms=20, backoff_max_ms=200, **settings))
    done = trio.Event()

    async def run(task_status=trio.TASK_STATUS_IGNORED):
        try:
            with trio.CancelScope() as scope:
                task_status.started(scope)
                await serve_ha_client(client)
        finally:
            done.set()

    scope = await nursery.start(run)
    return RunningClient(client, scope, done)


async def wait_until(predicate, timeout_s: float = 20.0, what: str = "condition") -> None:
    """Until ``predicate()`` holds, checked each time every task of this trio run has been
    blocked for a millisecond: HA sessions served in this process are waited for without
    sleeping, and the store's threads still get their turn. Bounded by ``timeout_s``. A run
    kept busy by a load never goes quiet: it is looked at again every 10 ms then."""
    with trio.move_on_after(timeout_s):
        while not predicate():
            with trio.move_on_after(0.01):
                await trio.testing.wait_all_tasks_blocked(cushion=0.001)
        return
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def same_answers(master: MessageStore, slave: MessageStore, topic: str, keys: list[str]) -> None:
    """Pulls, key queries, time queries and id lookups give the same answers on both stores."""
    assert master.wait_dispatched(timeout_s=20) and slave.wait_dispatched(timeout_s=20)
    assert master.topics() == slave.topics()
    for queue_id in master.topics().get(topic, []):
        assert master.max_offset(topic, queue_id) == slave.max_offset(topic, queue_id)
        offset, end = master.min_offset(topic, queue_id), master.max_offset(topic, queue_id)
        for _ in range(end + 1):
            if offset >= end:
                break
            a = master.pull(topic, queue_id, offset, 64)
            b = slave.pull(topic, queue_id, offset, 64)
            assert a.status == b.status and a.next_offset == b.next_offset
            assert [m.physical_offset for m in a.messages] == [m.physical_offset for m in b.messages]
            assert [m.body for m in a.messages] == [m.body for m in b.messages]
            middle = a.messages[len(a.messages) // 2]
            assert master.offset_by_time(topic, queue_id, middle.store_timestamp) == \
                slave.offset_by_time(topic, queue_id, middle.store_timestamp)
            assert slave.get_by_message_id(middle.message_id).body == middle.body
            offset = a.next_offset
    for key in keys:
        a = [m.physical_offset for m in master.query_by_key(topic, key, 0, 2**62, 32)]
        b = [m.physical_offset for m in slave.query_by_key(topic, key, 0, 2**62, 32)]
        assert a == b and a, key


def dir_size(path) -> int:
    return sum(os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(path) for name in names)


def frame(offset: int, data, *, crc_flip: int = 0) -> bytes:
    """A data frame as the master sends it (``crc_flip`` spoils the CRC)."""
    offset_, size, crc = protocol.DATA_HEADER.unpack(protocol.data_header(offset, data))
    return protocol.DATA_HEADER.pack(offset_, size, crc ^ crc_flip) + bytes(data)


def chunks(master: MessageStore, count: int, max_bytes: int) -> list[tuple[int, bytes]]:
    """The master's first ``count`` replication chunks as (offset, bytes)."""
    result, offset = [], 0
    for _ in range(count):
        data = bytes(master.replica_log.read(offset, max_bytes))
        assert data
        result.append((offset, data))
        offset += len(data)
    return result
