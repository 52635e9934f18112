"""The relay floor (node/bench/relay_floor.py) in one process on loopback: a request's
reply leaves only once every slave has acked it, every slave holds every payload, a
slave whose master closes mid-frame and a client whose reply never comes end in errors,
not quietly or never."""

from __future__ import annotations

import socket
import threading
import time

import pytest
import trio

from node.bench import relay_floor
from node.bench.relay_floor import ACK, FRAME, REPLY, REQUEST, FloorClient, RelayMaster, follow
from node.errors import NodeError

pytestmark = pytest.mark.trio

PAYLOAD = b"p" * 1000


async def _start_master(nursery, replicas: int) -> tuple[RelayMaster, int, int]:
    master = RelayMaster(replicas)
    client_port, ha_port = await nursery.start(master.serve)
    return master, client_port, ha_port


def _follow_in_thread(ha_port: int, ends: list[int]) -> threading.Thread:
    """A relay slave on a thread; its final end goes to ``ends`` when the master closes."""
    def run() -> None:
        with socket.create_connection(("127.0.0.1", ha_port)) as sock:
            ends.append(follow(sock, log_bytes=64 * 1024))
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


async def test_round_trips_reach_every_slave_and_each_holds_every_payload():
    ends: list[int] = []
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            _, client_port, ha_port = await _start_master(nursery, 2)
            threads = [_follow_in_thread(ha_port, ends) for _ in range(2)]
            client = await FloorClient.connect(client_port, PAYLOAD, 64)
            await client.round_trips(200, time.perf_counter() + 15)
            assert len(client.times) == 200 and all(value > 0 for value in client.times)
            await client.aclose()
            nursery.cancel_scope.cancel()   # the master closes its slave connections
        for thread in threads:
            await trio.to_thread.run_sync(thread.join, 5)
    assert ends == [200 * len(PAYLOAD)] * 2


async def test_a_reply_waits_for_the_last_slave_to_ack():
    ends: list[int] = []
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            _, client_port, ha_port = await _start_master(nursery, 2)
            thread = _follow_in_thread(ha_port, ends)
            held_back = await trio.open_tcp_stream("127.0.0.1", ha_port)   # the second slave: acks by hand
            client = await trio.open_tcp_stream("127.0.0.1", client_port)
            await client.send_all(REQUEST.pack(len(PAYLOAD), 8) + PAYLOAD)
            frame = b""
            while len(frame) < FRAME.size + len(PAYLOAD):
                frame += await held_back.receive_some(4096)
            assert FRAME.unpack_from(frame) == (0, len(PAYLOAD)) and frame[FRAME.size:] == PAYLOAD
            with trio.move_on_after(0.3):
                reply = await client.receive_some(4096)   # the first slave acked long ago
                pytest.fail(f"a reply before every slave acked: {reply!r}")
            await held_back.send_all(ACK.pack(len(PAYLOAD)))
            reply = b""
            while len(reply) < REPLY.size + 8:
                reply += await client.receive_some(4096)
            assert reply == REPLY.pack(8) + bytes(8)
            nursery.cancel_scope.cancel()   # before the slave closes: the master takes that for a failure
        await client.aclose()
        await held_back.aclose()
        await trio.to_thread.run_sync(thread.join, 5)
    assert ends == [len(PAYLOAD)]


async def test_a_master_closing_inside_a_frame_is_an_error():
    def slave(sock: socket.socket, failures: list[BaseException]) -> None:
        try:
            follow(sock, log_bytes=4096)
        except NodeError as error:
            failures.append(error)

    left, right = socket.socketpair()
    failures: list[BaseException] = []
    thread = threading.Thread(target=slave, args=(right, failures), daemon=True)
    thread.start()
    left.sendall(FRAME.pack(0, 100) + b"x" * 10)
    left.close()
    await trio.to_thread.run_sync(thread.join, 5)
    right.close()
    assert len(failures) == 1 and "inside a frame" in str(failures[0])


async def test_a_floor_that_does_not_answer_is_an_error_not_a_hang(monkeypatch):
    monkeypatch.setattr(relay_floor, "REPLY_TIMEOUT_S", 0.2)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            _, client_port, ha_port = await _start_master(nursery, 1)
            silent = await trio.open_tcp_stream("127.0.0.1", ha_port)   # a slave that never acks
            client = await FloorClient.connect(client_port, PAYLOAD, 8)
            with pytest.raises(NodeError, match="did not answer"):
                await client.round_trips(5, time.perf_counter() + 0.1)
            assert client.times == []
            nursery.cancel_scope.cancel()
        await client.aclose()
        await silent.aclose()
