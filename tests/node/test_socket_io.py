"""node/wire/socket_io.py's reads and writes that are no scheduling point, over a socket pair."""

from __future__ import annotations

import socket
import threading

import pytest
import trio
import trio.testing

from node.wire.socket_io import read_now, write_now


def _pair():
    left, right = socket.socketpair()
    left.setblocking(False)
    return left, right


def test_read_now_gives_what_waits_none_when_nothing_does_and_empty_at_the_end():
    left, right = _pair()
    try:
        assert read_now(left, 1024) is None
        right.sendall(b"first")
        first = read_now(left, 1024)
        right.sendall(b"second!")
        second = read_now(left, 1024)
        # each read is its own bytes object: the next read does not change the last one
        assert (first, second) == (b"first", b"second!") and type(first) is bytes
        right.sendall(b"x" * 100)
        assert read_now(left, 30) == b"x" * 30 and read_now(left, 1000) == b"x" * 70
        right.close()
        assert read_now(left, 1024) == b""
    finally:
        left.close()
        right.close()


def test_read_now_takes_more_than_an_earlier_smaller_read_asked_for():
    left, right = _pair()
    try:
        right.sendall(b"a")
        assert read_now(left, 1) == b"a"
        payload = bytes(range(256)) * 1024          # 256 KiB: the buffer grows
        right.setblocking(True)
        sender = threading.Thread(target=right.sendall, args=(payload,))
        sender.start()
        got = bytearray()
        while len(got) < len(payload):
            data = read_now(left, len(payload))
            if data:
                got += data
        sender.join()
        assert bytes(got) == payload
    finally:
        left.close()
        right.close()


def test_read_now_each_thread_reads_into_its_own_buffer():
    pairs = [_pair() for _ in range(4)]
    results: dict[int, list[bytes]] = {}

    def reader(index: int) -> None:
        left, right = pairs[index]
        seen = []
        for round_ in range(200):
            right.sendall(f"{index}:{round_};".encode())
            data = None
            while not data:
                data = read_now(left, 64)
            seen.append(data)
        results[index] = seen

    threads = [threading.Thread(target=reader, args=(index,)) for index in range(len(pairs))]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for index in range(len(pairs)):
            assert b"".join(results[index]) == b"".join(f"{index}:{r};".encode() for r in range(200))
    finally:
        for left, right in pairs:
            left.close()
            right.close()


def test_read_now_on_a_closed_socket_is_a_closed_resource():
    left, right = _pair()
    left.close()
    right.close()
    with pytest.raises(trio.ClosedResourceError):
        read_now(left, 10)


@pytest.mark.trio
async def test_write_now_writes_to_a_socket_stream_and_nothing_to_others():
    left, right = socket.socketpair()
    stream = trio.SocketStream(trio.socket.from_stdlib_socket(left))
    try:
        assert write_now(stream, b"hello") == 5
        assert right.recv(10) == b"hello"
        memory_stream = trio.testing.MemorySendStream()
        assert write_now(memory_stream, b"hello") == 0
    finally:
        await stream.aclose()
        right.close()
