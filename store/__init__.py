"""hastore's single-node storage engine: CommitLog, ConsumeQueue, IndexFile, recovery.

Synchronous (no trio, no network). The public names::

    from store import MessageStore, StoreConfig, Message, PutStatus

``store.codec`` is the pure byte codec that the pipeline imports on its own.
"""

from .codec import StoredMessage
from .config import StoreConfig
from .errors import (DiskFullError, MessageNotFound, StoreClosedError, StoreConfigError, StoreCorruptError,
                     StoreError)
from .message import Message, PutResult, PutStatus
from .message_store import GetResult, GetStatus, MessageStore, StoreStatistics

__all__ = [
    "MessageStore", "StoreConfig", "Message", "PutStatus", "PutResult", "StoredMessage", "GetResult", "GetStatus",
    "StoreStatistics", "StoreError", "StoreConfigError", "StoreClosedError", "StoreCorruptError", "DiskFullError",
    "MessageNotFound",
]
