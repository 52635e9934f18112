"""Fuzzing the framing and the request fields against a live node (bounded): no crash, typed
errors, and a client on another connection never notices."""

import threading

import msgpack
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from node.wire import protocol
from node.client import open_admin
from node.server.node import serve_node
from node.wire.protocol import FrameDecoder, ResponseCode

from node_helpers import small_config


@pytest.fixture(scope="module")
def live_node(tmp_path_factory):
    """A node running in its own thread's trio loop for the whole module."""
    box = {}
    started = threading.Event()

    async def run():
        async with trio.open_nursery() as nursery:
            box["node"] = await nursery.start(serve_node, small_config(tmp_path_factory.mktemp("fuzz") / "store"))
            box["token"] = trio.lowlevel.current_trio_token()
            box["cancel"] = nursery.cancel_scope.cancel
            started.set()

    thread = threading.Thread(target=trio.run, args=(run,), daemon=True)
    thread.start()
    assert started.wait(30)
    yield box["node"]
    trio.from_thread.run_sync(box["cancel"], trio_token=box["token"])
    thread.join(30)
    assert not thread.is_alive()


scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-2**64, max_value=2**64 - 1).filter(
    lambda v: -2**63 <= v < 2**64), st.text(max_size=40), st.binary(max_size=64), st.floats(allow_nan=False))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=12), inner, max_size=4)),
                      max_leaves=12)
field_names = st.sampled_from(["topic", "queue_id", "offset", "messages", "body", "max_count", "timeout_ms", "key",
                               "group", "offsets", "message_id", "queue_count", "timestamp_ms", "include_system"])
requests = st.fixed_dictionaries(
    {"code": st.one_of(st.sampled_from([int(c) for c in protocol.RequestCode]), values),
     "opaque": st.integers(min_value=0, max_value=2**31)},
    optional={"topic": st.one_of(st.sampled_from(["fuzz", "%SYS%CONFIG", "", "a b"]), values),
              "messages": st.lists(st.dictionaries(field_names, values, max_size=4), max_size=3)}).flatmap(
    lambda base: st.dictionaries(field_names, values, max_size=4).map(lambda extra: {**extra, **base}))


async def _exchange(address: str, data: bytes, expect_replies: int, half_close: bool = False) -> list:
    host, port = address.rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    decoder = FrameDecoder()
    replies = []
    async with stream:
        await stream.send_all(data)
        if half_close:
            await stream.send_eof()  # the node answers what it has, then closes
        with trio.move_on_after(5):
            while len(replies) < expect_replies:
                chunk = await stream.receive_some(65536)
                if not chunk:
                    break
                replies.extend(decoder.feed(chunk))
    return replies


async def _healthy(address: str) -> None:
    async with open_admin(address) as admin:
        with trio.fail_after(5):
            assert (await admin.status())["role"] == "master"


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(request=requests)
def test_fuzzed_requests_get_replies_with_their_opaque(live_node, request):
    request["timeout_ms"] = 0 if not isinstance(request.get("timeout_ms"), int) else request["timeout_ms"] % 50

    async def main():
        replies = await _exchange(live_node.client_address, protocol.encode_frame(request), 1)
        assert len(replies) == 1
        reply = replies[0]
        assert reply["opaque"] == request["opaque"]
        ResponseCode(reply["code"])  # a known code
        if reply["code"] != ResponseCode.SUCCESS:
            assert reply["error"]
        await _healthy(live_node.client_address)
    trio.run(main)


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(garbage=st.binary(max_size=300), prefix_good=st.booleans())
def test_garbage_bytes_never_hurt_the_node(live_node, garbage, prefix_good):
    data = (protocol.encode_frame({"code": int(protocol.RequestCode.STATUS), "opaque": 1}) if prefix_good else b"") \
        + garbage

    async def main():
        replies = await _exchange(live_node.client_address, data, 10, half_close=True)
        for reply in replies:
            assert isinstance(reply, dict) and "code" in reply
        await _healthy(live_node.client_address)
    trio.run(main)


def test_truncated_frames_and_a_concurrent_client(live_node):
    """A half-sent frame and a vanished peer leave a pipelining client on another connection unaffected."""
    async def main():
        async with open_admin(live_node.client_address) as admin:
            await admin.create_topic("fuzz-steady", 1)
            host, port = live_node.client_address.rsplit(":", 1)
            for cut in (1, 3, 4, 10):
                frame = protocol.encode_frame({"code": 10, "opaque": 1, "topic": "fuzz-steady",
                                               "messages": [{"body": b"y" * 100}]})
                stream = await trio.open_tcp_stream(host, int(port))
                await stream.send_all(frame[:cut])
                await stream.aclose()
            huge = protocol.LENGTH.pack(2**32 - 1) + msgpack.packb({"code": 20})
            assert (await _exchange(live_node.client_address, huge, 1))[0]["code"] == ResponseCode.FRAME_TOO_LARGE
            pendings = [await admin.connection.submit(protocol.RequestCode.SEND, topic="fuzz-steady",
                                                      messages=[{"body": b"z"}]) for _ in range(20)]
            results = [(await p.wait())["results"][0] for p in pendings]
            assert [r["status"] for r in results] == ["PUT_OK"] * 20
            assert [r["queue_offset"] for r in results] == list(range(20))  # pipelined sends keep their order
    trio.run(main)
