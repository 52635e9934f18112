"""What the hot paths read of the running trio loop, looked up once in its runner (trio
0.2x-0.3x on Linux): its epoll descriptor, whether events wait there, how many tasks are
runnable, and the seconds to its next deadline (what ``current_statistics`` reports for the
last two, which it finds by counting every registered descriptor's waiters: 2 µs a call
with a few connections, 39 µs with a thousand). The node's busy polling
(node/server/busy_poll.py) and a client waiting for its own reply (node/client/connection.py)
use it to wait for a socket without a pass of trio's loop when nothing else needs the loop;
``busy_poll`` is such a wait that does not sleep.
"""

from __future__ import annotations

import math
import os
import select
import time
from collections.abc import Callable


class LoopView:
    __slots__ = ("epoll_fd", "ready", "runnable", "real_clock", "_run_queue", "_next_deadline", "_now")

    def __init__(self, epoll_fd: int, run_queue, deadlines, clock, real_clock: bool = True) -> None:
        poller = select.poll()
        poller.register(epoll_fd, select.POLLIN)
        self.epoll_fd = epoll_fd
        self.ready = poller.poll          # ready(0): events wait for the loop
        self.runnable = run_queue.__len__
        self.real_clock = real_clock      # the loop's clock is the system's (not a test's mock clock)
        self._run_queue = run_queue
        self._next_deadline = deadlines.next_deadline
        self._now = clock.current_time

    def seconds_to_next_deadline(self) -> float:
        return self._next_deadline() - self._now()

    def poll_with(self, socket) -> Callable[[float], list[tuple[int, int]]]:
        """``poll(timeout_ms)`` of ``socket`` and this loop's epoll descriptor in one system
        call: the ready ones as (fd, events), the socket's first."""
        poller = select.poll()
        poller.register(socket, select.POLLIN)
        poller.register(self.epoll_fd, select.POLLIN)
        return poller.poll

    @classmethod
    def of_current_run(cls) -> "LoopView | None":
        """The view of the trio loop this runs in, or None where trio keeps these elsewhere."""
        try:
            from trio._core._run import GLOBAL_RUN_CONTEXT, SystemClock
            runner = GLOBAL_RUN_CONTEXT.runner
            epoll = runner.io_manager._epoll
            if not isinstance(epoll, select.epoll):   # select.epoll itself is Linux only
                return None
            return cls(epoll.fileno(), runner.runq, runner.deadlines, runner.clock,
                       type(runner.clock) is SystemClock)
        except (ImportError, AttributeError):
            return None


def busy_poll(poll: Callable[[float], list], window_s: float, clock: Callable[[], float] = time.perf_counter,
              give_way: Callable[[], None] = os.sched_yield) -> list:
    """``poll(0)`` until it finds something ready or ``window_s`` has passed; what it found.

    The CPU is yielded after each empty turn (``sched_yield`` returns at once when nothing
    else waits for it): on a machine with few CPUs, what the caller waits for is often a
    process woken onto the very CPU it polls on (a sync send's slave), which runs at once
    instead of after the window. Measured, one send at a time to a master with two all-ack
    slaves (warm, in-process stamps on one clock): the node's write of the reply, which
    wakes the client, 16 -> 8 µs, and from there to the caller's read 27 -> 7 µs; for a
    client CPU a send of about 40 -> 120 µs. What it costs besides, on a small machine, is
    the tail: README, "Busy polling". A client's leader waits with it for ``busy_poll_us``
    (a Producer's option, off by default; node/client/connection.py)."""
    ready = poll(0)
    if ready:
        return ready
    end = clock() + window_s
    while True:
        give_way()
        ready = poll(0)
        if ready or clock() >= end:
            return ready


class ReplyPoll:
    """How long a caller waiting for its one reply busy-polls for it (``busy_poll``), and
    when it does not. A request that follows the last wait by more than ``gap_s`` is not
    polled for: a node whose own poll for requests ended sleeps, and its reply comes late
    (and every process on the way runs cold). A poll that keeps ending before the reply
    comes (a node farther away than the window, a sync flush to a slow disk) only burns
    CPU: after ``misses_max`` such polls in a row the waits sleep at once, ``rest_waits`` of
    them; then one polls again, and a reply caught there brings polling back."""

    __slots__ = ("window_s", "gap_s", "misses_max", "rest_waits", "rests", "_misses", "_resting", "_last",
                 "_clock")

    def __init__(self, window_us: int, gap_s: float = 0.001, misses_max: int = 8, rest_waits: int = 128,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.window_s = window_us / 1e6
        self.gap_s = gap_s
        self.misses_max = misses_max
        self.rest_waits = rest_waits
        self.rests = 0          # times polling stopped for a while
        self._misses = 0        # polls in a row whose window passed without the reply
        self._resting = 0       # waits left to sleep through without polling
        self._clock = clock
        self._last = -math.inf  # when the last wait ended

    def window(self) -> float:
        """Seconds this wait polls (0: it sleeps at once)."""
        if self._resting:
            self._resting -= 1
            return 0.0
        if self._clock() - self._last > self.gap_s:
            return 0.0
        return self.window_s

    def waited(self) -> None:
        """A wait ended (whatever it found): the next request within ``gap_s`` is polled for."""
        self._last = self._clock()

    def polled(self, answered: bool) -> None:
        """What a whole window's poll found: the reply, or nothing."""
        if answered:
            self._misses = 0
            return
        self._misses += 1
        if self._misses >= self.misses_max:
            self._resting = self.rest_waits
            self.rests += 1
