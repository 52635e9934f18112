"""The epoch file and the consistent point, the latter checked exhaustively against a model."""

from __future__ import annotations

import itertools
import os

import pytest

from replication.epochs import (EpochEntry, EpochFile, ResyncKind, decode_epochs, encode_epochs, epoch_at,
                                find_resync, next_epoch_start, slave_epochs_after, within_log)
from replication.errors import EpochFileError

E = EpochEntry


# --- the file --------------------------------------------------------------------------------
def test_round_trip_and_atomic_replace(tmp_path):
    epochs = EpochFile(str(tmp_path))
    assert epochs.load(0) == [] and epochs.last_epoch == 0
    epochs.append(1, 0)
    epochs.append(3, 500)
    assert EpochFile(str(tmp_path)).load(1000) == [E(1, 0), E(3, 500)]
    assert sorted(os.listdir(tmp_path)) == ["epoch"]  # no temp file left behind


@pytest.mark.parametrize("flip_at", [0, 5, 12, 20, 27, 31])
def test_any_flipped_byte_is_caught(tmp_path, flip_at):
    data = bytearray(encode_epochs([E(1, 0), E(2, 4096)]))
    data[flip_at] ^= 0x40
    with pytest.raises(EpochFileError):
        decode_epochs(bytes(data))


def test_torn_or_foreign_files_are_refused():
    data = encode_epochs([E(1, 0), E(2, 10)])
    for bad in (data[:-1], data + b"\0", b"", b"XXXX" + data[4:]):
        with pytest.raises(EpochFileError):
            decode_epochs(bad)


@pytest.mark.parametrize("entries", [[E(2, 0), E(2, 5)], [E(2, 0), E(1, 5)], [E(1, 10), E(2, 5)], [E(0, 0)]])
def test_order_is_enforced(entries):
    with pytest.raises(EpochFileError):
        encode_epochs(entries)


def test_load_drops_terms_past_the_log_end_left_by_a_crash_mid_cut(tmp_path):
    epochs = EpochFile(str(tmp_path))
    epochs.replace([E(1, 0), E(2, 100), E(3, 300)])
    assert EpochFile(str(tmp_path)).load(250) == [E(1, 0), E(2, 100)]
    assert EpochFile(str(tmp_path)).load(250) == [E(1, 0), E(2, 100)]  # and it was rewritten
    assert within_log([E(1, 0), E(2, 100)], 100) == [E(1, 0), E(2, 100)]


def test_lookups():
    entries = [E(1, 0), E(2, 100), E(4, 100), E(5, 250)]
    assert epoch_at(entries, 0) == E(1, 0) and epoch_at(entries, 99) == E(1, 0)
    assert epoch_at(entries, 100) == E(4, 100)   # empty term 2 wrote nothing
    assert epoch_at(entries, 300) == E(5, 250)
    assert next_epoch_start(entries, 0) == 100 and next_epoch_start(entries, 100) == 250
    assert next_epoch_start(entries, 250) is None


# --- consistent point: hand-picked arrangements ----------------------------------------------
@pytest.mark.parametrize("master, m_max, slave, s_max, kind, offset", [
    ([E(1, 0)], 500, [E(1, 0)], 300, ResyncKind.TRUNCATE, 300),               # slave behind, same term
    ([E(1, 0)], 500, [E(1, 0)], 500, ResyncKind.TRUNCATE, 500),               # in step
    ([E(1, 0), E(2, 300)], 500, [E(1, 0)], 400, ResyncKind.TRUNCATE, 300),    # old master's tail
    ([E(1, 0), E(3, 300)], 900, [E(1, 0), E(2, 300)], 600, ResyncKind.TRUNCATE, 300),  # rival terms
    ([E(1, 0), E(2, 300), E(3, 300)], 400, [E(1, 0), E(2, 300)], 300, ResyncKind.TRUNCATE, 300),
    ([E(1, 0)], 200, [E(1, 0)], 600, ResyncKind.TRUNCATE, 200),               # slave ahead in one term
    ([E(2, 0)], 200, [E(1, 0)], 100, ResyncKind.RESET, 0),                    # nothing shared
    ([E(1, 0)], 200, [], 0, ResyncKind.TRUNCATE, 0),                          # empty slave, log at 0
])
def test_consistent_point_cases(master, m_max, slave, s_max, kind, offset):
    resync = find_resync(master, 0, m_max, slave, 0, s_max)
    assert (resync.kind, resync.offset) == (kind, offset), resync


def test_an_empty_slave_starts_at_the_masters_oldest_segment():
    resync = find_resync([E(1, 0)], 1 << 20, 5 << 20, [], 0, 0)
    assert (resync.kind, resync.offset) == (ResyncKind.RESET, 1 << 20)


def test_a_point_the_master_no_longer_holds_resets_the_slave():
    resync = find_resync([E(1, 0), E(2, 300)], 1 << 20, 5 << 20, [E(1, 0)], 0, 400)
    assert (resync.kind, resync.offset) == (ResyncKind.RESET, 1 << 20)


# --- consistent point: every arrangement a small cluster can reach ---------------------------
class Model:
    """Three nodes' logs as lists of record labels (epoch, serial) and their epoch lists.

    Events: a node becomes master in a new epoch (recording it at its log end, as a node
    does); the master writes records; a slave resyncs with the master exactly as the
    HAClient does (cut at the consistent point, keep epochs up to the common one) and then
    copies some of the master's records frame by frame, recording each new epoch before
    its first record.
    """

    def __init__(self) -> None:
        self.logs = [[], [], []]
        self.epochs = [[], [], []]
        self.master = None
        self.epoch = 0
        self.serial = 0

    def copy(self) -> "Model":
        other = Model()
        other.logs = [list(log) for log in self.logs]
        other.epochs = [list(e) for e in self.epochs]
        other.master, other.epoch, other.serial = self.master, self.epoch, self.serial
        return other

    def elect(self, node: int) -> None:
        self.epoch += 1
        self.master = node
        self.epochs[node].append(E(self.epoch, len(self.logs[node])))

    def write(self, count: int) -> None:
        for _ in range(count):
            self.serial += 1
            self.logs[self.master].append((self.epoch, self.serial))

    def sync(self, slave: int, limit: int | None) -> None:
        master_log, slave_log = self.logs[self.master], self.logs[slave]
        resync = find_resync(self.epochs[self.master], 0, len(master_log), self.epochs[slave], 0, len(slave_log))
        common = 0
        while common < min(len(master_log), len(slave_log)) and master_log[common] == slave_log[common]:
            common += 1
        # the property: the consistent point is exactly where the two logs stop agreeing (a
        # reset, to the master's first offset, only when they agree on nothing)
        assert resync.offset == common, (resync, master_log, slave_log, self.epochs)
        assert resync.kind is ResyncKind.TRUNCATE or common == 0, resync
        del slave_log[resync.offset:]
        self.epochs[slave] = slave_epochs_after(self.epochs[slave], resync)
        end = len(master_log) if limit is None else min(len(master_log), len(slave_log) + limit)
        master_epochs = self.epochs[self.master]
        while len(slave_log) < end:
            offset = len(slave_log)
            entry = epoch_at(master_epochs, offset)
            boundary = next_epoch_start(master_epochs, offset)
            frame_end = end if boundary is None else min(end, boundary)
            if not self.epochs[slave] or self.epochs[slave][-1].epoch != entry.epoch:
                self.epochs[slave].append(entry)
            slave_log.extend(master_log[offset:frame_end])


def _events():
    yield from (("elect", n) for n in range(3))
    yield from (("write", k) for k in (1, 2))
    yield from (("sync", s, limit) for s in range(3) for limit in (None, 1))


def test_consistent_point_matches_the_longest_common_prefix_in_every_reachable_arrangement():
    explored = 0
    frontier = [Model()]
    for depth in range(6):
        next_frontier = []
        for model in frontier:
            for event in _events():
                if event[0] != "elect" and model.master is None:
                    continue
                if event[0] == "sync" and event[1] == model.master:
                    continue
                child = model.copy()
                getattr(child, event[0])(*event[1:])
                explored += 1
                next_frontier.append(child)
        frontier = next_frontier
    assert explored > 100_000
