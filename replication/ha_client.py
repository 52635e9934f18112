"""HAClient: the slave's side of replication.

    client = HAClient(store.replica_log, epoch_file, settings)   # a ReplicaStore
    await nursery.start(serve_ha_client, client)    # runs until cancelled, reconnecting

One session: connect to ``master_ha_address``, answer the HELLO with a HANDSHAKE (proof
first), check the master's proof in its WELCOME, cut the log at the consistent point (or
reset it) and the epoch file after it, ack the new end, then apply data frames: each must
start exactly at the log's end, carry the CRC it claims and lie inside one of the master's
epochs; the first frame of a new epoch records that epoch (durably) before its bytes are
written. The store's own dispatcher builds ConsumeQueue and IndexFile from the bytes.

Over a TCP socket (``follow_thread``, the default) the streaming phase runs on a thread of
the session's own over a blocking socket (follow_thread.py): the same checks, appends and
acks, without the event loop's wake-up and scheduler per frame (a slave's CPU a one-at-a-time
send about a third lower), and the dispatch passes of what it appended, between frames
(``dispatch_delay_ms`` after the first of them, once the socket is quiet for a moment, or
in pieces that give way to frames when it is not). Over any other stream, and with
``follow_thread`` off, the loop's tasks do it:

Frames are received and applied by two tasks, so that the next frame arrives while the
last one is written (a write is a page-cache copy in a worker thread, which releases the
GIL): the receiver reads a frame into a free buffer of a small pool, checks it (CRC,
offset right after the frames before it, inside one epoch) and hands it over; the
applier records a new epoch if needed, appends at the log's end (checked again there),
returns the buffer and acks in the same step, straight to the socket (no task in between;
one ack for several frames that arrived together). A small frame that arrives while the
applier waits with nothing queued is appended and acked by the receiver itself, in the
step that read it: a one-at-a-time put's frame costs the slave no task hop. The pool bounds the frames in flight
and the memory. The store's dispatch (this replica's ConsumeQueue and IndexFile) is woken
``dispatch_delay_ms`` after the first frame it has not seen, not per frame: the frames of
that time share a pass, and no pass runs between a frame and its ack.

Any failure ends the session (nothing partial is applied: a frame is checked whole before
the store's ``append``, and frames received behind a failure are dropped unwritten) and the
client reconnects after a bounded, jittered backoff that resets once a session streams.
Cancelling the client waits for an append in progress, so once ``stop`` returns the log
no longer moves.
"""

from __future__ import annotations

import logging
import math
import os
import random
from dataclasses import dataclass
from functools import partial
from typing import Callable

import trio

from store.errors import DiskFullError, StoreError

from . import protocol
from .epochs import EpochFile, ResyncKind, slave_epochs_after
from .errors import HaAuthError, HandshakeRefused, HaProtocolError, ReplicationError, expected_failure
from .follow_thread import ACK_FRAMES_MAX, FollowThread, thread_socket
from .protocol import Handshake, Hello, Welcome
from .store_protocol import ReplicaStore
from .transport import StreamReader, send_now

log = logging.getLogger(__name__)

# smaller frames are written inline, larger in a worker thread. A batched load's frames (64
# messages x 8 in flight: up to ~600 KiB) stay inline: a worker thread's hop (start it, wake
# the loop with its result, reschedule) cost the slave more CPU than the copy it moved off the
# loop; a catch-up's multi-MiB frames still overlap their write with the next receive
INLINE_APPEND_BYTES_MAX = 1024 * 1024
# frame buffers of DATA_FRAME_BYTES_MAX each: one being written, one being received, one
# spare so that the receiver need not wait for the applier to take its last frame
FRAME_BUFFERS = 3
# the share of read_timeout_ms by which the read timeout may come early: its deadline is
# moved forward at most once per this share of it, not at every frame
READ_TIMEOUT_SLACK = 0.1
# what ends a session without being a bug: the client reconnects after a backoff
SESSION_FAILURES = (OSError, trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError,
                    ReplicationError, StoreError)


@dataclass(frozen=True, slots=True)
class HaClientSettings:
    node_id: str
    group: str
    cluster: str
    master_ha_address: str
    secret: str | None = None
    ack_interval_ms: int = 1_000
    connect_timeout_ms: int = 5_000
    handshake_timeout_ms: int = 5_000
    resync_timeout_ms: int = 120_000
    read_timeout_ms: int = 10_000          # no frame (not even a heartbeat) for this long: reconnect
    backoff_min_ms: int = 100
    backoff_max_ms: int = 5_000
    client_address: str = ""              # told to the master in the handshake (it repairs from it)
    # appended frames are indexed (ConsumeQueue, IndexFile) this long after the first of them,
    # together: a dispatch pass has a fixed cost of ~0.1 ms, more when it wakes a cold loop,
    # which a pass per one-message frame paid on every sync send. Acks never wait for it.
    # 50 rather than 10: under a steady batched load a slave ran a pass (and a timer's
    # expiry) every delay, which cost it ~0.8 us of CPU a message at ~30k messages/s
    # (~0.3 ms a pass); the price is that a slave's reads see a message up to 50 ms after
    # its bytes are in the log (a promoted slave's session end wakes the dispatch at once).
    # A follow thread runs these passes itself, when no frame waits for its ack (on a
    # socket that went quiet: up to twice the delay after the first frame).
    dispatch_delay_ms: int = 50
    # over a TCP socket, frames are read, checked, appended and acked by a thread of the
    # session's own on a blocking socket (follow_thread.py), not by tasks of the event loop
    follow_thread: bool = True


@dataclass(frozen=True, slots=True)
class HaClientStatistics:
    master_ha_address: str
    master_node_id: str | None
    master_epoch: int
    connected: bool
    max_offset: int
    master_max_offset: int
    lag_bytes: int
    sessions: int
    reconnects: int
    truncated_bytes: int
    resets: int
    received_bytes: int
    last_error: str | None


class Backoff:
    """Retry delays: doubling from ``min_ms`` to ``max_ms``, each jittered down by up to half."""

    def __init__(self, min_ms: int, max_ms: int, rng: random.Random | None = None) -> None:
        self.min_ms = min_ms
        self.max_ms = max_ms
        self.attempt = 0
        self._rng = rng or random.Random()

    def next_delay_s(self) -> float:
        base = min(self.max_ms, self.min_ms * (2 ** min(self.attempt, 30)))
        self.attempt += 1
        return base * (0.5 + self._rng.random() / 2) / 1000

    def reset(self) -> None:
        self.attempt = 0


class HAClient:
    """Keeps this slave's log a copy of its master's."""

    def __init__(self, store: ReplicaStore, epoch_file: EpochFile, settings: HaClientSettings, *,
                 on_truncated: Callable[[int], None] | None = None,
                 on_confirm_advanced: Callable[[], None] | None = None) -> None:
        """``on_confirm_advanced`` is told (on the trio thread) when the confirm offset this
        replica publishes moves: readers capped at it may have new messages."""
        self.store = store
        self.epoch_file = epoch_file
        self.settings = settings
        self.on_truncated = on_truncated
        self.on_confirm_advanced = on_confirm_advanced
        # the master's confirm offset as its CONFIRM frames told it (this session); the store's
        # confirm offset follows it, never past this log's end
        self._master_confirm_offset = 0
        self.backoff = Backoff(settings.backoff_min_ms, settings.backoff_max_ms)
        self._connected = False
        self._master_node_id: str | None = None
        self._master_epoch = 0
        self._master_max_offset = 0
        self._sessions = 0
        self._reconnects = 0
        self._truncated_bytes = 0
        self._resets = 0
        self._received_bytes = 0
        self._last_error: str | None = None
        self._undispatched = trio.Event()  # set: frames appended that the dispatch was not woken for
        # the applier waits for frames with none queued: the receiver may append one itself
        self._applier_idle = False
        # acks come from the applier and the receiver, one write at a time: set while one waits
        # in a partial write; another ack asked for meanwhile is left to it (``_ack_again``)
        self._ack_writing = False
        self._ack_again = False
        self.appended_by_receiver = 0  # frames the receiver appended itself (no hop to the applier)
        self._follower: FollowThread | None = None   # the session's follow thread, while it runs
        self._thread_frames = 0        # frames appended by the follow threads of ended sessions
        self._thread_passes = 0        # dispatch passes the follow threads of ended sessions asked for

    # --- the reconnect loop --------------------------------------------------------------
    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started(self)
        while True:
            sessions_before = self._sessions
            try:
                await self._session()
            except BaseException as raised:
                error = expected_failure(raised, SESSION_FAILURES)
                if error is None:
                    raise
                self._last_error = f"{type(error).__name__}: {error}"
                # what an operator must act on (a secret, a refusal, a full disk) is a warning at
                # each failed session (the backoff spaces them); a dropped link is only news
                needs_operator = isinstance(error, (HaAuthError, HandshakeRefused, DiskFullError))
                level = logging.WARNING if needs_operator else logging.INFO
                log.log(level, "replication from %s: %s", self.settings.master_ha_address, self._last_error)
            finally:
                self._connected = False
            if self._sessions != sessions_before:
                self.backoff.reset()  # it streamed: the next failure starts from the shortest delay
            self._reconnects += 1
            await trio.sleep(self.backoff.next_delay_s())

    async def _session(self) -> None:
        host, _, port = self.settings.master_ha_address.rpartition(":")
        with trio.fail_after(self.settings.connect_timeout_ms / 1000):
            stream = await trio.open_tcp_stream(host, int(port))
        async with stream:
            await self.follow(stream)

    async def follow(self, stream: trio.abc.Stream) -> None:
        """One session over ``stream`` (any trio stream): handshake, resync, then stream until
        the connection fails. Raises on the failure that ended it."""
        reader = StreamReader(stream)
        with trio.fail_after(self.settings.handshake_timeout_ms / 1000):
            welcome = await self._handshake(stream, reader)
        with trio.fail_after(self.settings.resync_timeout_ms / 1000):
            await self._resync(welcome)
        self._sessions += 1
        self._connected = True
        self._master_node_id = welcome.node_id
        self._master_epoch = welcome.epoch
        self._master_max_offset = welcome.max_offset
        self._master_confirm_offset = 0  # a confirm offset speaks of this master's log only
        await stream.send_all(protocol.ack(self.store.max_offset))
        log.info("following master %s (epoch %d) from %d", welcome.node_id, welcome.epoch,
                 self.store.max_offset)
        if self.settings.follow_thread and type(stream) is trio.SocketStream:
            await self._follow_in_thread(stream, reader, welcome)
            return
        free_buffers_in, free_buffers = trio.open_memory_channel(FRAME_BUFFERS)
        for _ in range(FRAME_BUFFERS):
            free_buffers_in.send_nowait(memoryview(bytearray(protocol.DATA_FRAME_BYTES_MAX)))
        frames_in, frames = trio.open_memory_channel(FRAME_BUFFERS)  # bounded by the buffers anyway
        self._undispatched = trio.Event()
        self._applier_idle = False
        self._ack_writing = self._ack_again = False
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._wake_dispatch_later)
                nursery.start_soon(self._apply_frames, stream, frames, free_buffers_in)
                await self._receive_frames(stream, reader, welcome, frames_in, free_buffers)
        finally:
            if self._undispatched.is_set():
                self.store.wake_dispatch()  # what the session appended is indexed all the same

    async def _follow_in_thread(self, stream: trio.SocketStream, reader: StreamReader, welcome: Welcome) -> None:
        """The session's frames on a thread of its own (follow_thread.py) until it fails or
        this task is cancelled. The thread dispatches what it appended itself; the confirm
        offset it moved is told to ``on_confirm_advanced`` here, when the thread says so."""
        token = trio.lowlevel.current_trio_token()
        news = trio.Event()

        def tell_news() -> None:   # on the loop's thread
            news.set()

        sock = thread_socket(stream)
        try:
            follower = FollowThread(
                self.store, self.epoch_file, welcome.epochs, sock, reader.take_buffered(),
                read_timeout_ms=self.settings.read_timeout_ms, ack_interval_ms=self.settings.ack_interval_ms,
                dispatch_delay_ms=self.settings.dispatch_delay_ms, master_max_offset=self._master_max_offset,
                signal=partial(token.run_sync_soon, tell_news))
        except BaseException:
            sock.close()
            raise

        async def take_news() -> None:
            nonlocal news
            while True:
                await news.wait()
                news = trio.Event()
                follower.signalled = False   # re-armed before the flags are read: none is missed
                self._take_news(follower)

        async def stop_when_cancelled() -> None:
            try:
                await trio.sleep_forever()
            finally:
                follower.stop()   # cancelled (or the thread is done): the thread leaves

        self._follower = follower
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(take_news)
                nursery.start_soon(stop_when_cancelled)
                try:
                    await trio.to_thread.run_sync(follower.run, abandon_on_cancel=False)
                finally:
                    nursery.cancel_scope.cancel()
        finally:
            follower.sock.close()   # closed by the thread as it ended; here if it never started
            self._follower = None
            self._master_max_offset = max(self._master_max_offset, follower.master_max_offset)
            self._received_bytes += follower.received_bytes
            self._thread_frames += follower.frames
            self._thread_passes += follower.passes
            if follower.undispatched:
                self.store.wake_dispatch()   # what the thread appended is indexed all the same
            self._take_news(follower)

    def _take_news(self, follower: FollowThread) -> None:
        """A confirm offset the follow thread moved, to the listeners."""
        if follower.confirm_moved:
            follower.confirm_moved = False
            if self.on_confirm_advanced is not None:
                self.on_confirm_advanced()

    async def _wake_dispatch_later(self) -> None:
        """Wake the store's dispatch ``dispatch_delay_ms`` after the first frame appended
        since its last wake: the frames of that time share one pass."""
        delay_s = self.settings.dispatch_delay_ms / 1000
        while True:
            await self._undispatched.wait()
            await trio.sleep(delay_s)
            self._undispatched = trio.Event()
            self.store.wake_dispatch()

    async def _handshake(self, stream, reader: StreamReader) -> Welcome:
        hello = Hello.decode(await reader.control())
        if hello.cluster != self.settings.cluster:
            raise HandshakeRefused(f"the master is in cluster {hello.cluster!r}, this slave in "
                                   f"{self.settings.cluster!r}")
        nonce = os.urandom(protocol.NONCE_BYTES)
        store = self.store
        epochs = self.epoch_file.entries
        await stream.send_all(Handshake(protocol.slave_proof(self.settings.secret, hello.nonce, nonce), nonce,
                                        self.settings.node_id, self.settings.group, self.settings.cluster, epochs,
                                        store.min_offset, store.max_offset, self.settings.client_address).encode())
        return Welcome.decode(await reader.control(), self.settings.secret, hello.nonce, nonce)

    async def _resync(self, welcome: Welcome) -> None:
        """Cut (or reset) the log where the master said, then the epoch file after it.

        The log goes first: a crash between the two leaves epochs past the log's end, which
        ``EpochFile.load`` drops; the other order could leave a divergent tail dated as the
        common epoch.
        """
        store = self.store
        resync = welcome.resync
        end = store.max_offset
        if resync.kind is ResyncKind.TRUNCATE:
            if resync.offset > end or resync.offset < store.min_offset:
                raise HaProtocolError(f"the master asks for a cut at {resync.offset}, outside this log "
                                      f"[{store.min_offset}, {end}]")
            if resync.offset < end:
                log.warning("cutting %d bytes of divergent log at %d (%s)", end - resync.offset, resync.offset,
                            resync.reason)
                await trio.to_thread.run_sync(store.cut, resync.offset)
                self._truncated_bytes += end - resync.offset
        else:
            log.warning("resetting the log to start empty at %d (%s)", resync.offset, resync.reason)
            await trio.to_thread.run_sync(store.reset, resync.offset)
            self._resets += 1
        kept = slave_epochs_after(self.epoch_file.entries, resync)
        if kept != self.epoch_file.entries:
            await trio.to_thread.run_sync(self.epoch_file.replace, kept)
        if (resync.kind is ResyncKind.RESET or resync.offset < end) and self.on_truncated is not None:
            self.on_truncated(store.max_offset)

    async def _receive_frames(self, stream, reader: StreamReader, welcome: Welcome, frames: trio.MemorySendChannel,
                              free_buffers: trio.MemoryReceiveChannel) -> None:
        """Read data frames into free buffers, check them and hand them to the applier in order.

        A small frame of the current epoch that arrives while the applier waits with nothing
        queued is appended and acked here, in this step (``_append_here``): a one-at-a-time
        put's frame costs no task hop. The hand-over and the buffer taken back are
        scheduling points only when they must wait (the applier is three frames behind)."""
        master_epochs = welcome.epochs
        timeout_s = self.settings.read_timeout_ms / 1000
        # the read timeout's deadline moves at most once per this much time (a move is a remove
        # and an add in trio's deadline heap, two a put when it was moved per frame): the
        # session ends after between timeout - slack and timeout without a frame
        slack_s = timeout_s * READ_TIMEOUT_SLACK
        moved_at = -math.inf
        expected = self.store.max_offset  # where the next frame must start
        buffer = None
        unacked = 0  # frames appended here since the last ack
        with trio.CancelScope() as waited:  # one scope, its deadline moved: none made per frame
            while True:
                if buffer is None:
                    try:
                        buffer = free_buffers.receive_nowait()
                    except trio.WouldBlock:
                        waited.deadline = math.inf  # outside the read timeout: the disk may be slow
                        moved_at = -math.inf
                        buffer = await free_buffers.receive()
                now = trio.current_time()
                if now - moved_at >= slack_s:
                    waited.deadline = now + timeout_s
                    moved_at = now
                if unacked and reader.buffered_bytes < protocol.DATA_HEADER.size:
                    # frames appended here are acked before the receiver may wait on the
                    # socket: at once when no next header is here, and after a CONFIRM or a
                    # heartbeat that was that header (no data frame follows to carry the ack)
                    await self._send_ack(stream)
                    unacked = 0
                header = protocol.parse_data_header(await reader.exactly(protocol.DATA_HEADER.size))
                data = buffer[:header.size]
                await reader.exactly_into(data)
                if header.is_confirm:
                    self._master_confirm_offset = max(self._master_confirm_offset, header.offset)
                    self._publish_confirm_offset()
                    continue
                if header.is_heartbeat:
                    self._master_max_offset = max(self._master_max_offset, header.offset)
                    continue
                protocol.check_data(header, data)
                offset = header.offset
                entry = protocol.place_frame(master_epochs, offset, header.size, expected)
                expected = offset + header.size
                self._master_max_offset = max(self._master_max_offset, expected)
                if self._applier_idle and header.size <= INLINE_APPEND_BYTES_MAX \
                        and entry.epoch == self.epoch_file.last_epoch:
                    unacked = await self._append_here(stream, offset, data, unacked)
                    continue   # the buffer is free again
                unacked = 0
                self._applier_idle = False   # it has a frame to take now, ahead of any other
                try:
                    frames.send_nowait((offset, entry, data, buffer))
                except trio.WouldBlock:
                    waited.deadline = math.inf
                    moved_at = -math.inf
                    await frames.send((offset, entry, data, buffer))
                buffer = None
        raise HaProtocolError(f"nothing from the master for at least "
                              f"{round(self.settings.read_timeout_ms * (1 - READ_TIMEOUT_SLACK))} ms "
                              f"(read_timeout_ms {self.settings.read_timeout_ms})")

    async def _append_here(self, stream, offset: int, data: memoryview, unacked: int) -> int:
        """Append a checked frame in the receiver's step (the applier waits with nothing
        queued, so the log ends at ``offset``). Its ack goes before the receiver next waits
        on the socket (``_receive_frames``), so while more frames are already here one ack
        covers them all, ``ACK_FRAMES_MAX`` frames at most. Returns the frames appended
        since the last ack."""
        store = self.store
        if offset != store.max_offset:
            raise HaProtocolError(f"frame at {offset}, but this log ends at {store.max_offset}")
        store.append(offset, data, wake_dispatch=False)
        self.appended_by_receiver += 1
        self._undispatched.set()
        self._received_bytes += len(data)
        self._publish_confirm_offset()
        unacked += 1
        if unacked >= ACK_FRAMES_MAX:
            await self._send_ack(stream)
            return 0
        return unacked

    async def _send_ack(self, stream) -> None:
        """Ack the log's end. The applier and the receiver both ack, one write at a time. An
        ack the socket takes whole (the usual case) is no scheduling point, so the two meet
        only while one waits in a partial write: the other then leaves its ack to that one,
        which acks the log's end again once its write is done (what it names is appended
        then too), rather than wait for it. No lock: a trio Lock's acquire and release cost
        more than the write on every ack."""
        if self._ack_writing:
            self._ack_again = True
            return
        self._ack_writing = True
        try:
            while True:
                self._ack_again = False
                await send_now(stream, protocol.ack(self.store.max_offset))
                if not self._ack_again:
                    return
        finally:
            self._ack_writing = False

    async def _apply_frames(self, stream, frames: trio.MemoryReceiveChannel,
                            free_buffers: trio.MemorySendChannel) -> None:
        """Write checked frames at the log's end, in order, and ack at once, unless the next
        one already waits (then one ack covers both, ``ACK_FRAMES_MAX`` frames at most); ack
        the log's end every ``ack_interval_ms`` without frames. While it waits with nothing
        queued the receiver appends small frames itself (``_applier_idle``)."""
        store = self.store
        interval_s = self.settings.ack_interval_ms / 1000
        unacked = 0  # frames applied since the last ack
        while True:
            try:
                frame = frames.receive_nowait()
            except trio.WouldBlock:
                frame = None
                self._applier_idle = True
                try:
                    with trio.move_on_after(interval_s):
                        frame = await frames.receive()
                finally:
                    self._applier_idle = False
            if frame is None:
                await self._send_ack(stream)
                continue
            offset, entry, data, buffer = frame
            if offset != store.max_offset:
                raise HaProtocolError(f"frame at {offset}, but this log ends at {store.max_offset}")
            if entry.epoch != self.epoch_file.last_epoch:
                # the term is recorded before its first byte lands, so no byte is ever dated
                # with an older term than the one that wrote it
                await trio.to_thread.run_sync(self.epoch_file.append, entry.epoch, entry.start_offset)
            if len(data) > INLINE_APPEND_BYTES_MAX:
                await trio.to_thread.run_sync(partial(store.append, offset, data, wake_dispatch=False))
            else:
                store.append(offset, data, wake_dispatch=False)
            self._undispatched.set()
            self._received_bytes += len(data)
            free_buffers.send_nowait(buffer)
            self._publish_confirm_offset()
            unacked += 1
            # the ack follows the append in the same step: what it names is in this log
            if unacked >= ACK_FRAMES_MAX or frames.statistics().current_buffer_used == 0:
                await self._send_ack(stream)
                unacked = 0

    def _publish_confirm_offset(self) -> None:
        """The store's confirm offset up to the master's, within what this log holds (a
        confirm offset only counts for bytes this replica has from this master)."""
        store = self.store
        confirm = min(self._master_confirm_offset, store.max_offset)
        if confirm > store.confirm_offset:
            store.publish_confirm_offset(confirm)
            if self.on_confirm_advanced is not None:
                self.on_confirm_advanced()

    @property
    def frames_by_thread(self) -> int:
        """Frames appended by follow threads (follow_thread.py), the running one's included."""
        follower = self._follower
        return self._thread_frames + (follower.frames if follower is not None else 0)

    @property
    def passes_by_thread(self) -> int:
        """Dispatch passes follow threads ran or asked for, the running one's included."""
        follower = self._follower
        return self._thread_passes + (follower.passes if follower is not None else 0)

    def statistics(self) -> HaClientStatistics:
        max_offset = self.store.max_offset
        master_max_offset, received_bytes = self._master_max_offset, self._received_bytes
        follower = self._follower
        if follower is not None:
            master_max_offset = max(master_max_offset, follower.master_max_offset)
            received_bytes += follower.received_bytes
        return HaClientStatistics(
            master_ha_address=self.settings.master_ha_address, master_node_id=self._master_node_id,
            master_epoch=self._master_epoch, connected=self._connected, max_offset=max_offset,
            master_max_offset=master_max_offset, lag_bytes=max(0, master_max_offset - max_offset),
            sessions=self._sessions, reconnects=self._reconnects, truncated_bytes=self._truncated_bytes,
            resets=self._resets, received_bytes=received_bytes, last_error=self._last_error)


async def serve_ha_client(client: HAClient, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Follow the master until cancelled; ``task_status.started(client)`` at once."""
    await client.run(task_status=task_status)
