"""A versioned signal: how many times something happened, and a wait for the next time.

One primitive for every "wake me when it changes" of the code: the cache's room (bytes were
freed, or a file became clean: fsops.cache), the changes of what is durable (fsops.state),
and the scheduler's uploads ended and store operations wanted (drain.uploads.scheduler). A waiter
notes ``version``, looks at what it waits for, and waits for a version past the one it noted:
a happening between its look and its wait is not lost."""

from __future__ import annotations

import math

import trio


class Signal:
    """Something happened: ``version`` counts the times, and a waiter that noted the version
    waits for the next time (or returns at once if it has happened since)."""

    def __init__(self) -> None:
        self.version = 0
        self._next: trio.Event | None = None  # made by the first waiter: none, no cost

    def fire(self) -> None:
        self.version += 1
        if self._next is not None:
            self._next.set()
            self._next = None

    async def wait(self, since: int, timeout: float = math.inf) -> None:
        """Return once it has fired after ``since`` (at once if it already has), or after
        ``timeout`` seconds."""
        if self.version != since:
            return
        if self._next is None:
            self._next = trio.Event()
        with trio.move_on_after(timeout):
            await self._next.wait()
