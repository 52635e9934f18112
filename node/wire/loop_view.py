"""What the hot paths read of the running trio loop, looked up once in its runner (trio
0.2x-0.3x on Linux): its epoll descriptor, whether events wait there, how many tasks are
runnable, and the seconds to its next deadline (what ``current_statistics`` reports for the
last two, which it finds by counting every registered descriptor's waiters: 2 µs a call
with a few connections, 39 µs with a thousand). The node's busy polling
(node/server/busy_poll.py) and a client waiting for its own reply (node/client/connection.py)
use it to wait for a socket without a pass of trio's loop when nothing else needs the loop.
"""

from __future__ import annotations

import select
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
