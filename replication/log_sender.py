"""The master's senders: the log cut into data frames and written to each slave.

    senders = LogSenders(store, epochs, chunk_bytes_max=..., heartbeat_interval_ms=...)
    await senders.stream(stream, replica, first_ack)   # a task per slave connection
    senders.notify_appended()                           # after a local write, on the trio thread

A sender task that has sent the whole log parks. A put that grows the log then writes the
new frame to each parked sender's socket itself, in ``notify_appended`` (``write_now``: no
scheduling point), and the sender stays parked: a caught-up slave gets a one-at-a-time
put's bytes with no task woken on the master. The task is woken only for what the put
cannot finish at once: the socket did not take the whole frame (the rest is left to the
task, which sends it before anything else), the slave is more than ``DIRECT_SEND_BYTES_MAX``
behind, the frame ends at an epoch boundary before the log's end, the stream is not a
socket stream, or the write failed (the task raises the error). The put path never writes
while the task is not parked, so only one of them writes to a socket at a time.

The task sends everything else: the backlog (frames of whole records, at most
``chunk_bytes_max``, never across a segment or an epoch boundary; views of the mapping;
behind by more than ``INLINE_READ_BYTES_MAX`` read and checksummed in a worker thread, the
next one while the one before is sent), a CONFIRM frame when the confirm offset moved
(it leads the next data frame, in the same write; a frame of its own only after
``IDLE_POLL_MS`` without data frames), and a heartbeat after
``heartbeat_interval_ms`` without a frame. A parked task also looks at the log every
``IDLE_POLL_MS``, for a writer that did not call ``notify_appended``.

Senders at the same offset share a frame: the last one read on the trio thread (its CRC
taken once) is served again to a sender asking at the same offset with the same bound
while the log's end has not moved, as with two caught-up slaves (a master's log is only
appended to within a term; a cut makes a new LogSenders). A frame, its header and a
CONFIRM before it go in one ``writev``, not concatenated first.
"""

from __future__ import annotations

import logging
import threading

import trio

from . import protocol
from .epochs import EpochEntry, next_epoch_start
from .errors import HaProtocolError
from .store_protocol import ReplicaStore
from .sync_state import ReplicaProgress
from .transport import send_now, writev_now

log = logging.getLogger(__name__)

# A sender at most this far behind the log's end reads and checksums its frame inline (recent
# bytes: in the page cache, a CRC of 2 MiB is ~0.2 ms); further behind, in a worker thread
# (older bytes may need the disk). At 256 KiB, batched sends (8 batches of ~70 KB in flight)
# crossed it on most batches, and each thread hop hands the GIL over twice: 2 MiB took a
# master with two slaves from 26.3-28.1k to 30.3-32.2k msgs/s (three alternated pairs).
INLINE_READ_BYTES_MAX = 2 * 1024 * 1024
DIRECT_SEND_BYTES_MAX = 64 * 1024     # a put writes a parked sender's frame up to this
IDLE_POLL_MS = 10                      # fallback when a writer did not call notify_appended


class _Sender:
    """One slave connection's sending state, shared by its task and the put path."""

    __slots__ = ("stream", "replica", "offset", "sent_confirm", "heartbeat_due", "wake", "pending", "error",
                 "direct")

    def __init__(self, stream, replica: ReplicaProgress, offset: int) -> None:
        self.stream = stream
        self.replica = replica
        self.offset = offset               # where the next frame starts
        self.sent_confirm = -1             # the confirm offset this slave was last told
        self.heartbeat_due = 0.0
        self.wake = trio.Event()           # set: the parked task must run
        self.pending: memoryview | None = None    # what a direct send left unsent
        self.error: BaseException | None = None   # what a direct send met
        self.direct = type(stream) is trio.SocketStream   # the put path may write to it


class LogSenders:
    """Every slave connection's sender of one master term."""

    def __init__(self, store: ReplicaStore, epochs: list[EpochEntry], *, chunk_bytes_max: int,
                 heartbeat_interval_ms: int) -> None:
        self.store = store
        self.epochs = epochs
        self.chunk_bytes_max = chunk_bytes_max
        self.heartbeat_s = heartbeat_interval_ms / 1000
        self._parked: dict[_Sender, None] = {}   # tasks waiting on their ``wake``, in park order
        self.direct_sends = 0    # frames a put wrote itself
        self.task_wakes = 0      # parked tasks woken for the log (not their idle poll)
        self.frames_built = 0    # frames read and checksummed on the trio thread (``_frame``)
        self.frames_shared = 0   # frames ``_frame`` served again to another sender
        self._last_frame: tuple[tuple[int, int, int], tuple[bytes, memoryview]] | None = None
        self._loop_thread = threading.get_ident()   # made on the trio thread: the put path's

    @property
    def parked(self) -> int:
        return len(self._parked)

    # --- the put path --------------------------------------------------------------------
    def notify_appended(self) -> None:
        """The log grew: each parked sender's new frame goes out now, from this call; a
        sender whose frame cannot is woken instead."""
        if self._parked:
            for sender in tuple(self._parked):
                self._send_direct(sender)

    def appended_run(self, offset: int, data: bytes) -> None:
        """The store's ``run_listener``: records just placed at ``offset`` go to each parked
        sender that has sent the log up to there, as ``notify_appended`` would send them, but
        from the put's own bytes (no read of the log back) and before the rest of the put's
        work: the slaves start sooner (one send at a time, alternated probe runs: p50 175 /
        172 / 170 / 177 -> 164 / 165 / 170 / 168 us). Anything else waits for
        ``notify_appended``; so does a write on another thread than the loop's."""
        if not self._parked or len(data) > DIRECT_SEND_BYTES_MAX or threading.get_ident() != self._loop_thread:
            return
        try:
            if len(data) > self.frame_limit(offset):
                return
            frame = None
            for sender in tuple(self._parked):
                if sender.offset == offset and sender.direct:
                    if frame is None:
                        frame = (protocol.data_header(offset, data), memoryview(data))
                    self._send_direct(sender, frame)
        except Exception:   # a put's bytes are in the log: its write must not fail for this
            log.exception("sending a put's records at %d to the slaves failed", offset)

    def _send_direct(self, sender: _Sender, frame: tuple[bytes, memoryview] | None = None) -> None:
        store = self.store
        offset = sender.offset
        behind = store.max_offset - offset
        if behind <= 0:
            return
        if sender.direct and behind <= DIRECT_SEND_BYTES_MAX:
            try:
                header, data = self._frame(offset) if frame is None else frame
                # before the write: an ack past sent_offset is a protocol error
                sender.replica.sent_offset = sender.offset = offset + len(data)
                confirm = self._confirm_frame(sender)
                parts = (confirm, header, data) if confirm else (header, data)
                sent = writev_now(sender.stream, parts)
            except Exception as error:   # the task raises it, in its session
                sender.error = error
            else:
                sender.heartbeat_due = trio.current_time() + self.heartbeat_s
                self.direct_sends += 1
                if sent < len(confirm) + len(header) + len(data):
                    sender.pending = _unsent(parts, sent)
                elif sender.offset >= store.max_offset:
                    return   # sent whole and caught up: the task stays parked
        self.task_wakes += 1
        self._wake(sender)

    def _wake(self, sender: _Sender) -> None:
        del self._parked[sender]   # from now on the task writes: the put path keeps off
        sender.wake.set()

    # --- the task ------------------------------------------------------------------------
    async def stream(self, stream, replica: ReplicaProgress, offset: int) -> None:
        """Send the log from ``offset`` for as long as the connection lives."""
        sender = _Sender(stream, replica, offset)
        try:
            await self._run(sender)
        finally:
            self._parked.pop(sender, None)

    def _confirm_frame(self, sender: _Sender) -> bytes:
        """A CONFIRM frame if the confirm offset moved since this slave was told, else b""."""
        confirm = self.store.confirm_offset
        if confirm == sender.sent_confirm:
            return b""
        sender.sent_confirm = confirm
        return protocol.confirm(confirm)

    async def _run(self, sender: _Sender) -> None:
        store = self.store
        stream = sender.stream
        sender.heartbeat_due = trio.current_time() + self.heartbeat_s
        ahead = None  # the next frame, read while the one before was sent
        parked = False  # since the last send: a send that yields nothing must not hog the loop
        while True:
            if sender.error is not None:
                raise sender.error
            if sender.pending is not None:
                pending, sender.pending = sender.pending, None
                await stream.send_all(pending)
                continue
            offset = sender.offset
            if ahead is None and offset >= store.max_offset:
                now = trio.current_time()
                wait_s = IDLE_POLL_MS / 1000
                if store.confirm_offset != sender.sent_confirm:
                    # while frames flow each one carries it: a CONFIRM frame of its own (a
                    # write, and a wake-up of the slave) only IDLE_POLL_MS after the last frame
                    confirm_due = sender.heartbeat_due - self.heartbeat_s + IDLE_POLL_MS / 1000
                    if now >= confirm_due:
                        await send_now(stream, self._confirm_frame(sender))
                        continue   # it may have waited: look at the log's end again
                    wait_s = confirm_due - now
                if now >= sender.heartbeat_due:
                    await send_now(stream, protocol.heartbeat(store.max_offset))
                    sender.heartbeat_due = now + self.heartbeat_s
                    continue
                # no checkpoint between the look at the log's end above and parking here, so
                # no put on this thread can slip in between unseen
                if sender.wake.is_set():
                    sender.wake = trio.Event()
                wake = sender.wake
                self._parked[sender] = None
                try:
                    with trio.move_on_after(min(wait_s, sender.heartbeat_due - now)):
                        await wake.wait()
                finally:
                    self._parked.pop(sender, None)
                parked = True
                continue
            confirm = self._confirm_frame(sender)
            if ahead is not None:
                header, data = ahead
                ahead = None
            elif store.max_offset - offset > INLINE_READ_BYTES_MAX:
                header, data = await trio.to_thread.run_sync(self.read_frame, offset, self.frame_limit(offset))
            else:
                if not parked:
                    await trio.lowlevel.checkpoint()  # still behind after a send: let the loop run
                header, data = self._frame(offset)
            # before the send: the slave can apply and ack these bytes before the send
            # returns here, and an ack past sent_offset is a protocol error
            sender.replica.sent_offset = sender.offset = offset = offset + len(data)
            header = confirm + header
            if store.max_offset - offset > INLINE_READ_BYTES_MAX:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._send_frame, stream, header, data)
                    ahead = await trio.to_thread.run_sync(self.read_frame, offset, self.frame_limit(offset))
            else:
                await self._send_frame(stream, header, data)
            parked = False
            sender.heartbeat_due = trio.current_time() + self.heartbeat_s

    def frame_limit(self, offset: int) -> int:
        """A frame's size bound at ``offset``: the chunk size, and never past an epoch's end."""
        boundary = next_epoch_start(self.epochs, offset)
        limit = self.chunk_bytes_max
        return limit if boundary is None else min(limit, boundary - offset)

    @staticmethod
    async def _send_frame(stream, header: bytes, data: memoryview) -> None:
        """``header`` (a CONFIRM frame may lead it) and ``data`` in one ``writev``, whatever
        the frame's size; what the socket did not take goes through ``send_all``, the data's
        rest as a view of it (no copy). A batched put's frame (~70 KB) used to go as two
        writes, the second through ``send_all``, which passes through trio's loop even when
        the socket takes everything."""
        sent = writev_now(stream, (header, data))
        if sent < len(header):
            await stream.send_all(memoryview(header)[sent:])
            sent = len(header)
        if sent - len(header) < len(data):
            await stream.send_all(data[sent - len(header):])

    def _frame(self, offset: int) -> tuple[bytes, memoryview]:
        """``read_frame`` at ``offset`` within ``frame_limit``, on the trio thread: the last
        frame read is served again while its offset, bound and the log's end are the same."""
        limit = self.frame_limit(offset)
        key = (offset, limit, self.store.max_offset)
        last = self._last_frame
        if last is not None and last[0] == key:
            self.frames_shared += 1
            return last[1]
        frame = self.read_frame(offset, limit)
        self._last_frame = (key, frame)
        self.frames_built += 1
        return frame

    def read_frame(self, offset: int, limit: int) -> tuple[bytes, memoryview]:
        """The data frame at ``offset``: its header (CRC included) and its bytes, a view of the
        log's mapping (no copy; the CRC taken here is what the slave checks them against)."""
        data = self.store.read(offset, limit)
        if not data:
            raise HaProtocolError(f"no record at {offset} below the log's end {self.store.max_offset}")
        return protocol.data_header(offset, data), data


def _unsent(parts: tuple, sent: int) -> memoryview:
    """What a write of ``parts`` that took ``sent`` bytes left (a copy: only a partial write
    pays it)."""
    return memoryview(b"".join(parts))[sent:]
