"""A bare trio frame echo server: the floor the node's latency is measured against.

Run as its own process (``python -m node.echo``), it prints ``{"ready": true, "port": N}``
and answers every frame ``u32 length | u32 reply_bytes | padding`` with a frame
``u32 reply_bytes | zeros``, so a benchmark can send a send request's size and get a send
reply's size back. It does the framing and nothing else: what a node adds on top of this
(decoding, checks, the store, the reply) is what the benchmark's ratio shows.
"""

from __future__ import annotations

import json
import signal
import struct
import sys

import trio

LENGTH = struct.Struct(">I")
RECEIVE_BYTES = 256 * 1024
REPLY_BYTES_MAX = 1 << 20
FRAME_BYTES_MAX = 16 * 1024 * 1024


def echo_request(request_bytes: int, reply_bytes: int) -> bytes:
    """A frame of ``request_bytes`` payload asking for ``reply_bytes`` back."""
    assert LENGTH.size <= request_bytes <= FRAME_BYTES_MAX and 0 <= reply_bytes <= REPLY_BYTES_MAX
    return LENGTH.pack(request_bytes) + LENGTH.pack(reply_bytes) + bytes(request_bytes - LENGTH.size)


async def echo_frames(stream: trio.abc.Stream) -> None:
    """Answer frames until the peer closes; a broken frame ends the connection."""
    buffer = bytearray()
    replies: dict[int, bytes] = {}
    async with stream:
        while data := await stream.receive_some(RECEIVE_BYTES):
            buffer += data
            out = []
            position = 0
            while len(buffer) - position >= 2 * LENGTH.size:
                (length,) = LENGTH.unpack_from(buffer, position)
                if not LENGTH.size <= length <= FRAME_BYTES_MAX:
                    return
                end = position + LENGTH.size + length
                if end > len(buffer):
                    break
                (reply_bytes,) = LENGTH.unpack_from(buffer, position + LENGTH.size)
                if reply_bytes > REPLY_BYTES_MAX:
                    return
                reply = replies.get(reply_bytes)
                if reply is None:
                    reply = replies[reply_bytes] = LENGTH.pack(reply_bytes) + bytes(reply_bytes)
                out.append(reply)
                position = end
            del buffer[:position]
            if out:
                await stream.send_all(b"".join(out))


async def serve_echo(host: str = "127.0.0.1", port: int = 0, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Serve echo_frames on ``host:port``; ``task_status.started(port)`` once listening."""
    listeners = await trio.open_tcp_listeners(port, host=host)
    task_status.started(listeners[0].socket.getsockname()[1])
    await trio.serve_listeners(echo_frames, listeners)


async def _main() -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            port = await nursery.start(serve_echo)
            print(json.dumps({"ready": True, "port": port}), flush=True)
            async for _ in signals:
                nursery.cancel_scope.cancel()
                break


if __name__ == "__main__":
    trio.run(_main)
    sys.exit(0)
