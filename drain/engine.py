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
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from dataclasses import dataclass, field

import trio

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
    changed: bool = False


class DrainEngine:
    def __init__(self, fs: Filesystem, store: Store, config: DrainConfig) -> None:
        self.fs = fs
        self.table = fs.table
        self.journal = fs.journal
        self.store = store
        self.config = config
        self.stats = RetryStats()
        self.uploader = Uploader(
            fs.table,
            fs.keys,
            store,
            config.upload,
            trio.CapacityLimiter(config.max_parts),
            self.stats,
        )
        self._due: dict[int, float] = {}  # inode -> monotonic time it may start
        self._failures: dict[int, int] = {}
        self._running: dict[int, _Running] = {}
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
            self._wake.set()

    def _content_changed(self, inode: int) -> None:
        run = self._running.get(inode)
        if run is not None:
            run.changed = True
            run.scope.cancel()

    def _new_ops(self) -> None:
        self._ops_wake.set()
        self._wake.set()

    # -- the loops -------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await self._reconcile()
        now = time.monotonic()
        for inode in self.journal.dirty_files():
            self._due[inode] = now
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

    def _start_due(self, nursery: trio.Nursery) -> None:
        now = time.monotonic()
        busy = {r.key for r in self._running.values()}
        pending: set[str] | None = None
        for inode, due in sorted(self._due.items(), key=lambda kv: kv[1]):
            if len(self._running) >= self.config.max_files:
                return
            if due > now or inode in self._running:
                continue
            ino = self.table.peek(inode) or self._load(inode)
            if ino is None:
                del self._due[inode]
                continue
            if ino.parent is None or ino.state not in (State.DIRTY, State.UPLOADING):
                del self._due[inode]
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
            run = _Running(inode, key, trio.CancelScope())
            self._running[inode] = run
            busy.add(key)
            nursery.start_soon(self._upload, ino, run)

    def _load(self, inode: int) -> Inode | None:
        try:
            return self.table.get(inode)
        except OSError:
            return None

    async def _upload(self, ino: Inode, run: _Running) -> None:
        started = time.monotonic()
        try:
            with run.scope:
                await self.uploader.upload(ino)
                self._failures.pop(ino.id, None)
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
            self._failed(ino, StoreError(f"unexpected error: {e!r}", temporary=True))
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
        self.stats.last_error = str(e)
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
                failures += 1
                self.stats.last_error = str(e)
                delay = min(300.0, 2.0 * 2 ** min(failures, 8))
                log.warning("store operation failed (%s); retrying in %.0f s", e, delay)
                await trio.sleep(delay)
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
