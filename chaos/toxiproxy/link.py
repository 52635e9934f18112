"""A link: one client connection accepted by a proxy and its connection to the upstream, with
one ``Direction`` each way (upstream: client -> upstream, downstream: upstream -> client).

A direction runs three tasks:

- the reader takes up to 64 KiB a read from its source. With no toxic on its stream (and
  nothing queued), it writes the bytes to the destination itself: one task, no queue, no
  sleep, plain non-blocking socket calls (see ``_read``);
  Otherwise it stamps each chunk with its arrival time and queues it (at most 64 chunks, so
  4 MiB a direction) for the writer;
- the writer passes each queued chunk down the stream's current toxic chain (``toxics.py``)
  to the destination, and closes the destination when the source ended or a toxic closed
  the direction (after the longest active ``slow_close`` delay);
- the watchdog follows the chain's changes: it draws each new toxic's toxicity for this link,
  closes the direction when a ``timeout`` toxic's time is up or when an active ``timeout``
  toxic is removed (Toxiproxy's cleanup: the bytes it dropped leave the stream broken).

As in Toxiproxy, a direction ending closes its destination fully; the other direction then
reads an end from that socket and ends in turn, so a link always closes both ways.
"""

from __future__ import annotations

import math
import random
import socket
import struct
from typing import Protocol

import trio

from .toxics import BEHAVIOURS, ToxicSpec, ToxicState, new_state

READ_BYTES = 64 * 1024
QUEUE_CHUNKS_MAX = 64
_END = object()
_LINK_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)


class ToxicChains(Protocol):
    """A proxy's toxics as a direction sees them (``proxy.ToxicCollection``)."""

    def chain(self, stream: str) -> tuple[ToxicSpec, ...]: ...

    def version(self, stream: str) -> int: ...

    def changed(self, stream: str) -> trio.Event: ...


async def _send_all(sock: socket.socket, data: bytes, still_open) -> None:
    view = memoryview(data)
    while view:
        if not still_open():
            raise trio.ClosedResourceError("the link closed")
        try:
            view = view[sock.send(view):]
        except BlockingIOError:
            await trio.lowlevel.wait_writable(sock)


class Direction:
    """One way of a link: source -> toxic chain -> destination."""

    def __init__(self, link: "Link", stream: str, source: trio.SocketStream, dest: trio.SocketStream,
                 toxics: ToxicChains, rng: random.Random) -> None:
        self.stream = stream
        self.rng = rng
        self.bytes_forwarded = 0
        self._link = link
        self._source = source
        self._dest = dest
        self._toxics = toxics
        self._send, self._receive = trio.open_memory_channel(QUEUE_CHUNKS_MAX)
        self._queued = 0
        self._writer_busy = False
        self._closing = False
        self._seen_version = -1
        self._states: dict[str, ToxicState] = {}
        self._write_scope = trio.CancelScope()

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._read)
            nursery.start_soon(self._watch)
            with self._write_scope:
                try:
                    await self._write()
                except _LINK_ERRORS:
                    pass
            try:
                await self._close_destination()
            finally:
                nursery.cancel_scope.cancel()

    # -- reader ---------------------------------------------------------------------------
    def _direct(self) -> bool:
        return (not self._queued and not self._writer_busy and not self._closing
                and self._seen_version == self._toxics.version(self.stream) and not self._toxics.chain(self.stream))

    def _open(self) -> bool:
        return self._source.socket.fileno() >= 0 and self._dest.socket.fileno() >= 0

    async def _read(self) -> None:
        if not self._open():  # closed before this task ran; no await between check and use
            await self._send.send(_END)
            return
        source = socket.socket(fileno=self._source.socket.fileno())
        dest = socket.socket(fileno=self._dest.socket.fileno())
        try:
            while True:
                if self._direct():
                    # The hot loop of a link with no toxics: plain non-blocking calls on the
                    # sockets, waiting in trio only when the kernel has nothing (or no room);
                    # trio's stream calls cost two scheduler passes each. Both objects share the
                    # trio sockets' descriptors: check they are still open right before each
                    # call (no await in between), so a descriptor closed and reused by another
                    # connection is never read.
                    if not self._open():
                        break
                    try:
                        data = source.recv(READ_BYTES)
                    except BlockingIOError:
                        await trio.lowlevel.wait_readable(source)
                        continue
                    if not data:
                        break
                    await _send_all(dest, data, self._open)
                    self.bytes_forwarded += len(data)
                    await trio.lowlevel.checkpoint()
                    continue
                data = await self._source.receive_some(READ_BYTES)
                if not data:
                    break
                if self._direct():
                    await self._dest.send_all(data)
                    self.bytes_forwarded += len(data)
                else:
                    self._queued += 1
                    await self._send.send((data, trio.current_time()))
        except _LINK_ERRORS:
            pass
        finally:
            source.detach()
            dest.detach()
        await self._send.send(_END)

    # -- writer ---------------------------------------------------------------------------
    async def _write(self) -> None:
        while True:
            item = await self._receive.receive()
            if item is _END:
                return
            data, stamp = item
            self._writer_busy = True
            try:
                go_on = await self._through(0, self._toxics.chain(self.stream), data, stamp)
            finally:
                self._writer_busy = False
                self._queued -= 1
            if not go_on:
                return

    async def _through(self, index: int, chain: tuple[ToxicSpec, ...], data: bytes, stamp: float) -> bool:
        if index == len(chain):
            await self._dest.send_all(data)
            self.bytes_forwarded += len(data)
            return True
        state = self._state(chain[index])

        async def emit(piece: bytes) -> bool:
            return await self._through(index + 1, chain, piece, stamp)

        if not state.active:
            return await emit(data)
        return await BEHAVIOURS[state.spec.type](state, data, stamp, emit, self)

    async def _close_destination(self) -> None:
        chain = self._toxics.chain(self.stream)
        delays_ms = [spec.attribute("delay") for spec in chain
                     if spec.type == "slow_close" and self._state(spec).active]
        if delays_ms:
            await trio.sleep(max(delays_ms) / 1000.0)
        await self._dest.aclose()

    # -- watchdog -------------------------------------------------------------------------
    async def _watch(self) -> None:
        held_timeouts: set[str] = set()
        while True:
            version = self._toxics.version(self.stream)
            changed = self._toxics.changed(self.stream)
            chain = self._toxics.chain(self.stream)
            names = {spec.name for spec in chain}
            for name in [name for name in self._states if name not in names]:
                del self._states[name]
            if held_timeouts - names:
                return self._close_now()
            now = trio.current_time()
            deadline = math.inf
            held_timeouts = set()
            for spec in chain:
                state = self._state(spec)
                if spec.type == "timeout" and state.active:
                    held_timeouts.add(spec.name)
                    if spec.attribute("timeout") > 0:
                        deadline = min(deadline, state.activated_at + spec.attribute("timeout") / 1000.0)
            if deadline <= now:
                return self._close_now()
            self._seen_version = version
            with trio.move_on_at(deadline):
                await changed.wait()

    def _close_now(self) -> None:
        self._closing = True
        self._write_scope.cancel()

    def _state(self, spec: ToxicSpec) -> ToxicState:
        state = self._states.get(spec.name)
        if state is None or state.spec is not spec:
            state = new_state(spec, trio.current_time(), self.rng, state)
            self._states[spec.name] = state
        return state

    # -- ToxicPort ------------------------------------------------------------------------
    def now(self) -> float:
        return trio.current_time()

    async def sleep_until(self, deadline: float, spec: ToxicSpec) -> bool:
        while True:
            if not any(current is spec for current in self._toxics.chain(self.stream)):
                return False
            if trio.current_time() >= deadline:
                return True
            changed = self._toxics.changed(self.stream)
            with trio.move_on_at(deadline):
                await changed.wait()

    async def reset(self) -> None:
        self._link.reset()
        await trio.lowlevel.checkpoint()


class Link:
    """A client connection and its upstream connection, forwarded both ways through toxics."""

    def __init__(self, client: trio.SocketStream, upstream: trio.SocketStream, toxics: ToxicChains,
                 rng: random.Random) -> None:
        self.client = client
        self.upstream = upstream
        self.upstream_direction = Direction(self, "upstream", client, upstream, toxics, rng)
        self.downstream_direction = Direction(self, "downstream", upstream, client, toxics, rng)
        self._scope = trio.CancelScope()

    async def run(self) -> None:
        """Forward until both directions end, the link is reset, or the caller is cancelled."""
        with self._scope:
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self.upstream_direction.run)
                    nursery.start_soon(self.downstream_direction.run)
            finally:
                await trio.aclose_forcefully(self.client)
                await trio.aclose_forcefully(self.upstream)

    def reset(self) -> None:
        """Close both sockets with SO_LINGER 0, so that both peers get a TCP RST."""
        for stream in (self.client, self.upstream):
            try:
                stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except OSError:
                pass  # already closed
        self._scope.cancel()
