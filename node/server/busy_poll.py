"""Busy polling: a connection's reader keeps reading its socket for a short while
(``busy_poll_us``) before it lets the loop sleep in epoll, as Linux's SO_BUSY_POLL does for
a socket read.

Why: a client that sends one request at a time sends the next one a few tens of
microseconds after it read its reply. A node that sleeps in epoll meanwhile wakes up cold.
On this machine that means the halted vCPU, and caches that other work has taken over. The
request then costs about twice what it costs when it is read at once. Measured with one
client doing single sends: 75 µs of node time per request from wake to reply sent. In
``hastore bench produce`` (8 invocations, each with and without polling) the median single
send took 1.54x a bare trio echo round trip with polling and 1.84x without.

A read by polling is taken only when nothing else needs the loop, so no other connection
and no other task waits for it:
- **Other work at the start.** No task may be runnable but the dispatch task
  (``serve_dispatch``) a put woke: its pass runs here first (``idle_work``), while the
  records just written are still in cache, and the task then finds nothing to do. Any
  other runnable task ends it, even a lone one: the run queue shows only the tasks of the
  loop's next batch, and a lone one there (a sync put's reply task) can mean that tasks of
  this batch still wait (the HA senders the put woke). Polling then held the frames of a
  one-at-a-time sync put back for the whole window: with busy_poll_us 200, a master with
  two all-ack slaves spent 910-950 µs of CPU a single send at a p50 of 1.6-1.7 ms, and
  770-800 µs at 1.4-1.45 ms without that wait (node/bench/sync_compare.py, alternated runs).
  Nor may the reader's step be one of a batch with other tasks (a loop pass that woke the
  reader and a slave's ack reader together): those are in no run queue until the step
  ends. The loop's polled wait counts each batch (``_LoopWaitPolling.batch``); such a
  reader goes through trio once more first.
- **Other I/O during the poll.** The loop's own epoll descriptor is polled with the socket
  (one ``poll(2)`` for both): another connection's request, a replication frame, or a
  wake-up from a thread (all of them registered there) ends the poll at once, unless
  ``ready_work`` takes it (a master's acks, replication/ack_reader.py) and nothing else
  waits then. A sync put's reply then leaves from the poll itself, and the poll goes on for
  the client's next request. While a put waits for its acks (``awaiting``), the dispatch
  pass waits until they came (run first, it held the first ack back).
- **Whatever else waits for the vCPU.** A poll gives its vCPU each turn (``sched_yield``,
  which returns at once when nothing else waits for it) to any thread queued on it, which
  the kernel seldom preempts the poll for or moves to the idle vCPU: a client the reply
  woke there, whose next request cannot come before it runs, or a slave woken there by
  the put's frames. Only while a put has waited less than ``AWAIT_YIELD_AFTER_S`` for its
  acks does the poll keep the vCPU, when the acks of a warm send come.
- **Timers.** The loop's next deadline ends the poll.
- **Time.** A reader that keeps getting requests by polling still passes through trio's
  scheduler at least every ``YIELD_INTERVAL_S`` (a checkpoint, after which it polls again).

What a reader cannot cover, the loop's own waits do (``poll_loop_waits``, the node's
setting; ``_LoopWaitPolling``): while the loop is busy with I/O, its wait for the next
events is polled for up to the same window before it sleeps in epoll. A sync put's reply
leaves from the task that reads the last slave's ack, after the reader's poll gave way to
that ack; without this the master slept until the client's next request.

Costs: up to ``busy_poll_us`` of CPU after each request while the loop is otherwise idle.
A node kept busy by pipelined requests hardly polls (the next request is already there), and
an idle node never does. ``busy_poll_us: 0`` turns
polling off.

The loop's epoll descriptor is not public in trio, and the two figures the checks need
(runnable tasks, next deadline) are public only through ``trio.lowlevel.current_statistics``,
at a cost on every read; ``LoopView`` (node/wire/loop_view.py) looks the three up once in
trio's runner. Where it cannot (another trio version, another platform's I/O backend),
busy polling is off and the node says so once in its log.
"""

from __future__ import annotations

import logging
import os
import select
import time
from collections.abc import Callable
from dataclasses import dataclass

import trio

from ..wire.loop_view import LoopView
from ..wire.socket_io import read_now, receive_some
from .dispatch_loop import serve_dispatch

log = logging.getLogger(__name__)

# A reader that keeps getting its requests by polling goes through trio's scheduler at least
# this often, so the loop's other tasks and timers run.
YIELD_INTERVAL_S = 0.001
_DISPATCH_CODE = serve_dispatch.__code__
# The loop's waits for I/O are polled (``poll_loop_waits``) only within this long of its last
# I/O events: a node that only its timers wake sleeps at once.
LOOP_BUSY_S = 0.001
# A poll gives its vCPU to whatever waits for it (``sched_yield`` each turn; nothing waits: it
# returns at once), except in its first this long while a put waits for its acks: a warm
# send's acks come within ~60 µs. A thread woken onto the vCPU a poll holds was otherwise
# not run until the poll ended (up to ~700 µs, the other vCPU idle; the kernel, 6.18 EEVDF,
# neither preempted the poll nor moved the thread): a slave (docs/sync-performance.md, stop
# 30), or the client its reply woke, which then waited out the poll for its next request
# and the loop's polled wait after it (stop 36).
AWAIT_YIELD_AFTER_S = 0.00005


@dataclass(frozen=True, slots=True)
class BusyPollStatistics:
    reads: int          # reads that found a request by polling (no epoll sleep, no wake-up)
    polls: int          # polls started
    seconds: float      # time spent polling
    loop_polls: int = 0          # waits of the idle loop polled before it slept (``poll_loop_waits``)
    loop_polls_woken: int = 0    # of them, those that I/O ended (the loop did not sleep)
    loop_seconds: float = 0.0    # time the idle loop spent polling
    ready_taken: int = 0         # polls that ``ready_work`` let go on (it took the I/O that came)


class BusyPoll:
    """One node's busy polling, shared by its connections; make it in the node's trio loop."""

    def __init__(self, window_us: int, idle_work: Callable[[], bool] | None = None, *,
                 poll_loop_waits: bool = False, ready_work: Callable[[], bool] | None = None,
                 awaiting: Callable[[], bool] | None = None) -> None:
        """``idle_work`` runs before a poll, once the loop has nothing else to do; it says
        whether it did anything (it may have woken tasks). ``ready_work`` runs when the
        loop's descriptor turns ready during a poll: it takes what it can of that I/O itself
        (a master's acks) and says whether it took anything; while ``awaiting()`` (a put
        waits for its acks) the idle work waits until that I/O came. With ``poll_loop_waits`` the
        loop's own waits for I/O are polled too (``_LoopWaitPolling``) until ``close``."""
        self.window_s = window_us / 1e6
        self.idle_work = idle_work
        self.ready_work = ready_work
        self.awaiting = awaiting
        self._loop: _LoopView | None = None
        self._loop_waits: _LoopWaitPolling | None = None
        if self.window_s > 0:
            self._loop = _LoopView.of_current_run()
            if self._loop is None:
                log.warning("busy polling is off: this trio loop's epoll descriptor, run queue or "
                            "deadlines cannot be found")
                self.window_s = 0.0
            elif poll_loop_waits:
                self._loop_waits = _LoopWaitPolling.install(self.window_s)
        self._reads = self._polls = self._ready_taken = 0
        self._seconds = 0.0

    @property
    def enabled(self) -> bool:
        return self.window_s > 0

    def statistics(self) -> BusyPollStatistics:
        waits = self._loop_waits
        if waits is None:
            return BusyPollStatistics(self._reads, self._polls, self._seconds, ready_taken=self._ready_taken)
        return BusyPollStatistics(self._reads, self._polls, self._seconds, waits.polls, waits.woken, waits.seconds,
                                  self._ready_taken)

    def close(self) -> None:
        """The loop's waits for I/O sleep at once again (idempotent)."""
        if self._loop_waits is not None:
            self._loop_waits.remove()

    def reader(self, stream: trio.SocketStream) -> "PollingReader":
        """The reads of one connection's socket stream, by polling where they may."""
        return PollingReader(self, stream)


class PollingReader:
    """``receive`` reads one socket stream, polling it first where it may."""

    __slots__ = ("_busy", "_stream", "_socket", "_since", "_yield_due", "_poll")

    def __init__(self, busy: BusyPoll, stream: trio.SocketStream) -> None:
        self._busy = busy
        self._stream = stream
        self._socket = stream.socket
        self._since: float | None = None   # when this reader last went through trio
        self._yield_due = False
        # _poll(0): whether the socket or the loop's descriptor is ready (one system call)
        self._poll = None if busy._loop is None else busy._loop.poll_with(stream.socket)

    async def receive(self, max_bytes: int) -> bytes:
        """``stream.receive_some(max_bytes)``, by polling where it may (see ``read``)."""
        data = self.read(max_bytes)
        if data is None and self._yield_due:
            await trio.lowlevel.checkpoint()   # its turn to let the loop run, not to sleep
            data = self.read(max_bytes)
        if data is None:
            data = await receive_some(self._stream, max_bytes)
        return data

    def read(self, max_bytes: int) -> bytes | None:
        """What the socket held or received within the polling window (b"" at its end), or
        None: the caller then waits with ``receive_some``, a scheduling point (or, when
        only its turn to pass through trio came, checkpoints and polls again). Never a
        scheduling point itself. Raises what ``read_now`` raises."""
        busy = self._busy
        self._yield_due = False
        if busy.window_s <= 0:
            return None
        now = time.perf_counter()
        waits = busy._loop_waits
        # its turn through trio: polled reads went on for YIELD_INTERVAL_S, or tasks woken with
        # this one by the loop's last pass still wait in its batch (no run queue shows them)
        if (self._since is not None and now - self._since > YIELD_INTERVAL_S) or \
                (waits is not None and waits.batch > 1):
            self._since = None
            self._yield_due = True
            return None
        if self._since is None:
            self._since = now
        loop = busy._loop
        loop_ready = loop.ready
        # others need the loop: through trio, as receive_some would go (but I/O that
        # ready_work takes, acks that came while the put's frames were being sent, does not)
        if loop.others_runnable() or (loop_ready(0) and not self._take_ready(busy, loop)):
            self._since = None
            return None
        socket = self._socket
        data = read_now(socket, max_bytes)
        if data is not None:
            return data          # a request already waits: no work in between
        # the idle work (a dispatch pass) waits while a put waits for its acks: run now, it
        # would hold the first ack back (the pass took ~10 µs of a ~35 µs wait for it)
        awaiting = busy.awaiting
        idle_due = busy.idle_work is not None
        if idle_due and (awaiting is None or not awaiting()):
            idle_due = False
            if busy.idle_work() and loop.runnable() > 1:
                self._since = None   # the work woke tasks
                return None
        busy._polls += 1
        clock = time.perf_counter
        started = clock()
        end = started + min(busy.window_s, loop.seconds_to_next_deadline())
        poll = self._poll
        epoll_fd = loop.epoll_fd
        yield_at = started + AWAIT_YIELD_AFTER_S
        sched_yield = os.sched_yield
        try:
            while True:
                ready = poll(0)   # [(fd, events)] in the order registered: the socket's first
                if ready:
                    if ready[0][0] != epoll_fd:
                        data = read_now(socket, max_bytes)
                        if data is not None:
                            busy._reads += 1
                            return data
                    if ready[-1][0] == epoll_fd:
                        if not self._take_ready(busy, loop):
                            self._since = None
                            return None
                        # taken here (a master's acks; a put's reply may have left): the poll
                        # starts again, for this connection's next request, within its turn
                        if idle_due and not awaiting():   # idle_due: awaiting is set
                            idle_due = False
                            if busy.idle_work() and loop.others_runnable():
                                self._since = None
                                return None
                        now = clock()
                        end = min(now + busy.window_s, self._since + YIELD_INTERVAL_S,
                                  now + loop.seconds_to_next_deadline())
                now = clock()
                if now >= end:
                    self._since = None
                    return None
                if now >= yield_at or awaiting is None or not awaiting():
                    # a client a reply woke onto this vCPU runs now, not after the poll (its
                    # next request is what this poll waits for); so does a slave queued on it
                    sched_yield()
        finally:
            busy._seconds += clock() - started

    @staticmethod
    def _take_ready(busy: BusyPoll, loop: "_LoopView") -> bool:
        """Whether the poll may go on after the loop's descriptor turned ready: ``ready_work``
        took that I/O, nothing else waits, and no task that needs the loop was woken by it."""
        ready_work = busy.ready_work
        if ready_work is None or not ready_work():
            return False
        busy._ready_taken += 1
        return not loop.others_runnable() and not loop.ready(0)


class _LoopWaitPolling:
    """The trio loop's own waits for I/O, polled for up to a window before it sleeps.

    When every task waits, trio sleeps in ``epoll_wait`` until I/O or a timer, and the
    reader's poll (``PollingReader``) cannot cover that time: a sync put's reply leaves from
    the task that reads the last slave's ack, after the client connection's reader stopped
    polling for that ack. The loop then slept until the client's next request, a few tens
    of microseconds later, and woke on a halted vCPU: on this machine kind about 30 µs from
    the client's write until the master ran (``perf sched``), one of four such wake-ups on a
    single send's path. Polling the wait instead (``epoll_wait`` with no timeout, over and
    over) keeps the master awake between the reply and the next request. Each turn gives the
    vCPU to a thread queued on it (``sched_yield``), as the reader's poll does: the client
    the reply woke there.

    It also counts the tasks of the loop's next batch (``batch``: the run queue once a pass's
    I/O woke its tasks). Trio runs a batch's tasks one step each, and its run queue shows
    only the batch after. A reader that starts a poll in a step of a batch with others holds
    them back for the whole window: the ack readers that the loop's pass woke with it (the
    reader's own turn through trio, ``YIELD_INTERVAL_S``) waited out the poll with a put's
    acks in hand, 2 % of one-at-a-time sync sends at ~470 µs against a p50 of ~200 (stop 36).
    Such a reader passes through trio once more first.

    A wait is polled only while the loop is busy with I/O: when it got I/O events within
    ``LOOP_BUSY_S``. A quiet node, woken by its own timers only, sleeps at once; so does a
    slave whose follow thread (replication/follow_thread.py) does the streaming and only
    wakes the loop now and then: a wake-up from another thread (trio's wake-up sockets) is
    not I/O here. Counted as I/O, a slave's loop polled after each wake its follow thread
    sent, taking the GIL back over and over from that thread: with one wake a frame, each
    slave's loop thread took 37 % of a core. A poll
    ends with the window, at the loop's next deadline, or as soon as any descriptor the loop
    watches is ready (another connection, a slave's ack, a thread's wake-up), which then
    costs no wake-up at all.

    How: trio's runner asks its I/O manager for events with ``get_events(timeout)``; the
    manager's class is swapped for a subclass whose ``get_events`` polls first, and swapped
    back by ``remove``. Only an epoll manager is polled (trio on Linux).
    """

    def __init__(self, manager, base: type, window_s: float) -> None:
        self._manager = manager
        self._base = base
        self.window_s = window_s
        self.batch = 0               # tasks in the loop's current batch (the run queue after its last I/O)
        self.io_at = float("-inf")   # when the loop last got I/O events (perf_counter)
        self.polls = self.woken = 0
        self.seconds = 0.0

    @classmethod
    def install(cls, window_s: float) -> "_LoopWaitPolling | None":
        """Poll the running loop's waits for I/O; None where its I/O manager is not trio's
        epoll one (or is polled already)."""
        try:
            from trio._core._run import GLOBAL_RUN_CONTEXT
            runner = GLOBAL_RUN_CONTEXT.runner
            manager = runner.io_manager
            # the loop's wake-ups from other threads: its I/O manager's own, and the one
            # behind TrioToken.run_sync_soon (trio.to_thread's results, a follow thread's news)
            wakeup_fds = frozenset((manager._force_wakeup_fd, runner.entry_queue.wakeup.wakeup_sock.fileno()))
            run_queue = runner.runq
        except (ImportError, AttributeError):
            return None
        base = type(manager)
        if not isinstance(getattr(manager, "_epoll", None), select.epoll) or \
                getattr(base, "_polled_by", None) is not None:
            return None
        polling = cls(manager, base, window_s)
        manager.__class__ = type(f"Polled{base.__name__}", (base,), {
            "__slots__": (), "_polled_by": polling,
            "get_events": polling._get_events_of(base.get_events, wakeup_fds),
            "process_events": polling._process_events_of(base.process_events, run_queue)})
        return polling

    def remove(self) -> None:
        if type(self._manager) is not self._base:
            self._manager.__class__ = self._base
        self.batch = 0   # no longer counted

    def _process_events_of(self, process_events: Callable, run_queue):
        polling = self

        def counted_process_events(manager, events) -> None:
            process_events(manager, events)
            polling.batch = len(run_queue)   # trio takes the whole run queue as its next batch

        return counted_process_events

    def _get_events_of(self, get_events: Callable, wakeup_fds: frozenset):
        polling = self
        clock = time.perf_counter
        sched_yield = os.sched_yield

        def is_io(events) -> bool:
            """Whether ``events`` (fd, flags) hold I/O, not only a wake-up from a thread."""
            if len(events) == 1:
                return events[0][0] not in wakeup_fds
            return any(fd not in wakeup_fds for fd, _ in events)

        def polled_get_events(manager, timeout: float):
            if timeout <= 0:
                events = get_events(manager, 0)
                if events and is_io(events):
                    polling.io_at = clock()
                return events
            started = clock()
            if started - polling.io_at < LOOP_BUSY_S:
                end = started + min(polling.window_s, timeout)
                polling.polls += 1
                while True:
                    events = get_events(manager, 0)
                    now = clock()
                    if events or now >= end:
                        break
                    sched_yield()   # a thread woken onto this vCPU (the client a reply woke) runs now
                polling.seconds += now - started
                if events:
                    polling.woken += 1
                    if is_io(events):
                        polling.io_at = now
                    return events
                timeout = max(0.0, timeout - (now - started))
            events = get_events(manager, timeout)
            if events and is_io(events):
                polling.io_at = clock()
            return events

        return polled_get_events


class _LoopView(LoopView):
    """The running loop (node/wire/loop_view.py), and whether a task other than the
    dispatch task needs it."""

    __slots__ = ()

    def others_runnable(self) -> bool:
        """Whether a runnable task would wait for a poll: two or more, or one that is not the
        dispatch task (``serve_dispatch``, whose pass ``idle_work`` runs before a poll)."""
        run_queue = self._run_queue
        count = len(run_queue)
        if count != 1:
            return count > 1
        return getattr(run_queue[0].coro, "cr_code", None) is not _DISPATCH_CODE
