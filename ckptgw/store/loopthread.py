"""An asyncio event loop on a thread of its own, which trio code awaits on.

aiobotocore's HTTP layer (aiohttp) needs asyncio; the filesystem runs on trio. Each call is a
task on this loop whose end wakes trio through its thread-safe ``run_sync_soon``, so no worker
thread blocks per call, and a cancel from trio cancels the task and waits for it to end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import trio

CANCEL_WAIT = 5.0  # seconds a cancelled request may take to end on the asyncio side
T = TypeVar("T")
log = logging.getLogger(__name__)


def _unretrieved(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The loop's handler of errors nobody awaited. A connection that breaks while aiohttp
    sends a request's body also ends the task that sends it, which nobody awaits: the
    request itself fails with the same error, and the one retry place retries it and says so.
    That second report is logged at DEBUG, not as asyncio's ERROR with a traceback (on a
    flaky network every reset would look like a crash in the log); anything else keeps
    asyncio's own handling."""
    if isinstance(context.get("exception"), ConnectionError):
        log.debug("%s: %r", context.get("message"), context["exception"])
        return
    loop.default_exception_handler(context)


class LoopThread:
    """An asyncio event loop on a thread of its own, and a way for trio to await on it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.loop.set_exception_handler(_unretrieved)
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="s3-asyncio", daemon=True
        )
        self._thread.start()

    async def run(self, make: Callable[[], Awaitable[T]]) -> T:
        """Await ``make()`` on the asyncio loop. Cancelled from trio, it cancels the asyncio
        task and waits (up to ``CANCEL_WAIT`` seconds) until that task has ended, so a request
        cancelled here is no longer in flight when this returns: a delete of the same key
        after a cancelled PUT cannot be overtaken by it on our side."""
        token = trio.lowlevel.current_trio_token()
        done = trio.Event()
        running: list[asyncio.Task[T]] = []

        async def job() -> T:
            task = asyncio.current_task()
            assert task is not None
            running.append(task)
            return await make()

        def finished(_: object) -> None:
            # The future is done once the task has ended (or was cancelled before it began):
            # one wake-up of trio per call, for its result and for a cancel alike.
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(done.set)

        fut = asyncio.run_coroutine_threadsafe(job(), self.loop)
        fut.add_done_callback(finished)
        try:
            await done.wait()
        except BaseException:
            if running:  # started: cancel it and wait for it to end
                self.loop.call_soon_threadsafe(running[0].cancel)
                with trio.CancelScope(shield=True), trio.move_on_after(CANCEL_WAIT):
                    await done.wait()
            fut.cancel()
            raise
        return fut.result()

    def close(self) -> None:
        def stop() -> None:
            # What still runs (the watchdog's sweeper, between two looks) ends first: the
            # cancels are handled in the loop's next turn, before the stop queued after them.
            for task in asyncio.all_tasks(self.loop):
                task.cancel()
            self.loop.call_soon(self.loop.stop)

        self.loop.call_soon_threadsafe(stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self.loop.close()
