"""Store operations: the moves, deletes and metadata updates that renames, unlinks and
attribute changes journaled (:mod:`fsops.storekeys`), carried out in order, woken by events
rather than polling.

A key is never deleted while an entry holds it (:meth:`fsops.storekeys.StoreKeys.held`): an
entry that took the name since the operation was journaled replaces the object instead (a
delete claimed before it was sent is gone from the journal; one found held when its turn
comes is skipped, and so is a move's delete of its source). So a name that is being replaced
is never missing from the store.

A move is a server-side copy then a delete of the source. A metadata update ('meta') is a
server-side copy of the object onto itself with the entry's metadata as it is when the copy
runs; an entry that is no longer clean or remote by then takes its metadata with its upload,
and an object someone else rewrote meanwhile is left alone (last writer wins).

An operation whose source an upload is still writing waits for that upload to end. A move
whose source is gone counts as done if its destination exists (a crash after the copy);
otherwise the object was deleted by someone else, and the entry is uploaded again from this
node (:meth:`FileStates.lost`). Failures wait and are retried (a flush retries at once);
the filesystem never waits for them.

A burst of operations (an ``rm -rf`` of a checkpoint) gathers until none came for ``settle``
seconds (at most GATHER), and a run of deletes goes as one DeleteObjects request per 1,000
keys.
"""

from __future__ import annotations

import logging

import trio

from ckptgw.drain.uploads.scheduler import Scheduler, Signal
from ckptgw.fsops.filesystem import Filesystem
from ckptgw.fsops.journal import State, StoreOp
from ckptgw.fsops.objectmeta import encode, updated
from ckptgw.store.interface import NotFound, Store, StoreError
from ckptgw.store.retry import RetryStats

log = logging.getLogger(__name__)

DELETE_BATCH = 1000  # keys in one DeleteObjects request (S3's limit)
GATHER = 2.0  # seconds a burst of operations may gather before they are carried out


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
            await self._quiet(wanted)

    async def _quiet(self, wanted: Signal) -> None:
        """Let a burst of operations (an ``rm -rf``) be journaled before they are carried
        out, so its deletes go in batches: until none came for ``settle`` seconds, for at
        most GATHER seconds."""
        deadline = trio.current_time() + GATHER
        while (now := trio.current_time()) < deadline:
            seen = wanted.version
            await wanted.wait(seen, min(self.scheduler.config.settle, deadline - now))
            if wanted.version == seen:
                return

    async def _run_all(self) -> None:
        while ops := self.journal.store_ops():
            i = 0
            while i < len(ops):
                # A run of deletes (rm -rf of a checkpoint) is one DeleteObjects request per
                # 1,000 keys; every other operation goes alone, in journal order.
                n = 1
                while (
                    n < DELETE_BATCH
                    and i + n < len(ops)
                    and ops[i].kind == "delete" == ops[i + n].kind
                ):
                    n += 1
                batch = ops[i : i + n]
                i += n
                for op in batch:
                    await self.scheduler.key_free(op.src)  # an upload still writes src
                    if op.dst is not None:
                        await self.scheduler.key_free(op.dst)  # or dst: the move must land last
                # A delete may have been claimed while we waited: an entry took its name.
                batch = [op for op in batch if self.journal.store_op_pending(op.id)]
                if not batch:
                    continue
                if batch[0].kind == "delete":
                    kept = await self._delete([op.src for op in batch])
                else:
                    kept = await self._apply(batch[0])
                self.fs.keys.done(*batch, kept=kept)
                self.scheduler.wake()  # uploads waiting for these keys may start

    async def _delete(self, keys: list[str]) -> frozenset[str]:
        """Delete the keys no entry holds (one request, or one per 1,000); returns the others,
        which are left in place for the entries that replace them."""
        kept = frozenset(k for k in keys if self.fs.keys.held(k))
        doomed = [k for k in keys if k not in kept]
        for key in kept:
            log.info("kept %s: the entry now at that name replaces it", key)
        if not doomed:
            return kept
        deleting = self.fs.keys.deleting
        deleting.update(doomed)  # from here on too late for a claim
        try:
            if len(doomed) > 1:
                await self.store.delete_many(doomed)
            else:
                await self.store.delete(doomed[0])
        finally:
            deleting.difference_update(doomed)
        return kept

    async def _apply(self, op: StoreOp) -> frozenset[str]:
        """Carry out a move or a metadata update; returns the keys it left in place rather
        than delete (a move's source that an entry holds by now)."""
        if op.kind == "meta":
            await self._update_metadata(op)
            return frozenset()
        assert op.kind == "move" and op.dst is not None
        try:
            etag = await self.store.copy(op.src, op.dst)
        except NotFound:
            if await self.store.head(op.dst) is not None:
                log.info("moved %s -> %s (before a restart)", op.src, op.dst)
                return frozenset()  # done before a crash: the copy landed, src was deleted
            self._lost_source(op)
            return frozenset()
        row = self.journal.stored_at(op.dst)
        if row is not None:
            # A copy gives the object a new ETag (S3 too, for multipart objects): record it,
            # so that listings do not mistake our own object for someone else's.
            self.fs.states.etag_changed(row, etag)
        kept = await self._delete([op.src])
        log.info("%s %s -> %s", "copied" if kept else "moved", op.src, op.dst)
        return kept

    async def _update_metadata(self, op: StoreOp) -> None:
        found = self.journal.stored_at(op.src)
        if found is None:
            return  # the entry went; its delete follows
        row = self.fs.table.current(found)
        if row.state not in (State.CLEAN, State.REMOTE):
            return  # it goes again, with its metadata
        info = await self.store.head(op.src)
        if info is None:
            self._lost(op.src, "before its metadata could be updated")
            return
        if info.etag != row.stored_etag:
            log.info("%s was rewritten elsewhere; its metadata is left as it is", op.src)
            return
        ours = encode(row, self.journal.xattrs(row.id), checksum=row.checksum)
        try:
            etag = await self.store.copy(op.src, op.src, updated(info.metadata, ours))
        except NotFound:
            self._lost(op.src, "before its metadata could be updated")
            return
        except StoreError as e:
            if e.temporary:
                raise
            # E.g. an object in an archive class cannot be copied. The operations after this
            # one must not wait for it forever; the content in the store is intact.
            log.error(
                "cannot update the metadata of %s (%s): the store keeps its old mode, owner, "
                "mtime and xattrs",
                op.src,
                e,
            )
            return
        self.fs.states.etag_changed(row, etag)

    def _lost_source(self, op: StoreOp) -> None:
        """The object to move vanished from the store (someone deleted it): upload it again."""
        assert op.dst is not None
        self._lost(op.dst, f"before it could move from {op.src}")

    def _lost(self, key: str, when: str) -> None:
        """The object of the entry that is (to be) at ``key`` vanished: a clean entry is
        uploaded again from this node; a remote one is gone (the next listing drops it)."""
        found = self.journal.stored_at(key)
        if found is None:
            return
        row = self.fs.table.current(found)
        if row.state not in (State.CLEAN, State.REMOTE):
            return  # the previous version of an entry whose own upload goes anyway
        log.warning(
            "object %s vanished %s; %s",
            key,
            when,
            "uploading again" if row.state is State.CLEAN else "the store has lost it",
        )
        if row.state is State.CLEAN:
            self.fs.states.lost(row)
            self.scheduler.written(row.id)
