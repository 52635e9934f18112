"""The store's one put function (``MessageStore.append``): the column-wise encoding of a
regular batch (store/put_batch.py) against the per-message encoding, for both forms of a
batch (Messages, PlainBatch).

Both encodings must write the same bytes and return the same results for the same messages;
anything the columns cannot vouch for must go message by message (refusals in place).
"""

from __future__ import annotations

import functools
import mmap
import os
import resource
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from store import Message, PlainBatch, PutColumns, PutStatus, put_batch
from store.errors import DiskFullError
from store.mapped_file import MappedFile
from store.mapped_file_queue import MappedFileQueue
from reference_put import expected_log
from store_helpers import pull_all, scan_commit_log

FIXED_TIME_MS = 1_700_000_000_000


def fixed_clock() -> int:
    return FIXED_TIME_MS


@pytest.fixture
def open_store(open_store):
    """The store tests' ``open_store`` with a fixed clock: both paths stamp the same store
    time, so their bytes can be compared."""
    return functools.partial(open_store, clock=fixed_clock)


def _log_bytes(store) -> bytes:
    log = store.commit_log
    return b"".join(bytes(segment.mm[:min(segment.size, log.max_offset - segment.start_offset)])
                    for segment in log.segments.files)


def _append_as_the_reference_does(store, messages, batch=None) -> list:
    """``store.append(batch or messages)``, held against the per-message reference
    (tests/store/reference_put.py): the same records, physical and queue offsets."""
    start, queue_offsets = store.commit_log.max_offset, dict(store.commit_log.queue_offsets)
    results = store.append(messages if batch is None else batch)
    expected, placed = expected_log(messages, results, start_offset=start, queue_offsets=queue_offsets,
                                    segment_bytes=store.config.commitlog_segment_bytes,
                                    store_host=store.config.store_host)
    assert _log_bytes(store)[start:] == expected
    assert [(r.physical_offset, r.queue_offset) for r in results if r.status is PutStatus.PUT_OK] == placed
    return results


def _columns(store, messages):
    """The columns of ``messages`` if the store would take them as a regular batch (any size)."""
    preparer = store.preparer
    return put_batch.batch_columns(messages, preparer.topic_prefixes, preparer.born_hosts, preparer.largest_record)


def _warm(store, messages) -> None:
    """Teach a store the batch's topics and hosts (the column path only takes known ones)."""
    for topic, host in dict.fromkeys((message.topic, message.born_host) for message in messages):
        store._append_each([Message(topic=topic, body=b"warm", born_host=host)])


def _put_both(open_store, messages, **settings_):
    """(column store, per-message store, their results) after the same puts."""
    columns_store = open_store(**settings_)
    each_store = open_store(**settings_)
    for store in (columns_store, each_store):
        _warm(store, messages)
    column_results = _append_as_the_reference_does(columns_store, messages)
    each_results = each_store._append_each(messages)
    return columns_store, each_store, column_results, each_results


def _regular(count: int, **fields) -> list[Message]:
    return [Message(topic="orders" if i % 3 else "audit", queue_id=i % 4, body=f"body-{i}".encode() * (i % 5 + 1),
                    keys=[f"k{i}", f"order-{i}"], tags="paid", properties={"UNIQ_KEY": f"{i:032X}", "shop": "7"},
                    **fields) for i in range(count)]


def test_a_regular_batch_takes_the_column_path(open_store):
    store = open_store()
    messages = _regular(8)
    _warm(store, messages)
    columns = _columns(store, messages)
    assert columns is not None and len(columns.sizes) == 8


def test_column_path_writes_the_bytes_of_the_per_message_path(open_store):
    columns_store, each_store, column_results, each_results = _put_both(open_store, _regular(40))
    assert [r.status for r in column_results] == [PutStatus.PUT_OK] * 40
    assert column_results == each_results
    assert _log_bytes(columns_store) == _log_bytes(each_store)
    assert columns_store.commit_log.queue_offsets == each_store.commit_log.queue_offsets
    columns_store.wait_dispatched()
    read = pull_all(columns_store, "orders", 1)
    assert [m.body for m in read][-1] == _regular(40)[37].body
    assert read[-1].keys == ["k37", "order-37"] and read[-1].tags == "paid"


@pytest.mark.parametrize("change", [
    "no keys anywhere", "no tags anywhere", "no properties", "born times given", "several hosts",
])
def test_other_regular_shapes_write_the_same_bytes(open_store, change):
    messages = _regular(12)
    for i, message in enumerate(messages):
        if change == "no keys anywhere":
            message.keys = ()
        elif change == "no tags anywhere":
            message.tags = None
        elif change == "no properties":
            message.properties = {}
        elif change == "born times given":
            message.born_timestamp = 0 if i % 2 else FIXED_TIME_MS - i
        elif change == "several hosts":
            message.born_host = f"10.0.0.{i % 3}:{5000 + i}"
    columns_store, each_store, column_results, each_results = _put_both(open_store, messages)
    assert _columns(columns_store, messages) is not None
    assert column_results == each_results
    assert _log_bytes(columns_store) == _log_bytes(each_store)


IRREGULAR = {
    "a new topic": lambda m: setattr(m[2], "topic", "fresh"),
    "an illegal topic": lambda m: setattr(m[2], "topic", "bad topic"),
    "an unhashable topic": lambda m: setattr(m[2], "topic", ["orders"]),
    "a bytearray body": lambda m: setattr(m[2], "body", bytearray(b"x")),
    "a body over the limit": lambda m: setattr(m[2], "body", bytes(4 * 1024 * 1024 + 1)),
    "a bool queue id": lambda m: setattr(m[2], "queue_id", True),
    "a negative queue id": lambda m: setattr(m[2], "queue_id", -1),
    "an int property value": lambda m: m[2].properties.__setitem__("n", 5),
    "an empty property name": lambda m: m[2].properties.__setitem__("", "v"),
    "a separator in a value": lambda m: m[2].properties.__setitem__("a", "x\x01y"),
    "a separator in a name": lambda m: m[2].properties.__setitem__("a\x02b", "y"),
    "the HCRC property": lambda m: m[2].properties.__setitem__("HCRC", "00000000"),
    "a KEYS property": lambda m: m[2].properties.__setitem__("KEYS", "other"),
    "keys on some messages only": lambda m: setattr(m[2], "keys", ()),
    "an empty key": lambda m: setattr(m[2], "keys", ["a", ""]),
    "a key with a space": lambda m: setattr(m[2], "keys", ["a b"]),
    "a separator in a key": lambda m: setattr(m[2], "keys", ["a\x02"]),
    "keys as one string": lambda m: setattr(m[2], "keys", "solo"),
    "an int key": lambda m: setattr(m[2], "keys", [7]),
    "tags on some messages only": lambda m: setattr(m[2], "tags", None),
    "int tags": lambda m: setattr(m[2], "tags", 3),
    "a separator in tags": lambda m: setattr(m[2], "tags", "a\x01"),
    "properties too large": lambda m: m[2].properties.__setitem__("big", "x" * 40_000),
    "properties not a dict": lambda m: setattr(m[2], "properties", [("a", "b")]),
    "a str subclass value": lambda m: m[2].properties.__setitem__("a", Text("v")),
    "a str subclass name": lambda m: m[2].properties.__setitem__(Text("a"), "v"),
    "a str subclass key": lambda m: setattr(m[2], "keys", [Text("k")]),
    "a str subclass tag": lambda m: setattr(m[2], "tags", Text("t")),
    "keys as a set": lambda m: setattr(m[2], "keys", {"k"}),
}


class Text(str):
    """A str subclass: the per-message path refuses it (exact types only), so must this one."""


@pytest.mark.parametrize("name", sorted(IRREGULAR))
def test_irregular_batches_go_message_by_message(open_store, name):
    messages = _regular(6)
    columns_store = open_store()
    each_store = open_store()
    for store in (columns_store, each_store):
        _warm(store, messages)
    IRREGULAR[name](messages)
    assert _columns(columns_store, messages) is None
    results = _append_as_the_reference_does(columns_store, messages)
    assert results == each_store._append_each(messages)
    assert _log_bytes(columns_store) == _log_bytes(each_store)
    assert [r.status for r in results[:2] + results[3:]] == [PutStatus.PUT_OK] * 5


def test_a_batch_across_segments_matches_the_per_message_path(open_store):
    messages = [Message(topic="roll", queue_id=i % 2, body=bytes([i]) * 3000, keys=[f"k{i}"], tags="t")
                for i in range(60)]   # ~180 KB over 64 KiB segments: several rolls inside the batch
    columns_store, each_store, column_results, each_results = _put_both(open_store, messages)
    assert column_results == each_results
    assert _log_bytes(columns_store) == _log_bytes(each_store)
    assert len(columns_store.commit_log.segments.files) >= 3
    assert [m.body for m in scan_commit_log(columns_store.config.store_path)
            if m.topic == "roll" and m.body != b"warm"] == [m.body for m in messages]


def test_a_full_disk_at_a_roll_refuses_the_rest_of_the_batch(open_store, monkeypatch):
    store = open_store()
    messages = [Message(topic="roll", queue_id=0, body=bytes([i]) * 3000) for i in range(40)]
    _warm(store, messages)
    log = store.commit_log

    def no_room(start):
        raise DiskFullError("no room on disk (test)")

    monkeypatch.setattr(log.segments, "roll", no_room)
    results = store.append(messages)
    written = [r for r in results if r.status is PutStatus.PUT_OK]
    refused = [r for r in results if r.status is PutStatus.SERVICE_NOT_AVAILABLE]
    assert written and refused and len(written) + len(refused) == 40
    assert results[:len(written)] == written, "the written ones come first, in order"
    assert all("no room on disk" in r.reason and r.physical_offset == -1 for r in refused)
    assert log.queue_offsets[("roll", 0)] == 1 + len(written)   # after the warm-up message
    assert log.max_offset == log.segments.last.end_offset   # closed with a blank record, nothing partial
    monkeypatch.undo()
    store.wait_dispatched()
    assert store.max_offset("roll", 0) == 1 + len(written)


def test_an_unpackable_field_raises_and_writes_nothing(open_store):
    store = open_store()
    messages = _regular(8)
    _warm(store, messages)
    before = (store.commit_log.max_offset, dict(store.commit_log.queue_offsets))
    messages[5].flag = "not an int"
    with pytest.raises(Exception):
        store.append(messages)
    assert (store.commit_log.max_offset, store.commit_log.queue_offsets) == before


# names, values, keys and tags: separators, spaces and non-ASCII included
TEXT = st.text(alphabet="abXY09_ \x01\x02é-", max_size=6)
SAFE_TEXT = st.text(alphabet="abXY09_é-", min_size=1, max_size=6)


def _compare_paths(open_store, messages) -> bool:
    """Put ``messages`` both ways; whether they were a regular batch."""
    columns_store = open_store()
    each_store = open_store()
    for store in (columns_store, each_store):
        _warm(store, [m for m in messages if m.topic != "new-one"])
    regular = _columns(columns_store, messages) is not None
    assert _append_as_the_reference_does(columns_store, messages) == each_store._append_each(messages)
    assert _log_bytes(columns_store) == _log_bytes(each_store)
    columns_store.shutdown()
    each_store.shutdown()
    return regular


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.lists(st.tuples(
    st.sampled_from(["orders", "audit", "new-one"]), st.integers(0, 3), st.binary(max_size=40),
    st.one_of(st.just(()), st.lists(TEXT, min_size=1, max_size=3)),
    st.one_of(st.none(), TEXT),
    st.dictionaries(TEXT, TEXT, max_size=3)), min_size=4, max_size=20))
def test_any_batch_gives_what_the_per_message_path_gives(open_store, batch):
    _compare_paths(open_store, [Message(topic=topic, queue_id=queue_id, body=body, keys=keys, tags=tags,
                                        properties=properties)
                                for topic, queue_id, body, keys, tags, properties in batch])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(with_keys=st.booleans(), with_tags=st.booleans(), batch=st.lists(st.tuples(
    st.sampled_from(["orders", "audit"]), st.integers(0, 3), st.binary(max_size=40),
    st.lists(SAFE_TEXT, min_size=1, max_size=3), SAFE_TEXT,
    st.dictionaries(SAFE_TEXT.filter(lambda name: name not in ("KEYS", "TAGS", "HCRC")), SAFE_TEXT, max_size=3)),
    min_size=4, max_size=20))
def test_any_regular_batch_gives_what_the_per_message_path_gives(open_store, with_keys, with_tags,
                                                                  batch):
    messages = [Message(topic=topic, queue_id=queue_id, body=body, keys=keys if with_keys else (),
                        tags=tags if with_tags else None, properties=properties)
                for topic, queue_id, body, keys, tags, properties in batch]
    assert _compare_paths(open_store, messages), "a regular batch takes the column path"


def test_populate_for_write_leaves_the_bytes_alone(tmp_path):
    mapped = MappedFile(str(tmp_path / "00000000000000000000"), 0, 16 * mmap.PAGESIZE, create=True)
    mapped.mm[100:105] = b"hello"
    assert mapped.populate_for_write(0, mapped.size) is True   # Linux >= 5.14 here
    assert mapped.populate_for_write(mmap.PAGESIZE + 5, 3 * mmap.PAGESIZE) is True   # an unaligned start
    assert mapped.populate_for_write(0, 10 * mapped.size) is True   # cut at the file's end
    assert mapped.mm[:mapped.size] == b"\0" * 100 + b"hello" + b"\0" * (mapped.size - 105)
    mapped.close()
    assert mapped.populate_for_write(0, mapped.size) is True   # closed: nothing to do


def test_a_range_flush_leaves_the_pages_ahead_of_the_writer_writable(tmp_path):
    mapped = MappedFile(str(tmp_path / "00000000000000000000"), 0, 64 * mmap.PAGESIZE, create=True)
    assert mapped.populate_for_write(0, mapped.size) is True

    def faults_writing(first_page: int, last_page: int) -> int:
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        for page in range(first_page, last_page):
            mapped.mm[page * mmap.PAGESIZE] = 7
        return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before

    mapped.mm[10:15] = b"hello"
    mapped.flush_range(10, 15)
    # an fdatasync (``flush``) would have written back and write-protected all 64 pages
    # (ext4, xfs): each of the 39 writes below would fault again. The bound leaves room
    # for the interpreter's own faults on this thread (its heap growing: 3 seen once in CI)
    assert faults_writing(1, 40) <= 8
    mapped.flush_range(mapped.size - 5, 10 * mapped.size)   # cut at the file's end
    with open(mapped.path, "rb") as handle:
        assert handle.read(15) == b"\0" * 10 + b"hello"
    mapped.close()
    mapped.flush_range(0, 15)   # closed: nothing to do


def test_a_window_read_ahead_is_faulted_in_writable_again_for_a_writer_through_the_mapping(tmp_path, monkeypatch):
    # a replica read ahead while catching up (clean pages), then writes small frames through
    # the mapping: its write window starts at the writer, not past the window read ahead
    written_windows = []
    real = MappedFile.populate_for_write
    monkeypatch.setattr(MappedFile, "populate_for_write",
                        lambda self, start, end, **options: written_windows.append((start, end))
                        or real(self, start, end, **options))
    queue = MappedFileQueue(str(tmp_path), 8 * 1024 * 1024, preallocate=True)
    queue.load()
    queue.roll(0)
    preallocator = queue._preallocator

    def populated_to(end: int, for_write: bool) -> None:
        deadline = time.monotonic() + 10
        while preallocator._populated[1:] != (end, for_write):
            assert time.monotonic() < deadline, preallocator._populated
            time.sleep(0.005)

    try:
        queue.populate_ahead(4096)   # read ahead: the whole file (its window is larger)
        populated_to(queue.file_size, False)
        assert written_windows == []
        queue.populate_ahead(8192, for_write=True)
        populated_to(queue.file_size, True)
        assert written_windows and written_windows[0][0] == 8192
        asked = len(written_windows)
        queue.populate_ahead(12288, for_write=True)   # the write window holds: nothing more
        queue.populate_ahead(16384)                    # nor for a read
        time.sleep(0.05)
        assert len(written_windows) == asked
    finally:
        queue.close()


# --- PlainBatch: a producer's batch given as columns ------------------------------------
def _plain(count: int, topic: str = "orders") -> list[Message]:
    return [Message(topic, f"body-{i}".encode() * (i % 5 + 1), queue_id=i % 4,
                    properties={"UNIQ_KEY": f"{i:032X}", "shop": "7"} if i % 7 else {}) for i in range(count)]


def _plain_batch(messages, topic: str = "orders") -> PlainBatch:
    return PlainBatch(topic, [m.queue_id for m in messages], [m.body for m in messages],
                      [m.properties for m in messages])


@pytest.mark.parametrize("warm", [True, False], ids=["known topic", "first batch of a topic"])
@pytest.mark.parametrize("count", [1, 3, 40])
def test_a_plain_batch_writes_what_its_messages_write(open_store, warm, count):
    messages = _plain(count)
    plain_store, each_store = open_store(), open_store()
    if warm:
        for store in (plain_store, each_store):
            _warm(store, messages)
    columns = plain_store.preparer.regular_columns(_plain_batch(messages))
    # a topic not seen yet, or a small batch, is left to the per-message encoding
    assert (columns is not None) == (warm and count >= put_batch.COLUMNS_MESSAGES_MIN)
    plain_results = _append_as_the_reference_does(plain_store, messages, _plain_batch(messages))
    each_results = each_store._append_each(messages)
    assert [r.status for r in plain_results] == [PutStatus.PUT_OK] * count
    assert plain_results == each_results
    assert _log_bytes(plain_store) == _log_bytes(each_store)
    plain_store.wait_dispatched()
    read = pull_all(plain_store, "orders", (count - 1) % 4)
    assert read[-1].body == messages[-1].body
    assert messages[-1].properties.items() <= read[-1].properties.items()


@pytest.mark.parametrize("body_bytes", [20, 3000], ids=["one segment", "across segments"])
def test_a_batch_written_whole_comes_back_as_columns_when_asked(open_store, body_bytes):
    messages = [Message("orders", bytes([i]) * body_bytes, queue_id=i % 4, properties={"UNIQ_KEY": f"{i:032X}"})
                for i in range(40)]
    columns_store, list_store = open_store(), open_store()
    for store in (columns_store, list_store):
        _warm(store, messages)
    written = columns_store.append(_plain_batch(messages), as_columns=True)
    results = list_store.append(_plain_batch(messages))
    assert type(written) is PutColumns and type(results) is list
    assert written.results() == results
    assert written.message_ids() == [r.message_id for r in results]
    assert written.end_offset == results[-1].end_offset == columns_store.commit_log.max_offset
    assert _log_bytes(columns_store) == _log_bytes(list_store)
    assert (len(columns_store.commit_log.segments.files) > 1) == (body_bytes > 1000)


def test_a_batch_not_written_whole_comes_back_as_results_even_when_columns_are_asked(open_store, monkeypatch):
    store = open_store()
    small = _plain(put_batch.COLUMNS_MESSAGES_MIN - 1)
    _warm(store, small)
    assert type(store.append(_plain_batch(small), as_columns=True)) is list   # the per-message path
    messages = [Message("orders", bytes([i]) * 3000) for i in range(40)]

    def no_room(start):
        raise DiskFullError("no room on disk (test)")

    monkeypatch.setattr(store.commit_log.segments, "roll", no_room)
    results = store.append(_plain_batch(messages), as_columns=True)
    assert type(results) is list and len(results) == 40
    statuses = [r.status for r in results]
    written = statuses.count(PutStatus.PUT_OK)
    assert 0 < written < 40
    assert statuses == [PutStatus.PUT_OK] * written + [PutStatus.SERVICE_NOT_AVAILABLE] * (40 - written)


@pytest.mark.parametrize("fault", ["a body not bytes", "a property value not a string", "a map not a dict",
                                   "a store-owned name"])
def test_a_plain_batch_is_refused_in_place_as_its_messages_are(open_store, fault):
    messages = _plain(12)
    batch = _plain_batch(messages)
    if fault == "a body not bytes":
        batch.bodies[5] = "text"
    elif fault == "a property value not a string":
        batch.properties[5] = {"UNIQ_KEY": 5}
    elif fault == "a map not a dict":
        batch.properties[5] = [("UNIQ_KEY", "x")]
    else:
        batch.properties[5] = {"HCRC": "00000000"}
    plain_store, each_store = open_store(), open_store()
    for store in (plain_store, each_store):
        _warm(store, messages)
    plain_results = plain_store.append(batch)
    each_results = each_store._append_each(batch.messages())
    assert plain_results == each_results
    assert plain_results[5].status is PutStatus.MESSAGE_ILLEGAL
    assert [r.status for i, r in enumerate(plain_results) if i != 5] == [PutStatus.PUT_OK] * 11
    assert _log_bytes(plain_store) == _log_bytes(each_store)


def test_a_plain_batch_with_columns_of_different_lengths_is_a_programming_error(open_store):
    store = open_store()
    before = store.commit_log.max_offset
    with pytest.raises(ValueError, match="one queue id, body, properties map"):
        store.append(PlainBatch("orders", [0, 1], [b"a", b"b", b"c"], [{}, {}, {}]))
    with pytest.raises(ValueError, match=r"per message, not 3, 3, 3 and 2"):
        store.append(PlainBatch("orders", [0, 1, 2], [b"a", b"b", b"c"], [{}, {}, {}], ["k1", "k2"]))
    assert store.commit_log.max_offset == before


def _uniq_batch(count: int, properties=None) -> PlainBatch:
    """A producer's batch of ``count`` messages: bodies and UNIQ_KEYs as columns."""
    return PlainBatch("orders", [i % 4 for i in range(count)],
                      [f"body-{i}".encode() * (i % 5 + 1) for i in range(count)],
                      properties or [{}] * count, [f"{i:032X}" for i in range(count)])


@pytest.mark.parametrize("count", [3, 40], ids=["per message", "column-wise"])
@pytest.mark.parametrize("others", [False, True], ids=["UNIQ_KEY alone", "with other properties"])
def test_uniq_keys_as_a_column_write_what_uniq_key_properties_write(open_store, count, others):
    batch = _uniq_batch(count, [{"shop": "7", "UNIQ_KEY": "replaced"} if i % 2 else {} for i in range(count)]
                        if others else None)
    maps = [{**properties, "UNIQ_KEY": key} for properties, key in zip(batch.properties, batch.uniq_keys)]
    as_maps = PlainBatch(batch.topic, batch.queue_ids, batch.bodies, maps)
    assert batch.property_maps() == as_maps.properties
    column_store, map_store = open_store(), open_store()
    for store in (column_store, map_store):
        _warm(store, as_maps.messages())
    assert (column_store.preparer.regular_columns(batch) is not None) == (count >= put_batch.COLUMNS_MESSAGES_MIN)
    column_results = _append_as_the_reference_does(column_store, as_maps.messages(), batch)
    assert column_results == map_store.append(as_maps)
    assert [r.status for r in column_results] == [PutStatus.PUT_OK] * count
    assert _log_bytes(column_store) == _log_bytes(map_store)
    column_store.wait_dispatched()
    last = pull_all(column_store, "orders", (count - 1) % 4)[-1]
    assert last.properties["UNIQ_KEY"] == batch.uniq_keys[-1]


@pytest.mark.parametrize("fault", ["a key not a string", "a separator inside a key", "a map not a dict"])
def test_a_faulty_uniq_key_is_refused_in_place_as_its_property_would_be(open_store, fault):
    batch = _uniq_batch(12)
    if fault == "a key not a string":
        batch.uniq_keys[5] = 5
    elif fault == "a separator inside a key":
        batch.uniq_keys[5] = "a\x02b"
    else:
        batch.properties[5] = [("shop", "7")]
    column_store, each_store = open_store(), open_store()
    for store in (column_store, each_store):
        _warm(store, batch.messages())
    assert column_store.preparer.regular_columns(batch) is None
    results = column_store.append(batch)
    assert results == each_store._append_each(batch.messages())
    assert [r.status for r in results] == [PutStatus.PUT_OK] * 5 + [PutStatus.MESSAGE_ILLEGAL] + [PutStatus.PUT_OK] * 6
    assert _log_bytes(column_store) == _log_bytes(each_store)


@pytest.mark.parametrize("shape", ["one UNIQ_KEY each", "one odd name each", "every map empty"])
def test_a_batch_of_one_property_name_writes_the_bytes_of_the_per_message_path(open_store, shape):
    """Maps that each hold the same one name (a producer's UNIQ_KEY), or none, are encoded
    by their own shortcut: the same bytes and results as message by message."""
    messages = _plain(16)
    for i, message in enumerate(messages):
        if shape == "one UNIQ_KEY each":
            message.properties = {"UNIQ_KEY": f"{i:032X}"}
        elif shape == "one odd name each":
            message.properties = {"a%sb%%": "v" * i}   # a format character in the name, values of any length
        else:
            message.properties = {}
    plain_store, each_store = open_store(), open_store()
    for store in (plain_store, each_store):
        _warm(store, messages)
    assert plain_store.preparer.regular_columns(_plain_batch(messages)) is not None
    plain_results = _append_as_the_reference_does(plain_store, messages, _plain_batch(messages))
    assert plain_results == each_store._append_each(messages)
    assert _log_bytes(plain_store) == _log_bytes(each_store)
    plain_store.wait_dispatched()
    assert pull_all(plain_store, "orders", 3)[-1].properties.items() >= messages[-1].properties.items()


@pytest.mark.parametrize("fault", ["a separator in a value", "a second name on one map", "a name missing on one"])
def test_a_one_name_batch_with_an_odd_map_is_still_checked(open_store, fault):
    """The shortcut takes only maps of the one name once each; a separator inside a value is
    refused as on the per-message path, and other shapes take the general encoding."""
    messages = [Message("orders", b"body", i % 4, properties={"UNIQ_KEY": f"{i:032X}"}) for i in range(12)]
    if fault == "a separator in a value":
        messages[5].properties = {"UNIQ_KEY": "a\x02b"}
    elif fault == "a second name on one map":
        messages[5].properties = {"UNIQ_KEY": "x", "shop": "7"}
    else:
        messages[5].properties = {}
    plain_store, each_store = open_store(), open_store()
    for store in (plain_store, each_store):
        _warm(store, messages)
    plain_results = _append_as_the_reference_does(plain_store, messages, _plain_batch(messages))
    assert plain_results == each_store._append_each(messages)
    assert _log_bytes(plain_store) == _log_bytes(each_store)
