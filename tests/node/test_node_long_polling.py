"""Long polling: a parked pull times out exactly (autojump clock) and wakes on a new message."""

import pytest
import trio
import trio.testing

from node.wire.protocol import RequestCode


@pytest.mark.trio
async def test_long_poll_times_out_at_the_client_deadline(memory_node, autojump_clock):
    async with trio.open_nursery() as nursery:
        connection = await memory_node.connect(nursery)
        await connection.request(RequestCode.TOPIC_CREATE, topic="quiet", queue_count=1)
        started = trio.current_time()
        reply = await connection.request(RequestCode.PULL, reply_timeout_ms=None, topic="quiet", queue_id=0,
                                         offset=0, timeout_ms=20_000)
        assert reply["status"] in ("NO_NEW_MESSAGE", "NO_MATCHED_LOGIC_QUEUE") and reply["messages"] == []
        assert trio.current_time() - started == pytest.approx(20.0, abs=0.01)
        # a client cannot park a pull past the node's limit
        started = trio.current_time()
        await connection.request(RequestCode.PULL, reply_timeout_ms=None, topic="quiet", queue_id=0, offset=0,
                                 timeout_ms=10_000_000)
        assert trio.current_time() - started == pytest.approx(memory_node.config.long_polling_timeout_ms_max / 1000,
                                                              abs=0.01)
        nursery.cancel_scope.cancel()


@pytest.mark.trio
async def test_long_poll_is_woken_by_the_dispatcher(memory_node):
    memory_node.wire_dispatcher()
    async with trio.open_nursery() as nursery:
        reader = await memory_node.connect(nursery)
        writer = await memory_node.connect(nursery)
        await writer.request(RequestCode.TOPIC_CREATE, topic="live", queue_count=1)
        replies = []
        answered = trio.Event()

        async def park():
            replies.append(await reader.request(RequestCode.PULL, topic="live", queue_id=0, offset=0,
                                                timeout_ms=20_000))
            answered.set()
        nursery.start_soon(park)
        await trio.testing.wait_all_tasks_blocked()
        assert replies == [] and memory_node.handlers.waiters.waiting == 1
        started = trio.current_time()
        await writer.request(RequestCode.SEND, topic="live", messages=[{"body": b"wake up"}])
        # woken by the store's dispatcher thread (a real one): a bounded wait in real time
        with trio.fail_after(5):
            await answered.wait()
        assert trio.current_time() - started < 2
        assert [m["body"] for m in replies[0]["messages"]] == [b"wake up"]
        assert memory_node.handlers.waiters.waiting == 0
        nursery.cancel_scope.cancel()
