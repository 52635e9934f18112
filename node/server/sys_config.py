"""Topic configs and consumer offsets: held in memory, logged to the CommitLog, checkpointed to files.

Every change is first appended to the CommitLog as a ``%SYS%CONFIG`` record (queue 0;
body = msgpack map), so it replicates with the data and a failover loses none of it. The
JSON config files (``topics.json``, ``consumerOffset.json``) are the checkpointed
materialisation, rewritten every ``config_persist_interval_ms`` and at shutdown, and
``sysConfigReplay.json`` says up to which %SYS%CONFIG queue offset they are complete. On
start the node loads the files and replays the records from that offset to the end of the
queue. Records are absolute ("queue 3 of T@G is at 120", "topic T has 8 queues"), so
replaying one twice is harmless and replaying them in log order always ends at the newest
state.

A slave applies the records as they replicate in (``catch_up``, called once a dispatch
pass grows the %SYS%CONFIG queue, and under a controller once the confirm offset its master
sends covers records it holds: ``confirm_advanced``), so its topics, subscription groups
and consumer offsets are current for reads served on it, not only once it is promoted.

Records::

    {"type": "topic", "topic": T, "queue_count": n, "perm": 6}
    {"type": "offsets", "group": G, "topic": T, "offsets": {queue_id: offset}}
"""

from __future__ import annotations

import json
import logging
import os

import msgpack
import trio

from store import Message, MessageStore, PutStatus
from store.config_files import write_atomically

from ..errors import RequestError

log = logging.getLogger(__name__)

SYS_CONFIG_TOPIC = "%SYS%CONFIG"
REPLAY_FILE = "sysConfigReplay.json"
REPLAY_BATCH_COUNT = 512
SYS_CONFIG_QUEUE = (SYS_CONFIG_TOPIC, 0)   # as a dispatch pass names a grown queue
CATCH_UP_BATCHES_MAX = 8                  # per catch-up in the loop; the rest at the next one
PERM_READ_WRITE = 6


def topic_record(topic: str, queue_count: int, perm: int = PERM_READ_WRITE) -> dict:
    return {"type": "topic", "topic": topic, "queue_count": queue_count, "perm": perm}


def offsets_record(group: str, topic: str, offsets: dict[int, int]) -> dict:
    return {"type": "offsets", "group": group, "topic": topic, "offsets": dict(offsets)}


class SysConfig:
    """The node's topic table and consumer offsets, backed by the store's config files."""

    def __init__(self, store: MessageStore) -> None:
        self.store = store
        self._topics_file = store.configs["topics.json"]
        self._offsets_file = store.configs["consumerOffset.json"]
        self._topics_file.data.setdefault("topicConfigTable", {})
        self.applied_queue_offset = self._read_replay_offset()
        self.replayed_records = 0
        self.caught_up_records = 0
        self._catch_up_scheduled = False

    # --- reading -------------------------------------------------------------------------
    @property
    def topics(self) -> dict[str, dict]:
        return self._topics_file.data["topicConfigTable"]

    def topic(self, topic: str) -> dict | None:
        return self.topics.get(topic)

    def offsets(self, group: str, topic: str) -> dict[int, int]:
        table = self._offsets_file.data.get(f"{topic}@{group}", {})
        return {int(queue_id): offset for queue_id, offset in table.items()}

    # --- changing ------------------------------------------------------------------------
    def record(self, change: dict) -> tuple[int, int]:
        """Append ``change`` to the CommitLog, then apply it. Returns (queue offset, end offset)."""
        body = msgpack.packb(change, use_bin_type=True)
        (result,) = self.store.append([Message(SYS_CONFIG_TOPIC, body, queue_id=0)])
        if result.status is not PutStatus.PUT_OK:
            raise RequestError("SERVICE_NOT_AVAILABLE", f"config change not logged: {result.status.value} "
                                                        f"{result.reason}")
        self.apply(change)
        self.applied_queue_offset = max(self.applied_queue_offset, result.queue_offset + 1)
        return result.queue_offset, result.end_offset

    def apply(self, change: dict) -> None:
        """Apply one record to the in-memory tables (no logging)."""
        kind = change.get("type")
        if kind == "topic":
            with self._topics_file.lock:
                self.topics[change["topic"]] = {"topicName": change["topic"], "readQueueNums": change["queue_count"],
                                                "writeQueueNums": change["queue_count"],
                                                "perm": change.get("perm", PERM_READ_WRITE)}
        elif kind == "offsets":
            key = f"{change['topic']}@{change['group']}"
            with self._offsets_file.lock:
                table = self._offsets_file.data.setdefault(key, {})
                for queue_id, offset in change["offsets"].items():
                    table[str(queue_id)] = offset
        else:
            log.warning("ignoring a %s record of unknown type %r", SYS_CONFIG_TOPIC, kind)

    def forget_from(self, queue_offset: int) -> None:
        """The log was cut: records from ``queue_offset`` on are gone, replay from there later."""
        self.applied_queue_offset = min(self.applied_queue_offset, queue_offset)

    # --- following the log ---------------------------------------------------------------
    def catch_up(self, batches_max: int | None = CATCH_UP_BATCHES_MAX) -> int:
        """Apply the records the log holds past those applied; how many. On a master it finds
        none (``record`` applies its own); a slave's arrive by replication."""
        self._catch_up_scheduled = False
        offset = max(self.applied_queue_offset, self.store.min_offset(SYS_CONFIG_TOPIC, 0))
        count = batches = 0
        while batches_max is None or batches < batches_max:
            result = self.store.pull(SYS_CONFIG_TOPIC, 0, offset, REPLAY_BATCH_COUNT)
            if not result.messages:
                break
            batches += 1
            for message in result.messages:
                try:
                    self.apply(msgpack.unpackb(message.body, raw=False, strict_map_key=False))
                    count += 1
                except (ValueError, KeyError, TypeError, AttributeError) as error:
                    log.warning("skipping an unreadable %s record at queue offset %d: %s",
                                SYS_CONFIG_TOPIC, message.queue_offset, error)
            offset = result.next_offset
        self.applied_queue_offset = max(self.applied_queue_offset, offset)
        self.caught_up_records += count
        return count

    def catch_up_soon(self) -> None:
        """Call ``catch_up`` from the trio loop soon (on the loop's thread; a dispatch pass's
        listener hands it over), once however many passes ask before it runs."""
        if not self._catch_up_scheduled:
            self._catch_up_scheduled = True
            trio.lowlevel.current_trio_token().run_sync_soon(self.catch_up)

    def confirm_advanced(self) -> None:
        """The confirm offset moved (on the loop's thread). Under a controller a slave reads
        its %SYS%CONFIG queue only up to the confirm offset its master sent, so a record that
        replicated in before the offset covered it was passed over by the catch-up its
        dispatch pass asked for: it applies now, not at the next record or on promotion."""
        if self.store.max_offset(SYS_CONFIG_TOPIC, 0) > self.applied_queue_offset:
            self.catch_up_soon()

    # --- start and checkpoint ------------------------------------------------------------
    def replay(self) -> int:
        """Apply every %SYS%CONFIG record past the checkpoint (blocking: run in a thread)."""
        self.store.wait_dispatched()
        count = self.catch_up(batches_max=None)
        self.caught_up_records -= count
        self.replayed_records += count
        return count

    def persist(self) -> None:
        """Rewrite the config files, then the replay offset they are complete up to (blocking)."""
        complete_up_to = self.applied_queue_offset  # taken first: the files hold at least this
        self._topics_file.persist()
        self._offsets_file.persist()
        write_atomically(self._replay_path, json.dumps({"queue_offset": complete_up_to}).encode())

    @property
    def _replay_path(self) -> str:
        return os.path.join(self.store.configs.directory, REPLAY_FILE)

    def _read_replay_offset(self) -> int:
        for path in (self._replay_path, self._replay_path + ".bak"):
            try:
                with open(path, "rb") as handle:
                    return int(json.load(handle)["queue_offset"])
            except FileNotFoundError:
                continue
            except (ValueError, KeyError, TypeError) as error:
                log.warning("%s unreadable (%s): replaying %s from the start", path, error, SYS_CONFIG_TOPIC)
                return 0
        return 0
