"""A per-message reference of the store's put, for tests only: the records a batch should add
to the log, built message by message from the codec's record encoder (``encode_message``)
and DESIGN.md's rules, independent of both encodings the store uses (put_batch's columns,
and Preparer + CommitLog.append).

It encodes what the store accepted (the results say which) and leaves the refusals to the
store's own checks: the tests hold the store's results and bytes against it.
"""

from __future__ import annotations

from store import codec
from store.message import Message, PutResult, PutStatus


def _properties_text(message: Message) -> str:
    """name\\x01value\\x02 for each property, then KEYS, then TAGS (the fields win over
    properties of the same names)."""
    keys = (message.keys,) if isinstance(message.keys, str) else tuple(message.keys or ())
    text = "".join(f"{name}\x01{value}\x02" for name, value in (message.properties or {}).items()
                   if not (name == "KEYS" and keys) and not (name == "TAGS" and message.tags))
    if keys:
        text += "KEYS\x01" + " ".join(keys) + "\x02"
    if message.tags:
        text += f"TAGS\x01{message.tags}\x02"
    return text


def expected_log(messages: list[Message], results: list[PutResult], *, start_offset: int,
                 queue_offsets: dict[tuple[str, int], int], segment_bytes: int,
                 store_host: str) -> tuple[bytes, list[tuple[int, int]]]:
    """The bytes the accepted messages add to a log ending at ``start_offset`` (blank records
    closing full segments included), and each accepted message's (physical offset, queue
    offset). Store times are taken from the results (the store stamps them)."""
    host = codec.encode_host(store_host)
    pieces: list[bytes] = []
    placed: list[tuple[int, int]] = []
    offset = start_offset
    next_offsets = dict(queue_offsets)
    for message, result in zip(messages, results):
        if result.status is not PutStatus.PUT_OK:
            continue
        body = bytes(message.body)
        topic_bytes = message.topic.encode()
        properties = _properties_text(message).encode()
        size = codec.message_size(topic_bytes, body, properties)
        segment_end = (offset // segment_bytes + 1) * segment_bytes
        if offset + size > segment_end - codec.END_OF_SEGMENT_MIN_BLANK:
            pieces.append(codec.encode_blank(segment_end - offset) + bytes(segment_end - offset - 8))
            offset = segment_end
        key = (message.topic, message.queue_id)
        queue_offset = next_offsets.get(key, 0)
        next_offsets[key] = queue_offset + 1
        pieces += codec.encode_message(
            topic_bytes=topic_bytes, queue_id=message.queue_id, body=body, body_crc=codec.crc32(body) & 0x7FFFFFFF,
            properties_bytes=properties, flag=message.flag, queue_offset=queue_offset, physical_offset=offset,
            sys_flag=message.sys_flag, born_timestamp=message.born_timestamp or result.store_timestamp,
            born_host=codec.encode_host(message.born_host), store_timestamp=result.store_timestamp,
            store_host=host, reconsume_times=message.reconsume_times,
            prepared_transaction_offset=message.prepared_transaction_offset)
        placed.append((offset, queue_offset))
        offset += size
    return b"".join(pieces), placed
