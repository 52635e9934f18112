"""Crash points: a writer process is killed with SIGKILL at random moments, including
inside a segment roll and its allocation, an index file's creation, a checkpoint write, a
config-file write and a replica truncation. After each kill the store starts by itself,
loses no acknowledged message (flush sync: a put returned PUT_OK after its flush) and
serves nothing corrupt.

How the kill lands: the writer wraps the file-system calls the store makes (posix_fallocate,
fdatasync, fsync, replace, unlink, ftruncate, pwrite, and a CommitLog flush's msync) so that
the k-th call of one of them (k and the call chosen from the round's seed) SIGKILLs the
process, before or after the real call; the module of the store that made the call names
the crash point. The calls themselves are the real ones. Rounds whose chosen call never
comes are killed by the test at a random moment instead ("timer"). The distinct crash
points reached are counted and printed (pytest -s shows them)."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from store import MessageStore, offline
from store_helpers import check_indexes_agree_with_log, make_config

pytestmark = pytest.mark.integration

SETTINGS = dict(commitlog_segment_bytes=4096, flush="sync", consume_queue_entries_per_file=8,
                index_hash_slots=4, index_max_entries=16, checkpoint_interval_ms=30, flush_interval_ms=10,
                dispatcher_thread=False)
ROUNDS_MIN = 10               # always this many kills, however slow the machine (each is bounded)
ROUNDS_TIME_BUDGET_S = 40     # more, up to ROUNDS_MAX, while the budget lasts
ROUNDS_MAX = 40

WRITER = textwrap.dedent("""
    import os, random, signal, sys, traceback
    seed, hook_name, kill_at, after = int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5] == "1"
    calls = {"n": 0}

    def crash_point():
        # the innermost store frame above the mapped-file plumbing names what was under way
        stack = traceback.extract_stack()[:-3]
        for frame in reversed(stack):
            name = os.path.basename(frame.filename)
            if "/store/" in frame.filename and name not in ("mapped_file.py", "mapped_file_queue.py"):
                return f"{name[:-3]}.{frame.name}"
        if any(frame.name == "_prepare" for frame in stack):
            return "preallocator._prepare"
        return "other"

    def wrap(name, owner=os, attribute=None):
        attribute = attribute or name
        real = getattr(owner, attribute)
        def hooked(*args, **kwargs):
            if name == hook_name:
                calls["n"] += 1
                if calls["n"] == kill_at:
                    point = f"{name}:{crash_point()}:{'after' if after else 'before'}"
                    if after:
                        real(*args, **kwargs)
                    os.write(1, f"CRASH {point}\\n".encode())
                    os.kill(os.getpid(), signal.SIGKILL)
            return real(*args, **kwargs)
        setattr(owner, attribute, hooked)

    for name in ("posix_fallocate", "fdatasync", "fsync", "replace", "unlink", "ftruncate", "pwrite"):
        wrap(name)

    from store import Message, MessageStore, PutStatus, StoreConfig
    from store import mapped_file
    wrap("msync", mapped_file, "_msync")   # a CommitLog flush: msync of the range written (ctypes)
    settings = dict(commitlog_segment_bytes=4096, flush="sync", consume_queue_entries_per_file=8,
                    index_hash_slots=4, index_max_entries=16, checkpoint_interval_ms=30, flush_interval_ms=10,
                    dispatcher_thread=False)
    store = MessageStore(StoreConfig(store_path=sys.argv[1], **settings))
    store.start()
    rng = random.Random(seed)
    print("STARTED", flush=True)
    n = int(sys.argv[6])
    for step in range(100_000):
        action = rng.random()
        if action < 0.08 and store.max_physical_offset > 0:
            acked = store.commit_log.queue_offsets
            target = store.pull("C", rng.randrange(2), max(0, store.max_offset("C", 0) - 3), 1).messages
            if target:
                offset = target[0].physical_offset
                print("CUTTING", offset, flush=True)
                store.replica_log.cut(offset)
                store.replica_log.catch_up_for_writes()
                print("CUT", offset, flush=True)
            continue
        if action < 0.15:
            store.configs["topics.json"].data["step"] = step
            store.configs["topics.json"].persist()
            continue
        if action < 0.22:
            store.flusher.write_checkpoint()
            continue
        batch = [Message(topic="C", queue_id=rng.randrange(2), body=b"c%d." % (n + i) + b"x" * rng.randrange(300),
                         keys=[f"k{n + i}"]) for i in range(rng.randrange(1, 4))]
        results = store.put_batch(batch)
        for message, result in zip(batch, results):
            if result.status is PutStatus.PUT_OK:
                print("ACK", message.body.split(b".")[0].decode()[1:], message.queue_id, result.queue_offset,
                      result.physical_offset, len(message.body), flush=True)
        n += len(batch)
        store.wait_dispatched()
""")

HOOKS = ["posix_fallocate", "fdatasync", "replace", "unlink", "ftruncate", "pwrite", "fsync", "msync", "timer"]


def _round(path: str, seed: int, first_number: int) -> tuple[str, dict, int]:
    """Run the writer once and kill it; (crash point, acknowledged messages still expected, next number)."""
    rng = random.Random(seed)
    hook = HOOKS[seed % len(HOOKS)]
    kill_at = rng.randrange(1, 25)
    process = subprocess.Popen([sys.executable, "-c", WRITER, path, str(seed), hook, str(kill_at),
                                "1" if rng.random() < 0.5 else "0", str(first_number)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = [process.stdout.readline()]           # STARTED: the random moment counts from here
    deadline = time.monotonic() + rng.uniform(0.05, 0.6)
    try:
        while time.monotonic() < deadline:
            line = process.stdout.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith("CRASH"):
                break
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
        rest, errors = process.communicate(timeout=30)
    lines.extend(rest.splitlines())
    assert process.returncode == -signal.SIGKILL, f"writer exited {process.returncode}: {errors[-2000:]}"
    point = "timer"
    acked: dict[int, tuple] = {}
    number = first_number
    for line in lines:
        parts = line.split()
        if not parts:
            continue
        if parts[0] == "ACK" and len(parts) == 6:        # a line the kill cut short is no evidence
            n, queue_id, queue_offset, physical_offset, size = map(int, parts[1:])
            acked[n] = (queue_id, queue_offset, physical_offset, size)
            number = max(number, n + 1)
        elif parts[0] in ("CUTTING", "CUT") and len(parts) == 2:
            # a cut (finished or not) takes away what lies at and past its offset
            offset = int(parts[1])
            acked = {n: a for n, a in acked.items() if a[2] < offset}
        elif parts[0] == "CRASH":
            point = parts[1]
    return point, acked, number


def test_every_crash_point_recovers_by_itself(tmp_path):
    path = str(tmp_path / "s")
    expected: dict[int, tuple] = {}
    points: dict[str, int] = {}
    number = 0
    started = time.monotonic()
    rounds = 0
    while rounds < ROUNDS_MIN or (rounds < ROUNDS_MAX and time.monotonic() - started < ROUNDS_TIME_BUDGET_S):
        point, acked, number = _round(path, rounds, number)
        rounds += 1
        points[point] = points.get(point, 0) + 1
        expected = expected | acked
        store = MessageStore(make_config(path, **SETTINGS))
        print("round", rounds, point, flush=True)
        store.start()                                      # by itself: no file removed by hand
        try:
            assert store.wait_dispatched()
            log_messages = check_indexes_agree_with_log(store)   # nothing corrupt, indexes agree
            by_offset = {m.physical_offset: m for m in log_messages}
            survivors = {}
            for n, (queue_id, queue_offset, physical_offset, size) in expected.items():
                message = by_offset.get(physical_offset)
                if message is not None and message.body.startswith(b"c%d." % n):
                    survivors[n] = (queue_id, queue_offset, physical_offset, size)
            lost = {n: a for n, a in expected.items() if n not in survivors}
            # the only acked messages allowed to be gone are those a cut took away later
            assert not [n for n in lost if n in acked], (point, sorted(lost)[:10])
            for n, (queue_id, queue_offset, physical_offset, size) in survivors.items():
                [message] = store.get("C", queue_id, queue_offset, 1)
                assert message.physical_offset == physical_offset and message.body.startswith(b"c%d." % n)
            expected = survivors
        finally:
            store.shutdown()
        assert offline.verify(path)[0] == [], point
    print(f"\ncrash points reached: {len(points)} distinct over {rounds} kills")
    for point, count in sorted(points.items()):
        print(f"  {count:3d}  {point}")
    assert rounds >= ROUNDS_MIN
    assert len(points) >= 6, points
