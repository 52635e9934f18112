"""Helpers shared by the store tests: configs, draining queues, reading files from disk."""

from __future__ import annotations

import os
import struct

from store import MessageStore, StoreConfig
from store import codec
from store.commit_log import now_ms

CQ_ENTRY = struct.Struct(">qiq")


class SteppedClock:
    """A store clock that moves only when the test moves it: starts at the wall clock's
    time (in ms), then ``advance(ms)``."""

    def __init__(self, start_ms: int | None = None) -> None:
        self.now_ms = now_ms() if start_ms is None else start_ms

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, ms: int) -> None:
        self.now_ms += ms


def make_config(path, **overrides) -> StoreConfig:
    """Small files and fast background threads; retention only when a test runs it."""
    settings = dict(
        store_path=str(path),
        commitlog_segment_bytes=64 * 1024,
        flush="async",
        flush_interval_ms=20,
        checkpoint_interval_ms=50,
        consume_queue_entries_per_file=64,
        index_hash_slots=64,
        index_max_entries=512,
        retention_check_interval_ms=3_600_000,
    )
    settings.update(overrides)
    return StoreConfig(**settings)


def pull_all(store: MessageStore, topic: str, queue_id: int, start: int | None = None):
    """Every message of one queue from ``start`` (default: its min offset), in order."""
    offset = store.min_offset(topic, queue_id) if start is None else start
    end = store.max_offset(topic, queue_id)
    messages = []
    for _ in range(end - offset + 2):  # each pull advances at least one offset
        if offset >= end:
            break
        result = store.pull(topic, queue_id, offset, 32)
        assert result.next_offset > offset, (result.status, offset)
        messages.extend(result.messages)
        offset = result.next_offset
    assert offset >= end
    return messages


def segment_files(store_path) -> list[str]:
    directory = os.path.join(str(store_path), "commitlog")
    return sorted(os.path.join(directory, n) for n in os.listdir(directory) if len(n) == 20 and n.isdigit())


def scan_commit_log(store_path) -> list[codec.StoredMessage]:
    """Decode the CommitLog straight from the segment files, independent of the store."""
    return scan_log(store_path)[0]


def scan_log(store_path) -> tuple[list[codec.StoredMessage], int]:
    """(messages, end offset of the last record, blank records included) from the files."""
    messages = []
    end = None
    for path in segment_files(store_path):
        with open(path, "rb") as handle:
            data = handle.read()
        start = int(os.path.basename(path))
        if end is None:
            end = start
        if end != start:
            break                             # a preallocated file past the log's end
        position = 0
        while position + 8 <= len(data):
            size, magic = struct.unpack_from(">iI", data, position)
            if magic == codec.BLANK_MAGIC:
                assert position + size == len(data), f"blank record at {start + position} does not end {path}"
                position = len(data)
                break
            if size == 0 and magic == 0:
                return messages, start + position  # unwritten space: the end of the log
            message = codec.decode_message(data[position:position + size])
            assert message.physical_offset == start + position
            messages.append(message)
            position += size
        end = start + position
    return messages, end or 0


def read_cq_entries(store_path, topic: str, queue_id: int) -> dict[int, tuple[int, int, int]]:
    """queue offset -> (commit log offset, size, tags code), from the ConsumeQueue files on disk."""
    directory = os.path.join(str(store_path), "consumequeue", topic, str(queue_id))
    entries = {}
    for name in sorted(os.listdir(directory)):
        if not (len(name) == 20 and name.isdigit()):
            continue
        with open(os.path.join(directory, name), "rb") as handle:
            data = handle.read()
        first = int(name) // CQ_ENTRY.size
        for index, (offset, size, tags_code) in enumerate(CQ_ENTRY.iter_unpack(data)):
            if 0 < size < 2**31 - 1:   # neither a hole nor RocketMQ's filler
                entries[first + index] = (offset, size, tags_code)
    return entries


def same_message(stored: codec.StoredMessage, put) -> bool:
    """Does a read-back message hold what was put (body, keys, tags, user properties)?"""
    expected = dict(put.properties)
    if put.keys:
        expected["KEYS"] = " ".join(put.keys)
    if put.tags:
        expected["TAGS"] = put.tags
    return (stored.topic == put.topic and stored.queue_id == put.queue_id and stored.body == put.body
            and stored.user_properties == expected)


def check_indexes_agree_with_log(store: MessageStore) -> list[codec.StoredMessage]:
    """ConsumeQueue and IndexFile agree with the CommitLog; returns the log's messages."""
    assert store.wait_dispatched(), "dispatcher did not catch up"
    log_messages, end = scan_log(store.config.store_path)
    assert store.commit_log.max_offset == end
    by_queue: dict[tuple[str, int], list[codec.StoredMessage]] = {}
    for message in log_messages:
        by_queue.setdefault((message.topic, message.queue_id), []).append(message)
    for (topic, queue_id), expected in by_queue.items():
        # queue offsets in the log run without gaps or duplicates
        offsets = [m.queue_offset for m in expected]
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets))), (topic, queue_id, offsets)
        assert store.max_offset(topic, queue_id) == offsets[-1] + 1
        got = pull_all(store, topic, queue_id, offsets[0])
        assert [(m.physical_offset, m.queue_offset) for m in got] == \
            [(m.physical_offset, m.queue_offset) for m in expected]
        for m in got:
            assert codec.crc32_body(m.body) == m.body_crc
    for topic, queue_ids in store.topics().items():
        for queue_id in queue_ids:
            assert (topic, queue_id) in by_queue or store.max_offset(topic, queue_id) == store.min_offset(topic, queue_id), \
                f"queue {topic}/{queue_id} has entries but no message in the log"
            if (topic, queue_id) not in by_queue:
                continue
            for queue_offset, (offset, size, _) in read_cq_entries(store.config.store_path, topic, queue_id).items():
                if queue_offset < store.min_offset(topic, queue_id):
                    continue
                message = store.commit_log.read_message(offset)
                assert (message.topic, message.queue_id, message.queue_offset, message.total_size) == \
                    (topic, queue_id, queue_offset, size)
    for message in log_messages:
        for key in message.keys:
            # within the message's own store time, so the query walks the index files of
            # that second only: over all time every query walked every file, and a store of
            # thousands of tiny index files took seconds a check
            when = message.store_timestamp
            found = store.query_by_key(message.topic, key, when, when, max_count=10_000)
            assert message.physical_offset in {m.physical_offset for m in found}, (message.topic, key)
            assert all(key in m.keys for m in found)
    return log_messages
