"""Store directories as the pipeline sees them: where the CommitLog is, which node and group
it belongs to, its segments and the store time each segment starts at.

A path given to the pipeline may be

- a node directory, as ``hastore cluster up`` lays it out: ``DIR/<node>/node.yaml`` (with
  ``node_id`` and ``group``) beside ``DIR/<node>/store/commitlog/``;
- a store directory (it holds ``commitlog/``). If a ``node.yaml`` sits beside it (in its
  parent directory), node and group come from there.

Without a ``node.yaml`` the node is the directory's name (the parent's name when the store
directory is called ``store``) and the group is the empty string. Reads only: nothing here
writes a byte or takes a lock, so a running node's store can be read (its newest records may
be incomplete; they show as ``crc_ok = false``).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from .errors import NotAStoreError

SEGMENT_NAME_DIGITS = 20
_FIRST_RECORD = struct.Struct(">iI")          # TOTALSIZE, MAGICCODE
_STORE_TIMESTAMP_AT = 56
_MESSAGE_MAGIC = 0xDAA320A7


@dataclass(frozen=True, slots=True)
class Segment:
    """One CommitLog file: its start offset (its name), path and size in bytes."""

    start_offset: int
    path: str
    file_bytes: int

    @property
    def name(self) -> str:
        return os.path.basename(self.path)


@dataclass(frozen=True, slots=True)
class StoreDir:
    """A store directory with the node and group it belongs to."""

    path: str                 # the store root (it holds commitlog/)
    node: str
    group: str

    @property
    def commitlog_path(self) -> str:
        return os.path.join(self.path, "commitlog")


def resolve_store(path: str) -> StoreDir:
    """The store behind ``path`` (a node directory or a store directory); NotAStoreError if none."""
    path = os.path.abspath(os.path.expanduser(path))
    if not os.path.isdir(path):
        raise NotAStoreError(f"{path}: no such directory (give a store directory, which holds commitlog/, "
                             f"or a node directory of `hastore cluster up`, which holds node.yaml and store/)")
    node_yaml = None
    if os.path.isfile(os.path.join(path, "node.yaml")) and not os.path.isdir(os.path.join(path, "commitlog")):
        node_yaml = os.path.join(path, "node.yaml")
        path = _store_path_from(node_yaml, path)
    elif os.path.isfile(os.path.join(os.path.dirname(path), "node.yaml")):
        node_yaml = os.path.join(os.path.dirname(path), "node.yaml")
    if not os.path.isdir(os.path.join(path, "commitlog")):
        raise NotAStoreError(f"{path}: not a store directory (no commitlog/ inside)")
    name = os.path.basename(path)
    node = os.path.basename(os.path.dirname(path)) if name == "store" else name
    group = ""
    if node_yaml is not None:
        config = _read_yaml(node_yaml)
        node = str(config.get("node_id") or node)
        group = str(config.get("group") or "")
    return StoreDir(path, node, group)


def _store_path_from(node_yaml: str, node_dir: str) -> str:
    configured = _read_yaml(node_yaml).get("store_path")
    if configured and os.path.isdir(os.path.join(str(configured), "commitlog")):
        return os.path.abspath(str(configured))
    return os.path.join(node_dir, "store")


def _read_yaml(path: str) -> dict:
    import yaml   # pyyaml is a hastore dependency; imported here so the pure helpers stay light
    try:
        with open(path, encoding="utf-8") as handle:
            loaded = yaml.safe_load(handle)
    except (OSError, yaml.YAMLError) as error:
        raise NotAStoreError(f"{path}: cannot read node config: {error}") from None
    return loaded if isinstance(loaded, dict) else {}


def resolve_stores(paths: list[str] | tuple[str, ...]) -> list[StoreDir]:
    """Every path resolved; NotAStoreError names the first bad one. Duplicates are refused."""
    if not paths:
        raise NotAStoreError("no store directory given")
    stores = [resolve_store(path) for path in paths]
    seen: set[str] = set()
    for store in stores:
        if store.path in seen:
            raise NotAStoreError(f"{store.path} is given twice")
        seen.add(store.path)
    return stores


def split_paths(text: str) -> list[str]:
    """A ``load("DIR1,DIR2")`` path string as a list (commas separate; blanks are dropped)."""
    return [part.strip() for part in text.split(",") if part.strip()]


def list_segments(store: StoreDir) -> list[Segment]:
    """The CommitLog segments of a store, by start offset (files not named by 20 digits are skipped)."""
    segments = []
    for name in os.listdir(store.commitlog_path):
        if len(name) == SEGMENT_NAME_DIGITS and name.isdigit():
            path = os.path.join(store.commitlog_path, name)
            segments.append(Segment(int(name), path, os.path.getsize(path)))
    return sorted(segments, key=lambda segment: segment.start_offset)


def first_store_timestamp_ms(segment: Segment) -> int | None:
    """The store timestamp of a segment's first record, None when it holds no message (empty,
    unwritten or corrupt at its start). Reads 64 bytes."""
    with open(segment.path, "rb") as handle:
        head = handle.read(_STORE_TIMESTAMP_AT + 8)
    if len(head) < _STORE_TIMESTAMP_AT + 8:
        return None
    total_size, magic = _FIRST_RECORD.unpack_from(head, 0)
    if magic != _MESSAGE_MAGIC or total_size <= _STORE_TIMESTAMP_AT + 8:
        return None
    return struct.unpack_from(">q", head, _STORE_TIMESTAMP_AT)[0]
