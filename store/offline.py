"""Read a store directory without starting a store: what ``hastore store inspect`` and
``hastore store verify`` use. Opens every file read-only and never changes a byte.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass, field
from typing import Iterator

from . import checkpoint as checkpoint_file, codec
from .checkpoint import CheckpointState
from .consume_queue import ENTRY as CQ_ENTRY, ENTRY_BYTES as CQ_ENTRY_BYTES, is_entry
from .index_file import ENTRY as INDEX_ENTRY, ENTRY_BYTES as INDEX_ENTRY_BYTES, HEADER as INDEX_HEADER, \
    HEADER_BYTES as INDEX_HEADER_BYTES, SLOT, parse_index_file_name
from .mapped_file import parse_file_name


@dataclass
class Problem:
    path: str
    offset: int
    what: str

    def __str__(self) -> str:
        return f"{self.path} @ {self.offset}: {self.what}"


def _map_read(path: str):
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size == 0:
            return b""
        return mmap.mmap(handle.fileno(), size, access=mmap.ACCESS_READ)


def segment_paths(directory: str) -> list[tuple[int, str]]:
    if not os.path.isdir(directory):
        return []
    found = [(parse_file_name(name), os.path.join(directory, name)) for name in os.listdir(directory)]
    return sorted((start, path) for start, path in found if start is not None)


@dataclass
class LogRecord:
    """One record found by an offline scan: a message, a blank, or the point where data stops."""

    offset: int
    kind: str                      # "message" | "blank" | "end" | "corrupt"
    size: int
    message: codec.StoredMessage | None = None
    problem: str = ""


def scan_commitlog(root: str, *, decode: bool = True) -> Iterator[LogRecord]:
    """Every record of ``root``/commitlog in order, CRC-checked; stops at the end of data."""
    for start, path in segment_paths(os.path.join(root, "commitlog")):
        mm = _map_read(path)
        position = 0
        size = len(mm)
        while position < size:
            try:
                header = codec.check_record(mm, position, size, check_crc=False)
            except codec.CorruptMessage as error:
                unwritten = mm[position:position + 4] == b"\0\0\0\0"
                yield LogRecord(start + position, "end" if unwritten else "corrupt", 0, None, str(error))
                return
            if header.is_blank:
                yield LogRecord(start + position, "blank", header.total_size)
                break
            try:
                codec.check_record(mm, position, size, check_crc=True)
            except codec.CorruptMessage as error:
                # the lengths hold, so the scan can step over it; its content is not trusted
                yield LogRecord(start + position, "corrupt", header.total_size, None, str(error))
                position += header.total_size
                continue
            message = codec.decode_message(mm, position, check_crc=False) if decode else None
            yield LogRecord(start + position, "message", header.total_size, message)
            position += header.total_size


def read_checkpoint(root: str) -> tuple[CheckpointState, bool] | None:
    """The checkpoint's state and whether a copy checked out (either layout version);
    None without a checkpoint file."""
    path = os.path.join(root, "checkpoint")
    if not os.path.exists(path):
        return None
    state, version = checkpoint_file.read_checkpoint(path)
    return state, version > 0


def consume_queue_dirs(root: str) -> list[tuple[str, int, str]]:
    base = os.path.join(root, "consumequeue")
    result = []
    if not os.path.isdir(base):
        return result
    for topic in sorted(os.listdir(base)):
        topic_dir = os.path.join(base, topic)
        if not os.path.isdir(topic_dir):
            continue
        for name in sorted(os.listdir(topic_dir), key=lambda n: (not n.isdigit(), int(n) if n.isdigit() else 0)):
            if name.isdigit():
                result.append((topic, int(name), os.path.join(topic_dir, name)))
    return result


def consume_queue_entries(directory: str) -> Iterator[tuple[int, int, int, int, str]]:
    """(queue offset, commit log offset, size, tags code, file) of every written entry."""
    for start, path in segment_paths(directory):
        raw = _map_read(path)
        for index, (offset, size, tags_code) in enumerate(CQ_ENTRY.iter_unpack(raw[:len(raw) - len(raw) % CQ_ENTRY_BYTES])):
            if is_entry(offset, size):
                yield (start // CQ_ENTRY_BYTES + index, offset, size, tags_code, path)


@dataclass
class IndexFileView:
    path: str
    begin_timestamp: int
    end_timestamp: int
    begin_physical_offset: int
    end_physical_offset: int
    hash_slot_count: int
    index_count: int
    hash_slots: int
    max_entries: int
    raw: object = field(repr=False, default=None)

    def chain_offsets(self, key_hash: int) -> set[int]:
        offsets = set()
        number = SLOT.unpack_from(self.raw, INDEX_HEADER_BYTES + (key_hash % self.hash_slots) * 4)[0]
        entries_at = INDEX_HEADER_BYTES + self.hash_slots * 4
        steps = 0
        while 0 < number < self.index_count and steps < self.index_count:
            read_hash, offset, _, previous = INDEX_ENTRY.unpack_from(self.raw, entries_at + number * INDEX_ENTRY_BYTES)
            if read_hash == key_hash:
                offsets.add(offset)
            if previous >= number:
                break
            number = previous
            steps += 1
        return offsets


def index_files(root: str, hash_slots: int | None = None) -> list[IndexFileView]:
    """Index files with their headers. The slot count is taken from ``hash_slots`` or worked
    out from the file size and the default 4:1 entries-to-slots ratio."""
    base = os.path.join(root, "index")
    views = []
    if not os.path.isdir(base):
        return views
    for name in sorted(os.listdir(base)):
        if not parse_index_file_name(name):
            continue
        path = os.path.join(base, name)
        raw = _map_read(path)
        header = INDEX_HEADER.unpack_from(raw, 0)
        size = len(raw)
        slots = hash_slots or store_layout(root).get("index_hash_slots") or _guess_slots(size)
        entries = (size - INDEX_HEADER_BYTES - 4 * slots) // INDEX_ENTRY_BYTES
        views.append(IndexFileView(path, *header, hash_slots=slots, max_entries=entries, raw=raw))
    return views


def store_layout(root: str) -> dict:
    """The file-size settings the store was made with (config/storeLayout.json), {} if absent."""
    path = os.path.join(root, "config", "storeLayout.json")
    if not os.path.exists(path):
        return {}
    import json
    with open(path, "rb") as handle:
        return json.loads(handle.read() or b"{}")


def _guess_slots(size: int) -> int:
    # size = 40 + 4*s + 20*e with e = 4*s by default -> s = (size - 40) / 84
    return max(1, (size - INDEX_HEADER_BYTES) // 84)


def verify(root: str, hash_slots: int | None = None) -> tuple[list[Problem], dict]:
    """Check every message's CRC and layout, and that ConsumeQueue and IndexFile agree with the log."""
    problems: list[Problem] = []
    messages: dict[int, codec.StoredMessage] = {}
    corrupt: set[int] = set()
    per_queue: dict[tuple[str, int], list[int]] = {}
    log_end = 0
    for record in scan_commitlog(root):
        if record.kind == "corrupt":
            problems.append(Problem(os.path.join(root, "commitlog"), record.offset, record.problem))
            corrupt.add(record.offset)
            log_end = record.offset + record.size
        if record.kind == "message":
            messages[record.offset] = record.message
            per_queue.setdefault((record.message.topic, record.message.queue_id), []).append(record.offset)
            log_end = record.offset + record.size
        if record.kind == "blank":
            log_end = record.offset + record.size
    checked_entries = 0
    for topic, queue_id, directory in consume_queue_dirs(root):
        expected = per_queue.pop((topic, queue_id), [])
        seen = []
        for queue_offset, offset, size, tags_code, path in consume_queue_entries(directory):
            checked_entries += 1
            message = messages.get(offset)
            if message is None:
                if offset in corrupt:
                    continue  # reported once, at the message
                if offset >= log_end or offset >= (min(messages) if messages else 0):
                    problems.append(Problem(path, queue_offset * CQ_ENTRY_BYTES,
                                            f"entry {queue_offset} points at {offset}, where no message starts"))
                continue
            if (message.topic, message.queue_id, message.queue_offset, message.total_size) != (topic, queue_id, queue_offset, size):
                problems.append(Problem(path, queue_offset * CQ_ENTRY_BYTES,
                                        f"entry {queue_offset} -> {offset} disagrees with the message there "
                                        f"({message.topic}/{message.queue_id} queue offset {message.queue_offset})"))
            if tags_code != codec.tags_hash_code(message.tags):
                problems.append(Problem(path, queue_offset * CQ_ENTRY_BYTES, f"entry {queue_offset}: wrong tags hash"))
            seen.append(offset)
        missing = sorted(set(expected) - set(seen))
        for offset in missing[:20]:
            problems.append(Problem(directory, offset, f"message at {offset} is missing from the consume queue"))
    for (topic, queue_id), offsets in per_queue.items():
        problems.append(Problem(os.path.join(root, "consumequeue", topic, str(queue_id)), offsets[0],
                                f"{len(offsets)} message(s) of {topic}/{queue_id} have no consume queue"))
    views = index_files(root, hash_slots)
    checked_keys = 0
    indexed_from = min((v.begin_physical_offset for v in views if v.index_count > 1), default=None)
    for offset, message in messages.items():
        if indexed_from is None or offset < indexed_from:
            continue
        for key in list(message.keys) + ([message.uniq_key] if message.uniq_key else []):
            key_hash = codec.index_key_hash(f"{message.topic}#{key}")
            checked_keys += 1
            if not any(offset in view.chain_offsets(key_hash) for view in views):
                problems.append(Problem(os.path.join(root, "index"), offset,
                                        f"key {key!r} of the message at {offset} is not in any index file"))
    keyed = [offset for offset, message in messages.items() if message.keys or message.uniq_key]
    if keyed and not views:
        problems.append(Problem(os.path.join(root, "index"), keyed[0],
                                f"no index file, but {len(keyed)} message(s) have keys: start rebuilds the index"))
    problems.extend(_start_repairs(root, hash_slots, any(m.topic == "%SYS%CONFIG" for m in messages.values())))
    summary = {"messages": len(messages), "log_end_offset": log_end, "consume_queue_entries": checked_entries,
               "index_keys_checked": checked_keys, "index_files": len(views), "problems": len(problems)}
    return problems, summary


def _start_repairs(root: str, hash_slots: int | None, has_config_records: bool) -> list[Problem]:
    """What a start would repair besides the indexes: short or empty last files left by a
    crash, index files of the wrong size, an unreadable checkpoint, config files unreadable
    in both copies (or missing while the log holds %SYS%CONFIG records)."""
    problems = []
    layout = store_layout(root)
    sizes = [(os.path.join(root, "commitlog"), layout.get("commitlog_segment_bytes"))]
    sizes += [(directory, (layout.get("consume_queue_entries_per_file") or 0) * CQ_ENTRY_BYTES or None)
              for _, _, directory in consume_queue_dirs(root)]
    for directory, expected in sizes:
        files = segment_paths(directory)
        if not files or not expected:
            continue
        start, path = files[-1]
        actual = os.path.getsize(path)
        if actual != expected:
            what = "empty: start deletes it" if actual == 0 else "short: start deletes it if it holds no data, else extends it"
            problems.append(Problem(path, start, f"last file is {actual} bytes of {expected}, {what}"))
    slots, entries = hash_slots or layout.get("index_hash_slots"), layout.get("index_max_entries")
    if slots and entries:
        expected = INDEX_HEADER_BYTES + 4 * slots + INDEX_ENTRY_BYTES * entries
        base = os.path.join(root, "index")
        for name in sorted(os.listdir(base)) if os.path.isdir(base) else []:
            path = os.path.join(base, name)
            if parse_index_file_name(name) and os.path.getsize(path) != expected:
                problems.append(Problem(path, 0, f"index file of {os.path.getsize(path)} bytes, expected {expected}: "
                                                 "start deletes it and rebuilds the index"))
    for directory in ("consumequeue", "index"):
        if os.path.exists(os.path.join(root, directory, ".rebuilding")):
            problems.append(Problem(os.path.join(root, directory), 0,
                                    "a rebuild was interrupted by a crash: start rebuilds it again from the log"))
    checkpoint = read_checkpoint(root)
    if checkpoint is not None and not checkpoint[1] and os.path.getsize(os.path.join(root, "checkpoint")):
        problems.append(Problem(os.path.join(root, "checkpoint"), 0,
                                "no copy of the checkpoint checks out: start scans the last segments"))
    for name in ("topics.json", "consumerOffset.json"):
        path = os.path.join(root, "config", name)
        copies = [p for p in (path, path + ".bak") if os.path.exists(p)]
        readable = [p for p in copies if _json_object(p)]
        if copies and not readable:
            problems.append(Problem(path, 0, "unreadable, and so is its .bak: start rebuilds it from the "
                                             "%SYS%CONFIG records of the log"))
        elif not copies and has_config_records:
            problems.append(Problem(path, 0, "missing while the log holds %SYS%CONFIG records: start rebuilds it"))
    return problems


def _json_object(path: str) -> bool:
    import json
    try:
        with open(path, "rb") as handle:
            return isinstance(json.loads(handle.read() or b"{}"), dict)
    except (ValueError, UnicodeDecodeError, OSError):
        return False
