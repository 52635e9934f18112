"""The store's dispatch, run in the node's trio loop instead of on the dispatcher thread.

    store = MessageStore(config.replace(dispatcher_thread=False))
    store.start()
    await nursery.start(serve_dispatch, store.dispatcher)

A put on the trio thread used to wake the dispatcher thread, and each GIL hand-over
between that thread and the trio thread costs tens of microseconds on a small machine,
on the put's own round trip. Here a put only sets the wake flag and an event; the pass
runs as a trio task, once every other task of the loop is blocked: the replies to the
requests that woke it are written, and the pass runs while the clients read them, with
the caches still warm with the records just written. (On this machine a pass that
follows a millisecond of idle loop costs three to four times the CPU of the same pass
run at once: everything it touches has gone cold.) A loop that stays busy gets its pass
``dispatch_interval_ms`` after the wake at the latest, so the puts of that time share
it (a pass has a fixed cost); the puts in between call nothing (the flag is already
set). Passes are bounded
(``PASS_BYTES_MAX``) with a checkpoint between them, so a backlog (a slave's replicated
bytes, a restart) never holds the loop for long.

Writes from other threads (a slave's replicated appends run in worker threads) hand the
wake over with ``TrioToken.run_sync_soon``, which never blocks them.
``MessageStore.wait_dispatched`` (role changes, %SYS%CONFIG replay) runs passes itself in
the thread that waits; passes are serialised by the dispatcher's lock either way. Dispatch
listeners (long polls) run on the thread of the pass: the node's listener notifies at once
on the trio thread and hands over from any other. When the task ends (the node stopping),
``MessageStore.shutdown`` dispatches the rest itself.
"""

from __future__ import annotations

import threading

import trio
import trio.testing

from store.dispatcher import Dispatcher, WakeFlag
from store.errors import invariant

# Bytes of CommitLog per pass in the loop: about a millisecond of work for 1 KiB messages
# (0.8 ms for 1,000 of them here), so other requests wait at most that long behind a
# backlog's dispatch. A pass has a fixed cost of about 0.1 ms (numpy calls), so under load
# fewer, bigger passes cost less per message: 256 KiB passes took 1.3 us a message.
PASS_BYTES_MAX = 1024 * 1024


class LoopCaller:
    """Calls a function in the trio loop it was made in: at once on the loop's thread, else
    handed over with ``TrioToken.run_sync_soon``, which never blocks the calling thread.
    Once the loop has finished, the call is dropped (the node is stopping)."""

    def __init__(self) -> None:
        self.token = trio.lowlevel.current_trio_token()
        self.loop_thread = threading.get_ident()

    def call(self, function, *args) -> None:
        if threading.get_ident() == self.loop_thread:
            function(*args)
            return
        try:
            self.token.run_sync_soon(function, *args)
        except trio.RunFinishedError:
            pass


class _LoopWake:
    """A ``WakeFlag`` listener for a trio loop: sets an event in the loop, from any thread (a
    wake dropped while the node stops is harmless: shutdown dispatches what is left)."""

    def __init__(self) -> None:
        self._caller = LoopCaller()
        self.event = trio.Event()

    def __call__(self) -> None:
        self._caller.call(self._set)

    def _set(self) -> None:
        self.event.set()

    async def wait(self) -> None:
        await self.event.wait()
        self.event = trio.Event()


async def serve_dispatch(dispatcher: Dispatcher, *, pass_bytes_max: int = PASS_BYTES_MAX,
                         task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Run ``dispatcher``'s passes in this trio loop until cancelled, each wake followed by
    a pass as soon as the loop is idle, ``interval_s`` later at the latest. The dispatcher must have no thread of its own
    (StoreConfig ``dispatcher_thread: false``)."""
    invariant(not dispatcher.threaded and isinstance(dispatcher.wake, WakeFlag),
              "serve_dispatch needs a dispatcher without its thread")
    wake = _LoopWake()
    dispatcher.wake.listen(wake)
    try:
        task_status.started()
        while True:
            # a pass first, also on entry: it clears a flag set before the listener was installed
            # (a writer that finds the flag set calls nothing)
            if dispatcher.dispatch_pass(pass_bytes_max) is None or dispatcher.lag_bytes <= 0:
                # caught up, or stopped (a cut in progress: start() sets the wake) or failed
                await wake.wait()
                # a pass elsewhere (a busy-polling reader's idle_pass) may have taken it all:
                # then the pass at the top only clears the flag, with no wait for an idle loop
                # (a step of this task less a put)
                if dispatcher.lag_bytes > 0:
                    with trio.move_on_after(dispatcher.interval_s):
                        await trio.testing.wait_all_tasks_blocked()  # the loop idle, or interval_s
            else:
                await trio.lowlevel.checkpoint()  # a backlog: let other tasks run between passes
    finally:
        dispatcher.wake.unlisten()


def idle_pass(dispatcher: Dispatcher, pass_bytes_max: int = PASS_BYTES_MAX):
    """A function that runs one pass when the log is ahead of the dispatch and says whether
    it ran one: the pass a connection's reader runs itself before it busy-polls
    (busy_poll.py), when the dispatch task would run it next anyway (the loop has nothing
    else to do)."""
    def run() -> bool:
        return dispatcher.lag_bytes > 0 and dispatcher.dispatch_pass(pass_bytes_max) is not None
    return run
