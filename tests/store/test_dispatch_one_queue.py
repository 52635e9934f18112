"""Records alike of one queue (a put batch's usual shape): parse_alike's one-run shortcut
gives exactly what parse_each gives, and falls back to the split when the batch's queue
offsets are not consecutive or its queues differ."""

from __future__ import annotations

import random

import pytest

from store.dispatch_batch import DispatchParser

from test_dispatch_batch import as_tuple, encode

ALPHABET = "0123456789ABCDEF"


def records(rng: random.Random, queues_and_offsets: list[tuple[int, int]]) -> tuple[bytes, list[int]]:
    buffer = bytearray(rng.randbytes(rng.randrange(0, 50)))
    positions = []
    for queue_id, queue_offset in queues_and_offsets:
        uniq = "".join(rng.choice(ALPHABET) for _ in range(32))
        positions.append(len(buffer))
        buffer += encode(rng, "Topic-A", queue_id, queue_offset, len(buffer), f"UNIQ_KEY\x01{uniq}\x02".encode())
    return bytes(buffer), positions


SHAPES = {
    "one queue, consecutive": [(3, 100 + n) for n in range(64)],
    "one record": [(0, 7)],
    "one queue, a gap": [(3, n) for n in range(30)] + [(3, n) for n in range(40, 74)],
    "one queue, offsets repeated": [(1, n % 32) for n in range(64)],
    "one queue, offsets descending": [(2, 64 - n) for n in range(64)],
    "two queues": [(n % 2, n // 2) for n in range(64)],
    "one queue then another": [(5, n) for n in range(32)] + [(6, n) for n in range(32)],
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_one_queue_batches_match_one_record_at_a_time(shape):
    buffer, positions = records(random.Random(shape), SHAPES[shape])
    parser = DispatchParser()
    alike = parser.parse_alike(buffer, positions)
    assert alike is not None
    assert as_tuple(alike) == as_tuple(parser.parse_each(buffer, positions))


def test_a_consecutive_batch_of_one_queue_is_one_run_in_log_order():
    buffer, positions = records(random.Random(1), SHAPES["one queue, consecutive"])
    runs = DispatchParser().parse_alike(buffer, positions).queue_runs
    assert [(queue, first, len(entries) // 20) for queue, first, entries in runs] == [(("Topic-A", 3), 100, 64)]
