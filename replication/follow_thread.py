"""A slave's streaming phase in a thread of its own, over a blocking socket.

    follower = FollowThread(store, epoch_file, welcome.epochs, thread_socket(stream),
                            reader.take_buffered(), read_timeout_ms=..., ack_interval_ms=...,
                            dispatch_delay_ms=..., master_max_offset=..., signal=...)
    await trio.to_thread.run_sync(follower.run, abandon_on_cancel=False)   # until it fails
    follower.stop()              # from the loop, on cancellation: the thread leaves

Once the handshake and the resync are done (in trio, replication/ha_client.py), a session
over a TCP socket hands its socket to this thread, which reads data frames, checks them,
appends them and acks, with plain blocking calls: a frame costs the kernel's wake-up of
this thread and a few dozen Python calls, where the event loop cost the slave an epoll
wake-up, a pass of trio's scheduler and about 200 Python calls. Measured on the 2-core
machine (a master with two all-ack slaves, one send at a time, alternated runs): each
slave's CPU a send 250-340 -> 165-190 µs, the send's p50 895-1,140 -> 795-880 µs.

What the thread does, frame by frame, is what the loop's receiver does (``HAClient``): a
frame must start exactly at the log's end, carry the CRC it claims and lie inside one of
the master's epochs (``protocol.place_frame``); the first frame of a new epoch records that
epoch durably before its bytes are written; nothing of a frame lands unless all of it
checked. Frames that arrived together share one ack (``ACK_FRAMES_MAX`` at most); the ack
follows their append, so what it names is in this log. With no frame it acks the log's end
every ``ack_interval_ms``. Silence of ``read_timeout_ms`` (no byte at all: a socket timeout,
no deadline moved per frame) ends the session.

The thread also indexes what it appended (the store's dispatch: ConsumeQueue and
IndexFile), ``dispatch_delay_ms`` after the first frame not yet indexed, so the frames of
that time share one pass, and only at a point where it would otherwise wait for the
socket: after the ack of the frames it has, never between a frame and its ack. A pass that
is due waits there for a quiet spell (``DISPATCH_QUIET_S`` without a byte: the socket's
timeout meanwhile), so it runs between bursts of frames instead of in front of the next
one; frames that keep coming for another delay make it overdue, and it then runs in pieces
(``DISPATCH_PIECE_BYTES``) with a look at the socket between them, so a frame waits for a
piece, not for a pass. While frames wait for a pass and it is not due yet, the socket's
timeout is the delay, so a socket that went quiet still gets theirs, at most twice the
delay after the first of them. Passes are bounded (``DISPATCH_PASS_BYTES``): behind by
more, it runs whole ones, one at each such point while frames keep coming and back to back
while the socket is quiet. Before, the loop's thread ran these passes at its own time, and
a pass (about a millisecond for the 50 one-message frames of a delay, cold) held the GIL
while the next send's frame waited: the slaves' passes every 50 ms were a quarter of the
single-send p99 (no pass at all: p99 2.5 -> 1.8 and 3.1 -> 2.3 ms); run on the thread
right after an ack, they still met the next send's frame (37 of the 60 sends over the p98
of a `hastore bench replicate --peer redis` run overlapped one): docs/sync-performance.md,
stop 30.

What stays on the loop's thread: ``on_confirm_advanced``, told after the pass that indexed
the frames the confirm offset covers (readers on a slave see a message once it is
dispatched, so the confirm offset moving sooner would wake them for nothing), or at once
when every frame is indexed already. The thread tells the loop (``signal``) once until the
loop re-arms it. A pass that cannot run now (another thread's is under way, or the
dispatcher is stopped or failed) is tried again a delay later; frames a session leaves
unindexed when it ends are the loop's (``undispatched``). The store is thread-safe for
this, as it is for its own dispatcher thread: appends take the commit log's write lock, the
dispatch pass its own, and dispatch listeners hand over to the loop from any thread.

Ending it: any failure ends the thread with its error; ``stop()`` (from the loop, when the
session is cancelled) shuts the socket down, so the thread leaves at its next read or write
and ``run`` returns quietly. An append in progress finishes first: once ``run`` has returned
the log no longer moves.
"""

from __future__ import annotations

import os
import select
import socket
import struct
import time
from typing import Callable

import trio

from . import protocol
from .epochs import EpochFile, next_epoch_start
from .errors import HaProtocolError
from .store_protocol import ReplicaStore
from .transport import PeerClosed

# received at once into one buffer: headers and the frames of a batched load (64 KiB-600
# KiB); a larger frame (a catch-up's, up to DATA_FRAME_BYTES_MAX) is received into its own
RECEIVE_BUFFER_BYTES = 1024 * 1024
# frames appended at most under one ack when they arrive together (the loop's path too)
ACK_FRAMES_MAX = 4
# the log indexed at most in one pass between frames (as a node's loop passes: about a
# millisecond of work for 1 KiB messages)
DISPATCH_PASS_BYTES = 1024 * 1024
# A pass that is due waits for the socket to be quiet this long, so that it runs between
# bursts of frames, not in front of the next one.
DISPATCH_QUIET_S = 0.001
# Overdue (frames kept coming for another dispatch_delay_ms) and behind by no more than a
# pass, the thread indexes one piece of this much each time it would wait for the socket,
# then waits: a frame that arrives meanwhile waits for one piece (~70 µs warm), not for the
# pass (~250 µs warm for 300 records of 1 KiB, a millisecond and more cold). One piece, not
# pieces until a frame comes: the next frame may wait for another process that shares this
# CPU (the other slave, whose ack the master needs first), and pieces back to back held it
# off for up to 2 ms (docs/sync-performance.md, stop 33). Pieces cost more a record (2.5
# against 0.85 µs: the parser's and the index's numpy calls pay off on larger passes).
DISPATCH_PIECE_BYTES = 32 * 1024
# A frame is appended with the pages ahead read in on the store's own thread (read_ahead)
# only while the master's log runs further ahead than this: catching up, megabytes at a
# time, where that thread keeps the allocation off this one. A slave that keeps up lets its
# pwrite allocate the pages: with the log's page-cache window (store.commitlog_cache_bytes)
# the memory is reused, and the read-ahead only zero-fills pages the write then fills again.
# Six 5-s probe blocks, two alternated pairs, batched: each slave ~0.7-1.0 us of CPU a
# message less (its read-ahead thread 0.4-0.5, and its flush thread's releases cheaper).
READ_AHEAD_BEHIND_BYTES = 8 * 1024 * 1024
_TIMEVAL = struct.Struct("@ll")   # struct timeval: seconds, microseconds


def thread_socket(stream: trio.SocketStream) -> socket.socket:
    """A plain socket for a thread, on a duplicate of ``stream``'s descriptor (the stream
    itself is not touched by the thread; closing either leaves the other open)."""
    return socket.socket(fileno=os.dup(stream.socket.fileno()))


class FollowThread:
    """One session's frames, read, checked, appended and acked on a thread of its own."""

    def __init__(self, store: ReplicaStore, epoch_file: EpochFile, master_epochs, sock: socket.socket,
                 buffered: bytes, *, read_timeout_ms: int, ack_interval_ms: int, dispatch_delay_ms: int,
                 master_max_offset: int, signal: Callable[[], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``buffered``: what the handshake's reader received past the WELCOME. ``signal``
        (called from the thread, once until the loop re-arms it: ``signalled = False``)
        tells the loop the confirm offset moved (``confirm_moved``) and what it covers is
        indexed."""
        if len(buffered) > RECEIVE_BUFFER_BYTES:
            raise HaProtocolError(f"{len(buffered)} bytes arrived with the handshake, more than a frame")
        self.store = store
        self.epoch_file = epoch_file
        self.master_epochs = master_epochs
        self.sock = sock
        self.read_timeout_s = read_timeout_ms / 1000
        self.ack_interval_s = ack_interval_ms / 1000
        self.dispatch_delay_s = dispatch_delay_ms / 1000
        self.signal = signal
        self.clock = clock
        # a wait on the socket ends at least this often (for the idle ack and the read timeout)
        self._wait_s = min(self.read_timeout_s, self.ack_interval_s)
        self._timeout_s = 0.0   # the socket's receive timeout now (set only when it changes)
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        self._readable = poller.poll     # _readable(0): bytes wait in the socket
        # when the frames appended and not yet indexed are due for a pass (None: none wait)
        self._dispatch_due: float | None = None
        self._unindexed_bytes = 0   # not indexed yet: what the last pass left, and what came since
        self._view = memoryview(bytearray(RECEIVE_BUFFER_BYTES))
        self._view[:len(buffered)] = buffered
        self._start = 0
        self._end = len(buffered)
        self._large: memoryview | None = None      # for frames over the receive buffer
        self._last_byte_at = clock()
        self._acked_at = clock()
        self.stopping = False
        # news for the loop, and whether it was told since it last looked
        self.signalled = False
        self.confirm_moved = False
        # what statistics read (plain ints, written by the thread only)
        self.master_max_offset = master_max_offset
        self.master_confirm_offset = 0
        self.received_bytes = 0
        self.frames = 0
        self.passes = 0          # dispatch passes this thread ran or asked for (dispatch_now calls)

    @property
    def undispatched(self) -> bool:
        """Frames this thread appended wait for a dispatch pass (the loop runs it once the
        thread has ended)."""
        return self._dispatch_due is not None

    def stop(self) -> None:
        """End the thread at its next read or write (from any thread; idempotent)."""
        self.stopping = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass   # not connected any more: the thread is leaving anyway

    def run(self) -> None:
        """Follow the stream until it fails (raises why) or ``stop`` is called (returns)."""
        sock = self.sock
        try:
            # blocking calls that the kernel times out (SO_RCVTIMEO, SO_SNDTIMEO): a socket
            # with a Python timeout polls before each read and each write, a system call
            # and a hand-over of the GIL more per frame and per ack
            sock.setblocking(True)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _timeval(self.read_timeout_s))
            self._set_timeout(self._wait_s)
            self._follow()
        except BaseException:
            if not self.stopping:
                raise
        finally:
            try:
                sock.setblocking(False)   # a duplicate shares the loop's stream's flags: as they were
            except OSError:
                pass   # closed already
            sock.close()

    # --- the loop of frames -------------------------------------------------------------
    def _follow(self) -> None:
        store = self.store
        read_header = protocol.read_data_header
        header_size = protocol.DATA_HEADER.size
        largest_buffered = RECEIVE_BUFFER_BYTES - header_size
        view = self._view
        expected = store.max_offset   # where the next frame must start
        unacked = 0                   # frames appended since the last ack
        # frames ending at or before this lie in the epoch last placed (and recorded): they
        # need no look at the epochs (-1: none placed yet)
        epoch_end = -1
        while True:
            if self._end - self._start < header_size:
                if unacked:
                    self._ack()
                    unacked = 0
                self._fill(header_size, may_dispatch=True)
            offset, size, crc = read_header(view, self._start)
            self._start += header_size
            if not size:   # a heartbeat or a CONFIRM: no bytes follow
                self._control(offset, crc)
                continue
            if size <= largest_buffered:
                if self._end - self._start < size:
                    self._fill(size)
                data = view[self._start:self._start + size]
                self._start += size
            else:
                data = self._receive_large(size)
            protocol.check_crc(offset, data, crc)
            if offset != expected or offset + size > epoch_end:
                epoch_end = self._place(offset, size, expected)
            store.append(offset, data, wake_dispatch=False,
                         read_ahead=self.master_max_offset - offset - size > READ_AHEAD_BEHIND_BYTES)
            expected = offset + size
            if expected > self.master_max_offset:
                self.master_max_offset = expected
            self.received_bytes += size
            self._unindexed_bytes += size
            self.frames += 1
            unacked += 1
            # the ack follows the append at once when no other frame waits behind it (the
            # master waits for it); the dispatch and the confirm offset come after
            if unacked >= ACK_FRAMES_MAX or self._end - self._start < header_size:
                self._ack()
                unacked = 0
            if self._dispatch_due is None:
                self._dispatch_due = self.clock() + self.dispatch_delay_s
            self._publish_confirm_offset()

    def _place(self, offset: int, size: int, expected: int) -> int:
        """Check that a frame starts at the log's end (``expected``) inside one master epoch,
        recording that epoch first when it is new here (HaProtocolError if not); return
        where the epoch ends (frames up to there need no look again)."""
        entry = protocol.place_frame(self.master_epochs, offset, size, expected)
        if entry.epoch != self.epoch_file.last_epoch:
            # the term is recorded before its first byte lands
            self.epoch_file.append(entry.epoch, entry.start_offset)
        boundary = next_epoch_start(self.master_epochs, offset)
        return protocol.OFFSET_MAX if boundary is None else boundary

    def _control(self, offset: int, crc: int) -> None:
        """A size-0 header: a CONFIRM (the master's confirm offset) or a heartbeat (its log's end)."""
        if crc == protocol.CONFIRM_MARK:
            if offset > self.master_confirm_offset:
                self.master_confirm_offset = offset
                self._publish_confirm_offset()
        elif offset > self.master_max_offset:
            self.master_max_offset = offset
        if self.clock() - self._acked_at >= self.ack_interval_s:
            self._ack()   # frames may not flow: the master hears from this slave all the same

    def _publish_confirm_offset(self) -> None:
        """The store's confirm offset up to the master's, within what this log holds; the
        loop is told now if every frame is indexed, else after the pass that indexes them."""
        store = self.store
        confirm = min(self.master_confirm_offset, store.max_offset)
        if confirm > store.confirm_offset:
            store.publish_confirm_offset(confirm)
            self.confirm_moved = True
            if self._dispatch_due is None:
                self._tell_loop()

    def _dispatch(self, quiet: bool) -> None:
        """Dispatch passes on this thread: whole passes (``DISPATCH_PASS_BYTES``) while
        they are due and no byte waits in the socket, once the socket is ``quiet`` or when
        behind by more than a pass; otherwise one piece (``DISPATCH_PIECE_BYTES``)."""
        while True:
            whole = quiet or self._unindexed_bytes > DISPATCH_PASS_BYTES
            left = self.store.dispatch_now(DISPATCH_PASS_BYTES if whole else DISPATCH_PIECE_BYTES)
            self.passes += 1
            now = self.clock()
            if left is None:   # no pass could run now (another thread's is under way): later
                self._dispatch_due = now + self.dispatch_delay_s
            else:
                self._unindexed_bytes = left
                if left <= 0:
                    self._dispatch_due = None
            if self._dispatch_due is None or self._dispatch_due > now or not whole or self._readable(0):
                break
        if self.confirm_moved and self._dispatch_due is None:
            self._tell_loop()

    def _tell_loop(self) -> None:
        """``signal`` the loop of news, unless it was told since it last re-armed it."""
        if not self.signalled:
            self.signalled = True
            self.signal()

    def _ack(self) -> None:
        self.sock.sendall(protocol.ack(self.store.max_offset))
        self._acked_at = self.clock()

    # --- reading ------------------------------------------------------------------------
    def _receive_into(self, target: memoryview, *, may_dispatch: bool = False) -> int:
        """One read into ``target`` (at least a byte); the session's end on silence or close.
        While the socket is silent it acks the log's end every ``ack_interval_ms``. With
        ``may_dispatch`` (no frame waits for its ack) a dispatch pass that is due runs
        first, and a wait ends for it when it comes due."""
        sock = self.sock
        while True:
            if may_dispatch and self._dispatch_due is not None:
                now = self.clock()
                if now < self._dispatch_due:
                    if self._timeout_s > self.dispatch_delay_s:
                        self._set_timeout(self.dispatch_delay_s)   # a quiet socket wakes it for the pass
                elif now - self._last_byte_at >= DISPATCH_QUIET_S:
                    self._dispatch(quiet=True)
                elif now - self._dispatch_due >= self.dispatch_delay_s:
                    self._dispatch(quiet=False)    # overdue: frames keep coming
                elif self._timeout_s > DISPATCH_QUIET_S:
                    self._set_timeout(DISPATCH_QUIET_S)
            try:
                got = sock.recv_into(target)
            except BlockingIOError:   # SO_RCVTIMEO: silence for the timeout
                now = self.clock()
                silent_s = now - self._last_byte_at
                if silent_s >= self.read_timeout_s:
                    raise HaProtocolError(f"nothing from the master for {self.read_timeout_s * 1000:.0f} ms "
                                          f"(read_timeout_ms)") from None
                if now - self._acked_at >= self.ack_interval_s:
                    self._ack()
                # the next wait ends at the read timeout if that comes before the next ack
                self._set_timeout(min(self._steady_timeout_s(), self.read_timeout_s - silent_s))
                continue
            if got == 0:
                raise PeerClosed("the peer closed the connection")
            self._last_byte_at = self.clock()
            steady_s = self._steady_timeout_s()
            if self._timeout_s != steady_s:
                self._set_timeout(steady_s)
            return got

    def _steady_timeout_s(self) -> float:
        """The socket's timeout between frames: ``_wait_s``; the dispatch delay while frames
        wait for a pass that is not due yet, so a quiet socket still gets theirs (at most
        twice the delay after the first of them); ``DISPATCH_QUIET_S`` once it is due (bytes
        came since), so a quiet spell that long runs it."""
        due = self._dispatch_due
        if due is not None:
            if self._last_byte_at >= due:   # due: it waits for a quiet spell
                return DISPATCH_QUIET_S
            if self.dispatch_delay_s < self._wait_s:
                return self.dispatch_delay_s
        return self._wait_s

    def _set_timeout(self, seconds: float) -> None:
        """The socket's receive timeout (a system call each time: only when it changes)."""
        seconds = max(0.001, seconds)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(seconds))
        self._timeout_s = seconds

    def _fill(self, count: int, *, may_dispatch: bool = False) -> None:
        """At least ``count`` bytes buffered from ``_start`` (``count`` fits the buffer)."""
        view = self._view
        if self._start == self._end:
            self._start = self._end = 0
        elif self._start + count > RECEIVE_BUFFER_BYTES:
            pending = self._end - self._start
            view[:pending] = view[self._start:self._end]
            self._start, self._end = 0, pending
        while self._end - self._start < count:
            self._end += self._receive_into(view[self._end:], may_dispatch=may_dispatch)

    def _receive_large(self, size: int) -> memoryview:
        """A frame over the receive buffer: what is buffered of it, the rest received straight
        into a buffer of its own."""
        if self._large is None:
            self._large = memoryview(bytearray(protocol.DATA_FRAME_BYTES_MAX))
        target = self._large[:size]
        buffered = self._end - self._start
        target[:buffered] = self._view[self._start:self._end]
        self._start = self._end = 0
        while buffered < size:
            buffered += self._receive_into(target[buffered:])
        return target


def _timeval(seconds: float) -> bytes:
    """A socket timeout option's value (struct timeval)."""
    whole = int(seconds)
    return _TIMEVAL.pack(whole, int((seconds - whole) * 1_000_000))
