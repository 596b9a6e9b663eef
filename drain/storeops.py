"""Store operations: the moves and deletes that renames and unlinks journaled
(:mod:`fsops.storekeys`), carried out in order, woken by events rather than polling.

A move is a server-side copy then a delete of the source. An operation whose source an upload
is still writing waits for that upload to end. A move whose source is gone counts as done if
its destination exists (a crash after the copy); otherwise the object was deleted by someone
else, and the file is uploaded again from the cache (:meth:`FileStates.lost`). Failures wait
and are retried (a flush retries at once); the filesystem never waits for them.
"""

from __future__ import annotations

import logging

from drain.retry import RetryStats
from drain.scheduler import Scheduler
from drain.store import NotFound, Store, StoreError
from fsops.filesystem import Filesystem
from fsops.journal import State, StoreOp

log = logging.getLogger(__name__)


class StoreOps:
    def __init__(
        self, fs: Filesystem, store: Store, scheduler: Scheduler, stats: RetryStats
    ) -> None:
        self.fs = fs
        self.journal = fs.journal
        self.store = store
        self.scheduler = scheduler
        self.stats = stats

    async def run(self) -> None:
        wanted = self.scheduler.ops_wanted
        failures = 0
        while True:
            seen = wanted.version  # ops journaled from here on get another pass
            try:
                await self._run_all()
                failures = 0
            except Exception as e:  # StoreError, or a bug: either way the ops wait, not the FS
                if not isinstance(e, StoreError):
                    log.exception("store operation failed unexpectedly")
                    self.stats.failed("store operation", StoreError(repr(e), temporary=True))
                failures += 1
                delay = min(300.0, 2.0 * 2 ** min(failures, 8))
                log.warning("store operation failed (%s); retrying in %.0f s", e, delay)
                await wanted.wait(wanted.version, delay)  # a flush retries at once
                continue
            await wanted.wait(seen)

    async def _run_all(self) -> None:
        while ops := self.journal.store_ops():
            for op in ops:
                await self.scheduler.key_free(op.src)  # an upload still writes src
                if op.dst is not None:
                    await self.scheduler.key_free(op.dst)  # or dst: the move must land last
                await self._apply(op)
                self.fs.keys.done(op)
                self.scheduler.wake()  # uploads waiting for these keys may start

    async def _apply(self, op: StoreOp) -> None:
        if op.kind == "delete":
            await self.store.delete(op.src)
            return
        assert op.dst is not None
        try:
            etag = await self.store.copy(op.src, op.dst)
        except NotFound:
            if await self.store.head(op.dst) is not None:
                return  # done before a crash: the copy landed and src was deleted
            self._lost_source(op)
            return
        row = self.journal.stored_at(op.dst)
        if row is not None:
            # A copy gives the object a new ETag (S3 too, for multipart objects): record it,
            # so that listings do not mistake our own object for someone else's.
            self.fs.states.etag_changed(row, etag)
        await self.store.delete(op.src)

    def _lost_source(self, op: StoreOp) -> None:
        """The object to move vanished from the store (someone deleted it): upload it again."""
        log.warning(
            "object %s vanished before it could move to %s; uploading again", op.src, op.dst
        )
        for row in self.journal.regular_files():
            if row.stored_key == op.dst and self.fs.table.current(row).state is State.CLEAN:
                self.fs.states.lost(row)
                self.scheduler.written(row.id)
