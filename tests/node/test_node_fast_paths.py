"""The latency fast paths: replies written by the reader when the stream is idle (and queued
for the writer task when it is not), long polls interleaved with inline replies on one
connection, and the Producer sending from the caller's task when nothing else is pending,
while concurrent sends still gather into batches and unknown outcomes stay unknown."""

import re
from functools import partial

import pytest
import trio
import trio.testing

from node.client import OutgoingMessage, open_producer
from node.errors import RequestError, UnknownOutcomeError
from node.wire.protocol import FrameDecoder, RequestCode
from node.server.connections import ReplyWriter

from node_helpers import wait_until


class GatedStream(trio.abc.SendStream):
    """A send stream whose first write waits for ``gate``: a write under way, on demand."""

    def __init__(self) -> None:
        self.gate = trio.Event()
        self.started: list[bytes] = []
        self.written: list[bytes] = []

    async def send_all(self, data) -> None:
        self.started.append(bytes(data))
        if len(self.started) == 1:
            await self.gate.wait()
        else:
            await trio.lowlevel.checkpoint()
        self.written.append(bytes(data))

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


@pytest.mark.trio
async def test_an_idle_stream_is_written_by_the_caller_itself():
    stream = GatedStream()
    stream.gate.set()
    writer = ReplyWriter(stream, 4)
    await writer.write(b"reply")      # no writer task runs: the caller wrote it
    assert stream.written == [b"reply"]


@pytest.mark.trio
async def test_replies_queue_behind_a_write_under_way_and_the_writer_task_sends_them():
    stream = GatedStream()
    writer = ReplyWriter(stream, 4)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer.run, nursery.cancel_scope)
        nursery.start_soon(writer.write, b"first")
        await trio.testing.wait_all_tasks_blocked()
        assert stream.started == [b"first"] and stream.written == []
        await writer.write(b"second")  # returns at once: queued, not written
        await writer.write_last(b"last")
        assert stream.written == []
        stream.gate.set()
        await trio.testing.wait_all_tasks_blocked()
        assert b"".join(stream.written) == b"firstsecondlast"
        writer.close()  # the writer task ends once its queue is written


@pytest.mark.trio
async def test_inline_replies_interleave_with_a_long_poll_on_one_connection(memory_node):
    memory_node.wire_dispatcher()
    async with trio.open_nursery() as nursery:
        connection = await memory_node.connect(nursery)
        await connection.request(RequestCode.TOPIC_CREATE, topic="polled", queue_count=1)
        await connection.request(RequestCode.TOPIC_CREATE, topic="other", queue_count=1)
        polls = []

        async def park():
            polls.append(await connection.request(RequestCode.PULL, topic="polled", queue_id=0, offset=0,
                                                  timeout_ms=20_000))
        nursery.start_soon(park)
        await wait_until(lambda: memory_node.handlers.waiters.waiting == 1, "the pull to park")
        # pipelined requests on the same connection are answered while the poll waits
        pendings = [await connection.submit(RequestCode.SEND, topic="other", messages=[{"body": b"%d" % i}])
                    for i in range(20)]
        pendings.append(await connection.submit(RequestCode.STATUS))
        with trio.fail_after(5):
            replies = [await pending.wait() for pending in pendings]
        assert [r["results"][0]["queue_offset"] for r in replies[:20]] == list(range(20))
        assert replies[20]["long_polls_waiting"] == 1 and polls == []
        await connection.request(RequestCode.SEND, topic="polled", messages=[{"body": b"wake"}])
        await wait_until(lambda: polls, "the dispatcher thread to wake the long poll")
        assert [m["body"] for m in polls[0]["messages"]] == [b"wake"]
        nursery.cancel_scope.cancel()


@pytest.mark.trio
async def test_a_sequential_producer_sends_each_message_at_once(node):
    async with open_producer(node.client_address, linger_ms=1_000) as producer:
        with trio.fail_after(10):  # a linger of 1 s on each of 5 sends would miss this
            results = [await producer.send("alone", b"%d" % i, queue_id=0) for i in range(5)]
            batch = await producer.send_batch("alone", [OutgoingMessage(b"b%d" % i, queue_id=0) for i in range(3)])
        stats = producer.statistics()
    assert [r.queue_offset for r in results + batch] == list(range(8))
    assert stats.batches == 6 and stats.sent_at_once == 6 and stats.sent_messages == 8


@pytest.mark.trio
async def test_concurrent_sends_to_a_busy_topic_still_gather_into_batches(node):
    async with open_producer(node.client_address, batch_count_max=49, linger_ms=60_000) as producer:
        results = []

        async def one(i: int) -> None:
            results.append(await producer.send("busy", b"%d" % i, queue_id=0))
        with trio.fail_after(10):  # the count closes the batch, never the minute of linger
            async with trio.open_nursery() as nursery:
                for i in range(50):
                    nursery.start_soon(one, i)
        stats = producer.statistics()
    # the first goes at once; the 49 that find its request in flight fill one batch
    assert len(results) == 50 and all(r.ok for r in results)
    assert stats.batches == 2 and stats.sent_at_once == 1
    assert sorted(r.queue_offset for r in results) == list(range(50))


async def _swallow(stream, received: list, *, close: bool) -> None:
    """A fake node: reads one request and never answers it; then closes the connection, or
    holds it open until cancelled."""
    decoder = FrameDecoder()
    frames: list = []
    while not frames:
        data = await stream.receive_some(65536)
        if not data:
            return
        frames = decoder.feed(data)
    received.extend(frames)
    if not close:
        await trio.sleep_forever()
    await stream.aclose()


async def _fake_node(nursery: trio.Nursery, received: list, *, close: bool) -> str:
    listeners = await nursery.start(partial(trio.serve_tcp, lambda s: _swallow(s, received, close=close), 0,
                                             host="127.0.0.1"))
    return "127.0.0.1:%d" % listeners[0].socket.getsockname()[1]


@pytest.mark.trio
@pytest.mark.parametrize("how", ["send", "send_batch"])
async def test_a_request_that_left_without_a_reply_is_an_unknown_outcome_never_retried(how):
    received: list = []
    async with trio.open_nursery() as nursery:
        address = await _fake_node(nursery, received, close=True)
        async with open_producer(address, retries_max=3, retry_backoff_ms=1) as producer:
            with pytest.raises(UnknownOutcomeError) as caught:
                if how == "send":
                    await producer.send("lost", b"maybe")
                else:
                    await producer.send_batch("lost", [OutgoingMessage(b"maybe"), OutgoingMessage(b"maybe too")])
            stats = producer.statistics()
        nursery.cancel_scope.cancel()
    # plain messages travel as columns, their UNIQ_KEYs a column of their own (send_fields)
    sent_keys = received[0]["message_columns"]["uniq_key"]
    assert caught.value.uniq_keys == sent_keys and sent_keys[0] in str(caught.value)
    assert len(received) == 1 and stats.retries == 0
    assert stats.unknown_messages == len(sent_keys) and stats.sent_messages == stats.failed_messages == 0


@pytest.mark.trio
async def test_a_caller_cancelled_while_waiting_leaves_its_send_unknown():
    received: list = []
    async with trio.open_nursery() as nursery:
        address = await _fake_node(nursery, received, close=False)
        async with open_producer(address, request_timeout_ms=60_000) as producer:
            with trio.move_on_after(0.5) as waited:
                await producer.send("t", b"sent, then the caller gave up")
            stats = producer.statistics()
            connection = producer._connection
            assert waited.cancelled_caught and len(received) == 1
            assert stats.unknown_messages == 1 and stats.sent_messages == stats.failed_messages == 0
            assert connection is not None and connection._pending == {}  # its reply is no longer awaited
        nursery.cancel_scope.cancel()


@pytest.mark.trio
async def test_a_batch_answered_in_columns_matches_the_per_message_answer(memory_node):
    async with trio.open_nursery() as nursery:
        connection = await memory_node.connect(nursery)
        await connection.request(RequestCode.TOPIC_CREATE, topic="cols", queue_count=3)
        plain = [{"body": b"a%d" % i, "properties": {"UNIQ_KEY": "U%d" % i}} for i in range(4)]
        maps = (await connection.request(RequestCode.SEND, topic="cols", messages=plain))["results"]
        columns = (await connection.request(RequestCode.SEND, topic="cols", messages=plain,
                                            result_columns=True))["result_columns"]
        assert [m["queue_id"] for m in maps] == [0, 1, 2, 0]      # round robin, per batch ...
        assert columns["queue_id"] == [1, 2, 0, 1]                # ... carried on to the next
        assert columns["status"] == ["PUT_OK"] * 4 and columns["reason"] == [""] * 4
        assert len(set(columns["message_id"])) == 4
        assert [m["queue_offset"] for m in maps] + columns["queue_offset"] == [0, 0, 0, 1, 1, 1, 2, 2]
        # a batch with one message the fast path does not take: every message is checked
        # one by one, the refused one is named, the others are written
        mixed = plain[:2] + [{"body": b"k", "keys": ["two words"]}] + [{"body": b"q", "queue_id": 2}]
        columns = (await connection.request(RequestCode.SEND, topic="cols", messages=mixed,
                                            result_columns=True))["result_columns"]
        assert columns["status"] == ["PUT_OK", "PUT_OK", "MESSAGE_ILLEGAL", "PUT_OK"]
        assert columns["queue_id"] == [2, 0, 1, 2] and "two words" in columns["reason"][2]
        assert columns["reason"][:2] == ["", ""] and columns["queue_offset"][2] == -1
        nursery.cancel_scope.cancel()


@pytest.mark.trio
async def test_the_producer_reads_column_replies_and_counts_refusals(node):
    async with open_producer(node.client_address) as producer:
        results = await producer.send_batch("prod-cols", [OutgoingMessage(b"x", queue_id=0),
                                                         OutgoingMessage(b"y", properties={"bad\x01": "v"}),
                                                         OutgoingMessage(b"z", queue_id=0)])
        stats = producer.statistics()
    assert [r.status for r in results] == ["PUT_OK", "MESSAGE_ILLEGAL", "PUT_OK"]
    assert [r.queue_offset for r in results] == [0, -1, 1] and results[1].reason
    assert stats.sent_messages == 2 and stats.failed_messages == 1


@pytest.mark.trio
async def test_requests_and_replies_written_straight_to_the_socket_arrive_whole(node):
    # frames from a few hundred bytes to 8 MiB: the socket takes the small ones at once and
    # the rest goes through send_all, on both ends, with pipelined requests in between
    from node.client import open_connection
    async with open_connection(node.client_address) as connection:
        sizes = [10, 1000, 200_000, 3_000_000, 50]
        pendings = [await connection.submit(RequestCode.SEND, topic="big", messages=[{"body": b"s" * size}])
                    for size in sizes]
        replies = [await pending.wait() for pending in pendings]
        assert [r["results"][0]["status"] for r in replies] == ["PUT_OK"] * len(sizes)
        offsets = [r["results"][0]["queue_offset"] for r in replies]
        pulled = await connection.request(RequestCode.PULL, topic="big", queue_id=replies[3]["results"][0]["queue_id"],
                                          offset=offsets[3], max_count=1, timeout_ms=5_000)  # until dispatched
        assert pulled["messages"][0]["body"] == b"s" * 3_000_000


@pytest.mark.trio
async def test_late_replies_time_out_exactly_per_timeout_and_answered_ones_never(autojump_clock):
    # a fake node that answers only odd opaques, and those only after 3 s
    from node.client import connect_stream
    from node.errors import ConnectionLostError, RequestTimeoutError
    from node.wire.protocol import encode_frame
    client_end, server_end = trio.testing.memory_stream_pair()

    async def fake_node():
        decoder = FrameDecoder()
        async with trio.open_nursery() as nursery:
            while data := await server_end.receive_some(65536):
                for frame in decoder.feed(data):
                    if frame["opaque"] % 2:
                        async def answer(opaque=frame["opaque"]):
                            await trio.sleep(3)
                            await server_end.send_all(encode_frame({"code": 0, "opaque": opaque, "flags": 1}))
                        nursery.start_soon(answer)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(fake_node)
        connection = await connect_stream(client_end, "fake", nursery)
        outcomes = {}

        async def one(name: str, timeout_ms: int | None) -> None:
            pending = await connection.submit(RequestCode.STATUS)
            started = trio.current_time()
            try:
                await pending.wait(timeout_ms)
                outcomes[name] = ("ok", trio.current_time() - started)
            except RequestTimeoutError:
                outcomes[name] = ("timeout", trio.current_time() - started)
            except ConnectionLostError:
                outcomes[name] = ("lost", trio.current_time() - started)
            connection.forget(pending)
        async with trio.open_nursery() as requests:
            for name, timeout_ms in (("a", 10_000), ("b", 10_000), ("c", 2_000), ("d", 5_000), ("e", 1_000),
                                     ("f", None)):
                requests.start_soon(one, name, timeout_ms)
                await trio.sleep(0.1)
            await trio.sleep(20)
            # f (opaque 6) has no timeout and no answer: it waits until the connection closes
            assert "f" not in outcomes
            await connection.aclose()
        # opaques 1, 3, 5 (a, c, e) are answered after 3 s; 2 and 4 (b, d) never
        assert outcomes["a"] == ("ok", pytest.approx(3, abs=0.01))
        assert outcomes["b"] == ("timeout", pytest.approx(10, abs=0.01))
        assert outcomes["c"] == ("timeout", pytest.approx(2, abs=0.01))   # its answer came too late
        assert outcomes["d"] == ("timeout", pytest.approx(5, abs=0.01))
        assert outcomes["e"] == ("timeout", pytest.approx(1, abs=0.01))
        assert outcomes["f"][0] == "lost"
        nursery.cancel_scope.cancel()


@pytest.mark.trio
@pytest.mark.parametrize("odd_one, error", [
    ({"body": b"x", "properties": {"n": 5}}, "messages[2].properties"),
    ({"body": b"x", "properties": {7: "v"}}, "messages[2].properties"),
    ({"body": b"x", "properties": ["n", "v"]}, "messages[2].properties"),
    ({"body": "not bytes"}, "messages[2].body"),
    ({"body": b"x", "properties": {f"p{i}": "v" for i in range(257)}}, "messages[2].properties"),
])
async def test_a_batch_the_column_check_turns_down_is_checked_message_by_message(memory_node, odd_one, error):
    async with trio.open_nursery() as nursery:
        connection = await memory_node.connect(nursery)
        await connection.request(RequestCode.TOPIC_CREATE, topic="odd", queue_count=2)
        batch = [{"body": b"a"}, {"body": b"b", "properties": None}, odd_one, {"body": b"c", "properties": {}}]
        with pytest.raises(RequestError, match=rf"BAD_REQUEST: field {re.escape(error)}"):
            await connection.request(RequestCode.SEND, topic="odd", messages=batch)
        fine = await connection.request(RequestCode.SEND, topic="odd", messages=[batch[0], batch[1], batch[3]])
        assert [result["status"] for result in fine["results"]] == ["PUT_OK"] * 3
        nursery.cancel_scope.cancel()
