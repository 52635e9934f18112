"""One pipelined connection to a node: requests carry an opaque, replies are matched to it."""

from __future__ import annotations

import math
import select
from collections import deque
from contextlib import asynccontextmanager
from dataclasses import dataclass

import trio

from store.errors import exception_leaves

from ..errors import AuthError, ConnectionLostError, FrameError, NodeError, RequestTimeoutError, UnsentError
from ..wire import protocol
from ..wire.address import address_problem, split_address
from ..wire.auth import auth_digest
from ..wire.loop_view import LoopView, ReplyPoll, busy_poll
from ..wire.protocol import FrameDecoder, RequestCode, ResponseCode
from ..wire.socket_io import read_now, receive_some, write_now
from .values import error_from_reply

RECEIVE_BYTES = 256 * 1024
CONNECT_TIMEOUT_MS = 5_000
REQUEST_TIMEOUT_MS = 30_000
SEND_TIMEOUT_MS = 30_000    # to write one request frame (a node that stops reading)
RETIRE_POLL_S = 0.005       # how often a connection closing after its last reply looks
# a leader's wait in place goes back through trio at least this often: a task of the loop's
# current batch (trio shows only the next batch's) waits at most this long for it
LEADER_WAIT_S_MAX = 0.001
LEADER_ALONE_SUBMITS = 2    # a wait in place only once this many requests in a row were alone
BUSY_POLL_US_MAX = 1_000    # a wait in place's busy poll fits in it (LEADER_WAIT_S_MAX)


def checked_busy_poll_us(busy_poll_us: int) -> int:
    """``busy_poll_us`` (a Connection's, a Producer's), or ValueError outside its bounds."""
    if not 0 <= busy_poll_us <= BUSY_POLL_US_MAX:
        raise ValueError(f"busy_poll_us must be in [0, {BUSY_POLL_US_MAX}], not {busy_poll_us!r}")
    return busy_poll_us


@dataclass(frozen=True, slots=True)
class ConnectionStatistics:
    """How a connection's replies were read: by the waiting callers themselves (leaders),
    or by its background task after a leader handed the role over."""

    requests_submitted: int
    reads_by_callers: int
    reads_in_background: int
    handovers: int
    waits_in_place: int = 0   # leaders' waits for the socket in poll(2), not through trio's loop
    busy_polled: int = 0      # those of them whose reply came while the leader busy-polled
    busy_poll_rests: int = 0  # times the leaders stopped polling for a while, their polls missing (ReplyPoll)


# --- connection --------------------------------------------------------------------------
# Who reads a connection's replies. One task at a time reads (trio's rule for a stream):
#
#   None         nobody: the next caller that waits for a reply reads itself (the leader)
#   a _Pending   that request's caller reads until its own reply is in, handing the
#                replies of others to their waiters, then gives the role up
#   _BACKGROUND  the connection's own task (Connection.run) reads for the waiters
#
# A caller alone on the connection so gets its reply with one wake-up (the socket's)
# instead of two (the reading task's, then its own). A leader that leaves while other
# requests wait for replies (answered, timed out, cancelled) hands the role to the
# background task, which reads while any request waits and then gives it up.
_BACKGROUND = "background"


class _Pending:
    __slots__ = ("opaque", "connection", "event", "reply", "error", "timeout_ms")

    def __init__(self, opaque: int, connection: "Connection") -> None:
        self.opaque = opaque
        self.connection = connection
        self.event = trio.Event()
        self.reply: dict | None = None
        self.error: Exception | None = None
        self.timeout_ms: int | None = None   # set while the connection's deadline task watches it

    async def wait(self, timeout_ms: int | None = REQUEST_TIMEOUT_MS) -> dict:
        """The SUCCESS reply's map; raises the typed error, or RequestTimeoutError."""
        if not self.event.is_set():
            connection = self.connection
            if timeout_ms is not None:
                connection._watch_deadline(self, timeout_ms)
            if connection._reader is None:
                await connection._read_until_answered(self)
            else:
                await self.event.wait()
        if self.error is not None:
            raise self.error
        if self.reply.get("code") != ResponseCode.SUCCESS:
            raise error_from_reply(self.reply)
        return self.reply


class Connection:
    """One connection to a node; many requests in flight at once, matched by opaque."""

    def __init__(self, stream: trio.abc.Stream, address: str, decoder: FrameDecoder, *,
                 busy_poll_us: int = 0) -> None:
        self.stream = stream
        self.address = address
        self._decoder = decoder
        # a socket stream is read and written here without trio's stream wrapper
        self._socket = stream.socket if type(stream) is trio.SocketStream else None
        self._idle_poll = select.poll()   # has the node sent anything (or closed) since the last read?
        # a leader's wait for its reply in place (``_waited_in_place``): the socket, and the
        # loop's descriptor (any other I/O, a timer's or a thread's wake-up ends the wait)
        self._loop: LoopView | None = None
        self._leader_poll = None
        busy_poll_us = checked_busy_poll_us(busy_poll_us)
        self._reply_poll = ReplyPoll(busy_poll_us) if busy_poll_us else None
        if self._socket is not None:
            self._idle_poll.register(self._socket.fileno(), select.POLLIN)
            loop = LoopView.of_current_run()
            if loop is not None and loop.real_clock:
                self._loop = loop
                self._leader_poll = loop.poll_with(self._socket.fileno())
        self._pending: dict[int, _Pending] = {}
        self._reader: _Pending | str | None = None      # who reads replies (see above)
        self._leader_scope: trio.CancelScope | None = None
        self._background_wanted = trio.lowlevel.ParkingLot()
        # reply deadlines: per timeout, (deadline, opaque) in the order they were set, so each
        # queue's head expires first; one task sleeps until the earliest head (see run)
        self._deadlines: dict[int, deque[tuple[float, int]]] = {}
        self._deadline_scope: trio.CancelScope | None = None
        self._deadline_idle_s = math.inf
        self._next_opaque = 1
        self._send_lock = trio.Lock()
        self._scope: trio.CancelScope | None = None
        self.closed_error: Exception | None = None
        self._caller_reads = self._background_reads = self._handovers = self._waits_in_place = 0
        self._busy_polled = 0
        self._alone_submits = 0
        self._spoke_protocol = False   # a well-formed reply came: the peer is a node's client port

    def statistics(self) -> ConnectionStatistics:
        return ConnectionStatistics(self._next_opaque - 1, self._caller_reads, self._background_reads,
                                    self._handovers, self._waits_in_place, self._busy_polled,
                                    self._reply_poll.rests if self._reply_poll is not None else 0)

    @property
    def closed(self) -> bool:
        return self.closed_error is not None

    async def submit(self, code: RequestCode, **fields) -> _Pending:
        """Send one request; returns its pending reply. Raises ConnectionLostError if not sent.

        A frame is written whole or the connection fails: a write cut short would garble
        every later frame, so the write is shielded from the caller's cancellation and
        bounded by SEND_TIMEOUT_MS instead. While no other write is under way the socket
        is tried directly first (socket_io.py): a frame it takes whole leaves with no
        scheduling point and no cancel scope (the wait for the reply is the checkpoint).

        While nobody reads the connection, what the node sent since the last read is
        looked at first: a connection the node closed is found here, before the request
        is written (so it is surely not sent), not after it (its outcome unknown).
        """
        if self._reader is None and self._socket is not None and self.closed_error is None \
                and self._idle_poll.poll(0):
            self._read_while_idle()
        self._refuse_if_closed()
        opaque = self._next_opaque
        self._next_opaque += 1
        frame = protocol.encode_frame({"code": int(code), "opaque": opaque, **fields})
        # The send lock orders writes that wait. One that does not wait (the socket takes
        # the frame whole, with no checkpoint in between) needs no lock: nobody can see it.
        locked = self._send_lock.locked()
        if locked:
            await self._send_lock.acquire()   # a write is under way: queue behind it, in order
            if self.closed_error is not None:  # it failed meanwhile (its auth refused): not sent
                self._send_lock.release()
                self._refuse_if_closed()
        # requests submitted in a row with no other one waiting (see _waited_in_place)
        self._alone_submits = 0 if self._pending else self._alone_submits + 1
        pending = self._pending[opaque] = _Pending(opaque, self)
        try:
            sent = write_now(self.stream, frame)
            if sent == len(frame):
                return pending
            if not locked:
                self._send_lock.acquire_nowait()  # free: no checkpoint since it was looked at
                locked = True
            with trio.CancelScope(shield=True) as scope:
                scope.deadline = trio.current_time() + SEND_TIMEOUT_MS / 1000
                await self._write_rest(memoryview(frame)[sent:])
            if scope.cancelled_caught:
                self._fail_all(ConnectionLostError(f"connection to {self.address}: a request could not be "
                                                   f"written within {SEND_TIMEOUT_MS} ms"))
                # the node decodes only whole frames: one not written whole took no effect
                pending.error = UnsentError(f"a request to {self.address} could not be written within "
                                            f"{SEND_TIMEOUT_MS} ms; it took no effect")
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as error:
            self._fail_all(ConnectionLostError(f"connection to {self.address} lost while sending: {error}"))
            pending.error = UnsentError(f"connection to {self.address} lost before a request was written whole "
                                        f"({error}); it took no effect")
        finally:
            if locked:
                self._send_lock.release()
        return pending

    def _refuse_if_closed(self) -> None:
        """Raise, before anything is written, if the connection has failed."""
        if self.closed_error is not None:
            if isinstance(self.closed_error, AuthError):
                raise AuthError(str(self.closed_error))  # a new connection would be refused alike
            raise ConnectionLostError(f"connection to {self.address} is closed: {self.closed_error}")

    async def _write_rest(self, data: memoryview) -> None:
        """Write what the socket did not take at once (the caller holds the send lock)."""
        socket = self._socket
        if socket is None:
            await self.stream.send_all(data)
            return
        while data:
            try:
                await trio.lowlevel.wait_writable(socket)
            except trio.ClosedResourceError:
                if socket.fileno() < 0:
                    raise
                continue  # a leader was woken on this socket (see _wake): not closed, wait again
            data = data[write_now(self.stream, data):]

    def forget(self, pending: _Pending) -> None:
        """Stop waiting for ``pending``'s reply (answered, timed out or given up)."""
        self._pending.pop(pending.opaque, None)

    @property
    def in_flight(self) -> int:
        """Requests sent whose reply is still awaited."""
        return len(self._pending)

    async def aclose_when_answered(self, timeout_ms: int = REQUEST_TIMEOUT_MS) -> None:
        """Close once every request in flight is answered, or after ``timeout_ms``. A client
        moving to another node (NOT_MASTER) lets the replies still coming on this connection
        arrive, instead of turning requests that were refused anyway into unknown outcomes."""
        # looked at every few ms: a retiring connection is rare and holds a few requests
        try:
            with trio.move_on_after(timeout_ms / 1000):
                while self._pending and self.closed_error is None:
                    await trio.sleep(RETIRE_POLL_S)
        finally:
            await self.aclose()

    async def request(self, code: RequestCode, reply_timeout_ms: int | None = REQUEST_TIMEOUT_MS, **fields) -> dict:
        """Send a request and wait for its SUCCESS reply (typed errors otherwise)."""
        pending = await self.submit(code, **fields)
        try:
            return await pending.wait(reply_timeout_ms)
        finally:
            self.forget(pending)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Read replies while requests wait and no caller reads (run in a nursery; ``aclose``
        stops it), and time out the requests whose reply is late."""
        with trio.CancelScope() as scope:
            self._scope = scope
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._expire_deadlines)
                task_status.started()
                try:
                    while True:
                        while self._reader is not _BACKGROUND:
                            await self._background_wanted.park()
                        while self._pending:
                            data = await receive_some(self.stream, RECEIVE_BYTES)
                            self._background_reads += 1
                            self._take(data)
                        self._reader = None
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError,
                        ConnectionLostError, FrameError) as error:
                    self._fail_all(self._lost_error(error))
                nursery.cancel_scope.cancel()
        if self.closed_error is None:
            self._fail_all(ConnectionLostError("connection closed by the client"))

    # --- reading -------------------------------------------------------------------------
    async def _read_until_answered(self, pending: _Pending) -> None:
        """Read as the leader until ``pending`` is answered, failed or timed out; then give
        the role up, to the background task if other requests still wait.

        Bytes read are decoded and their replies handed out before the next checkpoint, so
        a leader that is cancelled loses nobody's reply. The deadline task and
        ``_fail_all`` wake a leader that waits for bytes (see ``_wake``).
        """
        self._reader = pending
        socket = self._socket
        try:
            if socket is not None:
                while not pending.event.is_set():
                    # the reply cannot be there yet (the request just left): wait, then read
                    if not self._waited_in_place():
                        try:
                            await trio.lowlevel.wait_readable(socket)
                        except trio.ClosedResourceError:
                            if socket.fileno() < 0:
                                raise
                            continue  # woken by _wake while the socket is open: the loop's condition says why
                    data = read_now(socket, RECEIVE_BYTES)
                    if data is not None:
                        self._caller_reads += 1
                        self._take(data)
            else:
                with trio.CancelScope() as self._leader_scope:
                    while not pending.event.is_set():
                        data = await self.stream.receive_some(RECEIVE_BYTES)
                        self._caller_reads += 1
                        self._take(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError,
                ConnectionLostError, FrameError) as error:
            self._fail_all(self._lost_error(error))
        finally:
            self._leader_scope = None
            self._reader = None
            if self.closed_error is None and len(self._pending) > (pending.opaque in self._pending):
                self._reader = _BACKGROUND
                self._handovers += 1
                self._background_wanted.unpark()

    def _waited_in_place(self) -> bool:
        """Whether the socket turned readable in a wait right here, in ``poll(2)``, with no
        pass of trio's loop: what a blocking read (redis-py's) does, for a caller that sends
        one request at a time (this one and the one before it each alone on the connection:
        ``LEADER_ALONE_SUBMITS``), while the loop has nothing else to do (no task runnable,
        no event waiting). The wait ends at any I/O the loop watches, at its next deadline,
        or after ``LEADER_WAIT_S_MAX``; one that ends without the socket's bytes says so and
        the caller waits through trio. Run queue aside, trio does not show the tasks of its
        current batch still to run: those wait for the poll, as for a step of a task that
        computes for a millisecond, hence the bound. What it saves is the pass of trio's
        loop that wakes the leader (a client's CPU a send 51-54 -> 40-46 us). With other
        requests in flight it is not worth that risk: the loop's passes let their replies
        gather (taken in place as each came, a master with two slaves and 8 batches in
        flight ran at 78-88k msgs/s instead of 123-151k).

        The wait's first ``busy_poll_us`` are polled without sleeping (``busy_poll``): a
        reply that comes then finds the caller running, not asleep on a vCPU that halted;
        polls that keep missing their reply stop for a while (``ReplyPoll``)."""
        loop = self._loop
        if loop is None or self._alone_submits < LEADER_ALONE_SUBMITS or len(self._pending) > 1 \
                or loop.runnable() or loop.ready(0):
            return False
        timeout_s = loop.seconds_to_next_deadline()
        if timeout_s <= 0:
            return False
        wait_s = min(timeout_s, LEADER_WAIT_S_MAX)
        polled = []
        window_s = self._reply_poll.window() if self._reply_poll is not None else 0.0
        if window_s:
            polled_s = min(wait_s, window_s)
            polled = busy_poll(self._leader_poll, polled_s)
            wait_s -= polled_s
        ready = polled or (self._leader_poll(wait_s * 1000) if wait_s > 0 else [])
        self._waits_in_place += 1
        answered = bool(ready) and ready[0][0] != loop.epoll_fd   # the socket (registered first, listed first)
        if polled:
            if answered:
                self._busy_polled += 1
                self._reply_poll.polled(True)
        elif window_s and polled_s == window_s:   # a whole window, and nothing came
            self._reply_poll.polled(False)
        if self._reply_poll is not None:
            self._reply_poll.waited()
        return answered

    def _read_while_idle(self) -> None:
        """With nobody reading: take what the node sent (frames, or its close) without waiting."""
        try:
            data = read_now(self._socket, RECEIVE_BYTES)
            if data is not None:
                self._take(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError,
                ConnectionLostError, FrameError) as error:
            self._fail_all(self._lost_error(error))

    def _take(self, data: bytes) -> None:
        """Hand out the replies in ``data``; ConnectionLostError at the end of the stream."""
        if not data:
            raise ConnectionLostError(f"{self.address} closed the connection")
        for reply in self._decoder.feed_strict(data):
            self._on_reply(reply)

    def _lost_error(self, error: Exception) -> NodeError:
        if isinstance(error, ConnectionLostError):
            return error
        if isinstance(error, FrameError) and not self._spoke_protocol:
            # garbage before any reply: not a hastore client port, which took none of the requests
            return UnsentError(f"{not_a_client_port(self.address)} ({error})")
        if isinstance(error, FrameError):
            return ConnectionLostError(f"{self.address} sent a broken frame: {error}")
        return ConnectionLostError(f"connection to {self.address} lost: {error}")

    # --- reply deadlines -----------------------------------------------------------------
    # A cancel scope per request (trio.move_on_after) costs more than the rest of a small
    # request's bookkeeping. Requests of one timeout expire in the order they were sent, so
    # a queue per timeout and one task that sleeps until the earliest head do the same
    # work: in steady traffic that task wakes about once per timeout period, and a new
    # deadline never moves its wake-up (it is later than every earlier one of its timeout).
    def _watch_deadline(self, pending: _Pending, timeout_ms: int) -> None:
        deadline = trio.current_time() + timeout_ms / 1000
        pending.timeout_ms = timeout_ms
        queue = self._deadlines.get(timeout_ms)
        if queue is None:
            queue = self._deadlines[timeout_ms] = deque()
            # with nothing to watch the task sleeps this long: no new deadline is earlier
            self._deadline_idle_s = min(self._deadline_idle_s, timeout_ms / 1000)
        queue.append((deadline, pending.opaque))
        scope = self._deadline_scope
        if scope is not None and deadline < scope.deadline:
            scope.deadline = deadline

    def _drop_answered(self, timeout_ms: int) -> None:
        """Pop the heads of a deadline queue whose requests are answered or forgotten."""
        queue = self._deadlines.get(timeout_ms)
        pending = self._pending
        while queue and queue[0][1] not in pending:
            queue.popleft()

    async def _expire_deadlines(self) -> None:
        while True:
            now = trio.current_time()
            wake_at = now + self._deadline_idle_s  # no deadline set after now is earlier
            for timeout_ms, queue in self._deadlines.items():
                self._drop_answered(timeout_ms)
                while queue and queue[0][0] <= now:
                    _, opaque = queue.popleft()
                    pending = self._pending.pop(opaque, None)
                    if pending is not None:
                        pending.error = RequestTimeoutError(f"no reply within {timeout_ms} ms; the outcome is unknown")
                        self._wake(pending)
                    self._drop_answered(timeout_ms)
                if queue:
                    wake_at = min(wake_at, queue[0][0])
            with trio.CancelScope(deadline=wake_at) as scope:
                self._deadline_scope = scope
                await trio.sleep_forever()
            self._deadline_scope = None

    def _wake(self, pending: _Pending) -> None:
        """Wake ``pending``'s caller: from its event, or from its read if it is the leader.

        A leader on a socket waits in ``wait_readable``; a cancel scope around each such
        wait would cost more than the rest of a request's bookkeeping, so it is woken with
        ``notify_closing``, which wakes the socket's waiters with ClosedResourceError and
        closes nothing. Nobody else waits on the socket then: the background task reads
        only while no leader does, and a write that waits (``_write_rest``) waits again.
        """
        pending.event.set()
        if self._reader is pending:
            if self._socket is not None:
                trio.lowlevel.notify_closing(self._socket)
            else:
                self._leader_scope.cancel()

    def _on_reply(self, reply: object) -> None:
        if not isinstance(reply, dict) or type(reply.get("code")) is not int:
            raise FrameError("a reply without a code")
        self._spoke_protocol = True
        code = reply["code"]
        if code in _AUTH_REFUSALS or (code == RequestCode.AUTH_CHALLENGE and "nonce" in reply):
            # the node reads no request before authentication: none of this connection's took effect
            self._fail_all(_auth_error(self.address, reply))
            return
        opaque = reply.get("opaque")
        pending = self._pending.pop(opaque, None) if isinstance(opaque, int) else None
        if pending is not None:
            pending.reply = reply
            pending.event.set()   # a leader reading its own reply sees it when its read returns
            if pending.timeout_ms is not None:
                self._drop_answered(pending.timeout_ms)
        elif opaque is None and code != ResponseCode.SUCCESS:
            # a connection-level error (bad frame, busy, idle, shed): the node closes the
            # connection. With ``unread`` it says it read no request it has not answered.
            error = error_from_reply(reply)
            self._fail_all(UnsentError(f"{self.address} closed the connection before reading the requests still "
                                       f"waiting ({error}); they took no effect") if reply.get("unread") else error)

    def _fail_all(self, error: Exception) -> None:
        if self.closed_error is None:
            self.closed_error = error
        elif isinstance(self.closed_error, AuthError):
            error = self.closed_error   # the node read nothing on this connection: not "lost"
        pending, self._pending = self._pending, {}
        for item in pending.values():
            item.error = error
            self._wake(item)

    async def aclose(self) -> None:
        if self._scope is not None:
            self._scope.cancel()
        self._fail_all(ConnectionLostError("connection closed by the client"))
        await trio.aclose_forcefully(self.stream)


_AUTH_REFUSALS = frozenset((int(ResponseCode.AUTH_REQUIRED), int(ResponseCode.AUTH_FAILED)))


def not_a_client_port(address: str) -> str:
    return (f"{address} does not speak hastore's client protocol: is it a node's client port (client_address), "
            f"not its HA or metrics port?")


def _auth_error(address: str, reply: dict) -> AuthError:
    if reply.get("code") == RequestCode.AUTH_CHALLENGE:
        return AuthError(f"{address} requires a secret: pass --secret or set HASTORE_SECRET (no request took "
                         f"effect)")
    return AuthError(f"{address} refused authentication: {reply.get('error', 'no reason given')} (no request took "
                     f"effect); check --secret or HASTORE_SECRET")


def sole_error(group: BaseExceptionGroup) -> BaseException:
    """The one exception inside nested groups, or the group itself if there are several.

    The client's context managers run internal nurseries; a caller should see the
    NotMasterError or AuthError it can act on, not a group around it.
    """
    leaves = exception_leaves(group)
    return leaves[0] if len(leaves) == 1 else group


async def connect(address: str, nursery: trio.Nursery, *, secret: str | None = None,
                  connect_timeout_ms: int = CONNECT_TIMEOUT_MS, busy_poll_us: int = 0) -> Connection:
    """Open a Connection whose reply reader runs in ``nursery``. ConnectionLostError if none."""
    problem = address_problem(address)
    if problem is not None:
        raise ConnectionLostError(f"cannot connect to {address!r}: the address {problem}")
    host, port = split_address(address)
    try:
        with trio.fail_after(connect_timeout_ms / 1000):
            stream = await trio.open_tcp_stream(host, port)
    except (OSError, trio.TooSlowError) as error:
        raise ConnectionLostError(f"cannot connect to {address}: {error or 'timed out'}") from None
    return await connect_stream(stream, address, nursery, secret=secret, auth_timeout_ms=connect_timeout_ms,
                                busy_poll_us=busy_poll_us)


async def connect_stream(stream: trio.abc.Stream, address: str, nursery: trio.Nursery, *,
                         secret: str | None = None, auth_timeout_ms: int = CONNECT_TIMEOUT_MS,
                         busy_poll_us: int = 0) -> Connection:
    """A Connection over any trio stream (in-memory streams in tests); answers the auth challenge."""
    decoder = FrameDecoder()
    if secret is not None:
        try:
            with trio.fail_after(auth_timeout_ms / 1000):
                await _answer_challenge(stream, decoder, secret)
        except (trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError, OSError) as error:
            await trio.aclose_forcefully(stream)
            raise AuthError(f"authentication with {address} failed: {type(error).__name__} {error}") from None
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise
    connection = Connection(stream, address, decoder, busy_poll_us=busy_poll_us)
    await nursery.start(connection.run)
    return connection


async def _answer_challenge(stream, decoder: FrameDecoder, secret: str) -> None:
    frames: list = []

    async def next_frame() -> dict:
        while not frames:
            data = await stream.receive_some(RECEIVE_BYTES)
            if not data:
                raise AuthError("the node closed the connection during authentication")
            frames.extend(decoder.feed_strict(data))
        return frames.pop(0)

    challenge = await next_frame()
    if not isinstance(challenge, dict) or type(challenge.get("code")) is not int:
        raise AuthError("the node's first frame is not a hastore auth challenge: is this a node's client port, "
                        "not its HA or metrics port?")
    if challenge.get("code") != RequestCode.AUTH_CHALLENGE or not isinstance(challenge.get("nonce"), bytes):
        raise AuthError("the node sent no auth challenge (is a secret set on it?)")
    await stream.send_all(protocol.encode_frame({"code": int(RequestCode.AUTH), "opaque": 0,
                                                 "digest": auth_digest(secret, challenge["nonce"])}))
    answer = await next_frame()
    if answer.get("code") != ResponseCode.SUCCESS:
        raise AuthError(f"authentication refused: {answer.get('error')}; check --secret or HASTORE_SECRET "
                        f"(no request took effect)")


@asynccontextmanager
async def open_connection(address: str, *, secret: str | None = None, connect_timeout_ms: int = CONNECT_TIMEOUT_MS):
    """``async with open_connection(addr) as connection:`` one Connection, closed on exit."""
    try:
        async with trio.open_nursery() as nursery:
            connection = await connect(address, nursery, secret=secret, connect_timeout_ms=connect_timeout_ms)
            try:
                yield connection
            finally:
                await connection.aclose()
    except BaseExceptionGroup as group:
        raise sole_error(group) from None
