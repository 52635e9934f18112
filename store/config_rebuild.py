"""Rebuild config files from the log: the ``%SYS%CONFIG`` records are the truth.

The node appends every topic and consumer offset change to the CommitLog as a record of
topic ``%SYS%CONFIG``, queue 0, whose body is a msgpack map (node/server/sys_config.py):

    {"type": "topic", "topic": T, "queue_count": N, "perm": P}
    {"type": "offsets", "group": G, "topic": T, "offsets": {queue id: offset}}

``topics.json`` and ``consumerOffset.json`` are their materialisation. When a file is
unreadable in both copies (moved aside by ``ConfigFile``), or missing while the log holds
such records, ``rebuild_configs`` replays every record in log order into a fresh file, as
the node applies them. The decoding lives here so that the store never imports the node.
"""

from __future__ import annotations

import logging
from typing import Callable

import msgpack

from .config_files import ConfigStore

log = logging.getLogger(__name__)

SYS_CONFIG_TOPIC = "%SYS%CONFIG"
PERM_READ_WRITE = 6
REBUILT_FILES = ("topics.json", "consumerOffset.json")
_PULL_COUNT = 512


def apply_record(change: dict, topics: dict, offsets: dict) -> None:
    """Apply one decoded record to a topics.json and a consumerOffset.json table."""
    kind = change.get("type")
    if kind == "topic":
        table = topics.setdefault("topicConfigTable", {})
        table[change["topic"]] = {"topicName": change["topic"], "readQueueNums": change["queue_count"],
                                  "writeQueueNums": change["queue_count"],
                                  "perm": change.get("perm", PERM_READ_WRITE)}
    elif kind == "offsets":
        table = offsets.setdefault(f"{change['topic']}@{change['group']}", {})
        for queue_id, offset in change["offsets"].items():
            table[str(queue_id)] = offset


def files_to_rebuild(configs: ConfigStore, log_has_records: bool) -> list[str]:
    """The rebuildable files that were damaged, or missing although the log has records."""
    return [name for name in REBUILT_FILES
            if configs[name].damaged or (configs[name].missing and log_has_records)]


def rebuild_configs(configs: ConfigStore, pull: Callable, min_offset: int, max_offset: int) -> list[str]:
    """Replay every %SYS%CONFIG record into the files that need it; return their names.

    ``pull(queue_offset, count)`` returns a GetResult of queue 0 of %SYS%CONFIG."""
    names = files_to_rebuild(configs, max_offset > min_offset)
    if not names:
        return []
    topics: dict = {}
    offsets: dict = {}
    offset = min_offset
    records = 0
    while offset < max_offset:
        result = pull(offset, _PULL_COUNT)
        for message in result.messages:
            try:
                apply_record(msgpack.unpackb(message.body, raw=False, strict_map_key=False), topics, offsets)
                records += 1
            except (ValueError, KeyError, TypeError, AttributeError) as error:
                log.warning("skipping an unreadable %s record at queue offset %d: %s",
                            SYS_CONFIG_TOPIC, message.queue_offset, error)
        if result.next_offset <= offset:
            break
        offset = result.next_offset
    rebuilt = {"topics.json": topics, "consumerOffset.json": offsets}
    for name in names:
        config_file = configs[name]
        with config_file.lock:
            config_file.data = rebuilt[name]
        config_file.persist()
        config_file.damaged = config_file.missing = False
        log.warning("%s rebuilt from %d %s record(s) of the log", config_file.path, records, SYS_CONFIG_TOPIC)
    return names
