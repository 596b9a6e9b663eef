"""The drain engine: which files go to the store when, and the store operations renames imply.

A dirty file becomes eligible once its last writer has closed it and it has been quiet for the
settle delay. At most ``max_files`` files upload at once, with at most ``max_parts`` parts in
flight across them. One key is touched by one thing at a time: an upload never starts for a
key that a pending store operation (move, delete) reads or writes, or that another upload
targets.

A write, truncate or unlink during an upload cancels it (cancel and restart: the multipart
upload is aborted, and the file is scheduled again after the settle delay). A rename lets the
upload complete, then moves the object (see :mod:`fsops.storekeys`). Failures keep the file
dirty and retry it later with a growing delay; a permanent error is logged once per file and
retried after ``permanent_retry`` seconds, so fixing the cause (new credentials, the bucket
created) needs no remount.

``flush`` makes files due now, ahead of the rest, and retries failed ones at once. The
emergency drain (SIGTERM, a preemption notice) flushes everything, newest file first, with up
to ``max_parts`` files at once, and keeps doing so for files written after it began.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import trio

from drain.progress import DrainStats, UploadProgress
from drain.retry import RetryStats, retrying
from drain.store import NotFound, Store, StoreError
from drain.upload import Changed, UploadConfig, Uploader
from fsops.filesystem import Filesystem
from fsops.inodes import Inode
from fsops.journal import State, StoreOp

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DrainConfig:
    settle: float = 0.2
    max_files: int = 4
    max_parts: int = 8
    permanent_retry: float = 60.0
    orphan_age: float = 86400.0  # abort unknown multipart uploads older than this
    upload: UploadConfig = field(default_factory=UploadConfig)


@dataclass
class _Running:
    inode: int
    key: str
    scope: trio.CancelScope
    progress: UploadProgress
    changed: bool = False


class DrainEngine:
    def __init__(self, fs: Filesystem, store: Store, config: DrainConfig) -> None:
        self.fs = fs
        self.table = fs.table
        self.journal = fs.journal
        self.store = store
        self.config = config
        self.stats = RetryStats()
        self.drained = DrainStats()
        self.uploader = Uploader(
            fs.table,
            fs.keys,
            store,
            config.upload,
            trio.CapacityLimiter(config.max_parts),
            self.stats,
            self.drained,
        )
        self._due: dict[int, float] = {}  # inode -> monotonic time it may start
        self._failures: dict[int, int] = {}
        self._running: dict[int, _Running] = {}
        self._urgent: set[int] = set()  # flushed: before everything else, no settle delay
        self.emergency: str | None = None  # why everything drains now, newest first
        self.errors: dict[int, str] = {}  # inode -> why its last upload failed
        self.dirty_since: dict[int, float] = {}  # inode -> wall time it became dirty
        self._wake = trio.Event()
        self._ops_wake = trio.Event()
        fs.table.on_written = self._written
        fs.table.on_content_change = self._content_changed
        fs.keys.changed = self._content_changed
        fs.keys.wake = self._new_ops

    # -- hooks from the filesystem (called on the trio thread) ------------------------------------

    def _written(self, ino: Inode) -> None:
        if ino.state is State.DIRTY:
            self._due[ino.id] = time.monotonic() + self.config.settle
            self.dirty_since.setdefault(ino.id, time.time())
            self._wake.set()

    def _content_changed(self, inode: int) -> None:
        run = self._running.get(inode)
        if run is not None:
            run.changed = True
            run.scope.cancel()

    def _new_ops(self) -> None:
        self._ops_wake.set()
        self._wake.set()

    # -- what the control socket asks for -------------------------------------------------------

    def flush(self, inodes: Iterable[int] | None = None) -> None:
        """Drain these files (every dirty file if None) now, before the others."""
        now = time.monotonic()
        for inode in self.journal.dirty_files() if inodes is None else inodes:
            self._urgent.add(inode)
            self._failures.pop(inode, None)
            if inode not in self._running:
                self._due[inode] = min(self._due.get(inode, now), now)
        self._new_ops()

    def start_emergency(self, reason: str) -> None:
        """Drain everything now, newest first, at full concurrency (SIGTERM, preemption)."""
        if self.emergency is None:
            log.warning("emergency drain (%s): newest files first, no settle delay", reason)
            self.emergency = reason
        self.flush()

    def running(self) -> list[UploadProgress]:
        return [r.progress for r in self._running.values()]

    def is_idle(self) -> bool:
        """Nothing dirty, uploading or waiting for a store operation."""
        return (
            not self._running and not self.journal.dirty_files() and not self.journal.store_ops(1)
        )

    # -- the loops -------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await self._reconcile()
        now, wall = time.monotonic(), time.time()
        for inode in self.journal.dirty_files():
            self._due[inode] = now
            row = self.journal.get(inode)
            self.dirty_since[inode] = min(wall, row.mtime_ns / 1e9) if row else wall
        task_status.started()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._ops_loop)
            nursery.start_soon(self._abort_orphans)
            while True:
                self._start_due(nursery)
                self._wake = trio.Event()
                delay = min((t for t in self._due.values()), default=math.inf) - time.monotonic()
                with trio.move_on_after(max(0.01, min(delay, 60.0))):
                    await self._wake.wait()

    def _order(self, item: tuple[int, float]) -> tuple[bool, float]:
        inode, due = item
        if self.emergency is None:
            return inode not in self._urgent, due
        ino = self.table.peek(inode)
        return inode not in self._urgent, -(ino.mtime_ns if ino is not None else 0)

    def _start_due(self, nursery: trio.Nursery) -> None:
        now = time.monotonic()
        busy = {r.key for r in self._running.values()}
        pending: set[str] | None = None
        max_files = self.config.max_files
        if self.emergency is not None:
            max_files = max(max_files, self.config.max_parts)
        for inode, due in sorted(self._due.items(), key=self._order):
            if len(self._running) >= max_files:
                return
            now_wanted = (self.emergency or inode in self._urgent) and inode not in self._failures
            if (due > now and not now_wanted) or inode in self._running:
                continue
            ino = self.table.peek(inode) or self._load(inode)
            if ino is None:
                self._forget(inode)
                continue
            if ino.parent is None or ino.state not in (State.DIRTY, State.UPLOADING):
                self._forget(inode)
                self.table.release_if_unused(ino)
                continue
            if ino.writers > 0:
                del self._due[inode]  # the last writer's release schedules it again
                continue
            if ino.syncing > 0:
                continue  # the end of the fsync schedules it again
            key = self.fs.keys.key_of(inode)
            if pending is None:
                pending = self.journal.pending_keys()
            if key in busy or key in pending:
                continue
            del self._due[inode]
            run = _Running(inode, key, trio.CancelScope(), UploadProgress(inode, key))
            self._running[inode] = run
            busy.add(key)
            nursery.start_soon(self._upload, ino, run)

    def _forget(self, inode: int) -> None:
        """The file is clean or gone: nothing about it is pending any more."""
        self._due.pop(inode, None)
        self._urgent.discard(inode)
        self.errors.pop(inode, None)
        self.dirty_since.pop(inode, None)

    def _load(self, inode: int) -> Inode | None:
        try:
            return self.table.get(inode)
        except OSError:
            return None

    async def _upload(self, ino: Inode, run: _Running) -> None:
        started = time.monotonic()
        try:
            with run.scope:
                await self.uploader.upload(ino, run.progress)
                self._failures.pop(ino.id, None)
                if ino.state is State.CLEAN:
                    self._forget(ino.id)
                log.info(
                    "uploaded %s (%d bytes) in %.2f s",
                    run.key,
                    ino.size,
                    time.monotonic() - started,
                )
        except Changed:
            run.changed = True
        except StoreError as e:
            self._failed(ino, e)
        except Exception as e:  # a bug or a cache-disk error: this file waits, the rest goes on
            log.exception("upload of inode %d failed unexpectedly", ino.id)
            error = StoreError(f"unexpected error: {e!r}", temporary=True, code="Internal")
            self.stats.failed(f"upload {run.key}", error)
            self._failed(ino, error)
        finally:
            del self._running[ino.id]
            self._wake.set()
        if run.changed:
            await self._after_change(ino)
        self.table.release_if_unused(ino)

    async def _after_change(self, ino: Inode) -> None:
        """An upload was overtaken by a change: abort it; try again once the file settles."""
        record = self.journal.get_upload(ino.id)
        if record is not None and (ino.parent is None or record.generation != ino.generation):
            with trio.CancelScope(shield=True), trio.move_on_after(30):
                await self.uploader.discard(record)
        if ino.state is State.UPLOADING and ino.parent is not None:
            ino.state = State.DIRTY
            self.table.persist(ino)
        if ino.parent is not None and ino.writers == 0:
            self._due[ino.id] = time.monotonic() + self.config.settle

    def _failed(self, ino: Inode, e: StoreError) -> None:
        n = self._failures[ino.id] = self._failures.get(ino.id, 0) + 1
        self.errors[ino.id] = str(e)
        if e.temporary:
            delay = min(300.0, 2.0 * 2 ** min(n, 8))
            log.warning("upload of inode %d failed (%s); retrying in %.0f s", ino.id, e, delay)
        else:
            delay = self.config.permanent_retry
            if n == 1:
                log.error(
                    "upload of inode %d failed: %s; the data stays in the cache and is "
                    "tried again every %.0f s",
                    ino.id,
                    e,
                    delay,
                )
        if ino.state is State.UPLOADING:
            ino.state = State.DIRTY
            self.table.persist(ino)
        self._due[ino.id] = time.monotonic() + delay

    # -- store operations ------------------------------------------------------------------------

    async def _ops_loop(self) -> None:
        failures = 0
        while True:
            self._ops_wake = trio.Event()
            try:
                await self._run_ops()
                failures = 0
            except Exception as e:  # StoreError, or a bug: either way the ops wait, not the FS
                if not isinstance(e, StoreError):
                    log.exception("store operation failed unexpectedly")
                    self.stats.failed("store operation", StoreError(repr(e), temporary=True))
                failures += 1
                delay = min(300.0, 2.0 * 2 ** min(failures, 8))
                log.warning("store operation failed (%s); retrying in %.0f s", e, delay)
                self._ops_wake = trio.Event()
                with trio.move_on_after(delay):
                    await self._ops_wake.wait()  # a flush retries at once
                continue
            await self._ops_wake.wait()

    async def _run_ops(self) -> None:
        while ops := self.journal.store_ops():
            for op in ops:
                while op.src in {r.key for r in self._running.values()}:
                    await trio.sleep(0.05)  # an upload still writes src: wait for it
                await self._apply(op)
                with self.journal.transaction():
                    self.journal.done_store_op(op.id)

    async def _apply(self, op: StoreOp) -> None:
        retry = self.config.upload.retry
        if op.kind == "delete":
            await retrying(f"delete {op.src}", lambda: self.store.delete(op.src), retry, self.stats)
            return
        assert op.dst is not None
        dst = op.dst
        try:
            etag = await retrying(
                f"move {op.src} -> {dst}", lambda: self.store.copy(op.src, dst), retry, self.stats
            )
        except NotFound:
            if await self.store.head(dst) is not None:
                return  # done before a crash: the copy landed and src was deleted
            self._lost_source(op)
            return
        self._moved_to(dst, etag)
        await retrying(f"delete {op.src}", lambda: self.store.delete(op.src), retry, self.stats)

    def _moved_to(self, key: str, etag: str) -> None:
        """A copy gives the object a new ETag (S3 too, for multipart objects): record it, so
        that listings do not mistake our own object for someone else's."""
        self.fs.keys.note_stored(key)
        row = self.journal.stored_at(key)
        if row is None:
            return
        ino = self.table.peek(row.id)
        target = ino if ino is not None else row
        target.stored_etag = etag
        self.journal.update_attrs(target)

    def _lost_source(self, op: StoreOp) -> None:
        """The object to move vanished from the store (someone deleted it): upload it again."""
        log.warning(
            "object %s vanished before it could move to %s; uploading again", op.src, op.dst
        )
        for row in self.journal.regular_files():
            if row.stored_key == op.dst and row.state is State.CLEAN:
                ino = self.table.get(row.id)
                ino.state, ino.stored_key, ino.stored_etag = State.DIRTY, None, None
                ino.generation += 1
                self.table.persist(ino)
                self._due[ino.id] = time.monotonic()

    async def _abort_orphans(self) -> None:
        """Abort multipart uploads under our prefix that no journal entry wants. Other nodes
        may share the prefix, so only uploads older than ``orphan_age`` are touched."""
        known = {r.upload_id for r in self.journal.all_uploads() if r.upload_id}
        cutoff = time.time() - self.config.orphan_age
        try:
            async for u in self.store.iter_uploads(self.fs.keys.prefix):
                if u.upload_id not in known and u.initiated < cutoff:
                    log.info("aborting orphaned upload of %s (%s)", u.key, u.upload_id)
                    await self.store.abort_multipart(u.key, u.upload_id)
        except StoreError as e:
            log.warning("could not look for orphaned uploads: %s", e)

    # -- start-up ----------------------------------------------------------------------------------

    async def _reconcile(self) -> None:
        """Uploads journaled by an earlier run: keep those that can resume, abort the rest."""
        for record in self.journal.all_uploads():
            row = self.journal.get(record.inode)
            if row is None or row.parent is None or row.generation != record.generation:
                with contextlib.suppress(StoreError):
                    await self.uploader.discard(record)
            elif row.state is State.UPLOADING:
                ino = self.table.get(record.inode)
                ino.state = State.DIRTY  # resumed by the next upload attempt
                self.table.persist(ino)
