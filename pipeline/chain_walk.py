"""The record walk of a long slice without Python per record, whatever the records' sizes.

A walk follows TOTALSIZE from record to record: each step needs the one before, so a single
walk cannot be vectorised. ``walk_chains`` walks many at once instead. It picks an anchor
every ``stride`` bytes (the first place after it holding the message magic behind a
plausible TOTALSIZE) and follows the chain from every anchor in lockstep, one numpy step per
record for all chains together, each chain until it reaches the next anchor. Where a chain
lands exactly on the next anchor, that anchor starts a record of the true walk, and so on:
the records are those ``record_walk.walk`` finds one by one. An anchor inside a record (the
magic in a body) is found out by the chain before it landing elsewhere; the walk is then
finished one record at a time from where that chain landed. A chain that meets a record
which cannot be one (too small, running past the segment) ends the walk there, as it does
``record_walk.walk``.
"""

from __future__ import annotations

import numpy as np

from store import codec

from .record_walk import walk

CHAIN_STRIDE = 256 * 1024        # most bytes per chain: ~230 records of 1 KiB
CHAIN_STRIDE_MIN = 16 * 1024     # fewest bytes per chain
CHAINS_PER_WALK = 512            # a shorter walk takes shorter chains, so that each numpy step (one per
                                 # record of a chain) still moves about this many chains: a 16 MiB
                                 # step of the reader walks 512 chains of 32 KiB, not 64 of 256 KiB
RUNS_SHARE = 0.8                 # records of their predecessor's size, of the first stride, for ``walk``
ANCHOR_TRIES = 4                 # magic hits looked at per anchor before giving that stride up
ANCHOR_WINDOW = 16 * 1024        # bytes searched for an anchor (none in them: the chain before goes on;
                                 # unwritten space is not searched through)
_MAGIC = codec.MESSAGE_MAGIC.to_bytes(4, "big")


def walk_chains(buffer, begin: int, end: int, limit: int, *, stride: int | None = None):
    """The same (positions, sizes, stop position) as ``walk(..., check_magic=False)``.

    The first ``stride`` bytes (default: ``chain_stride`` of the walk's length) are walked
    one by one; when most records there have the size of the record before (runs, which
    ``walk`` reads in numpy faster than chains), the rest is too. Either way the walk goes
    on exactly where that first part stopped."""
    if stride is None:
        stride = chain_stride(end - begin)
    if end - begin < 4 * stride:
        return walk(buffer, begin, end, limit, check_magic=False)
    first_positions, first_sizes, stopped = walk(buffer, begin, begin + stride, limit, check_magic=False)
    if stopped < begin + stride:
        return first_positions, first_sizes, stopped
    if len(first_sizes) > 1 and np.mean(first_sizes[1:] == first_sizes[:-1]) >= RUNS_SHARE:
        rest = walk(buffer, stopped, end, limit, check_magic=False)
    else:
        rest = _chains(buffer, stopped, end, limit, stride)
    return np.concatenate([first_positions, rest[0]]), np.concatenate([first_sizes, rest[1]]), rest[2]


def chain_stride(length: int) -> int:
    """Bytes per chain for a walk of ``length`` bytes: CHAINS_PER_WALK chains, each of
    CHAIN_STRIDE_MIN to CHAIN_STRIDE bytes. A numpy step costs about the same for 64 chains
    as for 512, and a walk takes as many steps as its chains have records."""
    return min(CHAIN_STRIDE, max(CHAIN_STRIDE_MIN, length // CHAINS_PER_WALK))


def _chains(buffer, begin: int, end: int, limit: int, stride: int) -> tuple[np.ndarray, np.ndarray, int]:
    starts = _anchors(buffer, begin, end, limit, stride)
    data = np.frombuffer(buffer, dtype=np.uint8)
    chain_of, positions, sizes, landed, broken = _lockstep(data, starts, np.append(starts[1:], end), limit)
    del data
    joined = (~broken[:-1]) & (landed[:-1] == starts[1:])
    good = len(starts) if joined.all() and not broken[-1] else int(np.argmin(np.append(joined, False))) + 1
    order = np.argsort(chain_of, kind="stable")         # chain by chain, each in walk order
    keep = order[chain_of[order] < good]
    positions, sizes = positions[keep], sizes[keep]
    stopped = int(landed[good - 1])
    if broken[good - 1] or stopped >= end:
        return positions, sizes, stopped
    # the chain landed past the next anchor (which was inside a record): finish one by one
    rest_positions, rest_sizes, stopped = walk(buffer, stopped, end, limit, check_magic=False)
    return np.concatenate([positions, rest_positions]), np.concatenate([sizes, rest_sizes]), stopped


def _anchors(buffer, begin: int, end: int, limit: int, stride: int) -> np.ndarray:
    """``begin`` and, about every ``stride`` bytes, the first place within ANCHOR_WINDOW after it
    holding the magic behind a TOTALSIZE that fits (a guess; the chains check it)."""
    anchors = [begin]
    target = begin + stride
    while target < end:
        window_end = min(end, target + ANCHOR_WINDOW) + 4
        found = buffer.find(_MAGIC, target + 4, window_end)
        for _ in range(ANCHOR_TRIES):
            if found < 0:
                break
            candidate = found - 4
            size = int.from_bytes(buffer[candidate:candidate + 4], "big", signed=True)
            if size >= codec.FIXED_SIZE and candidate + size <= limit:
                anchors.append(candidate)
                break
            found = buffer.find(_MAGIC, found + 1, window_end)
        target = (target if found < 0 else max(target, found - 4)) + stride
    return np.array(anchors, dtype=np.int64)


def _lockstep(data: np.ndarray, starts: np.ndarray, bounds: np.ndarray, limit: int):
    """Follow every chain from its start until it reaches its bound or meets a record that
    cannot be one. Per record taken: its chain, position and size (in step order); per chain:
    the position it stopped at, and whether it stopped at a broken record."""
    chains = len(starts)
    landed = starts.copy()
    broken = np.zeros(chains, dtype=bool)
    active = np.flatnonzero(landed < bounds)
    position = landed[active]
    taken_chain, taken_at, taken_size = [], [], []
    header_room = limit - 8
    while len(active):
        readable = position <= header_room
        at = np.where(readable, position, 0)
        size = ((data[at].astype(np.int64) << 24) | (data[at + 1].astype(np.int64) << 16)
                | (data[at + 2].astype(np.int64) << 8) | data[at + 3])
        size -= (size & 0x80000000) << 1                # TOTALSIZE is signed
        valid = readable & (size >= codec.FIXED_SIZE) & (position + size <= limit)
        if not valid.all():
            bad = ~valid
            landed[active[bad]] = position[bad]
            broken[active[bad]] = True
            active, position, size = active[valid], position[valid], size[valid]
        taken_chain.append(active)
        taken_at.append(position)
        taken_size.append(size)
        position = position + size
        going = position < bounds[active]
        if not going.all():
            landed[active[~going]] = position[~going]
            active, position = active[going], position[going]
    if not taken_at:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty.copy(), landed, broken
    return np.concatenate(taken_chain), np.concatenate(taken_at), np.concatenate(taken_size), landed, broken
