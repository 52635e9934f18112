"""Index key hashes in bulk, with numpy: the dispatcher's speed path beside the pure codec.

``store.codec`` holds the scalar hash (Java's ``String.hashCode`` of ``topic#key``) and loads
no numpy, so that the client library, the pipeline and the chaos checkers can import it
alone. The dispatcher hashes two keys per message; one at a time that is about half of its
time, so it hashes a pass's keys here, as matrix products, with the same values bit for bit.
"""

from __future__ import annotations

import numpy

from . import codec


def index_key_hashes(prefix_hashes: list[int], keys: list[str]) -> list[int]:
    """``index_key_hash_with_prefix`` of many (prefix hash, key) pairs at once.

    The dispatcher hashes two keys per message (KEYS and UNIQ_KEY); one at a time that is
    about half of its time. ASCII keys are grouped by length (keys all of one length, a
    batch's UNIQ_KEYs, without a loop over them) and hashed as one matrix product with
    numpy (in float64, exact: 255 terms below 2^39 each); anything else takes the scalar
    path. Same values as the scalar functions, bit for bit.
    """
    if len(keys) < _VECTOR_GROUP_MIN:  # too few for a group: no grouping at all
        return list(map(codec.index_key_hash_with_prefix, prefix_hashes, keys))
    lengths = set(map(len, keys))
    if len(lengths) == 1:   # keys of one length (UNIQ_KEYs): one group, if ASCII, without a loop
        length = lengths.pop()
        joined = "".join(keys)
        if 0 < length <= _VECTOR_KEY_LENGTH_MAX and joined.isascii():
            return _group_hashes(prefix_hashes, joined, len(keys), length).tolist()
    result = [0] * len(keys)
    by_length: dict[int, list[int]] = {}
    for number, key in enumerate(keys):
        if key.isascii() and 0 < len(key) <= _VECTOR_KEY_LENGTH_MAX:
            group = by_length.get(len(key))
            if group is None:
                by_length[len(key)] = [number]
            else:
                group.append(number)
        else:
            result[number] = codec.index_key_hash_with_prefix(prefix_hashes[number], key)
    for length, numbers in by_length.items():
        if len(numbers) < _VECTOR_GROUP_MIN:
            for number in numbers:
                result[number] = codec.index_key_hash_with_prefix(prefix_hashes[number], keys[number])
            continue
        hashes = _group_hashes([prefix_hashes[n] for n in numbers], "".join([keys[n] for n in numbers]),
                               len(numbers), length)
        for number, value in zip(numbers, hashes.tolist()):
            result[number] = value
    return result


def _group_hashes(prefix_hashes: list[int], joined: str, count: int, length: int) -> "numpy.ndarray":
    """The index key hashes of ``count`` ASCII keys of ``length`` characters each, given
    joined, behind their prefix hashes: one matrix product."""
    units = numpy.frombuffer(joined.encode("ascii"), numpy.uint8)
    # in float64, exact (every partial sum is an integer below 255 * 127 * 2**32 < 2**53),
    # and a BLAS product where numpy's integer one is a plain loop
    sums = (units.reshape(count, length) @ _vector_powers(length)).astype(numpy.uint64)
    prefixes = numpy.array(prefix_hashes, numpy.uint64)
    # uint64 arithmetic wraps mod 2^64, which keeps the value mod 2^32 exact
    hashes = (prefixes * numpy.uint64(codec._POW31[length]) + sums) & numpy.uint64(0xFFFFFFFF)
    negative = (hashes & numpy.uint64(0x80000000)) != 0
    absolute = numpy.where(negative, numpy.uint64(1 << 32) - hashes, hashes)
    absolute[hashes == numpy.uint64(0x80000000)] = 0
    return absolute


_VECTOR_KEY_LENGTH_MAX = 255
_VECTOR_GROUP_MIN = 8
_VECTOR_POWERS: dict[int, "numpy.ndarray"] = {}


def _vector_powers(length: int):
    powers = _VECTOR_POWERS.get(length)
    if powers is None:
        powers = _VECTOR_POWERS[length] = numpy.array(codec._reversed_powers(length), numpy.float64)
    return powers
