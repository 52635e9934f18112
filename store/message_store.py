"""MessageStore: the single-node storage engine, composed of its parts.

    {store_path}/commitlog/  consumequeue/  index/  config/  checkpoint  abort  lock
                 truncate   (only while a replication cut is in progress)

It owns the parts (CommitLog, ConsumeQueueTable, IndexService, Dispatcher, FlushService,
Checkpoint, ConfigStore, Retention, Integrity, ReplicaLog) and wires them; none of them holds
a reference back to it. Writing is here (one put function, ``append``, over ``prepare`` and
``put_batch``); reading is ``reads.StoreReads``; replication is given ``replica_log``.

Synchronous and thread-safe: puts serialise on the CommitLog's write lock, reads run
concurrently, and three daemon threads do the background work (dispatch, flush,
retention) plus one that preallocates the next segment. With ``dispatcher_thread: false``
the owner runs dispatch in its own loop instead (see dispatcher.py).
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import time
from dataclasses import dataclass

from .checkpoint import Checkpoint
from .codec import StoredMessage
from .commit_log import CommitLog, now_ms
from .config import StoreConfig
from .config_files import ConfigStore, fsync_directory, write_atomically
from .dispatcher import ConsumeQueueTable, Dispatcher
from .errors import DiskFullError, StoreClosedError, StoreConfigError, StoreError
from .flush import FlushService
from .index_file import IndexService
from .integrity import Integrity, IntegrityStatistics
from .message import Message, PutColumns, PutResult, PutStatus
from .prepare import Preparer
from .put_batch import Batch, PlainBatch
from .reads import GetResult, GetStatus, StoreReads
from .recovery import RecoveryReport, recover
from .replica_log import CUT, RESET, ReplicaLog
from .retention import Retention
from .room import DiskRoom

log = logging.getLogger(__name__)

__all__ = ["GetResult", "GetStatus", "MessageStore", "StoreStatistics"]


@dataclass(frozen=True, slots=True)
class StoreStatistics:
    """A snapshot of the store for status replies and metrics."""

    min_physical_offset: int
    max_physical_offset: int
    flushed_offset: int
    dispatched_offset: int
    dispatch_lag_bytes: int
    dispatched_messages: int
    segments: int
    consume_queues: int
    index_files: int
    put_messages: int
    put_bytes: int
    running: bool
    recovery: RecoveryReport | None
    integrity: IntegrityStatistics | None = None


class MessageStore:
    """The storage engine: put, pull, query, recover. See the package docstring for the API.
    ``clock`` gives the store time in milliseconds of what is written (the wall clock)."""

    def __init__(self, config: StoreConfig, *, clock=now_ms) -> None:
        self.config = config
        root = config.store_path
        self.root = root
        self.commit_log = CommitLog(os.path.join(root, "commitlog"), config.commitlog_segment_bytes,
                                    config.store_host, preallocate=config.preallocate_next_segment,
                                    cache_bytes=config.commitlog_cache_bytes, clock=clock)
        self.queues = ConsumeQueueTable(os.path.join(root, "consumequeue"), config.consume_queue_entries_per_file)
        self.index = IndexService(os.path.join(root, "index"), config.index_hash_slots, config.index_max_entries)
        self.dispatcher = Dispatcher(self.commit_log, self.queues, self.index, config.dispatch_batch_bytes_max,
                                     config.dispatch_interval_ms / 1000, threaded=config.dispatcher_thread)
        self.integrity = Integrity(self.commit_log, self.queues, self.index, self.dispatcher)
        # what replication is given: the replica operations and the confirm offset
        self.replica_log = ReplicaLog(root, self.commit_log, self.queues, self.index, self.dispatcher,
                                      sync_flush=config.flush == "sync")
        self.checkpoint: Checkpoint | None = None
        self.flusher: FlushService | None = None
        self.retention: Retention | None = None
        self.configs: ConfigStore | None = None
        self.recovery: RecoveryReport | None = None
        self.reads = StoreReads(self.commit_log, self.queues, self.index, self.dispatcher, self.integrity,
                                self.replica_log, check_crc=config.check_crc_on_read)
        self.preparer = Preparer(config.commitlog_segment_bytes)
        self.room = DiskRoom(root, self.dispatcher, self.index, consume_queue_file_bytes=config.consume_queue_file_bytes)
        self._lock_fd: int | None = None
        self._running = False
        self._abort_path = os.path.join(root, "abort")

    # --- lifecycle -----------------------------------------------------------------------
    def start(self) -> RecoveryReport:
        """Open the store directory, recover, and start the background threads."""
        if self._running:
            raise StoreError("store already started")
        os.makedirs(self.root, exist_ok=True)
        self._take_directory_lock()
        try:
            abnormal = os.path.exists(self._abort_path)
            self.configs = ConfigStore(os.path.join(self.root, "config"))
            _check_layout(os.path.join(self.root, "config", LAYOUT_FILE), self.config)
            self.checkpoint = Checkpoint(os.path.join(self.root, "checkpoint"))
            self.commit_log.load()
            self.queues.load()
            self.index.load()
            self._create_abort_file()
            replica_log = self.replica_log
            intent = replica_log.pending_cut()
            if intent is not None and intent.kind == RESET:
                replica_log.finish_interrupted_reset(intent.offset, self.checkpoint)
            self.recovery = recover(self.commit_log, self.queues, self.index, self.dispatcher, self.checkpoint,
                                    abnormal=abnormal,
                                    cut_offset=intent.offset if intent is not None and intent.kind == CUT else None)
            if self.integrity.repair_at_start(index_missing=self.index.directory_missing):
                # recovery took each queue's next offset from the queues as it found them; a
                # queue rebuilt since may end elsewhere: the next put follows the rebuilt one
                self.commit_log.queue_offsets = {key: queue.max_offset for key, queue in self.queues.queues.items()}
            self.integrity.rebuild_configs(self.configs)
            self.flusher = FlushService(self.commit_log, self.dispatcher, self.checkpoint,
                                        sync=self.config.flush == "sync",
                                        flush_interval_ms=self.config.flush_interval_ms,
                                        checkpoint_interval_ms=self.config.checkpoint_interval_ms,
                                        confirm_offset=lambda: replica_log.confirm_offset,
                                        dirty_bytes_max=self.config.flush_dirty_bytes_max)
            self.retention = Retention(self.commit_log, self.queues, self.index, self.dispatcher, self.root,
                                       file_reserved_hours=self.config.file_reserved_hours,
                                       disk_max_used_ratio=self.config.disk_max_used_ratio,
                                       interval_ms=self.config.retention_check_interval_ms,
                                       disk_full_policy=self.config.disk_full_policy,
                                       consumer_offsets=lambda: dict(self.configs["consumerOffset.json"].data))
            replica_log.open(self.checkpoint, self.flusher, self.retention)
            state = self.checkpoint.state
            if self.recovery.end_offset < max(state.flushed_phy_offset, state.dispatched_phy_offset) \
                    or not self.checkpoint.valid or self.commit_log.flushed_offset < self.recovery.end_offset:
                # the old checkpoint claims bytes recovery cut: replace it before any new write.
                # Or recovery kept bytes written after the last checkpoint (a kill within a
                # checkpoint interval): make them durable before they are served or reported,
                # so the flushed offset is never behind what the store holds from its start
                # (it read 0 for up to flush_interval_ms on a node killed early in its life)
                self.flusher.flush_now()
                self.flusher.write_checkpoint()
            if intent is not None:
                replica_log.finish_interrupted_cut()
            self.commit_log.segments.request_ahead()
            self.dispatcher.start()
            self.flusher.start()
            self.retention.start()
            self._running = True
        except BaseException:
            self._close_files()
            self._release_directory_lock()
            raise
        return self.recovery

    def shutdown(self) -> None:
        """Stop cleanly: dispatch and flush everything, write the checkpoint, remove ``abort``."""
        if not self._running:
            return
        self._running = False
        self.retention.stop()
        self.dispatcher.stop()
        try:
            self.dispatcher.catch_up()
        except DiskFullError as error:   # the checkpoint records how far dispatch got: the next start goes on
            log.warning("shutdown: dispatch left unfinished: %s", error)
        self.flusher.stop()
        self.flusher.flush_now()
        self.flusher.write_checkpoint()
        self.configs.persist_all()
        self._close_files()
        os.unlink(self._abort_path)
        fsync_directory(self.root)
        self._release_directory_lock()

    def halt(self) -> None:
        """Stop the threads and let go of the files without any of shutdown's cleanup.

        What is on disk afterwards is what a process killed at this moment leaves behind
        (the ``abort`` file stays, nothing more is flushed or checkpointed). Tests and the
        demo use it to rehearse a crash without a second process.
        """
        if not self._running:
            return
        self._running = False
        self.retention.stop()
        self.dispatcher.stop()
        self.flusher.stop()
        self._close_files()
        self._release_directory_lock()

    def _close_files(self) -> None:
        self.replica_log.close()
        self.commit_log.close()
        self.queues.close()
        self.index.close()
        if self.checkpoint is not None:
            self.checkpoint.close()
            self.checkpoint = None

    def _take_directory_lock(self) -> None:
        self._lock_fd = os.open(os.path.join(self.root, "lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            os.close(self._lock_fd)
            self._lock_fd = None
            if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise StoreError(f"{self.root} is in use by another store (lock held)") from None
            raise

    def _release_directory_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _create_abort_file(self) -> None:
        with open(self._abort_path, "wb") as handle:
            os.fsync(handle.fileno())
        fsync_directory(self.root)

    def _check_running(self) -> None:
        if not self._running:
            raise StoreClosedError("the store is not running: call start()")

    @property
    def running(self) -> bool:
        return self._running

    # --- writing -------------------------------------------------------------------------
    def append(self, batch: Batch, *, as_columns: bool = False) -> list[PutResult] | PutColumns:
        """Write a batch without waiting for the disk; refused messages get their status in
        their place. The store's one put function.

        ``batch`` is a list of Messages or a ``PlainBatch`` (a producer's batch as columns:
        no Message per message when it is regular). A regular batch of several messages is
        encoded column-wise (``put_batch``); any other is prepared and placed one message at a
        time (``Preparer.prepare``, ``CommitLog.append``). Both write the same bytes.
        ``as_columns``: a batch written column-wise whole comes back as PutColumns (the same
        results, no PutResult per message)."""
        self._check_running()
        count = len(batch.bodies) if type(batch) is PlainBatch else len(batch)
        refusal = self.room.refusal(count)
        if refusal is not None:
            self._wake_dispatcher()   # a dispatch waiting for room tries again: writes resume once it has room
            return [PutResult(PutStatus.SERVICE_NOT_AVAILABLE, reason=refusal)] * count
        if self.replica_log.writes_need_catch_up:
            self.replica_log.catch_up_for_writes()
        columns = self.preparer.regular_columns(batch)
        if columns is not None:
            results = self.commit_log.append_columns(columns)
            if not as_columns and type(results) is PutColumns:
                results = results.results()
        else:
            results = self._append_each(batch.messages() if type(batch) is PlainBatch else batch)
        self._wake_dispatcher()
        self.flusher.written()
        return results

    def _wake_dispatcher(self) -> None:
        wake = self.dispatcher.wake
        if not wake.is_set():   # set and not yet cleared: the dispatcher's next pass sees these
            wake.set()

    def _append_each(self, messages: list[Message]) -> list[PutResult]:
        prepare = self.preparer.prepare
        prepared = [prepare(message) for message in messages]
        written = [outcome for outcome in prepared if type(outcome) is not PutResult]
        results = self.commit_log.append(written) if written else []
        if len(written) < len(prepared):
            # put each refusal back in its message's place
            outcomes = iter(results)
            results = [outcome if type(outcome) is PutResult else next(outcomes) for outcome in prepared]
        return results

    def put(self, message: Message) -> PutResult:
        """Store one message; under ``flush: sync`` return once it is on disk."""
        return self.put_batch([message])[0]

    def put_batch(self, batch: Batch) -> list[PutResult]:
        """Store a batch (see ``append``) in one write per segment; under ``flush: sync``
        return once it is on disk. Each message gets its own result: illegal ones are
        refused alone, the others are written."""
        results = self.append(batch)
        if self.config.flush == "sync":
            end = max((r.end_offset for r in results if r.status is PutStatus.PUT_OK), default=0)
            if end and not self.wait_flushed(end):
                results = [PutResult(PutStatus.FLUSH_DISK_TIMEOUT, r.physical_offset, r.queue_offset, r.message_id,
                                     r.store_timestamp, r.wrote_bytes, "not on disk within sync_flush_timeout_ms")
                           if r.status is PutStatus.PUT_OK else r for r in results]
        return results

    def wait_flushed(self, offset: int, timeout_ms: int | None = None) -> bool:
        """Block until the CommitLog is on disk up to ``offset``."""
        self._check_running()
        timeout_ms = self.config.sync_flush_timeout_ms if timeout_ms is None else timeout_ms
        return self.flusher.wait_flushed(offset, timeout_ms / 1000)

    # --- reading (``reads``) -------------------------------------------------------------
    def pull(self, topic: str, queue_id: int, queue_offset: int, max_count: int = 32,
             max_bytes: int = 8 * 1024 * 1024) -> GetResult:
        """Messages of one queue from ``queue_offset``, at most ``max_count`` and about
        ``max_bytes`` (``StoreReads.pull``)."""
        self._check_running()
        return self.reads.pull(topic, queue_id, queue_offset, max_count, max_bytes)

    def get(self, topic: str, queue_id: int, queue_offset: int, max_count: int = 32) -> list[StoredMessage]:
        """Decoded messages of one queue from ``queue_offset`` (see ``pull``)."""
        self._check_running()
        return self.reads.get(topic, queue_id, queue_offset, max_count)

    def query_by_key(self, topic: str, key: str, begin_ms: int = 0, end_ms: int = 2**63 - 1,
                     max_count: int = 32) -> list[StoredMessage]:
        """Messages of ``topic`` whose KEYS hold ``key`` (or whose UNIQ_KEY is it), stored in
        [begin_ms, end_ms]; the newest ``max_count``, oldest first."""
        self._check_running()
        return self.reads.query_by_key(topic, key, begin_ms, end_ms, max_count)

    def offset_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The queue offset of the first message stored at or after ``timestamp_ms``."""
        self._check_running()
        return self.reads.offset_by_time(topic, queue_id, timestamp_ms)

    def min_offset(self, topic: str, queue_id: int) -> int:
        """The first queue offset whose message still exists."""
        self._check_running()
        return self.reads.min_offset(topic, queue_id)

    def max_offset(self, topic: str, queue_id: int) -> int:
        """The queue offset the next message of the queue gets (once dispatched)."""
        self._check_running()
        return self.reads.max_offset(topic, queue_id)

    def get_by_message_id(self, message_id: str) -> StoredMessage:
        """The message an offset message id names; MessageNotFound if it is not here."""
        self._check_running()
        return self.reads.get_by_message_id(message_id)

    def topics(self) -> dict[str, list[int]]:
        """Topics with their queue ids, as the ConsumeQueues know them."""
        return self.reads.topics()

    # --- the log's ends and the confirm offset (replica operations: ``replica_log``) ------
    @property
    def max_physical_offset(self) -> int:
        """End of the CommitLog: always a record boundary."""
        return self.commit_log.max_offset

    @property
    def min_physical_offset(self) -> int:
        return self.commit_log.min_offset

    @property
    def confirm_offset(self) -> int:
        """The least offset every member of the sync-state set holds (``replica_log``)."""
        return self.replica_log.confirm_offset

    def limit_reads_to_confirm_offset(self, enabled: bool) -> None:
        """Whether pulls stop before the first message not wholly below the confirm offset:
        a master under a controller serves only what every in-sync replica holds, a slave
        or a static master what it has."""
        self.reads.limit_to_confirm_offset(enabled)

    # --- background hooks ----------------------------------------------------------------
    def add_dispatch_listener(self, listener) -> None:
        """``listener(dispatched_offset, grown_queues)`` after each dispatch pass (on the thread
        that ran it: see ``Dispatcher.add_listener``)."""
        self.dispatcher.add_listener(listener)

    def remove_dispatch_listener(self, listener) -> None:
        self.dispatcher.remove_listener(listener)

    def run_retention(self, now_ms: int | None = None) -> int:
        """One retention pass now; returns the number of CommitLog segments deleted."""
        self._check_running()
        return self.retention.run_once(now_ms)

    def statistics(self) -> StoreStatistics:
        return StoreStatistics(
            min_physical_offset=self.commit_log.min_offset, max_physical_offset=self.commit_log.max_offset,
            flushed_offset=self.commit_log.flushed_offset, dispatched_offset=self.dispatcher.dispatched_offset,
            dispatch_lag_bytes=self.dispatcher.lag_bytes, dispatched_messages=self.dispatcher.dispatched_messages,
            segments=len(self.commit_log.segments.files), consume_queues=len(self.queues.queues),
            index_files=len(self.index.files), put_messages=self.commit_log.put_messages,
            put_bytes=self.commit_log.put_bytes,
            running=self._running, recovery=self.recovery, integrity=self.integrity.statistics(),
        )

    def wait_dispatched(self, offset: int | None = None, timeout_s: float = 10.0) -> bool:
        """Block until the dispatcher has reached ``offset`` (default: everything written).
        Without a dispatcher thread the passes run here, in the caller's thread (the owner's
        loop may be the caller, blocked in this call)."""
        target = self.commit_log.max_offset if offset is None else offset
        deadline = time.monotonic() + timeout_s
        dispatcher = self.dispatcher
        while dispatcher.dispatched_offset < target:
            if time.monotonic() > deadline or dispatcher.error is not None:
                return False
            if not dispatcher.threaded and dispatcher.dispatch_pass():
                continue
            dispatcher.wake.set()
            time.sleep(0.001)
        return True

    def __enter__(self) -> "MessageStore":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()


LAYOUT_FILE = "storeLayout.json"
LAYOUT_KEYS = ("commitlog_segment_bytes", "consume_queue_entries_per_file", "index_hash_slots", "index_max_entries")


def _check_layout(path: str, config: StoreConfig) -> None:
    """The file sizes a store directory was made with; other settings would misread it."""
    wanted = {key: getattr(config, key) for key in LAYOUT_KEYS}
    if os.path.exists(path):
        with open(path, "rb") as handle:
            existing = json.loads(handle.read() or b"{}")
        changed = [f"{key} is {existing[key]} in this store, {wanted[key]} in the config"
                   for key in LAYOUT_KEYS if key in existing and existing[key] != wanted[key]]
        if changed:
            raise StoreConfigError(f"{os.path.dirname(os.path.dirname(path))}: " + "; ".join(changed))
        if all(key in existing for key in LAYOUT_KEYS):
            return
    write_atomically(path, json.dumps(wanted, indent=2).encode("utf-8"))
