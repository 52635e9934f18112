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
