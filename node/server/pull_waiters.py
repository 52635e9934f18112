"""The long-polling pulls a node has parked, per queue: woken when a dispatch pass grows
their queue, or all at once when the confirm offset moves."""

from __future__ import annotations

import trio


class PullWaiters:
    """Long-polling pulls parked per queue, woken when the dispatcher grows that queue.

    ``notify`` runs in trio's thread: the node's dispatch passes run there (dispatch_loop.py);
    a pass on another thread hands it over with ``TrioToken.run_sync_soon``, which never
    blocks that thread.
    """

    def __init__(self) -> None:
        self._events: dict[tuple[str, int], trio.Event] = {}
        self.waiting = 0

    def event_for(self, topic: str, queue_id: int) -> trio.Event:
        key = (topic, queue_id)
        event = self._events.get(key)
        if event is None:
            event = self._events[key] = trio.Event()
        return event

    def any_waiting(self, queues) -> bool:
        """Whether a long poll waits on one of ``queues``. Safe from another thread: it only
        reads the table. A long poll parks before it looks at its queue, so a message
        dispatched after that look finds the waiter here."""
        events = self._events
        return any(key in events for key in queues)

    def notify(self, grown_queues) -> None:
        for key in grown_queues:
            event = self._events.pop(key, None)
            if event is not None:
                event.set()

    def notify_all(self) -> None:
        self.notify(list(self._events))
