"""Each toxic's effect on real socket pairs (client -> proxy -> the test's own upstream server on
127.0.0.1), the server in the test's own trio loop; with TOXIPROXY_URL set, the same tests
run against that (real) Toxiproxy. Timing bounds are +/-20% of what was asked (plus the
measured baseline), generous enough for a busy machine."""

from __future__ import annotations

import os
import statistics
import uuid

import pytest
import trio

from chaos.toxiproxy import serve_toxiproxy
from chaos.toxiproxy.probe import ApiSession, pattern, serve_upstream

pytestmark = pytest.mark.trio
BIG_BYTES = 1_000_000


@pytest.fixture
async def api(nursery):
    url = os.environ.get("TOXIPROXY_URL")
    if not url:
        url = (await nursery.start(serve_toxiproxy, "127.0.0.1", 0)).url
    session = ApiSession(url)
    yield session
    await session.cleanup()


@pytest.fixture
async def proxy(api, nursery):
    """(name, host, port) of a fresh proxy in front of an upstream ECHO/SEND server."""
    upstream = await nursery.start(serve_upstream)
    name = f"t_{uuid.uuid4().hex[:8]}"
    host, port = await api.create_proxy(name, upstream)
    return name, host, port


async def connect(proxy, line: bytes) -> trio.SocketStream:
    _, host, port = proxy
    stream = await trio.open_tcp_stream(host, port)
    await stream.send_all(line)
    return stream


async def round_trip_s(stream: trio.SocketStream, message: bytes = b"ping") -> float:
    start = trio.current_time()
    await stream.send_all(message)
    received = b""
    while len(received) < len(message):
        data = await stream.receive_some(65536)
        assert data, "the link closed"
        received += data
    assert received == message
    return trio.current_time() - start


async def receive_exactly(stream: trio.SocketStream, count: int) -> bytes:
    received = bytearray()
    while len(received) < count:
        data = await stream.receive_some(65536)
        assert data, f"the link closed after {len(received)} of {count} bytes"
        received += data
    return bytes(received)


async def receive_until_end(stream: trio.SocketStream, limit_s: float = 10.0) -> bytes:
    received = bytearray()
    with trio.fail_after(limit_s):
        while data := await stream.receive_some(65536):
            received += data
    return bytes(received)


async def median_rtt_s(stream: trio.SocketStream, count: int = 3) -> float:
    return statistics.median([await round_trip_s(stream) for _ in range(count)])


async def test_no_toxic_forwards_every_byte(proxy):
    stream = await connect(proxy, f"SEND {BIG_BYTES} close\n".encode())
    async with stream:
        assert await receive_until_end(stream) == pattern(BIG_BYTES)
    echo = await connect(proxy, b"ECHO\n")
    async with echo:
        big = pattern(300_000, 7)
        await echo.send_all(big)
        assert await receive_exactly(echo, len(big)) == big


@pytest.mark.parametrize("stream_name", ["downstream", "upstream"])
async def test_latency_adds_what_was_asked(api, proxy, stream_name):
    stream = await connect(proxy, b"ECHO\n")
    async with stream:
        baseline = await median_rtt_s(stream)
        await api.add_toxic(proxy[0], "latency", {"latency": 300}, stream=stream_name)
        added = await median_rtt_s(stream) - baseline  # the open link takes the new toxic
        assert 0.24 <= added <= 0.36, added
        await api.request("DELETE", f"/proxies/{proxy[0]}/toxics/latency_{stream_name}")
        assert await median_rtt_s(stream) < 0.15


async def test_latency_jitter_stays_within_its_range(api, proxy):
    await api.add_toxic(proxy[0], "latency", {"latency": 200, "jitter": 50})
    stream = await connect(proxy, b"ECHO\n")
    async with stream:
        samples = [await round_trip_s(stream) for _ in range(5)]
    assert all(0.15 * 0.8 <= sample <= 0.25 * 1.2 for sample in samples), samples


async def test_bandwidth_caps_the_rate(api, proxy):
    rate_kb_s = 400
    total = 400_000  # one second at the cap
    await api.add_toxic(proxy[0], "bandwidth", {"rate": rate_kb_s})
    stream = await connect(proxy, f"SEND {total} close\n".encode())
    async with stream:
        start = trio.current_time()
        data = await receive_until_end(stream)
        elapsed = trio.current_time() - start
    assert data == pattern(total)
    measured_kb_s = total / 1000 / elapsed
    assert rate_kb_s * 0.8 <= measured_kb_s <= rate_kb_s * 1.2, measured_kb_s


async def test_timeout_zero_blackholes_until_removed(api, proxy):
    await api.add_toxic(proxy[0], "timeout", {"timeout": 0})
    stream = await connect(proxy, b"ECHO\n")
    async with stream:
        await stream.send_all(b"into the hole")
        with trio.move_on_after(0.5) as waited:
            await stream.receive_some(100)
        assert waited.cancelled_caught, "bytes came through a blackhole"
        assert (await api.request("DELETE", f"/proxies/{proxy[0]}/toxics/timeout_downstream")).status == 204
        # As Toxiproxy does, removing the toxic closes the links whose bytes it dropped...
        with trio.fail_after(5):
            try:
                assert await stream.receive_some(100) == b""
            except trio.BrokenResourceError:
                pass
    fresh = await connect(proxy, b"ECHO\n")  # ...and new links flow again
    async with fresh:
        assert await round_trip_s(fresh) < 1.0


async def test_timeout_closes_after_its_time(api, proxy):
    await api.add_toxic(proxy[0], "timeout", {"timeout": 300})
    stream = await connect(proxy, b"ECHO\n")
    async with stream:
        start = trio.current_time()
        await stream.send_all(b"dropped")
        try:
            assert await receive_until_end(stream, limit_s=5) == b""
        except trio.BrokenResourceError:
            pass
        assert 0.24 <= trio.current_time() - start <= 2.0


async def test_reset_peer_resets_the_connection(api, proxy):
    await api.add_toxic(proxy[0], "reset_peer", {"timeout": 100})
    stream = await connect(proxy, b"ECHO\n")
    async with stream:
        await stream.send_all(b"ping")
        with pytest.raises(trio.BrokenResourceError) as raised:
            await receive_until_end(stream, limit_s=5)
    assert isinstance(raised.value.__cause__, ConnectionResetError)


async def test_limit_data_closes_after_n_bytes(api, proxy):
    await api.add_toxic(proxy[0], "limit_data", {"bytes": 1000})
    stream = await connect(proxy, b"SEND 5000\n")
    async with stream:
        assert await receive_until_end(stream) == pattern(1000)


async def test_slicer_delivers_every_byte_in_pieces(api, proxy):
    await api.add_toxic(proxy[0], "slicer", {"average_size": 100, "size_variation": 20, "delay": 2000})
    stream = await connect(proxy, b"SEND 5000 close\n")
    reads = []
    async with stream:
        with trio.fail_after(10):
            while data := await stream.receive_some(65536):
                reads.append(data)
    assert b"".join(reads) == pattern(5000)
    assert len(reads) >= 10, [len(read) for read in reads]


async def test_slow_close_delays_the_close(api, proxy):
    stream = await connect(proxy, b"SEND 10 close\n")
    async with stream:
        start = trio.current_time()
        assert await receive_until_end(stream) == pattern(10)
        plain_s = trio.current_time() - start
    await api.add_toxic(proxy[0], "slow_close", {"delay": 500})
    stream = await connect(proxy, b"SEND 10 close\n")
    async with stream:
        start = trio.current_time()
        assert await receive_until_end(stream) == pattern(10)
        slow_s = trio.current_time() - start
    assert 0.4 <= slow_s - plain_s <= 0.8, (plain_s, slow_s)


async def test_down_refuses_and_closes_then_up_accepts(api, proxy):
    name, host, port = proxy
    open_link = await connect(proxy, b"ECHO\n")
    async with open_link:
        assert await round_trip_s(open_link) < 1.0
        assert (await api.request("POST", f"/proxies/{name}", {"enabled": False})).status == 200
        with pytest.raises(OSError):
            await trio.open_tcp_stream(host, port)
        try:
            assert await receive_until_end(open_link, limit_s=5) == b""
        except trio.BrokenResourceError:
            pass
    assert (await api.request("POST", f"/proxies/{name}", {"enabled": True})).status == 200
    again = await connect(proxy, b"ECHO\n")
    async with again:
        assert await round_trip_s(again) < 1.0


async def test_toxicity_zero_has_no_effect(api, proxy):
    await api.add_toxic(proxy[0], "latency", {"latency": 1000}, toxicity=0.0)
    await api.add_toxic(proxy[0], "timeout", {"timeout": 0}, toxicity=0.0, stream="upstream")
    stream = await connect(proxy, b"ECHO\n")
    async with stream:
        assert await median_rtt_s(stream) < 0.5
