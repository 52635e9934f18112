"""The client Connection's reading role: a caller alone on the connection reads its own
reply (leader); replies for others go to their waiters; the role goes to the background
task when the leader leaves with requests still waiting. Pipelining, cancellation,
deadlines and connection loss, over in-memory streams and over real sockets."""

import socket
import threading
import time
from contextlib import asynccontextmanager, contextmanager
from functools import partial

import pytest
import trio
import trio.testing

from node.client import connect_stream, open_producer
from node.errors import ConnectionLostError, RequestError, RequestTimeoutError
from node.wire.protocol import FrameDecoder, RequestCode, encode_frame


class FakeNode:
    """The node's end of a connection: records requests; the test answers them."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.requests: list[dict] = []
        self._decoder = FrameDecoder()
        self._may_read = trio.Event()
        self._may_read.set()
        self._arrived = trio.lowlevel.ParkingLot()

    def pause_reading(self) -> None:
        self._may_read = trio.Event()

    def resume_reading(self) -> None:
        self._may_read.set()

    async def serve(self) -> None:
        while True:
            await self._may_read.wait()
            try:
                data = await self.stream.receive_some(1 << 20)
            except trio.ClosedResourceError:  # the test closed the node's end
                return
            if not data:
                return
            self.requests.extend(self._decoder.feed(data))
            self._arrived.unpark_all()

    async def wait_requests(self, count: int) -> None:
        """Until ``count`` requests have arrived."""
        while len(self.requests) < count:
            await self._arrived.park()

    async def answer(self, request: dict, code: int = 0, **fields) -> None:
        await self.stream.send_all(encode_frame({"code": code, "opaque": request["opaque"], "flags": 1,
                                                 **fields}))

    def request(self, tag: str) -> dict:
        (found,) = [r for r in self.requests if r.get("tag") == tag]
        return found


def _stream_pair(transport: str):
    if transport == "memory":
        return trio.testing.memory_stream_pair()
    a, b = socket.socketpair()
    return (trio.SocketStream(trio.socket.from_stdlib_socket(a)),
            trio.SocketStream(trio.socket.from_stdlib_socket(b)))


async def _open(nursery: trio.Nursery, transport: str):
    client_end, node_end = _stream_pair(transport)
    node = FakeNode(node_end)
    nursery.start_soon(node.serve)
    connection = await connect_stream(client_end, "fake", nursery)
    return connection, node


transports = pytest.mark.parametrize("transport", ["memory", "socket"])


@pytest.mark.trio
@transports
async def test_a_caller_alone_reads_its_own_reply(transport):
    async with trio.open_nursery() as nursery:
        connection, node = await _open(nursery, transport)

        async def answer_each():
            for i in range(5):
                await node.wait_requests(i + 1)
                await node.answer(node.requests[i], echo=node.requests[i]["tag"])
        nursery.start_soon(answer_each)
        replies = [await connection.request(RequestCode.STATUS, tag=f"r{i}") for i in range(5)]
        assert [r["echo"] for r in replies] == [f"r{i}" for i in range(5)]
        stats = connection.statistics()
        assert stats.requests_submitted == 5 and stats.reads_by_callers >= 5
        assert stats.reads_in_background == 0 and stats.handovers == 0
        nursery.cancel_scope.cancel()


@pytest.mark.trio
@transports
async def test_pipelined_replies_in_any_order_reach_their_own_callers(transport):
    async with trio.open_nursery() as nursery:
        connection, node = await _open(nursery, transport)
        got: dict[str, str] = {}

        async def one(tag: str):
            got[tag] = (await connection.request(RequestCode.STATUS, tag=tag))["echo"]
        with trio.fail_after(5):
            async with trio.open_nursery() as callers:
                for i in range(30):
                    callers.start_soon(one, f"t{i}")
                await trio.testing.wait_all_tasks_blocked()
                assert len(node.requests) == 30
                # answered out of order, in three bursts: the first caller leads, reads the
                # first burst (its own reply last in it) and hands the others out; the
                # rest is read by the background task once the leader left
                order = list(reversed(node.requests[1:]))
                for burst in (order[:9] + [node.requests[0]], order[9:19], order[19:]):
                    for request in burst:
                        await node.answer(request, echo=request["tag"])
                    await trio.testing.wait_all_tasks_blocked()
        assert got == {f"t{i}": f"t{i}" for i in range(30)}
        stats = connection.statistics()
        assert stats.reads_by_callers >= 1 and stats.handovers == 1 and stats.reads_in_background >= 1
        # the background task gave the role up once nothing waited: the next caller leads
        before = connection.statistics()
        nursery.start_soon(node_answers_next, node, 30)
        assert (await connection.request(RequestCode.STATUS, tag="after"))["echo"] == "after"
        after = connection.statistics()
        assert after.reads_in_background == before.reads_in_background
        assert after.reads_by_callers > before.reads_by_callers
        nursery.cancel_scope.cancel()


async def node_answers_next(node: FakeNode, index: int) -> None:
    await node.wait_requests(index + 1)
    await node.answer(node.requests[index], echo=node.requests[index]["tag"])


@pytest.mark.trio
@transports
async def test_a_cancelled_leader_hands_reading_over_and_loses_no_reply(transport):
    async with trio.open_nursery() as nursery:
        connection, node = await _open(nursery, transport)
        got = {}

        async def one(tag: str):
            got[tag] = (await connection.request(RequestCode.STATUS, tag=tag))["echo"]
        leader_scope = trio.CancelScope()

        async def leader():
            with leader_scope:
                await connection.request(RequestCode.STATUS, tag="leader")
        nursery.start_soon(leader)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(one, "f1")
        nursery.start_soon(one, "f2")
        await trio.testing.wait_all_tasks_blocked()
        assert connection.statistics().handovers == 0
        leader_scope.cancel()
        await trio.testing.wait_all_tasks_blocked()
        assert connection.statistics().handovers == 1
        # the leader's reply comes anyway and goes nowhere; the others reach their callers
        for tag in ("leader", "f2", "f1"):
            await node.answer(node.request(tag), echo=tag)
        await trio.testing.wait_all_tasks_blocked()
        assert got == {"f1": "f1", "f2": "f2"} and connection._pending == {}
        nursery.cancel_scope.cancel()


@pytest.mark.trio
@transports
async def test_a_cancelled_follower_gets_nothing_and_misroutes_nothing(transport):
    async with trio.open_nursery() as nursery:
        connection, node = await _open(nursery, transport)
        got = {}

        async def one(tag: str, scope: trio.CancelScope | None = None):
            with scope or trio.CancelScope():
                got[tag] = (await connection.request(RequestCode.STATUS, tag=tag))["echo"]
        follower_scope = trio.CancelScope()
        nursery.start_soon(one, "leader")
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(one, "follower", follower_scope)
        nursery.start_soon(one, "other")
        await trio.testing.wait_all_tasks_blocked()
        follower_scope.cancel()
        await trio.testing.wait_all_tasks_blocked()
        for tag in ("follower", "other", "leader"):
            await node.answer(node.request(tag), echo=tag)
        await trio.testing.wait_all_tasks_blocked()
        assert got == {"leader": "leader", "other": "other"} and connection._pending == {}
        nursery.cancel_scope.cancel()


@pytest.mark.trio
@transports
async def test_a_leader_times_out_exactly_and_the_connection_still_serves(transport, autojump_clock):
    async with trio.open_nursery() as nursery:
        connection, node = await _open(nursery, transport)
        started = trio.current_time()
        with pytest.raises(RequestTimeoutError), trio.fail_after(60):
            await connection.request(RequestCode.STATUS, reply_timeout_ms=1_500, tag="late")
        assert trio.current_time() - started == pytest.approx(1.5, abs=1e-6)
        assert not connection.closed
        # the late reply is dropped; the next request is answered as usual
        await node.answer(node.request("late"), echo="late")
        nursery.start_soon(node_answers_next, node, 1)
        assert (await connection.request(RequestCode.STATUS, tag="next"))["echo"] == "next"
        nursery.cancel_scope.cancel()


@pytest.mark.trio
@transports
async def test_a_leader_and_its_followers_time_out_each_at_its_own_deadline(transport, autojump_clock):
    async with trio.open_nursery() as nursery:
        connection, node = await _open(nursery, transport)
        outcomes = {}

        async def one(tag: str, timeout_ms: int):
            started = trio.current_time()
            try:
                await connection.request(RequestCode.STATUS, reply_timeout_ms=timeout_ms, tag=tag)
                outcomes[tag] = ("ok", trio.current_time() - started)
            except RequestTimeoutError:
                outcomes[tag] = ("timeout", trio.current_time() - started)
        with trio.fail_after(60):
            async with trio.open_nursery() as callers:
                callers.start_soon(one, "leader", 1_000)
                await trio.testing.wait_all_tasks_blocked()
                callers.start_soon(one, "slow", 5_000)
                callers.start_soon(one, "quick", 500)
                await trio.sleep(2)
                await node.answer(node.request("slow"))
        assert outcomes == {"leader": ("timeout", pytest.approx(1.0, abs=1e-6)),
                            "quick": ("timeout", pytest.approx(0.5, abs=1e-6)),
                            "slow": ("ok", pytest.approx(2.0, abs=1e-6))}
        nursery.cancel_scope.cancel()


@pytest.mark.trio
@transports
async def test_connection_loss_fails_the_leader_and_every_follower(transport):
    async with trio.open_nursery() as nursery:
        connection, node = await _open(nursery, transport)
        errors = {}

        async def one(tag: str):
            try:
                await connection.request(RequestCode.STATUS, tag=tag)
            except ConnectionLostError as error:
                errors[tag] = error
        with trio.fail_after(5):
            async with trio.open_nursery() as callers:
                for tag in ("leader", "f1", "f2"):
                    callers.start_soon(one, tag)
                    await trio.testing.wait_all_tasks_blocked()
                await node.stream.aclose()
        assert set(errors) == {"leader", "f1", "f2"} and connection.closed
        with pytest.raises(ConnectionLostError):
            await connection.submit(RequestCode.STATUS)
        nursery.cancel_scope.cancel()


@pytest.mark.trio
@transports
async def test_closing_the_connection_fails_a_waiting_leader(transport):
    async with trio.open_nursery() as nursery:
        connection, node = await _open(nursery, transport)
        errors = []

        async def leader():
            try:
                await connection.request(RequestCode.STATUS, tag="leader")
            except ConnectionLostError as error:
                errors.append(error)
        nursery.start_soon(leader)
        await trio.testing.wait_all_tasks_blocked()
        await connection.aclose()
        await trio.testing.wait_all_tasks_blocked()
        assert len(errors) == 1 and "closed by the client" in str(errors[0])
        nursery.cancel_scope.cancel()


@pytest.mark.trio
async def test_a_connection_the_node_closed_while_idle_sends_nothing_more():
    # nobody reads while no request waits: the next request looks first and is refused
    # before it is written, so its outcome is known (not sent) rather than unknown
    async with trio.open_nursery() as nursery:
        connection, node = await _open(nursery, "socket")
        nursery.start_soon(node_answers_next, node, 0)
        await connection.request(RequestCode.STATUS, tag="first")
        await node.stream.aclose()
        with pytest.raises(ConnectionLostError, match="closed"):
            await connection.submit(RequestCode.STATUS, tag="second")
        assert [r["tag"] for r in node.requests] == ["first"] and connection.closed
        nursery.cancel_scope.cancel()


@pytest.mark.trio
async def test_a_leader_woken_while_a_large_frame_waits_to_be_written_does_not_break_the_write(autojump_clock):
    # The leader's deadline passes while another request's frame is still being written
    # (the node reads nothing): waking the leader must not fail the write.
    async with trio.open_nursery() as nursery:
        connection, node = await _open(nursery, "socket")
        node.pause_reading()
        outcome = {}

        async def leader():
            try:
                await connection.request(RequestCode.STATUS, reply_timeout_ms=1_000, tag="leader")
            except RequestTimeoutError:
                outcome["leader"] = trio.current_time()

        async def big():
            pending = await connection.submit(RequestCode.STATUS, tag="big", padding=b"p" * 8_000_000)
            outcome["big"] = (await pending.wait())["echo"]
        start = trio.current_time()
        nursery.start_soon(leader)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(big)
        await trio.sleep(2)
        assert outcome == {"leader": pytest.approx(start + 1.0, abs=1e-6)} and not connection.closed
        node.resume_reading()
        await node.wait_requests(2)   # the leader's, then the big one, whole
        await node.answer(node.request("big"), echo="big")
        await trio.testing.wait_all_tasks_blocked()
        assert outcome["big"] == "big" and not connection.closed
        nursery.cancel_scope.cancel()


@pytest.mark.trio
@transports
async def test_an_error_reply_to_a_leader_is_its_typed_error(transport):
    async with trio.open_nursery() as nursery:
        connection, node = await _open(nursery, transport)

        async def refuse():
            await node.wait_requests(1)
            await node.answer(node.requests[0], code=9, error="no such topic")
        nursery.start_soon(refuse)
        with pytest.raises(RequestError, match="TOPIC_NOT_EXIST"):
            await connection.request(RequestCode.STATUS, tag="x")
        assert not connection.closed
        nursery.cancel_scope.cancel()


@pytest.mark.trio
@transports
async def test_large_frames_from_many_tasks_arrive_whole_and_in_order_of_their_writes(transport):
    # frames the socket cannot take at once wait for each other (the send lock); small
    # ones written in between never land inside a large one
    async with trio.open_nursery() as nursery:
        connection, node = await _open(nursery, transport)
        sizes = [3_000_000, 10, 2_000_000, 100, 1_500_000, 5]

        async def one(i: int, size: int):
            pending = await connection.submit(RequestCode.STATUS, tag=f"s{i}", padding=b"%d" % i * size)
            await pending.wait()
        with trio.fail_after(20):
            async with trio.open_nursery() as senders:
                for i, size in enumerate(sizes):
                    senders.start_soon(one, i, size)
                await node.wait_requests(len(sizes))
                for request in node.requests:
                    await node.answer(request)
        assert sorted(r["tag"] for r in node.requests) == [f"s{i}" for i in range(len(sizes))]
        for request in node.requests:
            i = int(request["tag"][1:])
            assert request["padding"] == b"%d" % i * sizes[i]
        nursery.cancel_scope.cancel()


@pytest.mark.trio
async def test_a_producer_retries_a_send_on_a_connection_the_node_closed_while_idle():
    # the node answers one request per connection, then closes it: each next send finds
    # the close before writing, so it is retried on a new connection, never unknown
    from functools import partial

    from node.client import open_producer
    connections = []

    async def one_answer_then_close(stream):
        connections.append(stream)
        node = FakeNode(stream)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(node.serve)
            await node.wait_requests(1)
            count = len(node.requests[0]["message_columns"]["body"])
            columns = {"status": ["PUT_OK"] * count, "queue_id": [0] * count, "queue_offset": [len(connections)] * count,
                       "physical_offset": [0] * count, "message_id": ["M"] * count, "reason": [""] * count}
            await node.answer(node.requests[0], result_columns=columns)
            await stream.aclose()
            nursery.cancel_scope.cancel()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, one_answer_then_close, 0, host="127.0.0.1"))
        address = "127.0.0.1:%d" % listeners[0].socket.getsockname()[1]
        with trio.fail_after(20):
            async with open_producer(address, retry_backoff_ms=1) as producer:
                results = []
                for i in range(3):
                    results.append(await producer.send("t", b"%d" % i))
                    await trio.testing.wait_all_tasks_blocked()   # the node has closed; nobody reads
                stats = producer.statistics()
        assert [r.queue_offset for r in results] == [1, 2, 3] and len(connections) == 3
        assert stats.unknown_messages == 0 and stats.sent_messages == 3 and stats.retries == 2
        nursery.cancel_scope.cancel()


@pytest.mark.trio
async def test_a_request_queued_behind_a_write_when_authentication_fails_is_a_refusal_not_an_unknown():
    # A request waiting for the send lock while the node's auth challenge is read (a client
    # with no secret) went out afterwards on the failed connection, and the node's close
    # then made its outcome unknown. Nothing is read before authentication: it is refused.
    async with trio.open_nursery() as nursery:
        connection, node = await _open(nursery, "socket")
        node.pause_reading()
        outcome = {}

        async def call(tag: str, **fields) -> None:
            try:
                await connection.request(RequestCode.STATUS, tag=tag, **fields)
            except Exception as error:     # noqa: BLE001 - the test records each caller's error
                outcome[tag] = type(error).__name__
        nursery.start_soon(call, "leader")
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(partial(call, "big", padding=b"p" * 8_000_000))   # holds the send lock
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(call, "queued")                                       # waits for the lock
        await trio.testing.wait_all_tasks_blocked()
        await node.stream.send_all(encode_frame({"code": int(RequestCode.AUTH_CHALLENGE), "opaque": 0,
                                                 "nonce": b"n" * 16}))
        await trio.testing.wait_all_tasks_blocked()
        node.resume_reading()                    # the big frame goes out whole; the lock is free
        await trio.testing.wait_all_tasks_blocked()
        await node.stream.aclose()               # the node closes, as it does after a failed auth
        with trio.fail_after(5):
            while len(outcome) < 3:
                await trio.sleep(0.01)
        assert outcome == {"leader": "AuthError", "big": "AuthError", "queued": "AuthError"}
        assert [r["tag"] for r in node.requests][:2] == ["leader", "big"]
        nursery.cancel_scope.cancel()


def _thread_node(sock: socket.socket, count: int, delay_s: float = 0.0) -> None:
    """A node on a thread of its own: answers ``count`` requests, echoing each one's tag,
    each ``delay_s`` after it came."""
    decoder = FrameDecoder()
    answered = 0
    while answered < count:
        data = sock.recv(1 << 20)
        if not data:
            return
        for request in decoder.feed(data):
            reply = {"code": 0, "opaque": request["opaque"], "flags": 1, "echo": request.get("tag")}
            if "message_columns" in request:   # a producer's send: every message PUT_OK
                n = len(request["message_columns"]["body"])
                reply["result_columns"] = {"status": ["PUT_OK"] * n, "queue_id": [0] * n,
                                           "queue_offset": [answered] * n, "physical_offset": [0] * n,
                                           "message_id": ["M"] * n, "reason": [""] * n}
            if delay_s:
                time.sleep(delay_s)
            sock.sendall(encode_frame(reply))
            answered += 1


@asynccontextmanager
async def _connected_to_a_thread_node(requests: int):
    """A Connection (in a nursery of its own) to ``_thread_node`` answering ``requests``."""
    ours, theirs = socket.socketpair()
    node = threading.Thread(target=_thread_node, args=(theirs, requests), daemon=True)
    node.start()
    try:
        async with trio.open_nursery() as nursery:
            yield await connect_stream(trio.SocketStream(trio.socket.from_stdlib_socket(ours)), "thread", nursery)
            nursery.cancel_scope.cancel()
        node.join(10)
    finally:
        theirs.close()


@contextmanager
def _thread_node_listening(requests: int, delay_s: float = 0.0):
    """The address of a ``_thread_node`` answering ``requests`` on its first connection."""
    listener = socket.create_server(("127.0.0.1", 0))

    def accept_then_serve():
        sock, _ = listener.accept()
        with sock:
            _thread_node(sock, requests, delay_s)
    node = threading.Thread(target=accept_then_serve, daemon=True)
    node.start()
    try:
        yield "127.0.0.1:%d" % listener.getsockname()[1]
    finally:
        listener.close()
        node.join(10)


@pytest.mark.trio
async def test_a_caller_alone_waits_for_its_reply_in_place_when_the_loop_has_nothing_else_to_do():
    # the reply comes from another thread: nothing in this loop needs it meanwhile, so the
    # leader waits in poll(2) instead of a pass of trio's loop
    async with _connected_to_a_thread_node(5) as connection:
        replies = [await connection.request(RequestCode.STATUS, tag=f"r{i}") for i in range(5)]
        assert [r["echo"] for r in replies] == [f"r{i}" for i in range(5)]
        assert connection.statistics().waits_in_place >= 1


@pytest.mark.trio
@pytest.mark.parametrize("busy_poll_us", [0, 1_000])
async def test_a_producer_sending_one_at_a_time_busy_polls_for_its_replies_unless_told_not_to(busy_poll_us):
    # the node (a thread) answers at once: with a window, replies come while the caller
    # polls; without, the caller still waits in place, asleep in poll(2)
    sends = 50
    with _thread_node_listening(sends) as address:
        async with open_producer(address, batch_count_max=1, linger_ms=0, busy_poll_us=busy_poll_us) as producer:
            results = [await producer.send("t", b"m%d" % i) for i in range(sends)]
            statistics = producer._connection.statistics()
    assert [r.queue_offset for r in results] == list(range(sends))
    assert statistics.waits_in_place >= sends - 2    # the first sends are not yet "alone in a row"
    assert (statistics.busy_polled > 0) == (busy_poll_us > 0)


@pytest.mark.trio
async def test_a_producer_sending_now_and_then_does_not_poll_for_its_replies():
    # 5 ms between sends: past ReplyPoll's gap (1 ms) each wait sleeps at once
    sends = 12
    with _thread_node_listening(sends) as address:
        async with open_producer(address, batch_count_max=1, linger_ms=0, busy_poll_us=200) as producer:
            for i in range(sends):
                await producer.send("t", b"m%d" % i)
                await trio.sleep(0.005)
            statistics = producer._connection.statistics()
    assert statistics.waits_in_place >= sends - 2
    assert statistics.busy_polled == 0


@pytest.mark.trio
async def test_a_producer_whose_replies_come_after_its_poll_window_stops_polling_for_a_while():
    # each reply 0.5 ms after its request, the window 100 µs: every poll misses, so after
    # ReplyPoll's misses_max (8) in a row the next 128 waits sleep at once
    sends = 40
    with _thread_node_listening(sends, delay_s=0.0005) as address:
        async with open_producer(address, batch_count_max=1, linger_ms=0, busy_poll_us=100) as producer:
            results = [await producer.send("t", b"m%d" % i) for i in range(sends)]
            statistics = producer._connection.statistics()
    assert [r.queue_offset for r in results] == list(range(sends))
    assert statistics.busy_polled == 0
    assert statistics.busy_poll_rests == 1


@pytest.mark.trio
@pytest.mark.parametrize("busy_poll_us", [-1, 1_001])
async def test_a_busy_poll_window_outside_its_bounds_is_refused(busy_poll_us):
    with pytest.raises(ValueError, match="busy_poll_us must be in"):
        async with open_producer("127.0.0.1:1", busy_poll_us=busy_poll_us):
            pass


@pytest.mark.trio
async def test_a_leader_does_not_wait_in_place_while_another_task_needs_the_loop():
    # the node is a task of this loop: its read makes the loop's descriptor ready, and the
    # leader's wait then goes through trio, or the node would never answer
    async with trio.open_nursery() as nursery:
        connection, node = await _open(nursery, "socket")

        async def answer_each():
            for i in range(3):
                await node.wait_requests(i + 1)
                await node.answer(node.requests[i], echo=node.requests[i]["tag"])
        nursery.start_soon(answer_each)
        with trio.fail_after(10):
            replies = [await connection.request(RequestCode.STATUS, tag=f"r{i}") for i in range(3)]
        assert [r["echo"] for r in replies] == ["r0", "r1", "r2"]
        nursery.cancel_scope.cancel()


@pytest.mark.trio
async def test_a_wait_in_place_still_ends_at_the_callers_deadline():
    ours, theirs = socket.socketpair()
    async with trio.open_nursery() as nursery:
        connection = await connect_stream(trio.SocketStream(trio.socket.from_stdlib_socket(ours)), "silent", nursery)
        started = trio.current_time()
        with trio.move_on_after(0.2) as scope:
            await connection.request(RequestCode.STATUS, tag="never answered")
        assert scope.cancelled_caught and trio.current_time() - started < 5
        nursery.cancel_scope.cancel()
    theirs.close()


@pytest.mark.trio
async def test_requests_that_overlap_are_not_waited_for_in_place():
    # two callers with requests in flight together: their replies are read through trio
    async with _connected_to_a_thread_node(6) as connection:
        for round_ in range(3):
            async with trio.open_nursery() as callers:
                for caller in range(2):
                    callers.start_soon(partial(connection.request, RequestCode.STATUS, tag=f"{round_}-{caller}"))
        assert connection.statistics().waits_in_place == 0
