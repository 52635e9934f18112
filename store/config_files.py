"""Config files under ``config/``, written atomically: temp file, fsync, rename, keep ``.bak``.

    config/topics.json            topic configs
    config/consumerOffset.json    consumer offsets per group, topic@group -> {queueId: offset}
    config/delayOffset.json       delay-level pull offsets
    config/subscriptionGroup.json consumer group configs
    config/consumerFilter.json    consumer filter data

A reader gets the newest whole file: if the main file is missing or unreadable (a crash
between writes can never make it so, but a disk can), the ``.bak`` copy is used. When both
are unreadable the file is moved aside (``.damaged``) and rebuilt from the ``%SYS%CONFIG``
records of the log (``config_rebuild``); nothing asks a person to remove a file.
"""

from __future__ import annotations

import json
import logging
import os
import threading


log = logging.getLogger(__name__)

CONFIG_FILES = ("topics.json", "consumerOffset.json", "delayOffset.json",
                "subscriptionGroup.json", "consumerFilter.json")


def write_atomically(path: str, data: bytes, *, keep_backup: bool = True) -> None:
    """Replace ``path`` with ``data`` so a crash leaves either the old or the new file
    (temp file, fsync, rename, fsync of the directory); the previous version goes to
    ``path.bak`` first unless ``keep_backup`` is False."""
    temp = f"{path}.tmp"
    with open(temp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    if keep_backup and os.path.exists(path):
        _copy_to_backup(path, f"{path}.bak")
    os.replace(temp, path)
    fsync_directory(os.path.dirname(path) or ".")


def fsync_directory(path: str) -> None:
    """Make the directory entries of ``path`` (creations, renames, unlinks) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _copy_to_backup(path: str, backup: str) -> None:
    # a hard link would keep the main name pointing at the old inode until the rename; a copy
    # keeps the rule simple: .bak always holds the previous whole version.
    with open(path, "rb") as source:
        previous = source.read()
    with open(f"{backup}.tmp", "wb") as handle:
        handle.write(previous)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(f"{backup}.tmp", backup)


class ConfigFile:
    """One JSON config file held in memory as a dict and persisted on demand."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.damaged = False     # both copies unreadable at load: to be rebuilt from the log
        self.missing = False     # neither copy existed at load
        self.data: dict = self._load()

    def _load(self) -> dict:
        for candidate in (self.path, f"{self.path}.bak"):
            if not os.path.exists(candidate):
                continue
            try:
                with open(candidate, "rb") as handle:
                    data = json.loads(handle.read() or b"{}")
                if not isinstance(data, dict):
                    raise ValueError("top level is not an object")
                if candidate != self.path:
                    log.warning("%s unreadable; using its backup %s", self.path, candidate)
                return data
            except (ValueError, UnicodeDecodeError) as error:
                log.warning("%s is not valid JSON: %s", candidate, error)
        if os.path.exists(self.path):
            # kept for a person to look at, out of the way; the store rebuilds the content from
            # the %SYS%CONFIG records of its log (config_rebuild)
            aside = f"{self.path}.damaged"
            os.replace(self.path, aside)
            log.warning("%s and its .bak are both unreadable; moved to %s, rebuilding it from the log",
                        self.path, aside)
            self.damaged = True
        elif not os.path.exists(f"{self.path}.bak"):
            self.missing = True
        return {}

    def persist(self) -> None:
        with self.lock:
            encoded = json.dumps(self.data, indent=2, sort_keys=True).encode("utf-8")
        write_atomically(self.path, encoded)


class ConfigStore:
    """All config files of a store directory."""

    def __init__(self, directory: str) -> None:
        os.makedirs(directory, exist_ok=True)
        self.directory = directory
        self.files = {name: ConfigFile(os.path.join(directory, name)) for name in CONFIG_FILES}

    def __getitem__(self, name: str) -> ConfigFile:
        return self.files[name]

    def persist_all(self) -> None:
        for config_file in self.files.values():
            config_file.persist()
