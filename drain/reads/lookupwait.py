"""How long a lookup waits for the store: the deadline on the lookup path, and its stalls.

A lookup or an opendir may need the store: a listing of the directory (:mod:`drain.reads.listing`)
or the description of an entry (a HEAD, or the first response of its fetch:
:mod:`drain.reads.entries`). Each such request runs in the background, shared by every lookup that
needs it while it runs, and a lookup waits for it at most ``wait`` seconds after the request
started (``store.lookup_wait``): a kernel that holds a directory's lock for a lookup holds
every create in that directory behind it, so a store that stalls one LIST would otherwise
stall a whole save. Past the deadline the caller answers from what the journal knows (what
it may answer is the caller's rule: :meth:`drain.reads.listing.Listings.has_view`); the request
goes on, and what it brings is applied when it completes.

A request a lookup stopped waiting for is a stall. The first stall of an episode is logged at
WARNING, naming the store, its endpoint and the request waited for; the end of the episode
(no stalled request left) at INFO. The counters and :meth:`LookupWait.view` are for
``ckptgw status`` and the metrics.

Retries are not made here: a request on this path is a call of a
:class:`ckptgw.store.retry.RetryingStore` (counted and logged there, like every other retry).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import trio

from ckptgw.fsops.inodes import Inode, InodeTable

log = logging.getLogger(__name__)

DEFAULT_WAIT = 2.0  # seconds; ``store.lookup_wait``


@dataclass(eq=False)
class Pending:
    """One store request on the lookup path, shared by every lookup that needs it."""

    what: str  # what is waited for, e.g. "LIST ckpt/run/" (a key, never a credential)
    started: float = field(default_factory=trio.current_time)  # trio's clock
    done: trio.Event = field(default_factory=trio.Event)
    ok: bool = False  # it completed and its answer was applied
    late: bool = False  # a lookup stopped waiting for it
    # Whether being late means the store is slow (a fetch's first response may be waiting
    # for a free GET slot instead: late, but no stall of the store).
    of_store: bool = True


@dataclass(frozen=True)
class LookupStalls:
    """What status and the metrics may show: whether lookups are waiting less than the store
    needs, since when, on what, and how often they were answered without it."""

    wait: float  # the deadline, seconds
    stalled_since: float | None  # seconds since the epoch; None: nothing stalled now
    stalled_on: str  # the oldest request stalled now, with the store it was sent to
    from_journal: int  # lookups and opendirs answered from the journal past the deadline
    undescribed: int  # lookups answered before their entry's metadata came
    episodes: int  # stall episodes since the mount


class LookupWait:
    """The deadline (``wait``, seconds) and the background the requests run in. ``where``
    names the store and its endpoint in messages: a URL without credentials. Until
    :meth:`run` has started (a test that calls the filesystem directly), requests run in
    their caller's task and are always waited for."""

    def __init__(self, wait: float = DEFAULT_WAIT, where: str = "") -> None:
        self.wait = wait
        self.where = where
        self.from_journal = 0
        self.undescribed = 0
        self.episodes = 0
        self.stalled_since: float | None = None  # time.time() the episode began
        self._stalled: list[Pending] = []  # late and still running, oldest first
        self._nursery: trio.Nursery | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Hold the nursery the requests run in (cancelled with the mount)."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None

    async def start(
        self,
        jobs: dict[int, Pending],
        ino: Inode,
        what: str,
        call: Callable[[Pending], Awaitable[bool]],
        table: InodeTable,
    ) -> Pending:
        """A new job for ``ino``, shared through ``jobs`` while it runs (:meth:`launch`): the
        inode stays in memory meanwhile (the job may outlive the lookup that started it),
        and the job leaves ``jobs`` when it ends."""
        job = jobs[ino.id] = Pending(what)
        ino.pins += 1

        async def run() -> bool:
            try:
                return await call(job)
            finally:
                del jobs[ino.id]
                ino.pins -= 1
                table.release_if_unused(ino)

        await self.launch(job, run)
        return job

    async def launch(self, job: Pending, call: Callable[[], Awaitable[bool]]) -> None:
        """Run ``call`` (True: its answer was applied) for ``job``: in the background once
        :meth:`run` has started, else here. ``job.done`` is set when it ends, however."""
        if self._nursery is not None:
            self._nursery.start_soon(self._run, job, call, True)
        else:
            await self._run(job, call, False)

    async def _run(self, job: Pending, call: Callable[[], Awaitable[bool]], behind: bool) -> None:
        try:
            job.ok = await call()
        except Exception:
            if not behind:
                raise
            # No lookup waits to be told: an error here must not end the mount.
            log.exception("%s failed", job.what)
        finally:
            job.done.set()
            self._ended(job)

    async def join(self, job: Pending, deadline: float | None = None) -> bool:
        """Wait for ``job`` until ``wait`` seconds after it started (or ``deadline``, trio's
        clock, if sooner). True if it is done; False if the caller must answer without it."""
        if job.done.is_set():
            return True
        if self._nursery is None:  # running in a caller's task: nothing goes on without it
            await job.done.wait()
            return True
        until = job.started + self.wait
        if deadline is not None:
            until = min(until, deadline)
        with trio.move_on_at(until):
            await job.done.wait()
        if job.done.is_set():
            return True
        if trio.current_time() >= job.started + self.wait:  # else: the caller's time ran out
            self._late(job)
        return False

    def view(self) -> LookupStalls:
        return LookupStalls(
            wait=self.wait,
            stalled_since=self.stalled_since,
            stalled_on=self.stalled_on,
            from_journal=self.from_journal,
            undescribed=self.undescribed,
            episodes=self.episodes,
        )

    @property
    def stalled_on(self) -> str:
        if not self._stalled:
            return ""
        job = self._stalled[0]
        waited = trio.current_time() - job.started
        return f"{job.what} on {self.where}, {waited:.0f} s so far"

    def _late(self, job: Pending) -> None:
        if job.late or not job.of_store:
            return
        job.late = True
        self._stalled.append(job)
        if self.stalled_since is not None:
            log.debug("%s has not completed in %.1f s either", job.what, self.wait)
            return
        self.stalled_since = time.time()
        self.episodes += 1
        log.warning(
            "the store %s has not completed %s in %.1f s; it goes on in the background, and "
            "lookups no longer wait for it where this node can answer without it (names "
            "added by other nodes meanwhile may not show yet)",
            self.where,
            job.what,
            self.wait,
        )

    def _ended(self, job: Pending) -> None:
        if not job.late:
            return
        self._stalled.remove(job)
        if self._stalled or self.stalled_since is None:
            return
        took = trio.current_time() - job.started
        if job.ok:
            log.info("the store %s answers again (%s took %.1f s)", self.where, job.what, took)
        else:  # its error was logged where it was made
            log.info("%s on %s ended without an answer after %.1f s", job.what, self.where, took)
        self.stalled_since = None
