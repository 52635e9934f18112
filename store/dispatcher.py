"""Dispatcher (RocketMQ's ReputMessageService): builds ConsumeQueue and IndexFile from the log.

It reads the CommitLog from ``dispatched_offset`` up to the writer's ``max_offset`` in
bounded passes, appends one ConsumeQueue entry per message (packed per queue, one copy per
queue per pass) and one IndexFile entry per KEYS word and per UNIQ_KEY, then advances
``dispatched_offset`` and tells listeners which queues grew (long polling waits on that).
Consumers see a message only once it is dispatched.
"""

from __future__ import annotations

import logging
import os
import shutil
import struct
import threading
from typing import Callable

from . import codec
from .commit_log import CommitLog
from .consume_queue import ENTRY, ConsumeQueue
from .index_file import IndexService

log = logging.getLogger(__name__)

# TOTALSIZE, MAGIC, -, QUEUEID, -, QUEUEOFFSET, PHYSICALOFFSET ... STORETIMESTAMP, ..., BODY LENGTH
_FIELDS = struct.Struct(">iI4xi4xqq20x q 20x i")
assert _FIELDS.size == 88

DispatchListener = Callable[[int, set[tuple[str, int]]], None]


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
    """Builds the indexes from the CommitLog, synchronously (``dispatch_available``) or on a thread."""

    def __init__(self, commit_log: CommitLog, queues: ConsumeQueueTable, index: IndexService,
                 batch_bytes_max: int) -> None:
        self.commit_log = commit_log
        self.queues = queues
        self.index = index
        self.batch_bytes_max = batch_bytes_max
        self.dispatched_offset = 0
        self.last_store_timestamp = 0
        self.dispatched_messages = 0
        self.lock = threading.Lock()          # held for a pass; truncation takes it too
        self.wake = threading.Event()
        self._listeners: list[DispatchListener] = []
        self._topic_hash_prefix: dict[str, int] = {}
        self._tags_codes: dict[str, int] = {}
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.error: BaseException | None = None

    def add_listener(self, listener: DispatchListener) -> None:
        """``listener(dispatched_offset, grown_queues)`` runs on the dispatcher thread after each pass."""
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
            pending: dict[tuple[str, int], list] = {}
            count = 0
            offset = start
            last_timestamp = self.last_store_timestamp
            # key hashes are computed in one batch after the walk (codec.index_key_hashes)
            key_prefixes: list[int] = []
            index_keys: list[str] = []
            key_offsets: list[int] = []
            key_timestamps: list[int] = []
            tags_codes = self._tags_codes
            prefix_hashes = self._topic_hash_prefix
            pack_entry = ENTRY.pack
            unpack = _FIELDS.unpack_from
            for mm, position, size, is_blank in self.commit_log.records(start, end):
                if is_blank:
                    offset = offset - offset % self.commit_log.segment_bytes + self.commit_log.segment_bytes
                    continue
                (_, _, queue_id, queue_offset, physical_offset, store_timestamp,
                 body_length) = unpack(mm, position)
                topic_at = position + 88 + body_length
                topic_end = topic_at + 1 + mm[topic_at]
                topic = mm[topic_at + 1:topic_end].decode("utf-8")
                props = mm[topic_end + 2:position + size].decode("utf-8")
                tags = keys = uniq = None
                if props:
                    for pair in props.split("\x02"):
                        name, _, value = pair.partition("\x01")
                        if name == "KEYS":
                            keys = value
                        elif name == "TAGS":
                            tags = value
                        elif name == "UNIQ_KEY":
                            uniq = value
                queue_key = (topic, queue_id)
                run = pending.get(queue_key)
                if tags:
                    tags_code = tags_codes.get(tags)
                    if tags_code is None:
                        tags_code = codec.java_hash(tags)
                        if len(tags_codes) < 65536:
                            tags_codes[tags] = tags_code
                else:
                    tags_code = 0
                entry = pack_entry(physical_offset, size, tags_code)
                if run is None:
                    pending[queue_key] = [queue_offset, [entry]]
                elif run[0] + len(run[1]) == queue_offset:
                    run[1].append(entry)
                else:  # not contiguous (never in a log this store wrote): write what we have
                    self._write_queue(queue_key, run)
                    pending[queue_key] = [queue_offset, [entry]]
                if keys or uniq:
                    prefix = prefix_hashes.get(topic)
                    if prefix is None:
                        prefix = prefix_hashes[topic] = codec.java_hash_unsigned(topic + "#")
                    if keys:
                        for key in keys.split(" "):
                            if key:
                                key_prefixes.append(prefix)
                                index_keys.append(key)
                                key_offsets.append(physical_offset)
                                key_timestamps.append(store_timestamp)
                    if uniq:
                        key_prefixes.append(prefix)
                        index_keys.append(uniq)
                        key_offsets.append(physical_offset)
                        key_timestamps.append(store_timestamp)
                last_timestamp = store_timestamp
                offset = physical_offset + size
                count += 1
            if index_keys:
                hashes = codec.index_key_hashes(key_prefixes, index_keys)
                self.index.put_many(list(zip(hashes, key_offsets, key_timestamps)))
            for queue_key, run in pending.items():
                self._write_queue(queue_key, run)
            self.last_store_timestamp = last_timestamp
            self.dispatched_messages += count
            self.dispatched_offset = offset
            grown = set(pending)
        for listener in self._listeners:
            listener(self.dispatched_offset, grown)
        return count

    def _write_queue(self, queue_key: tuple[str, int], run: list) -> None:
        queue = self.queues.get_or_create(*queue_key)
        queue.append_entries(run[0], b"".join(run[1]))

    def catch_up(self) -> int:
        """Dispatch everything written so far (recovery, promotion, tests)."""
        total = 0
        while self.dispatched_offset < self.commit_log.max_offset:
            total += self.dispatch_available()
        return total

    # --- thread --------------------------------------------------------------------------
    def start(self) -> None:
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="dispatcher", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopping:
            self.wake.wait(0.05)
            self.wake.clear()
            try:
                while not self._stopping and self.dispatch_available():
                    pass
            except BaseException as error:  # surfaced through statistics and health checks
                self.error = error
                log.exception("dispatcher stopped: %s", error)
                return

    def stop(self) -> None:
        self._stopping = True
        self.wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
