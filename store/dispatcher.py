"""Dispatcher (RocketMQ's ReputMessageService): builds ConsumeQueue and IndexFile from the log.

It reads the CommitLog from ``dispatched_offset`` up to the writer's ``max_offset`` in
bounded passes, appends one ConsumeQueue entry per message (packed per queue, one copy per
queue per pass) and one IndexFile entry per KEYS word and per UNIQ_KEY, then advances
``dispatched_offset`` and tells listeners which queues grew (long polling waits on that).
Consumers see a message only once it is dispatched. On its thread, a wake from a write is
followed by ``dispatch_interval_ms`` of waiting, so the writes of that time share a pass.

Without the thread (``threaded=False``, StoreConfig ``dispatcher_thread: false``) the
owner runs the passes in its own loop: ``wake`` is then a ``WakeFlag`` whose listener
the owner installs with ``listen`` (a write calls it, from whatever thread wrote), and the owner
answers it with ``dispatch_pass`` until ``lag_bytes`` is 0. ``stop``/``start`` hold and
release a gate that ``dispatch_pass`` tries without blocking, so a cut or a shutdown that
stopped the dispatcher never races a pass. The node runs its store this way, in its trio
loop (node/server/dispatch_loop.py).

A pass walks record boundaries here and leaves the rest to ``dispatch_batch``: a few
records are parsed one by one, a large pass (catching up) with numpy in one go.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from itertools import repeat
from operator import sub
from typing import Callable

from . import codec
from .commit_log import CommitLog
from .consume_queue import ConsumeQueue
from .dispatch_batch import DispatchBatch, DispatchParser
from .errors import DiskFullError, invariant
from .index_file import IndexService
from .mapped_file import MappedFile

log = logging.getLogger(__name__)

# Passes with fewer records are parsed one record at a time: below these, numpy's per-call
# cost is more than the loop it replaces (a live store's passes are often a put's worth).
# Records alike (dispatch_layout) take a few dozen numpy calls, any others about a hundred.
_ALIKE_RECORDS_MIN = 16
_COLUMNS_RECORDS_MIN = 128

DISK_FULL_RETRY_S = 1.0   # a pass stopped by a full disk is tried again this much later

DispatchListener = Callable[[int, set[tuple[str, int]]], None]


class WakeFlag:
    """The wake of a dispatcher without a thread: the ``threading.Event`` calls a writer
    makes (``is_set``, ``set``), a flag the owner clears before a pass, and a listener, which
    ``set`` calls on whichever thread wrote (the owner hands over to its loop from there).
    The owner installs it with ``listen`` while its loop runs and removes it with ``unlisten``."""

    __slots__ = ("_set", "_listener")

    def __init__(self) -> None:
        self._set = False
        self._listener: Callable[[], None] | None = None

    def listen(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` on every ``set`` from now on (one listener at a time)."""
        invariant(self._listener is None, "a WakeFlag has one listener at a time")
        self._listener = listener

    def unlisten(self) -> None:
        """No listener any more (a later ``set`` only raises the flag)."""
        self._listener = None

    @property
    def listening(self) -> bool:
        return self._listener is not None

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        self._set = True  # before the callback: a pass the callback starts sees the flag set
        listener = self._listener
        if listener is not None:
            listener()

    def clear(self) -> None:
        self._set = False


class ConsumeQueueTable:
    """Every ConsumeQueue of a store, by (topic, queue id)."""

    def __init__(self, root: str, entries_per_file: int) -> None:
        self.root = root
        self.entries_per_file = entries_per_file
        self.queues: dict[tuple[str, int], ConsumeQueue] = {}
        self._lock = threading.Lock()

    def load(self) -> None:
        os.makedirs(self.root, exist_ok=True)
        for topic in sorted(os.listdir(self.root)):
            topic_dir = os.path.join(self.root, topic)
            if not os.path.isdir(topic_dir) or codec.topic_problem(topic):
                continue
            for name in sorted(os.listdir(topic_dir)):
                if name.isdigit():
                    queue = ConsumeQueue(self.root, topic, int(name), self.entries_per_file)
                    queue.load()
                    self.queues[(topic, int(name))] = queue

    def get(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self.queues.get((topic, queue_id))

    def get_or_create(self, topic: str, queue_id: int) -> ConsumeQueue:
        queue = self.queues.get((topic, queue_id))
        if queue is None:
            with self._lock:
                queue = self.queues.get((topic, queue_id))
                if queue is None:
                    queue = ConsumeQueue(self.root, topic, queue_id, self.entries_per_file)
                    queue.load()
                    self.queues = {**self.queues, (topic, queue_id): queue}
        return queue

    def all(self) -> list[ConsumeQueue]:
        return list(self.queues.values())

    def topics(self) -> dict[str, list[int]]:
        result: dict[str, list[int]] = {}
        for topic, queue_id in self.queues:
            result.setdefault(topic, []).append(queue_id)
        return {topic: sorted(ids) for topic, ids in sorted(result.items())}

    def flush(self) -> None:
        for queue in self.all():
            if queue.dirty:
                queue.flush()

    def close(self) -> None:
        for queue in self.all():
            queue.close()

    def destroy_all(self) -> None:
        """Delete every queue's files (a replica whose whole log is being replaced)."""
        with self._lock:
            for queue in self.all():
                for mapped in reversed(queue.files.files):
                    mapped.destroy()
                queue.files.files = []
            self.queues = {}
            for topic in os.listdir(self.root):
                shutil.rmtree(os.path.join(self.root, topic), ignore_errors=True)


class Dispatcher:
    """Builds the indexes from the CommitLog, synchronously (``dispatch_available``), on a
    thread (``threaded``), or in its owner's loop (``dispatch_pass``). Passes of at least
    ``alike_records_min`` records try the records-alike parser, of at least
    ``columns_records_min`` the column parser; smaller ones go one record at a time."""

    def __init__(self, commit_log: CommitLog, queues: ConsumeQueueTable, index: IndexService,
                 batch_bytes_max: int, interval_s: float = 0.0, *, threaded: bool = True,
                 alike_records_min: int = _ALIKE_RECORDS_MIN, columns_records_min: int = _COLUMNS_RECORDS_MIN) -> None:
        self.commit_log = commit_log
        self.alike_records_min = alike_records_min
        self.columns_records_min = columns_records_min
        self.interval_s = interval_s
        self.queues = queues
        self.index = index
        self.batch_bytes_max = batch_bytes_max
        self.dispatched_offset = 0
        self.last_store_timestamp = 0
        self.dispatched_messages = 0
        self.lock = threading.Lock()          # held for a pass; truncation takes it too
        self.threaded = threaded
        self.wake: threading.Event | WakeFlag = threading.Event() if threaded else WakeFlag()
        # without the thread: held while stopped (stop() to start()), tried by dispatch_pass
        self._gate = threading.Lock()
        self._gate.acquire()
        self._gate_closed = True
        self._listeners: list[DispatchListener] = []
        self._parser = DispatchParser()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.error: BaseException | None = None
        # why the last pass could not create a ConsumeQueue or index file (DiskFullError),
        # until a pass succeeds: the store refuses puts meanwhile (store/room.py)
        self.room_wait: str | None = None

    def add_listener(self, listener: DispatchListener) -> None:
        """``listener(dispatched_offset, grown_queues)`` runs after each pass, on the thread that
        ran it (the dispatcher thread, the owner's loop, or a caller of ``catch_up``)."""
        self._listeners = self._listeners + [listener]

    def remove_listener(self, listener: DispatchListener) -> None:
        self._listeners = [item for item in self._listeners if item is not listener]

    @property
    def lag_bytes(self) -> int:
        return self.commit_log.max_offset - self.dispatched_offset

    # --- one pass ------------------------------------------------------------------------
    def dispatch_available(self, bytes_max: int | None = None) -> int:
        """Dispatch up to ``bytes_max`` of the log now; return the number of messages."""
        with self.lock:
            start = self.dispatched_offset
            end = min(self.commit_log.max_offset, start + (bytes_max or self.batch_bytes_max))
            if end <= start:
                return 0
            count = 0
            offset = start
            grown: set[tuple[str, int]] = set()
            while offset < end:  # one segment at a time (a pass crosses at most a few)
                segment = self.commit_log.segments.find(offset)
                if segment is None:
                    break
                positions, stop, blank = self._positions(segment, offset, end)
                if positions:
                    batch = self._parse(segment.mm, positions)
                    grown.update(self._write(batch))
                    count += batch.count
                offset = segment.end_offset if blank else segment.start_offset + stop
            self.dispatched_messages += count
            self.dispatched_offset = offset
            self.room_wait = None
        for listener in self._listeners:
            listener(self.dispatched_offset, grown)
        return count

    def _positions(self, segment: MappedFile, offset: int, end: int) -> tuple[list[int], int, bool]:
        """``_walk`` from ``offset`` to ``end`` within ``segment``; the records this process
        appended itself are found in the writer's record of them instead (as far as that
        goes on without a gap; the next round of the pass walks from there)."""
        base = segment.start_offset
        limit = min(segment.end_offset, end)
        written = self.commit_log.written_runs.take(offset, limit)
        if written is None:
            return _walk(segment, offset - base, limit - base)
        offsets, stop = written
        if stop > segment.end_offset:   # the message only when it is needed
            invariant(False, f"{segment.path}: a written run crosses the segment's end")
        return list(map(sub, offsets, repeat(base))), stop - base, False

    def _parse(self, buffer, positions: list[int]) -> DispatchBatch:
        parser = self._parser
        batch = None
        if len(positions) >= self.alike_records_min:
            batch = parser.parse_alike(buffer, positions)
        if batch is None:
            batch = (parser.parse_each if len(positions) < self.columns_records_min else parser.parse)(buffer, positions)
        return batch

    def _write(self, batch: DispatchBatch) -> set[tuple[str, int]]:
        """IndexFile entries, then ConsumeQueue entries, of one parsed batch; return the
        queues written."""
        if len(batch.key_hashes):
            self.index.put_many(batch.key_hashes, batch.key_offsets, batch.key_timestamps)
        written = set()
        for queue_key, first_queue_offset, entries in batch.queue_runs:
            self.queues.get_or_create(*queue_key).append_entries(first_queue_offset, entries)
            written.add(queue_key)
        self.last_store_timestamp = batch.last_store_timestamp
        return written

    def catch_up(self) -> int:
        """Dispatch everything written so far (recovery, promotion, tests)."""
        total = 0
        while self.dispatched_offset < self.commit_log.max_offset:
            total += self.dispatch_available()
        return total

    # --- thread, or the owner's loop ------------------------------------------------------
    def start(self) -> None:
        self._stopping = False
        if not self.threaded:
            if self._gate_closed:
                self._gate_closed = False
                self._gate.release()
            self.wake.set()  # the owner's loop: dispatch what was written while stopped
            return
        self._thread = threading.Thread(target=self._run, name="dispatcher", daemon=True)
        self._thread.start()

    def dispatch_pass(self, bytes_max: int | None = None) -> int | None:
        """Without the thread: one pass of up to ``bytes_max`` for the owner's loop (or a
        caller of ``MessageStore.wait_dispatched``); the number of messages, or None while
        stopped, while another thread runs a pass, or after a failure (``error``): then the
        owner waits for the next wake. Never blocks."""
        invariant(not self.threaded, "dispatch_pass is for a dispatcher without its thread")
        if self.error is not None or not self._gate.acquire(blocking=False):
            return None
        try:
            self.wake.clear()
            return self.dispatch_available(bytes_max)
        except DiskFullError as error:  # no room for a ConsumeQueue or index file: the next wake retries
            self._wait_for_room(error)
            return None
        except Exception as error:  # surfaced through statistics and health checks, as on the thread
            self.error = error
            log.exception("dispatcher stopped: %s", error)
            return None
        finally:
            self._gate.release()

    def _run(self) -> None:
        while not self._stopping:
            if self.wake.wait(0.05) and self.interval_s and not self._stopping:
                # the writes of the next interval join this pass (writers see the wake
                # still set and skip setting it): one GIL hand-over instead of one per write
                time.sleep(self.interval_s)
            self.wake.clear()
            try:
                while not self._stopping and self.dispatch_available():
                    pass
            except DiskFullError as error:  # no room for a ConsumeQueue or index file: retried
                self._wait_for_room(error)
                time.sleep(DISK_FULL_RETRY_S)
            except BaseException as error:  # surfaced through statistics and health checks
                self.error = error
                log.exception("dispatcher stopped: %s", error)
                return

    def _wait_for_room(self, error: DiskFullError) -> None:
        if self.room_wait is None:
            log.warning("dispatch waits for room on disk (puts are refused meanwhile): %s", error)
        self.room_wait = str(error)

    def stop(self) -> None:
        self._stopping = True
        if not self.threaded:
            if not self._gate_closed:
                self._gate.acquire()  # waits for a pass under way in the owner's loop
                self._gate_closed = True
            return
        self.wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None


def _walk(segment: MappedFile, position: int, limit: int) -> tuple[list[int], int, bool]:
    """Positions of the messages of ``segment`` starting in [position, limit), where the
    walk stopped, and whether it stopped at the segment's blank record. No CRC check:
    records below the log's ``max_offset`` are whole. (``CommitLog.records`` walks the
    same way but yields one record at a time; the parser wants a segment's positions.)"""
    mm = segment.mm
    unpack = codec.BLANK_HEADER.unpack_from
    message_magic = codec.MESSAGE_MAGIC
    positions: list[int] = []
    while position < limit:
        size, magic = unpack(mm, position)
        if magic != message_magic or size <= 0:
            invariant(magic == codec.BLANK_MAGIC,
                      f"{segment.path}: no record at offset {segment.start_offset + position}")
            return positions, position, True
        positions.append(position)
        position += size
    return positions, position, False
