"""Values of the client library: messages going out, results and messages coming back."""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from typing import NamedTuple

from ..errors import NotMasterError, RequestError
from ..wire.protocol import ResponseCode


class SendResult(NamedTuple):
    """One message's outcome as the node reported it. A named tuple rather than a frozen
    dataclass: a batch's results are made from the reply's columns in one C-level pass
    (see Producer._resolve), where a frozen dataclass costs ~0.7 µs per message."""

    status: str
    queue_id: int
    queue_offset: int
    physical_offset: int
    message_id: str
    uniq_key: str
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "PUT_OK"


@dataclass(frozen=True, slots=True)
class ReceivedMessage:
    """A message as pulled or queried."""

    topic: str
    queue_id: int
    queue_offset: int
    physical_offset: int
    message_id: str
    body: bytes
    properties: dict
    born_timestamp: int
    store_timestamp: int
    born_host: str = ""
    store_host: str = ""
    flag: int = 0

    @property
    def keys(self) -> list[str]:
        return [key for key in self.properties.get("KEYS", "").split(" ") if key]

    @property
    def tags(self) -> str | None:
        return self.properties.get("TAGS")

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get("UNIQ_KEY")

    @classmethod
    def from_wire(cls, item: dict) -> "ReceivedMessage":
        return cls(item["topic"], item["queue_id"], item["queue_offset"], item["physical_offset"],
                   item["message_id"], item["body"], item.get("properties", {}), item["born_timestamp"],
                   item["store_timestamp"], item.get("born_host", ""), item.get("store_host", ""),
                   item.get("flag", 0))

    def to_json(self) -> dict:
        body = self.body.decode("utf-8", errors="replace")
        return {"topic": self.topic, "queue_id": self.queue_id, "queue_offset": self.queue_offset,
                "physical_offset": self.physical_offset, "message_id": self.message_id, "keys": self.keys,
                "tags": self.tags, "uniq_key": self.uniq_key, "born_timestamp": self.born_timestamp,
                "store_timestamp": self.store_timestamp, "properties": self.properties,
                "body_bytes": len(self.body), "body": body}


# UNIQ_KEY, the client's id of a message, made as RocketMQ's client makes it: a prefix
# unique to the process and a counter, 32 hex digits. The prefix is 64 random bits (drawn
# again in a forked child), so keys of different processes collide with odds of about
# processes**2 / 2**65; one process never repeats a key. Far cheaper than 16 random bytes
# per message (a system call each).
_uniq_key_prefix = os.urandom(8).hex().upper()
_uniq_key_counter = itertools.count()


def new_uniq_key() -> str:
    """A fresh UNIQ_KEY (32 upper-case hex digits)."""
    return f"{_uniq_key_prefix}{next(_uniq_key_counter):016X}"


def _new_uniq_key_prefix() -> None:
    global _uniq_key_prefix
    _uniq_key_prefix = os.urandom(8).hex().upper()


os.register_at_fork(after_in_child=_new_uniq_key_prefix)


@dataclass(slots=True, init=False)
class OutgoingMessage:
    """A message to send. ``queue_id`` None lets the node pick (round robin);
    ``uniq_key`` None gets a new one (new_uniq_key)."""

    body: bytes
    keys: list[str] | tuple[str, ...]
    tags: str | None
    properties: dict[str, str]
    queue_id: int | None
    uniq_key: str

    # written out: the generated __init__'s default factories cost as much as the rest of it
    def __init__(self, body: bytes, keys: list[str] | tuple[str, ...] = (), tags: str | None = None,
                 properties: dict[str, str] | None = None, queue_id: int | None = None,
                 uniq_key: str | None = None) -> None:
        self.body = body
        self.keys = keys
        self.tags = tags
        self.properties = {} if properties is None else properties
        self.queue_id = queue_id
        self.uniq_key = f"{_uniq_key_prefix}{next(_uniq_key_counter):016X}" if uniq_key is None else uniq_key

    def to_wire(self) -> dict:
        item: dict = {"body": self.body, "properties": self.wire_properties()}
        if self.keys:
            item["keys"] = list(self.keys)
        if self.tags:
            item["tags"] = self.tags
        if self.queue_id is not None:
            item["queue_id"] = self.queue_id
        return item

    def wire_properties(self) -> dict[str, str]:
        """The properties as sent: the message's own and its UNIQ_KEY."""
        properties = self.properties
        return {**properties, "UNIQ_KEY": self.uniq_key} if properties else {"UNIQ_KEY": self.uniq_key}

    @property
    def size_bytes(self) -> int:
        return len(self.body) + 64


def send_fields(messages: list[OutgoingMessage]) -> dict:
    """A SEND's messages: ``message_columns`` (a list per field) when every one is plain, a
    body and properties, with the UNIQ_KEYs as a column of their own when no message has
    other properties (no map per message); ``messages`` (a map each) when any carries keys,
    tags or a queue."""
    if any(message.keys or message.tags or message.queue_id is not None for message in messages):
        return {"messages": [message.to_wire() for message in messages]}
    bodies = [message.body for message in messages]
    if any(message.properties for message in messages):
        return {"message_columns": {"body": bodies,
                                    "properties": [message.wire_properties() for message in messages]}}
    return {"message_columns": {"body": bodies, "uniq_key": [message.uniq_key for message in messages]}}


def error_from_reply(reply: dict) -> RequestError:
    """The typed exception for an error reply."""
    try:
        name = ResponseCode(reply.get("code")).name
    except ValueError:
        name = f"CODE_{reply.get('code')}"
    message = str(reply.get("error", ""))
    if name == "NOT_MASTER":
        return NotMasterError(message, reply.get("master_address"))
    return RequestError(name, message)
