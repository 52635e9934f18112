"""Batch puts without a Python loop per message: the columns of a regular batch.

A put of many messages used to run Python code per message twice, once to validate and
encode (``Preparer.prepare``) and once to place it (``CommitLog._append_to_segment``):
about 5 us a message on this machine, most of it interpreter overhead. Here a batch is
turned into columns (one tuple per field) and every step is a C-level ``map`` over them:
the checks are set and count operations over whole columns, the encodings are bound
``join`` / ``%`` / ``pack`` methods mapped over zipped columns, the CRCs ``codec.crc32``
mapped over bodies, headers and tails.

A batch comes in one of two forms, both taken by the store's one put function
(``MessageStore.append``): a list of ``Message``, or a ``PlainBatch`` (one topic, and per
message only a queue id, a body and properties, as lists: what a producer's batch carries,
without a Message per message). ``regular_columns`` turns either into the same columns.

Only a *regular* batch of at least COLUMNS_MESSAGES_MIN messages goes column-wise: every
topic and born host already seen by the store (so known legal), bodies ``bytes``, queue ids
``int``, properties plain ``str`` maps without store-owned names, and KEYS / TAGS either set
on every message or on none. Anything else (a first message of a new topic, an illegal
message, a mixed batch, a small batch) is prepared and written one message at a time,
which is also the reference: the tests compare both encodings byte for byte. Regular means
no message can be refused, so this way either writes the whole batch or (a full disk)
refuses the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate, chain, count, repeat
from operator import add, and_, attrgetter, itemgetter
from typing import NamedTuple, Union

from . import codec
from .message import Message

# every field of a Message the record needs, read in one C call per message
_MESSAGE_FIELDS = attrgetter("topic", "queue_id", "body", "keys", "tags", "properties", "flag", "sys_flag",
                             "born_timestamp", "born_host", "reconsume_times", "prepared_transaction_offset")
# names a regular batch's property maps must not hold: HCRC belongs to the store, and a
# KEYS or TAGS property loses to the field of the same name (the per-message path sorts that out)
_STORE_NAMES = codec.STORE_PROPERTY_NAMES | {codec.PROPERTY_KEYS, codec.PROPERTY_TAGS}
_PROPERTIES_LENGTH = codec.PROPS_LEN.pack
# a record is header + body + tail + the __CRC32# property (its name, digits and separator);
# a column's tail stops before that property: it is what the whole-message CRC covers after the body
_BESIDE_BODY_AND_TAIL = codec.HEADER.size + codec.SEAL_PROPERTY_BYTES
_BODY_CRC_MASK = 0x7FFFFFFF
_MAX_QUEUE_ID = 2**31 - 1
_join_pair = codec.NAME_VALUE_SEPARATOR.join
_join_pairs = codec.PROPERTY_SEPARATOR.join
_join_keys = codec.KEY_SEPARATOR.join
_crc32 = codec.crc32
_TAIL_FORMAT = b"%s%s%s"
# the __CRC32# property from a CRC (codec.seal_value as three C-level steps mapped over a
# run): ten decimal digits, reversed (least significant first), between its name and \x02
_DIGITS_FORMAT = b"%010d"
_REVERSED = itemgetter(slice(None, None, -1))
_SEAL_FORMAT = codec.SEAL_PREFIX + b"%s\x02"
_END_OF_PAIRS = ("",)  # joined last, so a non-empty map's text ends with its separator
# from this many messages a batch may be written column-wise: below it the fixed cost of
# the column encoding is more than the per-message loop it replaces
COLUMNS_MESSAGES_MIN = 4


class PlainBatch(NamedTuple):
    """Messages of one topic that set only a queue id, a body and properties (every other
    field its default), one list per field: ``Message(topic, bodies[i], queue_ids[i],
    properties=property_maps()[i])`` for each i. ``uniq_keys``, when given, holds each
    message's UNIQ_KEY property, set in its map as ``{**properties, "UNIQ_KEY": key}`` would
    (after the others, or in the place of one of that name): a producer's batch of messages
    with no properties of their own needs no map per message."""

    topic: str
    queue_ids: list[int]
    bodies: list[bytes]
    properties: list[dict]
    uniq_keys: list[str] | None = None

    def property_maps(self) -> list:
        """Each message's properties, its UNIQ_KEY included (an item that is not a map is
        left as it is, for the per-message path to refuse)."""
        if self.uniq_keys is None:
            return self.properties
        return [{**properties, codec.PROPERTY_UNIQ_KEY: key} if type(properties) is dict else properties
                for properties, key in zip(self.properties, self.uniq_keys)]

    def messages(self) -> list[Message]:
        """The same batch as Messages, for the per-message path."""
        return [Message(self.topic, body, queue_id, properties=message_properties)
                for queue_id, body, message_properties in zip(self.queue_ids, self.bodies, self.property_maps())]


# what the store's put function takes: Messages, or a plain batch as columns
Batch = Union[Sequence[Message], PlainBatch]


def regular_columns(batch: Batch, tail_prefixes: dict[str, bytes], born_hosts: dict[str, bytes],
                    largest_record: int) -> BatchColumns | None:
    """The columns of ``batch`` if it is regular and has at least COLUMNS_MESSAGES_MIN
    messages; None if it must go message by message (see the module docstring)."""
    if type(batch) is PlainBatch:
        uniq_keys = batch.uniq_keys
        if not len(batch.queue_ids) == len(batch.bodies) == len(batch.properties) or \
                (uniq_keys is not None and len(uniq_keys) != len(batch.bodies)):
            raise ValueError(f"a plain batch needs one queue id, body, properties map (and UNIQ_KEY, if given) per "
                             f"message, not {len(batch.queue_ids)}, {len(batch.bodies)}, {len(batch.properties)}"
                             + ("" if uniq_keys is None else f" and {len(uniq_keys)}"))
        if len(batch.bodies) < COLUMNS_MESSAGES_MIN:
            return None
        properties = batch.properties
        if uniq_keys is not None and any(properties):   # keys beside other properties: merged into maps
            properties, uniq_keys = batch.property_maps(), None
        return plain_batch_columns(batch.topic, batch.queue_ids, batch.bodies, properties, tail_prefixes,
                                   born_hosts, largest_record, uniq_keys)
    if len(batch) < COLUMNS_MESSAGES_MIN:
        return None
    return batch_columns(batch, tail_prefixes, born_hosts, largest_record)


class BatchColumns(NamedTuple):
    """A regular batch, one tuple or list per field, ready to be placed in the log."""

    topics: tuple[str, ...]
    queue_ids: tuple[int, ...]
    bodies: tuple[bytes, ...]
    body_crcs: list[int]
    tails: list[bytes]                     # TOPICLEN TOPIC PROPLEN PROPERTIES, up to the __CRC32# property
    flags: tuple[int, ...]
    sys_flags: tuple[int, ...]
    born_timestamps: tuple[int, ...]
    born_hosts: list[bytes]
    reconsume_times: tuple[int, ...]
    prepared_transaction_offsets: tuple[int, ...]
    sizes: list[int]

    def run(self, start: int, end: int) -> "BatchColumns":
        """The messages [start, end) (a segment roll splits a batch)."""
        return BatchColumns(*(column[start:end] for column in self))


def batch_columns(messages: list, tail_prefixes: dict[str, bytes], born_hosts: dict[str, bytes],
                  largest_record: int) -> BatchColumns | None:
    """The columns of ``messages``, or None if the batch is not regular.

    ``tail_prefixes`` maps each known legal topic to its TOPICLEN + TOPIC bytes, and
    ``born_hosts`` each known born host to its 8 bytes; a topic or host missing from them
    makes the batch irregular (``Preparer.prepare`` checks it and fills the caches).
    """
    return _columns(*zip(*map(_MESSAGE_FIELDS, messages)), tail_prefixes, born_hosts, largest_record)


def plain_batch_columns(topic: str, queue_ids: list[int], bodies: list[bytes], properties: list[dict],
                        tail_prefixes: dict[str, bytes], born_hosts: dict[str, bytes],
                        largest_record: int, uniq_keys: list[str] | None = None) -> BatchColumns | None:
    """``batch_columns`` of the Messages ``Message(topic, body, queue_id, properties=...)``
    (every other field its default), given as columns: a producer's batch as the node
    receives it, without a Message per message. With ``uniq_keys`` every properties map
    must be empty: each message's properties are then its UNIQ_KEY alone."""
    count = len(bodies)
    return _columns((topic,) * count, queue_ids, bodies, _NO_KEYS * count, _NO_TAGS * count, properties,
                    _ZEROS * count, _ZEROS * count, _ZEROS * count, _DEFAULT_HOSTS * count, _ZEROS * count,
                    _ZEROS * count, tail_prefixes, born_hosts, largest_record, uniq_keys)


_NO_KEYS = ((),)
_NO_TAGS = (None,)
_ZEROS = (0,)
_DEFAULT_HOSTS = (Message.__dataclass_fields__["born_host"].default,)


def _columns(topics: tuple, queue_ids, bodies, keys, tags, properties, flags, sys_flags, born_timestamps, hosts,
             reconsume_times, prepared_offsets, tail_prefixes: dict[str, bytes], born_hosts: dict[str, bytes],
             largest_record: int, uniq_keys: list[str] | None = None) -> BatchColumns | None:
    try:
        topic_set = set(topics)
        host_set = set(hosts)
    except TypeError:  # an unhashable topic or host: certainly illegal, the per-message path says why
        return None
    if not (topic_set <= tail_prefixes.keys() and host_set <= born_hosts.keys()
            and set(map(type, bodies)) == {bytes} and max(map(len, bodies)) <= codec.MAX_BODY_BYTES
            and set(map(type, queue_ids)) == {int} and min(queue_ids) >= 0 and max(queue_ids) <= _MAX_QUEUE_ID
            and set(map(type, properties)) == {dict} and not any(sys_flags)):   # flags: prepare checks them
        return None
    texts = _property_texts(keys, tags, properties) if uniq_keys is None else _uniq_key_texts(uniq_keys)
    if texts is None:
        return None
    encoded = list(map(str.encode, texts))
    if max(map(len, encoded)) + codec.HCRC_PROPERTY_BYTES > codec.MAX_PROPERTIES_BYTES:
        return None
    if len(topic_set) == 1:
        prefixes = repeat(tail_prefixes[topics[0]])
    else:
        prefixes = map(tail_prefixes.__getitem__, topics)
    lengths = map(_PROPERTIES_LENGTH, map(add, map(len, encoded), repeat(codec.HCRC_PROPERTY_BYTES)))
    tails = list(map(_TAIL_FORMAT.__mod__, zip(prefixes, lengths, encoded)))
    sizes = list(map(add, map(len, bodies), map(add, map(len, tails), repeat(_BESIDE_BODY_AND_TAIL))))
    if max(sizes) > largest_record:
        return None
    if len(host_set) == 1:
        host_bytes = [born_hosts[hosts[0]]] * len(hosts)
    else:
        host_bytes = list(map(born_hosts.__getitem__, hosts))
    body_crcs = list(map(and_, map(_crc32, bodies), repeat(_BODY_CRC_MASK)))
    return BatchColumns(topics, queue_ids, bodies, body_crcs, tails, flags, sys_flags, born_timestamps,
                        host_bytes, reconsume_times, prepared_offsets, sizes)


def _property_texts(keys: tuple, tags: tuple, properties: tuple[dict, ...]) -> list[str] | None:
    """Each message's properties as ``name\x01value\x02`` text (its map, then KEYS, then
    TAGS, as ``prepare._properties_of`` writes them), or None if any needs the
    per-message path: a name, value, key or tag not exactly a str, an empty name or key, a
    key with a space, a separator inside a name or value, a store-owned name, keys not a
    list or tuple, or KEYS / TAGS set on some messages only."""
    names = set().union(*properties)
    values = list(chain.from_iterable(map(dict.values, properties)))
    if not (_only_str(names) and "" not in names and _STORE_NAMES.isdisjoint(names) and _only_str(values)):
        return None
    pairs = len(values)
    if not names:
        texts = [""] * len(properties)
    elif len(names) == 1 and pairs == len(properties):
        # every map holds the one name once (a producer's UNIQ_KEY): "name\x01" + value + "\x02"
        texts = list(map(add, repeat(f"{next(iter(names))}{codec.NAME_VALUE_SEPARATOR}"),
                         map(add, values, repeat(codec.PROPERTY_SEPARATOR))))
    else:
        texts = list(map(_join_pairs, map(chain, map(map, repeat(_join_pair), map(dict.items, properties)),
                                          repeat(_END_OF_PAIRS))))
    if not set(map(type, keys)) <= _KEY_LIST_TYPES:
        return None
    if any(keys):
        if not all(keys) or not _only_str(chain.from_iterable(keys)):
            return None
        key_texts = list(map(_join_keys, keys))
        if not _words_are_keys(key_texts, sum(map(len, keys))):
            return None
        texts = list(map(add, texts, map(add, repeat("KEYS\x01"), map(add, key_texts, repeat("\x02")))))
        pairs += len(keys)
    if any(tags):
        if set(map(type, tags)) != {str} or not all(tags):
            return None
        texts = list(map(add, texts, map(add, repeat("TAGS\x01"), map(add, tags, repeat("\x02")))))
        pairs += len(tags)
    whole = "".join(texts)
    # every separator must be one written here, none from inside a name or value
    if whole.count(codec.NAME_VALUE_SEPARATOR) != pairs or whole.count(codec.PROPERTY_SEPARATOR) != pairs:
        return None
    return texts


def _uniq_key_texts(uniq_keys: list[str]) -> list[str] | None:
    """Each message's properties text when they are its UNIQ_KEY alone (``_property_texts``
    of ``{"UNIQ_KEY": key}`` maps, without the maps); None if a key is not exactly a str or
    holds a separator."""
    if not _only_str(uniq_keys):
        return None
    whole = "".join(uniq_keys)
    if codec.NAME_VALUE_SEPARATOR in whole or codec.PROPERTY_SEPARATOR in whole:
        return None
    return list(map(add, repeat(_UNIQ_KEY_NAME), map(add, uniq_keys, repeat(codec.PROPERTY_SEPARATOR))))


_UNIQ_KEY_NAME = codec.PROPERTY_UNIQ_KEY + codec.NAME_VALUE_SEPARATOR
_KEY_LIST_TYPES = frozenset((list, tuple))


def _only_str(items) -> bool:
    """Whether every item is exactly a str (a subclass is refused by the per-message path)."""
    return set(map(type, items)) <= {str}


def _words_are_keys(key_texts: list[str], key_count: int) -> bool:
    """Whether the space-joined key lists hold exactly ``key_count`` non-empty keys: the
    spaces are only the joins, so no key was empty or held a space itself."""
    joined = "\x02".join(key_texts)
    return ("" not in key_texts and joined.count(" ") == key_count - len(key_texts) and "  " not in joined
            and " \x02" not in joined and "\x02 " not in joined
            and not joined.startswith(" ") and not joined.endswith(" "))


def queue_offsets_for(topics: tuple[str, ...], queue_ids: tuple[int, ...],
                      next_offsets: dict[tuple[str, int], int]) -> tuple[list[int], dict[tuple[str, int], int]]:
    """Each message's queue offset, in order, from each queue's next offset in
    ``next_offsets``; and the queues' next offsets after them (for the caller to keep once
    the records are written)."""
    queue_keys = list(zip(topics, queue_ids))
    counters = {key: count(next_offsets.get(key, 0)) for key in set(queue_keys)}
    offsets = list(map(next, map(counters.__getitem__, queue_keys)))
    return offsets, {key: next(counter) for key, counter in counters.items()}


def encode_run(columns: BatchColumns, start_offset: int, queue_offsets: list[int], store_timestamp: int,
               store_host: bytes) -> tuple[bytes, list[int]]:
    """The records of ``columns`` placed from ``start_offset``: (their bytes, each record's
    physical offset)."""
    positions = list(accumulate(columns.sizes, initial=start_offset))
    del positions[-1]
    born = columns.born_timestamps
    if 0 in born:  # 0: the store stamps its own time
        born = [timestamp or store_timestamp for timestamp in born]
    headers = list(map(codec.HEADER.pack, columns.sizes, repeat(codec.MESSAGE_MAGIC), columns.body_crcs,
                       columns.queue_ids, columns.flags, queue_offsets, positions, columns.sys_flags, born,
                       columns.born_hosts, repeat(store_timestamp), repeat(store_host), columns.reconsume_times,
                       columns.prepared_transaction_offsets, map(len, columns.bodies)))
    # the whole-message CRC of each record: header, body and tail, three CRC calls per record,
    # each mapped over the run (no Python frame per record)
    crcs = map(_crc32, columns.tails, map(_crc32, columns.bodies, map(_crc32, headers)))
    seals = map(_SEAL_FORMAT.__mod__, map(_REVERSED, map(_DIGITS_FORMAT.__mod__,
                                                          map(and_, crcs, repeat(_BODY_CRC_MASK)))))
    data = b"".join(chain.from_iterable(zip(headers, columns.bodies, columns.tails, seals)))
    return data, positions
