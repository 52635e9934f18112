"""hastore's single-node storage engine: CommitLog, ConsumeQueue, IndexFile, recovery.

Synchronous (no trio, no network). The public names::

    from store import MessageStore, StoreConfig, Message, PutStatus

They are loaded on first use (PEP 562), so that ``import store.codec`` or ``store.errors``
(the pure byte codec and the error types, which the client library, the pipeline and the
chaos checkers import on their own) loads neither the engine nor numpy.
"""

from __future__ import annotations

import importlib

# public name -> the module that defines it
_EXPORTS = {
    "StoredMessage": "codec",
    "StoreConfig": "config",
    "DiskFullError": "errors", "MessageNotFound": "errors", "StoreClosedError": "errors",
    "StoreConfigError": "errors", "StoreCorruptError": "errors", "StoreError": "errors",
    "Message": "message", "PutColumns": "message", "PutResult": "message", "PutStatus": "message",
    "PlainBatch": "put_batch",
    "GetResult": "reads", "GetStatus": "reads", "MessageStore": "message_store",
    "StoreStatistics": "message_store",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module_name = _EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'store' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module_name}", __name__), name)
    globals()[name] = value   # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
