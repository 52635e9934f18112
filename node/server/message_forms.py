"""The message forms a SEND carries and a reply carries, checked and converted.

A send's ``message_columns`` (a list per field: body, properties) is checked here column by
column with the same refusals as the ``messages`` form; ``message_to_wire`` is a stored
message as a PULL or a query reply carries it.
"""

from __future__ import annotations

from itertools import chain

from store.codec import StoredMessage

from ..errors import RequestError
from ..wire import protocol
from ..wire.protocol import Fields

BODY_AND_PROPERTIES = frozenset(("body", "properties"))   # a message map a producer sends most
MESSAGE_COLUMNS = frozenset(("body", "properties", "uniq_key"))


def message_columns(value: object) -> tuple[list, list, list | None]:
    """The ``body``, ``properties`` and ``uniq_key`` lists of a send's ``message_columns``
    (properties ``[{}, ...]`` when absent, uniq_key None), their shape checked."""
    if type(value) is not dict or not value.keys() <= MESSAGE_COLUMNS:
        raise protocol.bad_request("field message_columns must be a map of the lists body, properties and uniq_key")
    bodies = value.get("body")
    if type(bodies) is not list or not 1 <= len(bodies) <= protocol.BATCH_COUNT_MAX:
        raise protocol.bad_request(f"field message_columns.body must be a list of 1 to {protocol.BATCH_COUNT_MAX} "
                                   "bodies")
    uniq_keys = value.get("uniq_key")
    if uniq_keys is not None:
        if type(uniq_keys) is not list or len(uniq_keys) != len(bodies):
            raise protocol.bad_request("field message_columns.uniq_key must be a list as long as body")
        if not set(map(type, uniq_keys)) <= _STR:
            index = next(i for i, key in enumerate(uniq_keys) if type(key) is not str)
            raise protocol.bad_request(f"field message_columns.uniq_key[{index}] must be a string")
    properties = value.get("properties")
    if properties is None:
        return bodies, [{}] * len(bodies), uniq_keys  # never changed by the store: one map serves them all
    if type(properties) is not list or len(properties) != len(bodies):
        raise protocol.bad_request("field message_columns.properties must be a list as long as body")
    return bodies, properties, uniq_keys


def check_message_columns(bodies: list, properties: list) -> None:
    """Check every message as the ``messages`` form does (the same refusals), column by
    column; the faulty message is looked for only once one is known to be there."""
    if set(map(type, bodies)) != {bytes}:
        index = next(i for i, body in enumerate(bodies) if type(body) is not bytes)
        raise protocol.bad_request(f"field message_columns.body[{index}] must be binary, "
                                   f"not {type(bodies[index]).__name__}")
    if max(map(len, bodies)) > protocol.BODY_BYTES_MAX:
        index = next(i for i, body in enumerate(bodies) if len(body) > protocol.BODY_BYTES_MAX)
        raise RequestError("BODY_TOO_LARGE", f"field message_columns.body[{index}] is {len(bodies[index])} bytes, "
                                             f"over the {protocol.BODY_BYTES_MAX} byte limit")
    if set(map(type, properties)) <= _DICT and max(map(len, properties)) <= _PROPERTIES_MAX \
            and set(map(type, chain.from_iterable(properties))) <= _STR \
            and set(map(type, chain.from_iterable(map(dict.values, properties)))) <= _STR:
        return
    for index, item in enumerate(properties):
        if not plain_properties(item) or item is None:
            Fields({"properties": item}, prefix=f"message_columns[{index}].").str_map("properties")
            raise protocol.bad_request(f"field message_columns.properties[{index}] must be a map of strings")


_DICT = frozenset((dict,))
_STR = frozenset((str,))
_PROPERTIES_MAX = 256


def plain_properties(properties: object) -> bool:
    """None, or a map of at most 256 strings to strings (what Fields.str_map accepts)."""
    if properties is None:
        return True
    if type(properties) is not dict or len(properties) > 256:
        return False
    for key, value in properties.items():
        if type(key) is not str or type(value) is not str:
            return False
    return True


def message_to_wire(message: StoredMessage) -> dict:
    """A stored message as a reply carries it."""
    return {"topic": message.topic, "queue_id": message.queue_id, "queue_offset": message.queue_offset,
            "physical_offset": message.physical_offset, "message_id": message.message_id,
            "body": message.body, "properties": message.user_properties, "flag": message.flag,
            "born_timestamp": message.born_timestamp, "store_timestamp": message.store_timestamp,
            "born_host": message.born_host, "store_host": message.store_host,
            "reconsume_times": message.reconsume_times}
