"""The node's client bounds over in-memory streams (node/server/client_limits.py): a client
that does not read its replies stops being read (the bytes held stay under its bound) and
gets every reply once it reads; idle connections are closed with an ``unread`` notice; at
the connection limit an idle or silent connection gives its place to a new one, a working
one never does; before authentication only a small frame is read."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from node.errors import UnsentError
from node.server.client_limits import NEW_GRACE_S, SHED_IDLE_S
from node.wire import protocol
from node.wire.protocol import FrameDecoder, RequestCode
from store import Message

from node_helpers import MemoryNode, small_config

pytestmark = pytest.mark.trio

BODY = b"x" * (100 * 1024)
PULLS = 200


@pytest.fixture
def limited(tmp_path):
    parts = MemoryNode(small_config(tmp_path / "store", connection_reply_bytes_max=256 * 1024,
                                    client_buffer_bytes_max=64 << 20, idle_timeout_ms=10_000, connections_max=2))
    yield parts
    parts.store.shutdown()


def _serve_lockstep(node: MemoryNode, nursery: trio.Nursery):
    """A connection whose bytes move only while the client reads (as a full socket)."""
    client_end, server_end = trio.testing.lockstep_stream_pair()
    nursery.start_soon(node.server.handle_connection, server_end)
    return client_end


async def _read_frames(stream, count: int) -> list:
    decoder, frames = FrameDecoder(), []
    while len(frames) < count:
        data = await stream.receive_some(1 << 20)
        if not data:
            break
        frames.extend(decoder.feed(data))
    return frames


async def test_a_client_that_does_not_read_gets_backpressure_and_then_every_reply(limited):
    limited.store.append([Message("big", BODY, queue_id=0) for _ in range(4)])
    limited.store.wait_dispatched()
    limits = limited.server.limits
    async with trio.open_nursery() as nursery:
        stream = _serve_lockstep(limited, nursery)
        pulls = b"".join(protocol.encode_frame({"code": int(RequestCode.PULL), "opaque": i, "topic": "big",
                                                "queue_id": 0, "offset": 0, "max_count": 4,
                                                "max_bytes": 8 << 20}) for i in range(PULLS))
        nursery.start_soon(stream.send_all, pulls)
        await trio.testing.wait_all_tasks_blocked()
        reply_bytes = 4 * len(BODY) + 4096
        assert limits.held_bytes <= 256 * 1024 + reply_bytes
        assert limited.handlers.statistics().requests < 10   # the reader stopped handing pulls over
        replies = await _read_frames(stream, PULLS)
        assert sorted(reply["opaque"] for reply in replies) == list(range(PULLS))
        assert all(len(reply["messages"]) == 4 for reply in replies)
        await trio.testing.wait_all_tasks_blocked()
        assert limits.held_bytes == 0
        counts = limited.server.counts
        assert counts.backpressure_pauses >= 1 and counts.peak_held_bytes >= 256 * 1024
        assert counts.status()["backpressure_pauses"] == counts.backpressure_pauses
        assert _metric(limited, b"hastore_client_backpressure_pauses_total") == counts.backpressure_pauses
        assert _metric(limited, b"hastore_client_held_bytes") == 0
        assert _metric(limited, b"hastore_client_held_bytes_peak") == counts.peak_held_bytes
        nursery.cancel_scope.cancel()


async def test_an_idle_connection_is_closed_and_told_nothing_was_read(limited, autojump_clock):
    async with trio.open_nursery() as nursery:
        nursery.start_soon(limited.server.limits.reap_forever)
        connection = await limited.connect(nursery)
        assert (await connection.request(RequestCode.STATUS))["node_id"] == "n1"
        await trio.sleep(11)
        statistics = limited.server.limits_statistics()
        assert statistics.idle_closed == 1 and statistics.connections == 0
        assert limited.server.counts.status()["idle_timeouts"] == 1
        assert _metric(limited, b"hastore_connections_idle_timeouts_total") == 1
        with pytest.raises(UnsentError):   # the notice says the node read nothing more: safe to resend
            pending = await connection.submit(RequestCode.STATUS)
            await pending.wait(5_000)
        nursery.cancel_scope.cancel()


async def test_at_the_limit_a_silent_connection_gives_way_and_working_ones_do_not(limited, autojump_clock):
    # bounded: a wait that never ends would otherwise spin the autojump clock forever
    with trio.fail_after(120):
        await _silent_gives_way_working_do_not(limited)


async def _silent_gives_way_working_do_not(limited):
    async with trio.open_nursery() as nursery:
        silent = limited.raw(nursery)        # connects and never sends a thing
        working = await limited.connect(nursery)
        # a request, so that ``silent`` is the one connection silent since it opened (two
        # silent ones left the node free to displace either, and the test hung on the wrong one)
        await working.request(RequestCode.STATUS)
        await trio.sleep(NEW_GRACE_S + 0.1)
        newcomer = await limited.connect(nursery)
        assert (await newcomer.request(RequestCode.STATUS))["node_id"] == "n1"
        notice = await _read_frames(silent, 1)
        assert notice[0]["code"] == protocol.ResponseCode.SYSTEM_BUSY and notice[0]["unread"] is True
        # both connections left are working (a long poll each): a third is refused, not let in
        pending = [await c.submit(RequestCode.PULL, topic="t", queue_id=0, offset=0,
                                  timeout_ms=30_000)   # still working when the third is refused
                   for c in (working, newcomer)]
        await trio.sleep(SHED_IDLE_S + 1)
        refused = limited.raw(nursery)
        (answer,) = await _read_frames(refused, 1)
        assert answer["code"] == protocol.ResponseCode.SYSTEM_BUSY and answer["unread"] is True
        assert limited.server.statistics().connections_refused == 1
        for item in pending:
            assert (await item.wait(60_000))["status"] in ("NO_NEW_MESSAGE", "NO_MATCHED_LOGIC_QUEUE")
        status = limited.server.counts.status()
        assert (status["limit"], status["open"], status["refused_busy"], status["shed_unauthenticated"],
                status["shed_idle"]) == (2, 2, 1, 1, 0)
        assert _metric(limited, b'hastore_connections_shed_total{node="n1",reason="unauthenticated"}') == 1
        assert _metric(limited, b'hastore_connections_shed_total{node="n1",reason="idle"}') == 0
        assert _metric(limited, b"hastore_connections_refused_busy_total") == 1
        assert _metric(limited, b"hastore_connections_max") == 2
        assert _metric(limited, b"hastore_connections") == 2
        nursery.cancel_scope.cancel()


async def test_at_the_limit_the_connection_idle_longest_gives_way(limited, autojump_clock):
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            first = await limited.connect(nursery)
            await first.request(RequestCode.STATUS)
            await trio.sleep(1)
            second = await limited.connect(nursery)
            await second.request(RequestCode.STATUS)
            await trio.sleep(SHED_IDLE_S + 0.5)   # both idle past SHED_IDLE_S, the first the longer
            newcomer = await limited.connect(nursery)
            assert (await newcomer.request(RequestCode.STATUS))["node_id"] == "n1"
            with pytest.raises(UnsentError):   # the first was shed, told nothing more was read
                await (await first.submit(RequestCode.STATUS)).wait(5_000)
            assert (await second.request(RequestCode.STATUS))["node_id"] == "n1"
            counts = limited.server.counts
            assert (counts.shed_idle, counts.shed_unauthenticated, counts.refused_busy) == (1, 0, 0)
            assert _metric(limited, b'hastore_connections_shed_total{node="n1",reason="idle"}') == 1
            nursery.cancel_scope.cancel()


async def test_a_connection_that_does_not_authenticate_in_time_is_counted(tmp_path, autojump_clock):
    node = MemoryNode(small_config(tmp_path / "store", secret="s3cret", auth_timeout_ms=2_000))
    try:
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                stream = node.raw(nursery)
                (challenge,) = await _read_frames(stream, 1)
                assert challenge["code"] == RequestCode.AUTH_CHALLENGE
                (answer,) = await _read_frames(stream, 1)   # nothing sent: the node gives up after 2 s
                assert answer["code"] == protocol.ResponseCode.AUTH_REQUIRED
                assert trio.current_time() >= 2
                wrong = node.raw(nursery)
                await _read_frames(wrong, 1)
                await wrong.send_all(protocol.encode_frame({"code": int(RequestCode.AUTH), "opaque": 1,
                                                            "digest": b"0" * 32}))
                (refused,) = await _read_frames(wrong, 1)
                assert refused["code"] == protocol.ResponseCode.AUTH_FAILED
                status = node.server.counts.status()
                assert (status["auth_timeouts"], status["auth_failures"]) == (1, 2)
                assert _metric(node, b"hastore_connections_auth_timeouts_total") == 1
                assert _metric(node, b"hastore_connections_auth_failures_total") == 2
                nursery.cancel_scope.cancel()
    finally:
        node.store.shutdown()


async def test_past_the_total_bound_the_connection_holding_the_most_is_closed_and_counted(tmp_path):
    node = MemoryNode(small_config(tmp_path / "store", connection_reply_bytes_max=1 << 20,
                                   client_buffer_bytes_max=1 << 20))
    try:
        node.store.append([Message("big", BODY, queue_id=0) for _ in range(4)])
        node.store.wait_dispatched()
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                streams = [_serve_lockstep(node, nursery) for _ in range(2)]
                pulls = b"".join(protocol.encode_frame({"code": int(RequestCode.PULL), "opaque": i, "topic": "big",
                                                        "queue_id": 0, "offset": 0, "max_count": 4,
                                                        "max_bytes": 8 << 20}) for i in range(20))
                for stream in streams:
                    nursery.start_soon(stream.send_all, pulls)
                await trio.testing.wait_all_tasks_blocked()
                counts = node.server.counts
                assert counts.closed_for_memory >= 1
                assert counts.status()["closed_for_memory"] == counts.closed_for_memory
                assert _metric(node, b"hastore_connections_closed_for_memory_total") == counts.closed_for_memory
                nursery.cancel_scope.cancel()
    finally:
        node.store.shutdown()


def _metric(node: MemoryNode, name: bytes) -> float:
    """The value of the one sample named ``name`` (labels included when given) in the node's
    Prometheus text."""
    found = [line for line in node.metrics.render().splitlines()
             if line.startswith(name + (b"" if b"{" in name else b"{"))]
    assert len(found) == 1, (name, found)
    return float(found[0].rsplit(b" ", 1)[1])


async def test_before_authentication_only_a_small_frame_is_read(tmp_path):
    node = MemoryNode(small_config(tmp_path / "store", secret="s3cret"))
    try:
        async with trio.open_nursery() as nursery:
            stream = node.raw(nursery)
            (challenge,) = await _read_frames(stream, 1)
            assert challenge["code"] == RequestCode.AUTH_CHALLENGE
            await stream.send_all(protocol.LENGTH.pack(1 << 20) + b"\x80" * 1000)   # a 1 MiB frame begins
            (answer,) = await _read_frames(stream, 1)
            assert answer["code"] == protocol.ResponseCode.BAD_FRAME and "65536" in answer["error"]
            assert await stream.receive_some(1024) == b""
            nursery.cancel_scope.cancel()
    finally:
        node.store.shutdown()
