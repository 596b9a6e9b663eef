"""The drain's scheduler: which file goes to the store when, and what happens after.

It knows files by inode number and key only, and imports nothing of the filesystem but the
versioned :class:`fsops.signal.Signal`: it is the filesystem's :class:`fsops.events.DrainEvents`
(told when a file is quiet, changed, or when store operations were journaled), and it drives a
:class:`Worker` (the engine) that looks at files and uploads them. Time comes from trio's
clock, so tests run it with a fake clock and a fake worker.

Rules:

* A file is due ``settle`` seconds after it was last reported quiet; a file still being
  written or fsynced is held until the next report. A quiet file that is renamed (a save's
  temp file, fsynced, renamed into place) is due at once.
* At most ``max_files`` uploads at once, and never two for one key, nor one for a key that a
  pending store operation touches (the worker's ``busy_keys``).
* A change of a file during its upload cancels the upload; it is due again after the settle
  delay.
* Failures are retried later, in one place (:meth:`Scheduler._failed`): temporary ones after a
  growing delay (up to 5 minutes), permanent ones every ``permanent_retry`` seconds, logged
  once per file and error.
* ``flush`` makes files due now, ahead of all others, and retries failed ones at once. The
  emergency drain (SIGTERM, preemption) flushes everything, newest file first, with up to
  ``max_parts`` uploads at once, and keeps skipping the settle delay for later files.
* Every file in ``_due`` has a current entry in the start queue: both change together in
  :meth:`Scheduler._set_due` and nowhere else (a flush that makes a file urgent queues it
  anew there; urgency is part of the entry).
* No wake-up is lost, and the audit is the net under that, not the mechanism: whenever
  nothing is due now (at most once a second, less often while audits find nothing, but at
  least every AUDIT_SPACING_DIRTY seconds while any file is dirty) the worker's dirty files
  are compared with what is uploading and queued (:meth:`Scheduler.audit`). A file that is
  dirty and quiet (no writer, no fsync) yet neither, at two audits in a row, is a bug: it is
  logged as an error (``bug: ...``; the tests fail on it) and queued at once.
"""

from __future__ import annotations

import enum
import heapq
import itertools
import logging
import math
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import trio

from ckptgw.fsops.signal import Signal
from ckptgw.store.interface import StoreError

log = logging.getLogger(__name__)


SMALL_FILE = 4 << 20  # up to this size a file takes the small files' lane
# With one lane full, due files are looked at for the other lane up to this many: a burst of
# thousands of small files does not cost a look at each of them every time one ends.
SCAN = 32
# Seconds between two audits (an audit reads every dirty file): AUDIT_SPACING after one that
# found a suspect, doubled after each that finds nothing, up to AUDIT_SPACING_DIRTY while any
# file is dirty (a lost file is found within seconds, at two audits in a row) and up to
# AUDIT_SPACING_MAX while none is (nothing to lose).
AUDIT_SPACING = 1.0
AUDIT_SPACING_DIRTY = 4.0
AUDIT_SPACING_MAX = 60.0


@dataclass(frozen=True)
class ScheduleConfig:
    settle: float = 0.2
    max_files: int = 4
    emergency_files: int = 8  # uploads at once during the emergency drain
    permanent_retry: float = 60.0
    max_small_files: int = 16  # small files (<= SMALL_FILE) uploading at once, besides max_files
    # While files keep being finished less than ``settle`` apart (a sharded save), due files
    # wait, each for at most this many seconds (0: never): the save keeps the cores.
    yield_to_saves: float = 0.0


class Ready(NamedTuple):
    """A file that may be uploaded now: its mtime (for ordering) and size (small files have a
    lane of their own). Its key is asked for only once its lane has room
    (:meth:`Worker.key`): a look is cheap, and a scan passes over many files."""

    mtime_ns: int
    size: int = 0


class Hold(enum.Enum):
    GONE = "gone"  # clean, unlinked or no longer there: nothing to do
    WRITING = "writing"  # open for writing: its last release reports it quiet again
    SYNCING = "syncing"  # an fsync runs: its end reports it quiet again


class Worker(Protocol):
    def look(self, inode: int) -> Ready | Hold:
        """Whether a due file can be uploaded now."""

    def key(self, inode: int) -> str:
        """The key a file that :meth:`look` found ready goes to."""

    def dirty(self) -> list[int]:
        """Every file waiting to be drained (for a flush of everything)."""

    def busy_keys(self) -> set[str]:
        """Keys that pending store operations read or write."""

    def begin(self, inode: int, key: str) -> None:
        """Take a file :meth:`look` found ready for ``key``: from now on a change of it is
        reported (``changed``). Called in the same step as ``look``, so nothing comes in
        between."""

    async def upload(self, inode: int, key: str) -> bool:
        """Upload a file taken by :meth:`begin`; True if it is clean now, False if it changed
        meanwhile (also when cancelled for that change: the worker cleans up after the
        stale upload). Raises StoreError when the store refused."""


@dataclass
class _Running:
    key: str
    scope: trio.CancelScope
    small: bool = False
    changed: bool = False


class Scheduler:
    def __init__(self, config: ScheduleConfig) -> None:
        self.config = config
        self._due: dict[int, float] = {}  # inode -> trio time it may start
        # The due files in start order, (not urgent, due time, seq, inode), with stale
        # entries skipped when they surface: a file's entry is current while ``_due`` and
        # ``_urgent`` still say what it says. A start looks at the head only, so a burst of
        # thousands of small files costs O(log n) per file, not a sort per upload.
        self._queue: list[tuple[bool, float, int, int]] = []
        self._seq = itertools.count()
        self._times: list[tuple[float, int]] = []  # (due time, inode): the next wake-up
        self._sleep_until = math.inf  # when the loop wakes up by itself
        self._last_written = -math.inf  # when a file was last reported quiet
        self._last_inode = 0  # that file
        self._others_written = -math.inf  # when a file other than that one last was
        self._excused = False  # that file's save ended with its rename: its reports no burst
        self._renamed: set[int] = set()  # dirty files renamed since their upload last began
        self._hold_until = -math.inf  # due files wait for a save in progress until then
        self._small = 0  # small files uploading now
        self.yielded = 0  # times due files waited for a save in progress
        self._failures: dict[int, int] = {}
        self._running: dict[int, _Running] = {}
        self._urgent: set[int] = set()  # flushed: before everything else, no settle delay
        self._mtime: dict[int, int] = {}  # for the emergency order, looked up once
        self.emergency: str | None = None  # why everything drains now, newest first
        self.errors: dict[int, str] = {}  # inode -> why its last upload failed
        self.dirty_since: dict[int, float] = {}  # inode -> wall time it was first reported
        self._wake = trio.Event()
        self._ended = Signal()  # an upload ended: a key may be free
        self.ops_wanted = Signal()  # store operations were journaled, or a flush retries them
        self._worker: Worker | None = None
        self._flush_all = False
        self._audited = -math.inf  # when the last audit ran
        self._audit_spacing = AUDIT_SPACING  # until the next one may run
        self._suspects: set[int] = set()  # unqueued at the last audit: lost if again now
        self.lost_wakeups = 0  # files the audit found dirty, quiet and unqueued (bugs)

    # -- DrainEvents: what the filesystem reports (trio thread, never blocks) -----------------

    def _set_due(self, inode: int, due: float, *, urgent: bool = False) -> None:
        """The one place a file is queued: ``_due`` and its entry in ``_queue`` change
        together (an entry is current while both say the same due time and urgency), so an
        inode in ``_due`` always has a current entry (:meth:`_unqueued` checks it)."""
        if urgent:
            self._urgent.add(inode)
        self._due[inode] = due
        heapq.heappush(self._queue, (inode not in self._urgent, due, next(self._seq), inode))
        heapq.heappush(self._times, (due, inode))
        if due < self._sleep_until or inode in self._urgent or self.emergency is not None:
            self._wake.set()  # otherwise the loop wakes up in time by itself

    def _activity(self) -> None:
        """A file changed: something may be dirty now, so the next audit comes within
        AUDIT_SPACING_DIRTY seconds, however long the audits found nothing before (a
        report lost after a quiet hour is found within seconds too)."""
        if self._audit_spacing > AUDIT_SPACING_DIRTY:
            self._audit_spacing = AUDIT_SPACING_DIRTY
            if self._audited + AUDIT_SPACING_DIRTY < self._sleep_until:
                self._wake.set()

    def written(self, inode: int) -> None:
        self._activity()
        self.dirty_since.setdefault(inode, time.time())
        if inode != self._last_inode:
            self._others_written, self._last_inode = self._last_written, inode
        now = self._last_written = trio.current_time()
        self._excused = inode in self._renamed  # renamed while still open: quiet now
        self._set_due(inode, now if self._excused else now + self.config.settle)

    def changed(self, inode: int) -> None:
        self._activity()
        self._renamed.discard(inode)  # unlinked, or changing again
        run = self._running.get(inode)
        if run is not None:
            run.changed = True
            run.scope.cancel()

    def store_ops_added(self) -> None:
        self.ops_wanted.fire()
        self._wake.set()

    def renamed(self, inode: int) -> None:
        # Due now if it waits out its settle delay; not a retry's wait, nor a file uploading
        # (its upload ends, and the rename's move follows it). One still open for writing
        # (its RELEASE may even come after the RENAME) is due as soon as it is reported quiet.
        self._renamed.add(inode)
        if inode == self._last_inode:  # its own save is over: a burst is other files'
            self._excused = True
        due, now = self._due.get(inode), trio.current_time()
        waiting = inode in self._failures or inode in self._running
        if due is not None and due > now and not waiting:
            self._set_due(inode, now)

    def wake(self) -> None:
        """Look at the due files again (a key became free)."""
        self._wake.set()

    # -- what operators ask for ------------------------------------------------------------------

    def flush(self, inodes: Iterable[int] | None = None) -> None:
        """Drain these files (every dirty file of the journal if None) now, before the
        others. A file whose upload runs keeps it; if it was reported quiet again meanwhile,
        its next round is due now, first. Any file may be named: one the scheduler holds
        nothing for (no report reached it) is queued too."""
        if inodes is None:
            if self._worker is None:
                self._flush_all = True  # before run(): the dirty files are not known yet
            inodes = list(self._due) if self._worker is None else self._worker.dirty()
        now = trio.current_time()
        for inode in inodes:
            self._failures.pop(inode, None)
            due = self._due.get(inode)
            if inode in self._running and due is None:
                self._urgent.add(inode)  # no queue entry to renew: its next one is urgent
            else:
                self._set_due(inode, now if due is None else min(due, now), urgent=True)
        self.store_ops_added()  # failed store operations are retried at once too

    def start_emergency(self, reason: str) -> None:
        """Drain everything now, newest first, at full concurrency (SIGTERM, preemption)."""
        if self.emergency is None:
            log.warning("emergency drain (%s): newest files first, no settle delay", reason)
            self.emergency = reason
        self.flush()

    def uploading(self) -> dict[int, str]:
        """inode -> key of every upload under way."""
        return {inode: r.key for inode, r in self._running.items()}

    def waiting(self) -> int:
        """Files scheduled but not uploading."""
        return len(self._due)

    async def key_free(self, key: str) -> None:
        """Return once no upload writes ``key``."""
        while key in {r.key for r in self._running.values()}:
            await self._ended.wait(self._ended.version)

    # -- the loop ----------------------------------------------------------------------------------

    async def run(
        self,
        worker: Worker,
        initial: Iterable[tuple[int, float]] = (),
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Schedule uploads until cancelled. ``initial``: (inode, wall time it became dirty)
        of files left dirty by an earlier run, due at once."""
        self._worker = worker
        now = trio.current_time()
        for inode, since in initial:
            self.dirty_since[inode] = since
            self._set_due(inode, now)
        if self._flush_all:
            self.flush()
        task_status.started()
        async with trio.open_nursery() as nursery:
            while True:
                self._start_due(nursery, worker)
                self._wake = trio.Event()
                now = trio.current_time()
                hold = self._hold_until if self._hold_until > -math.inf else math.inf
                wake = min(self._next_due(now), hold)
                if wake > now and now - self._audited >= self._audit_spacing:
                    self._audited = now
                    if self.audit(worker):
                        continue  # queued: start them now
                audit = self._audited + self._audit_spacing
                delay = max(0.01, min(wake - now, audit - now, AUDIT_SPACING_MAX))
                self._sleep_until = trio.current_time() + delay
                with trio.move_on_after(delay):
                    await self._wake.wait()
                self._sleep_until = -math.inf  # awake: every change is seen by the next look

    def audit(self, worker: Worker) -> list[int]:
        """Compare the worker's dirty files with the queue; returns the files found lost.

        A dirty file that no writer or fsync holds (:meth:`Worker.look` says Ready) must be
        uploading or have a current entry in the queue (:meth:`_unqueued`): its last release,
        fsync, truncate or rename reported it. One that is neither, here and at the previous
        audit too (a report may be a moment away, e.g. an open that creates a file awaits
        before its handle exists), was lost: a bug, logged as an error, and the file is
        queued now so its data still drains."""
        lost = []
        suspects = set()
        dirty = worker.dirty()
        unqueued = self._unqueued(dirty)
        for inode in unqueued:
            if not isinstance(worker.look(inode), Ready):
                continue  # written, fsynced or gone: that report comes
            if inode not in self._suspects:
                suspects.add(inode)
                continue
            lost.append(inode)
            log.error(
                "bug: %s is dirty and quiet but was not queued for upload; queued now",
                worker.key(inode),
            )
            self._set_due(inode, trio.current_time())
        self._suspects = suspects
        self.lost_wakeups += len(lost)
        if suspects or lost:
            self._audit_spacing = AUDIT_SPACING
        else:
            most = AUDIT_SPACING_DIRTY if dirty else AUDIT_SPACING_MAX
            self._audit_spacing = min(most, 2 * self._audit_spacing)
        return lost

    def _unqueued(self, inodes: Iterable[int]) -> list[int]:
        """Those of ``inodes`` that are neither uploading nor in the queue with a current
        entry (what :meth:`_candidates` would start)."""
        queued = {entry[3] for entry in self._queue if self._current(entry)}
        return [i for i in inodes if i not in self._running and i not in queued]

    def _current(self, entry: tuple[bool, float, int, int]) -> bool:
        """Whether a queue entry still says what ``_due`` and ``_urgent`` say of its file
        (else it is stale: the file was rescheduled, flushed or forgotten since)."""
        not_urgent, due, _, inode = entry
        return self._due.get(inode) == due and (inode not in self._urgent) == not_urgent

    def _next_due(self, now: float) -> float:
        """When a file becomes due next. Files due already and not started (their lane or
        key busy, an fsync running) need no timer: the end of an upload, a store operation
        or an fsync wakes the loop."""
        while self._times and (
            self._times[0][0] <= now or self._due.get(self._times[0][1]) != self._times[0][0]
        ):
            heapq.heappop(self._times)  # due already, or rescheduled or gone since
        return self._times[0][0] if self._times else math.inf

    def _order(self, worker: Worker, inode: int, due: float) -> tuple[bool, float]:
        if self.emergency is None:
            return inode not in self._urgent, due
        mtime = self._mtime.get(inode)
        if mtime is None:
            look = worker.look(inode)
            mtime = self._mtime[inode] = look.mtime_ns if isinstance(look, Ready) else 0
        return inode not in self._urgent, -mtime

    def _start_due(self, nursery: trio.Nursery, worker: Worker) -> None:
        max_files, max_small_files = self.config.max_files, self.config.max_small_files
        big = len(self._running) - self._small
        if self.emergency is not None:  # one lane, newest first: the order is kept
            max_files, max_small_files = max(max_files, self.config.emergency_files), 0
            big = len(self._running)
        if big >= max_files and self._small >= max_small_files:
            return
        now = trio.current_time()
        self._hold_until = -math.inf
        busy = {r.key for r in self._running.values()}
        pending: set[str] | None = None
        later: list[tuple[bool, float, int, int]] = []  # not started now: back in the queue
        passed = 0  # due files passed over because their lane is full
        for inode in self._candidates(worker, now, later):
            if (big >= max_files and self._small >= max_small_files) or passed > SCAN:
                break
            if inode in self._running:
                continue  # written again during its upload: after it ends
            look = worker.look(inode)
            if look is Hold.GONE:
                self._forget(inode)
                continue
            if look is Hold.WRITING:
                del self._due[inode]  # the last writer's release reports it again
                continue
            if not isinstance(look, Ready):
                continue  # syncing: the end of the fsync reports it again
            small = look.size <= SMALL_FILE and self.emergency is None
            if (big >= max_files, self._small >= max_small_files)[small]:
                passed += 1
                continue
            if pending is None:
                pending = worker.busy_keys()
            key = worker.key(inode)
            if key in busy or key in pending:
                continue
            del self._due[inode]
            worker.begin(inode, key)
            self._renamed.discard(inode)  # a later change waits out the settle delay again
            run = self._running[inode] = _Running(key, trio.CancelScope(), small)
            busy.add(key)
            self._small += small
            big += not small
            nursery.start_soon(self._upload, worker, inode, run)
        for entry in later:
            if self._due.get(entry[3]) == entry[1]:
                heapq.heappush(self._queue, entry)

    def _candidates(
        self, worker: Worker, now: float, taken: list[tuple[bool, float, int, int]]
    ) -> Iterator[int]:
        """The files that may start now, in start order, as the caller asks for them:
        flushed files first, then by due time (in an emergency: newest first). Their queue
        entries go to ``taken`` first, for the caller to put back those it does not start."""
        if self.emergency is not None:  # rare: a plain sort of everything due
            order = sorted(self._due.items(), key=lambda item: self._order(worker, *item))
            yield from (i for i, due in order if due <= now or i not in self._failures)
            return
        while self._queue:
            not_urgent, due, _, inode = self._queue[0]
            if not self._current(self._queue[0]):
                heapq.heappop(self._queue)  # stale: rescheduled, flushed or gone since
                continue
            if due > now and not_urgent:
                break  # the queue is in due order from here on
            if not_urgent and self._saving(now, due):
                break  # so is every file after it
            taken.append(heapq.heappop(self._queue))
            if due <= now or inode not in self._failures:
                yield inode  # a flushed file that failed waits for its retry time

    def _saving(self, now: float, due: float) -> bool:
        """Whether a file due since ``due`` waits for a save in progress (files are still
        being finished one after another) for now; if so, the loop looks again when the
        save may have ended or the file has waited long enough."""
        last = self._others_written if self._excused else self._last_written
        wait, end = self.config.yield_to_saves, last + self.config.settle
        if wait <= 0 or end <= now or due + wait <= now:
            return False
        self._hold_until = min(end, due + wait)  # later than now
        self.yielded += 1
        return True

    def _forget(self, inode: int) -> None:
        """The file is clean or gone: nothing about it is pending any more."""
        self._due.pop(inode, None)
        self._renamed.discard(inode)
        self._urgent.discard(inode)
        self._mtime.pop(inode, None)
        self.errors.pop(inode, None)
        self.dirty_since.pop(inode, None)

    async def _upload(self, worker: Worker, inode: int, run: _Running) -> None:
        started = trio.current_time()
        try:
            with run.scope:
                clean = await worker.upload(inode, run.key)
                self._failures.pop(inode, None)
                if clean:
                    self._forget(inode)
                    log.info("uploaded %s in %.2f s", run.key, trio.current_time() - started)
                else:
                    run.changed = True
        except StoreError as e:
            self._failed(inode, run.key, e)
        except Exception as e:  # a bug or a cache-disk error: this file waits, the rest goes on
            log.exception("upload of %s failed unexpectedly", run.key)
            self._failed(inode, run.key, StoreError(f"unexpected error: {e!r}", temporary=True))
        finally:
            del self._running[inode]
            self._small -= run.small
            self._ended.fire()
            self._wake.set()
        if run.changed and inode not in self._due:
            self._set_due(inode, trio.current_time() + self.config.settle)

    def _failed(self, inode: int, key: str, e: StoreError) -> None:
        """The one place that decides when a failed file is tried again."""
        n = self._failures[inode] = self._failures.get(inode, 0) + 1
        repeated = self.errors.get(inode) == str(e)
        self.errors[inode] = str(e)
        if e.temporary:
            delay = min(300.0, 2.0 * 2 ** min(n, 8))
            log.warning("upload of %s failed (%s); retrying in %.0f s", key, e, delay)
        else:
            delay = self.config.permanent_retry
            if not repeated:
                log.error(
                    "upload of %s failed: %s; the data stays in the cache and is tried again "
                    "every %.0f s",
                    key,
                    e,
                    delay,
                )
        self._set_due(inode, trio.current_time() + delay)
