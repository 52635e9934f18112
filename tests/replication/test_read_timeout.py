"""The slave's read timeout (``read_timeout_ms``): a master that sends nothing, not even a
heartbeat, for that long ends the session; one that sends something more often never
does. Its deadline moves at most once per READ_TIMEOUT_SLACK of it (not at every frame),
so the session ends between (1 - slack) and 1 read timeout after the last frame. Trio's
autojump clock, a real replica log, a memory stream pair (no process, no network wait)."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from replication import protocol
from replication.epochs import EpochEntry, Resync, ResyncKind
from replication.errors import HaProtocolError
from replication.ha_client import READ_TIMEOUT_SLACK, HAClient, HaClientSettings
from replication.protocol import Welcome
from replication.transport import StreamReader
from replication_helpers import epoch_file, put

pytestmark = pytest.mark.trio

READ_TIMEOUT_MS = 10_000
TIMEOUT_S = READ_TIMEOUT_MS / 1000


async def _session_end(open_store, sends: list[tuple[float, str]], name: str = "") -> float:
    """Run the slave's receiver while a 'master' sends each (time from now, "heartbeat" or
    "data") of ``sends``, then nothing; the time the receiver gave up at."""
    master, slave = open_store(f"master{name}"), open_store(f"slave{name}")
    data_sends = sum(1 for _, kind in sends if kind == "data")
    put(master, max(1, data_sends))
    chunks, offset = [], 0
    for _ in range(data_sends):
        chunk = bytes(master.replica_log.read(offset, 1))   # one record a frame
        chunks.append((offset, chunk))
        offset += len(chunk)
    epochs = epoch_file(slave)
    epochs.append(1, 0)
    welcome = Welcome(proof=b"", node_id="m", epoch=1, epochs=[EpochEntry(1, 0)], min_offset=0,
                      max_offset=master.max_physical_offset, resync=Resync(ResyncKind.TRUNCATE, 0, 1, "test"))
    client = HAClient(slave.replica_log, epochs,
                      HaClientSettings(node_id="s1", group="g", cluster="c", master_ha_address="127.0.0.1:1",
                                       read_timeout_ms=READ_TIMEOUT_MS))
    master_end, slave_end = trio.testing.memory_stream_pair()
    free_in, free_out = trio.open_memory_channel(2)
    for _ in range(2):
        free_in.send_nowait(memoryview(bytearray(protocol.DATA_FRAME_BYTES_MAX)))
    frames_in, frames_out = trio.open_memory_channel(2)
    started = trio.current_time()
    ended = None
    with trio.fail_after(10 * TIMEOUT_S + max((at for at, _ in sends), default=0)):
        async with trio.open_nursery() as nursery:
            async def master_side() -> None:
                pending = iter(chunks)
                for at, kind in sends:
                    await trio.sleep_until(started + at)
                    if kind == "data":
                        at_offset, chunk = next(pending)
                        await master_end.send_all(protocol.data_header(at_offset, chunk) + chunk)
                    else:
                        await master_end.send_all(protocol.heartbeat(0))
                while True:   # the slave's acks, read and dropped
                    if not await master_end.receive_some(1 << 16):
                        return

            async def receiver() -> None:
                nonlocal ended
                with pytest.raises(HaProtocolError, match="nothing from the master"):
                    await client._receive_frames(slave_end, StreamReader(slave_end), welcome, frames_in, free_out)
                ended = trio.current_time() - started
                nursery.cancel_scope.cancel()

            nursery.start_soon(master_side)
            nursery.start_soon(client._apply_frames, slave_end, frames_out, free_in)
            nursery.start_soon(receiver)
    assert slave.max_physical_offset == sum(len(chunk) for _, chunk in chunks)
    return ended


async def test_a_silent_master_ends_the_session_after_the_read_timeout(open_store, autojump_clock):
    ended = await _session_end(open_store, [])
    assert ended == pytest.approx(TIMEOUT_S, abs=0.01)


async def test_frames_more_often_than_the_timeout_keep_the_session_then_silence_ends_it(open_store, autojump_clock):
    # a frame every 0.3 s (well inside the slack) and every 4 s (well outside it), for
    # two read timeouts: the session lives on; after the last one it ends within
    # [1 - slack, 1] read timeouts
    for step in (0.3, 4.0):
        times = [round(step * i, 3) for i in range(1, int(2 * TIMEOUT_S / step) + 1)]
        sends = [(at, "data" if i % 8 == 0 else "heartbeat") for i, at in enumerate(times)]
        ended = await _session_end(open_store, sends, str(step))
        last = times[-1]
        assert last + (1 - READ_TIMEOUT_SLACK) * TIMEOUT_S - 0.01 <= ended <= last + TIMEOUT_S + 0.01, (step, ended)
