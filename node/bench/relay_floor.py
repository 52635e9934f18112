"""The floor under a one-at-a-time sync send: a relay with the message flow of a master and
two all-ack slaves, and nothing of hastore's in it. ``hastore bench replicate --peer redis``
times its round trips in the same blocks as hastore's and Redis's single sends.

    client --u32 length | u32 reply bytes | payload--> master --u64 offset | u32 size | payload--> slave (x2)
    client <--u32 reply bytes | zeros----------------- master <--u64 end of what it holds--------- slave

- the relay master is one trio loop, as a node is: a task reads each client connection and
  writes each request's payload to every slave at once; a task per slave reads its acks,
  and a request's reply leaves from the ack that completes it (as a sync put's does);
- each relay slave reads a plain blocking socket on one thread, as a slave's follow thread
  does, copies each payload into a log buffer and acks the end of what it holds;
- the client (the bench's process) sends one request at a time from trio.

Run as processes: ``python -m node.bench.relay_floor master REPLICAS`` prints
``{"ready": true, "client_port": P, "ha_port": H}``, then relays once REPLICAS slaves have
connected; ``python -m node.bench.relay_floor slave H`` follows it. No decoding beyond the
length fields, no checks, no store, no index, no bookkeeping: what a single send costs
over this floor is the work of the store that serves it.
"""

from __future__ import annotations

import json
import signal
import socket
import struct
import subprocess
import sys
import time
from collections import deque

import trio

from ..errors import NodeError
from ..wire.socket_io import read_now, receive_some, write_now
from ..cluster.processes import read_ready_line, stop_child

REQUEST = struct.Struct(">II")     # payload length, reply bytes wanted
FRAME = struct.Struct(">QI")       # offset in the relayed log, payload length
ACK = struct.Struct(">Q")          # end of what the slave holds
REPLY = struct.Struct(">I")        # reply bytes that follow
RECEIVE_BYTES = 256 * 1024
PAYLOAD_BYTES_MAX = 1 << 20
REPLY_BYTES_MAX = 1 << 16
SLAVE_LOG_BYTES = 64 << 20         # a slave's log buffer, written round (its content is never read)
READY_TIMEOUT_S = 30
REPLY_TIMEOUT_S = 10               # past a block's deadline, for the reply in flight
STOP_TIMEOUT_S = 10


# --- master --------------------------------------------------------------------------------
class _Slave:
    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.acked = 0
        self.lock = trio.Lock()   # held by a write the socket did not take at once


class RelayMaster:
    """The relay master's state; ``serve`` runs it in a trio loop."""

    def __init__(self, replicas: int) -> None:
        self.replicas = replicas
        self.slaves: list[_Slave] = []
        self.ready = trio.Event()
        self.end = 0
        self.waiting: deque[tuple[int, trio.SocketStream, bytes]] = deque()  # (end, client, reply)

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        ha_listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
        client_listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
        task_status.started((client_listener.socket.getsockname()[1], ha_listener.socket.getsockname()[1]))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners, self._client, [client_listener])
            async with ha_listener:
                while len(self.slaves) < self.replicas:
                    slave = _Slave(await ha_listener.accept())
                    self.slaves.append(slave)
                    nursery.start_soon(self._acks, slave)
            self.ready.set()

    async def _client(self, stream: trio.SocketStream) -> None:
        await self.ready.wait()
        buffer = bytearray()
        replies: dict[int, bytes] = {}
        async with stream:
            while data := await receive_some(stream, RECEIVE_BYTES):
                buffer += data
                while len(buffer) >= REQUEST.size:
                    length, reply_bytes = REQUEST.unpack_from(buffer)
                    if length > PAYLOAD_BYTES_MAX or reply_bytes > REPLY_BYTES_MAX:
                        return   # not a relay client: drop the connection
                    if len(buffer) < REQUEST.size + length:
                        break
                    frame = FRAME.pack(self.end, length) + buffer[REQUEST.size:REQUEST.size + length]
                    del buffer[:REQUEST.size + length]
                    self.end += length
                    reply = replies.get(reply_bytes)
                    if reply is None:
                        reply = replies[reply_bytes] = REPLY.pack(reply_bytes) + bytes(reply_bytes)
                    self.waiting.append((self.end, stream, reply))
                    for slave in self.slaves:
                        await _write(slave.stream, slave.lock, frame)

    async def _acks(self, slave: _Slave) -> None:
        """Read a slave's acks until it closes (an error) or the relay stops (closing it)."""
        pending = b""
        async with slave.stream:
            while data := await receive_some(slave.stream, RECEIVE_BYTES):
                pending += data
                whole = len(pending) - len(pending) % ACK.size
                if whole:
                    slave.acked = ACK.unpack_from(pending, whole - ACK.size)[0]
                    pending = pending[whole:]
                    self._release()
        raise NodeError("a relay slave closed its connection")

    def _release(self) -> None:
        """Reply to every request all slaves hold."""
        held = min(slave.acked for slave in self.slaves)
        waiting = self.waiting
        while waiting and waiting[0][0] <= held:
            _, client, reply = waiting.popleft()
            try:
                sent = write_now(client, reply)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                continue   # that client is gone; the others' replies still go
            if sent < len(reply):   # a client that sends one request at a time always has room
                raise NodeError("a relay reply did not fit its client's socket")


async def _write(stream: trio.SocketStream, lock: trio.Lock, data: bytes) -> None:
    """All of ``data``: at once if the socket takes it, else in order behind earlier writes."""
    if not lock.locked():
        sent = write_now(stream, data)
        if sent == len(data):
            return
        data = data[sent:]
    async with lock:
        await stream.send_all(data)


async def _master_main(replicas: int) -> None:
    master = RelayMaster(replicas)
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            client_port, ha_port = await nursery.start(master.serve)
            print(json.dumps({"ready": True, "client_port": client_port, "ha_port": ha_port}), flush=True)
            async for _ in signals:
                nursery.cancel_scope.cancel()
                break


# --- slave ---------------------------------------------------------------------------------
def follow(sock: socket.socket, log_bytes: int = SLAVE_LOG_BYTES) -> int:
    """Read frames, copy each payload into the log, ack its end; until the master closes.
    Returns the end of what it holds."""
    log = memoryview(bytearray(log_bytes))
    header = memoryview(bytearray(FRAME.size))
    end = 0
    while True:
        if not _receive_exactly(sock, header):
            return end
        offset, length = FRAME.unpack(header)
        if length > min(PAYLOAD_BYTES_MAX, log_bytes):
            raise NodeError(f"a relay frame of {length} bytes")
        at = offset % log_bytes
        if at + length > log_bytes:
            at = 0
        if not _receive_exactly(sock, log[at:at + length]):
            raise NodeError("the relay master closed the connection inside a frame")
        end = offset + length
        sock.sendall(ACK.pack(end))


def _receive_exactly(sock: socket.socket, target: memoryview) -> bool:
    """Fill ``target``; False if the peer closed before its first byte."""
    got = 0
    while got < len(target):
        count = sock.recv_into(target[got:])
        if not count:
            if got:
                raise NodeError("the relay master closed the connection inside a frame")
            return False
        got += count
    return True


def _slave_main(ha_port: int) -> None:
    with socket.create_connection(("127.0.0.1", ha_port), timeout=READY_TIMEOUT_S) as sock:
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        print(json.dumps({"ready": True}), flush=True)
        follow(sock)


# --- the group, from the bench -------------------------------------------------------------
class RelayFloor:
    """A relay master and its slaves as processes on loopback; ``stop`` ends them by pid."""

    def __init__(self) -> None:
        self.processes: dict[str, subprocess.Popen] = {}
        self.client_port = 0

    @classmethod
    def start(cls, replicas: int) -> "RelayFloor":
        floor = cls()
        try:
            master = floor._spawn("master", "master", str(replicas))
            ready = read_ready_line(master, READY_TIMEOUT_S)
            floor.client_port = ready["client_port"]
            for index in range(replicas):
                read_ready_line(floor._spawn(f"slave{index}", "slave", str(ready["ha_port"])), READY_TIMEOUT_S)
        except BaseException:
            floor.stop()
            raise
        return floor

    def _spawn(self, name: str, *argv: str) -> subprocess.Popen:
        process = self.processes[name] = subprocess.Popen(
            [sys.executable, "-P", "-m", "node.bench.relay_floor", *argv], stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL)
        return process

    @property
    def pids(self) -> dict[str, int]:
        return {name: process.pid for name, process in self.processes.items()}

    def stop(self) -> None:
        for process in self.processes.values():
            try:
                stop_child(process, STOP_TIMEOUT_S)
            finally:
                process.stdout.close()
        self.processes.clear()


class FloorClient:
    """One connection to the relay master; round trips one at a time, timed."""

    def __init__(self, stream: trio.SocketStream, payload: bytes, reply_bytes: int) -> None:
        self.stream = stream
        self.request = REQUEST.pack(len(payload), reply_bytes) + payload
        self.reply_size = REPLY.size + reply_bytes
        self.times: list[float] = []

    @classmethod
    async def connect(cls, port: int, payload: bytes, reply_bytes: int) -> "FloorClient":
        return cls(await trio.open_tcp_stream("127.0.0.1", port), payload, reply_bytes)

    async def round_trips(self, count: int, deadline: float) -> None:
        """``count`` round trips (fewer if ``deadline``, a perf_counter time, passes); NodeError
        if a reply is still missing ``REPLY_TIMEOUT_S`` after the deadline."""
        with trio.move_on_after(max(0.0, deadline - time.perf_counter()) + REPLY_TIMEOUT_S) as scope:
            await self._round_trips(count, deadline)
        if scope.cancelled_caught:
            raise NodeError(f"the relay floor did not answer within {REPLY_TIMEOUT_S} s of the deadline")

    async def _round_trips(self, count: int, deadline: float) -> None:
        stream, request, reply_size = self.stream, self.request, self.reply_size
        for _ in range(count):
            if time.perf_counter() > deadline:
                break
            began = time.perf_counter()
            if write_now(stream, request) != len(request):
                raise NodeError("a relay request did not fit the socket")
            got = 0
            while got < reply_size:
                data = read_now(stream.socket, reply_size - got)
                if data is None:
                    await trio.lowlevel.wait_readable(stream.socket)
                    continue
                if not data:
                    raise NodeError("the relay master closed the connection")
                got += len(data)
            self.times.append((time.perf_counter() - began) * 1e6)

    async def aclose(self) -> None:
        await self.stream.aclose()


if __name__ == "__main__":
    if sys.argv[1:2] == ["master"] and len(sys.argv) == 3:
        trio.run(_master_main, int(sys.argv[2]))
    elif sys.argv[1:2] == ["slave"] and len(sys.argv) == 3:
        try:
            _slave_main(int(sys.argv[2]))
        except (ConnectionError, NodeError):
            pass   # the master stopped first
    else:
        sys.exit("usage: python -m node.bench.relay_floor master REPLICAS | slave HA_PORT")
