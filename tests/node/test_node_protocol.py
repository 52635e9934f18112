"""Framing (pure) and request round trips over trio in-memory streams."""

import msgpack
import pytest
import trio
from hypothesis import given, settings, strategies as st

from node.wire import protocol
from node.errors import FrameError, NotMasterError, RequestError
from node.wire.protocol import FrameDecoder, RequestCode, ResponseCode
from node.server.role import Role


def test_frames_split_anywhere_decode_the_same():
    frames = [{"code": 10, "opaque": i, "body": bytes(range(i % 256)) * 3} for i in range(50)]
    stream = b"".join(protocol.encode_frame(f) for f in frames)
    for chunk in (1, 3, 7, 100, len(stream)):
        decoder = FrameDecoder()
        out = []
        for start in range(0, len(stream), chunk):
            out.extend(decoder.feed(stream[start:start + chunk]))
        assert out == frames
        assert decoder.buffered_bytes == 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=300), min_size=1, max_size=12), st.data())
def test_frames_decode_the_same_for_any_chunking(bodies, data):
    # chunks that end mid-length, mid-frame and exactly on frame ends, with and without
    # bytes left over from the previous chunk
    frames = [{"code": 10, "opaque": i, "body": body} for i, body in enumerate(bodies)]
    stream = b"".join(protocol.encode_frame(f) for f in frames)
    cuts = sorted(data.draw(st.sets(st.integers(1, len(stream) - 1), max_size=20)))
    decoder = FrameDecoder()
    out = []
    for start, end in zip([0, *cuts], [*cuts, len(stream)]):
        out.extend(decoder.feed(bytearray(stream[start:end])))
    assert out == frames
    assert decoder.buffered_bytes == 0 and decoder.error is None


def test_oversized_length_breaks_the_decoder_for_good():
    decoder = FrameDecoder()
    with pytest.raises(protocol.FrameTooLarge):
        decoder.feed_strict(protocol.LENGTH.pack(protocol.FRAME_BYTES_MAX + 1))
    with pytest.raises(FrameError):
        decoder.feed(protocol.encode_frame({"code": 20, "opaque": 1}))


def test_garbage_payload_is_a_frame_error():
    with pytest.raises(FrameError):
        FrameDecoder().feed_strict(protocol.LENGTH.pack(2) + b"\xc1\xc1")


def test_good_frames_before_a_broken_one_are_kept():
    decoder = FrameDecoder()
    frames = decoder.feed(protocol.encode_frame({"opaque": 1}) + protocol.LENGTH.pack(1) + b"\xc1")
    assert frames == [{"opaque": 1}] and isinstance(decoder.error, FrameError)


def test_encode_refuses_frames_over_the_limit():
    with pytest.raises(FrameError):
        protocol.encode_frame({"body": b"x" * (protocol.FRAME_BYTES_MAX + 1)})


def test_encode_after_a_failed_or_a_big_frame_is_exact():
    # the per-thread Packer is kept between frames: nothing of an earlier frame may leak
    small = {"code": 10, "opaque": 1, "body": b"x"}
    with pytest.raises(TypeError):
        protocol.encode_frame({"code": 10, "opaque": 2, "list": [b"y" * 1000, object()]})
    assert protocol.encode_frame(small) == protocol.LENGTH.pack(len(msgpack.packb(small))) + msgpack.packb(small)
    big = {"code": 10, "opaque": 3, "body": b"z" * (3 << 20)}
    assert FrameDecoder().feed(protocol.encode_frame(big)) == [big]
    assert FrameDecoder().feed(protocol.encode_frame(small)) == [small]


@pytest.mark.trio
async def test_round_trips_over_memory_streams(memory_node):
    memory_node.wire_dispatcher()
    async with trio.open_nursery() as nursery:
        connection = await memory_node.connect(nursery)
        created = await connection.request(RequestCode.TOPIC_CREATE, topic="mem", queue_count=2)
        assert created["queue_count"] == 2
        reply = await connection.request(RequestCode.SEND, topic="mem", messages=[
            {"body": b"a", "queue_id": 1, "keys": ["k1"]}, {"body": b"b", "queue_id": 1}])
        results = reply["results"]
        assert [r["status"] for r in results] == ["PUT_OK", "PUT_OK"]
        assert [r["queue_offset"] for r in results] == [0, 1]
        pulled = await connection.request(RequestCode.PULL, topic="mem", queue_id=1, offset=0, timeout_ms=2000)
        assert [m["body"] for m in pulled["messages"]] == [b"a", b"b"]
        assert pulled["next_offset"] == 2
        # many requests pipelined on one connection, answered by opaque
        pendings = [await connection.submit(RequestCode.QUEUE_OFFSETS, topic="mem", queue_id=1) for _ in range(50)]
        for pending in pendings:
            assert (await pending.wait())["max_offset"] == 2
        nursery.cancel_scope.cancel()


@pytest.mark.trio
async def test_send_to_a_slave_gets_not_master_with_the_master_address(memory_node):
    memory_node.role.change(Role.SLAVE, 1, "127.0.0.1:30911")
    async with trio.open_nursery() as nursery:
        connection = await memory_node.connect(nursery)
        with pytest.raises(NotMasterError) as caught:
            await connection.request(RequestCode.SEND, topic="t", messages=[{"body": b"x"}])
        assert caught.value.master_address == "127.0.0.1:30911"
        # reads still work on a slave
        assert (await connection.request(RequestCode.STATUS))["role"] == "slave"
        nursery.cancel_scope.cancel()


async def _raw_exchange(stream, data: bytes) -> list:
    await stream.send_all(data)
    decoder = FrameDecoder()
    replies = []
    with trio.move_on_after(5):
        while True:
            chunk = await stream.receive_some(65536)
            if not chunk:
                break
            replies.extend(decoder.feed(chunk))
    return replies


@pytest.mark.trio
async def test_broken_framing_gets_an_error_and_a_closed_connection(memory_node):
    async with trio.open_nursery() as nursery:
        too_large = memory_node.raw(nursery)
        replies = await _raw_exchange(too_large, protocol.LENGTH.pack(protocol.FRAME_BYTES_MAX + 1) + b"x" * 10)
        assert [r["code"] for r in replies] == [ResponseCode.FRAME_TOO_LARGE]
        garbage = memory_node.raw(nursery)
        replies = await _raw_exchange(garbage, protocol.encode_frame({"code": 20, "opaque": 5})
                                      + protocol.LENGTH.pack(3) + b"\xc1\xc1\xc1")
        assert [r["code"] for r in replies] == [ResponseCode.SUCCESS, ResponseCode.BAD_FRAME]
        assert replies[0]["opaque"] == 5


@pytest.mark.trio
async def test_bad_requests_get_typed_errors_and_the_connection_stays(memory_node):
    cases = [
        ({"code": 999, "opaque": 1}, ResponseCode.REQUEST_CODE_NOT_SUPPORTED),
        ({"code": "SEND", "opaque": 2}, ResponseCode.REQUEST_CODE_NOT_SUPPORTED),
        ({"code": 10, "opaque": 3, "topic": "bad topic!", "messages": [{"body": b"x"}]}, ResponseCode.TOPIC_ILLEGAL),
        ({"code": 10, "opaque": 4, "topic": "t", "messages": [{"body": "text"}]}, ResponseCode.BAD_REQUEST),
        ({"code": 10, "opaque": 5, "topic": "t", "messages": [{"body": b"x" * (4 * 1024 * 1024 + 1)}]},
         ResponseCode.BODY_TOO_LARGE),
        ({"code": 10, "opaque": 6, "topic": "%SYS%CONFIG", "messages": [{"body": b"x"}]}, ResponseCode.NO_PERMISSION),
        ({"code": 11, "opaque": 7, "topic": "t", "queue_id": -1, "offset": 0}, ResponseCode.BAD_REQUEST),
        ({"code": 11, "opaque": 8, "topic": "t", "queue_id": 0, "offset": "0"}, ResponseCode.BAD_REQUEST),
        ({"code": 14, "opaque": 9, "message_id": "nothex"}, ResponseCode.MESSAGE_NOT_FOUND),
        ({"code": 10, "opaque": 10, "topic": "t", "messages": [{"body": b"x", "queue_id": 99}]},
         ResponseCode.QUEUE_ILLEGAL),
        ({"code": 16, "opaque": 11, "group": "g", "topic": "t", "offsets": {"0": 1}}, ResponseCode.BAD_REQUEST),
        ([1, 2, 3], ResponseCode.BAD_REQUEST),
        ({"code": 20}, ResponseCode.BAD_REQUEST),
    ]
    async with trio.open_nursery() as nursery:
        stream = memory_node.raw(nursery)
        data = b"".join(protocol.encode_frame(request) for request, _ in cases)
        data += protocol.encode_frame({"code": 20, "opaque": 99})
        await stream.send_all(data)
        decoder = FrameDecoder()
        replies = []
        while len(replies) < len(cases) + 1:
            replies.extend(decoder.feed(await stream.receive_some(65536)))
        by_opaque = {r["opaque"]: r for r in replies}
        for request, code in cases:
            opaque = request.get("opaque") if isinstance(request, dict) else None
            reply = by_opaque[opaque] if opaque is not None else [r for r in replies if r["opaque"] is None][0]
            assert reply["code"] == code, (request, reply)
            assert reply["error"]
        assert by_opaque[99]["code"] == ResponseCode.SUCCESS
        nursery.cancel_scope.cancel()
