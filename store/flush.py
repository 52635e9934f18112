"""FlushService: makes the CommitLog durable and writes the checkpoint, on one thread.

``sync``: group commit. A writer asks for its end offset and waits; the thread fsyncs
everything written so far and wakes every waiter whose offset is now on disk, so one
sync serves all the puts that arrived during the previous one (of the CommitLog: the range
written since the last sync, ``MappedFile.flush_range``).
``async``: the thread fsyncs every ``flush_interval_ms``, and as soon as
``flush_dirty_bytes_max`` bytes are written and not yet synced (``written``, after each
write). Without that bound a burst left one fdatasync hundreds of megabytes (200 MB/s of
batched puts, 500 ms): 27-55 ms of it, on the master and on each slave, right when the
load that wrote them had ended, and one-at-a-time sends that followed were slowed by
milliseconds while it ran. Measured (a master with two all-ack slaves, 5 s of batched
sends, then single sends in blocks of 100, alternated): single p99 930 / 1,300 -> 602 /
610 µs with 16 MiB; batched msgs/s unchanged (159-164k against 161-172k).

Either way, every ``checkpoint_interval_ms`` it flushes the ConsumeQueue and IndexFile
files and then writes the checkpoint: flushed offset F and dispatched offset D are read
*before* their files are synced, so the checkpoint never claims more than is on disk.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from .checkpoint import Checkpoint, CheckpointState
from .commit_log import CommitLog
from .dispatcher import Dispatcher

log = logging.getLogger(__name__)


class FlushService:
    def __init__(self, commit_log: CommitLog, dispatcher: Dispatcher, checkpoint: Checkpoint, *,
                 sync: bool, flush_interval_ms: int, checkpoint_interval_ms: int,
                 confirm_offset: Callable[[], int] = lambda: 0, dirty_bytes_max: int = 0) -> None:
        self.commit_log = commit_log
        self.dispatcher = dispatcher
        self.checkpoint = checkpoint
        self.sync = sync
        self.flush_interval_s = flush_interval_ms / 1000
        self.checkpoint_interval_s = checkpoint_interval_ms / 1000
        self.confirm_offset = confirm_offset
        self.dirty_bytes_max = 0 if sync else dirty_bytes_max
        self._condition = threading.Condition()
        self._requested = 0
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._last_checkpoint = time.monotonic()
        self.flush_count = 0
        self.error: BaseException | None = None
        self._flush_listeners: list[Callable[[int], None]] = []

    @property
    def flushed_offset(self) -> int:
        return self.commit_log.flushed_offset

    def add_listener(self, listener: Callable[[int], None]) -> None:
        """``listener(flushed_offset)`` runs on the flush thread after each fsync."""
        self._flush_listeners = self._flush_listeners + [listener]

    def written(self) -> None:
        """After a write (async): once ``dirty_bytes_max`` bytes wait for the disk, have the
        thread flush now instead of at its interval. Cheap when they do not (no lock)."""
        limit = self.dirty_bytes_max
        if limit:
            end = self.commit_log.max_offset
            if end - self.commit_log.flushed_offset >= limit and end - self._requested >= limit:
                self.request(end)

    def request(self, offset: int) -> None:
        """Ask for ``offset`` to be made durable (sync mode) without waiting."""
        with self._condition:
            if offset > self._requested:
                self._requested = offset
                self._condition.notify_all()

    def wait_flushed(self, offset: int, timeout_s: float) -> bool:
        """Block until the CommitLog is durable up to ``offset``; False on timeout or stop."""
        deadline = time.monotonic() + timeout_s
        with self._condition:
            if offset > self._requested:
                self._requested = offset
                self._condition.notify_all()
            while self.commit_log.flushed_offset < offset:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._stopping or self.error is not None:
                    return self.commit_log.flushed_offset >= offset
                self._condition.wait(remaining)
        return True

    def flush_now(self) -> int:
        flushed = self.commit_log.flush()
        self.flush_count += 1
        with self._condition:
            self._condition.notify_all()
        for listener in self._flush_listeners:
            listener(flushed)
        return flushed

    def write_checkpoint(self) -> CheckpointState:
        """Flush the derived files, then record what is now safe on disk."""
        dispatched = self.dispatcher.dispatched_offset
        logics_timestamp = self.dispatcher.last_store_timestamp
        flushed = self.commit_log.flushed_offset
        physic_timestamp = self.commit_log.last_store_timestamp if flushed >= self.commit_log.max_offset else \
            max(self.commit_log.flushed_store_timestamp, self.checkpoint.state.physic_msg_timestamp)
        self.dispatcher.queues.flush()
        self.dispatcher.index.flush()
        state = CheckpointState(
            physic_msg_timestamp=physic_timestamp, logics_msg_timestamp=logics_timestamp,
            index_msg_timestamp=logics_timestamp, confirm_phy_offset=self.confirm_offset(),
            flushed_phy_offset=flushed, dispatched_phy_offset=dispatched,
        )
        self.checkpoint.write(state)
        self._last_checkpoint = time.monotonic()
        return state

    def start(self) -> None:
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="flush", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopping:
            with self._condition:
                # a request that arrived while we were flushing must not wait a whole interval;
                # one past the log's end (the log was cut since) can never be met: drop it
                self._requested = min(self._requested, self.commit_log.max_offset)
                if self._requested <= self.commit_log.flushed_offset and not self._stopping:
                    self._condition.wait(self.flush_interval_s)
                if self._stopping:
                    # woken by stop(): shutdown flushes by itself; halt() must leave the
                    # files exactly as a kill at this moment would
                    return
            try:
                self.flush_now()
                if time.monotonic() - self._last_checkpoint >= self.checkpoint_interval_s:
                    self.write_checkpoint()
            except BaseException as error:
                self.error = error
                log.exception("flush failed; the store stops acknowledging sync puts: %s", error)
                with self._condition:
                    self._condition.notify_all()
                return

    def stop(self) -> None:
        with self._condition:
            self._stopping = True
            self._condition.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
