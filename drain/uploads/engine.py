"""The drain engine: the scheduler's worker, joining it to the filesystem and the store.

:class:`drain.uploads.scheduler.Scheduler` decides when a file goes; this module says whether
a file can go now (``look``), takes it (``begin``: the file becomes ``uploading``, so any later
change of its content is reported and stops the upload), uploads it
(:mod:`drain.uploads.upload`) and cleans up after an upload that a change overtook. It also runs
the store operations (:mod:`drain.uploads.storeops`), resumes or aborts uploads journaled by an
earlier run, and aborts orphaned multipart uploads.

"Durable" is defined here, once (:meth:`DrainEngine.durability`): status, wait, retention, the
emergency drain and the shutdown log all go by it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import trio

from ckptgw.drain.checkpoints import DRAINING, DURABLE, LOCAL
from ckptgw.drain.uploads.progress import DrainStats, UploadProgress
from ckptgw.drain.uploads.scheduler import Hold, Ready, Scheduler
from ckptgw.drain.uploads.storeops import StoreOps
from ckptgw.drain.uploads.upload import Changed, UploadConfig, Uploader
from ckptgw.fsops.filesystem import Filesystem
from ckptgw.fsops.inodes import Inode
from ckptgw.fsops.journal.rows import InodeRow, State
from ckptgw.fsops.parts import OnParts
from ckptgw.store.interface import Store, StoreError
from ckptgw.store.retry import RetryStats

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DrainConfig:
    """What the engine takes of the settings; the scheduler's are its own (ScheduleConfig)."""

    max_parts: int = 8
    orphan_age: float = 86400.0  # abort unknown multipart uploads older than this
    upload: UploadConfig = field(default_factory=UploadConfig)


class DrainEngine(OnParts):
    """``store`` should retry temporary errors itself
    (:class:`ckptgw.store.retry.RetryingStore`)."""

    def __init__(
        self,
        fs: Filesystem,
        store: Store,
        config: DrainConfig,
        scheduler: Scheduler,
        stats: RetryStats | None = None,
    ) -> None:
        super().__init__(fs.parts)
        self.fs = fs
        self.store = store
        self.config = config
        self.scheduler = scheduler
        self.stats = stats if stats is not None else RetryStats()
        self.drained = DrainStats()
        self.uploader = Uploader(
            fs.parts,
            store,
            config.upload,
            trio.CapacityLimiter(config.max_parts),
            self.drained,
        )
        self.ops = StoreOps(fs, store, scheduler, self.stats)
        self._progress: dict[int, UploadProgress] = {}

    # -- what the control socket and the daemon ask for ------------------------------------------

    def flush(self, inodes: Iterable[int] | None = None) -> None:
        self.scheduler.flush(inodes)

    def start_emergency(self, reason: str) -> None:
        self.scheduler.start_emergency(reason)

    @property
    def errors(self) -> dict[int, str]:
        return self.scheduler.errors

    @property
    def dirty_since(self) -> dict[int, float]:
        return self.scheduler.dirty_since

    def running(self) -> list[UploadProgress]:
        return list(self._progress.values())

    def upload_of(self, inode: int) -> UploadProgress | None:
        """The upload of ``inode`` under way, if any."""
        return self._progress.get(inode)

    def durability(self, row: InodeRow, moving: set[str]) -> str:
        """The one definition of durable. A file is ``durable`` when the store holds its
        current content under its current path: it is clean (or only in the store) and no
        journaled move to its key is pending (``moving``: :meth:`Journal.pending_keys`). It is
        ``draining`` while an upload or such a move is under way, and ``local`` otherwise. A
        directory that needs no marker (:func:`fsops.namespace.needs_no_marker`) is clean with
        no key, and durable: a fresh node sees it through the keys of what is in it, whose own
        durability its checkpoint's waits for."""
        if row.state in (State.DIRTY, State.UPLOADING):
            uploading = row.state is State.UPLOADING or row.id in self._progress
            return DRAINING if uploading else LOCAL
        return DRAINING if row.stored_key in moving else DURABLE

    def is_idle(self) -> bool:
        """Everything is durable (no named file is dirty or uploading, no store operation is
        pending) and no upload runs."""
        return (
            not self.scheduler.uploading()
            and not self.journal.dirty_files()
            and not self.journal.store_ops(1)
        )

    # -- running ---------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await self._reconcile()
        wall = time.time()
        initial = []
        for inode in self.journal.dirty_files():
            row = self.journal.get(inode)
            initial.append((inode, min(wall, row.mtime_ns / 1e9) if row else wall))
        async with trio.open_nursery() as nursery:
            await nursery.start(self.scheduler.run, self, initial)
            nursery.start_soon(self.ops.run)
            nursery.start_soon(self._abort_orphans)
            task_status.started()

    # -- the scheduler's Worker ------------------------------------------------------------------

    def _inode(self, inode: int) -> Inode | None:
        try:
            return self.table.get(inode)
        except OSError:
            return None

    def look(self, inode: int) -> Ready | Hold:
        ino = self._inode(inode)
        if ino is None or ino.parent is None or ino.state is not State.DIRTY:
            if ino is not None:
                self.table.release_if_unused(ino)
            return Hold.GONE
        if ino.writers > 0 or ino.dirtying is not None:
            return Hold.WRITING
        if ino.syncing > 0:
            return Hold.SYNCING
        return Ready(ino.mtime_ns, ino.size if ino.is_reg else 0)

    def key(self, inode: int) -> str:
        return self.fs.keys.entry_key(self.table.get(inode))

    def dirty(self) -> list[int]:
        return self.journal.dirty_files()

    def busy_keys(self) -> set[str]:
        return self.journal.pending_keys()

    def begin(self, inode: int, key: str) -> None:
        ino = self.table.get(inode)
        self.states.begin_upload(ino)
        ino.pins += 1  # kept in memory, so that every change of it reaches this Inode
        self._progress[inode] = UploadProgress(inode, key)

    async def upload(self, inode: int, key: str) -> bool:
        ino = self.table.get(inode)
        generation = ino.generation
        clean = False
        try:
            clean = await self.uploader.upload(ino, generation, key, self._progress[inode])
        except Changed:  # written meanwhile, or the cache file was short
            pass
        finally:
            # However it ended, a file not made clean is dirty again (a no-op where a write
            # already made it so). If it was written or unlinked meanwhile, what this upload
            # sent is stale; a cancel without a change (shutdown) keeps the journaled upload,
            # and the next mount resumes it.
            if not clean:
                self.states.abandon_upload(ino)
            if ino.generation != generation or ino.parent is None:
                with trio.CancelScope(shield=True), trio.move_on_after(30):
                    await self._after_change(ino, generation)
            del self._progress[inode]
            ino.pins -= 1
            self.table.release_if_unused(ino)
        return clean

    async def _after_change(self, ino: Inode, generation: int) -> None:
        """An upload was overtaken by a write or an unlink: whatever it sent is stale."""
        record = self.journal.get_upload(ino.id)
        if record is not None and record.generation == generation:
            with self.journal.transaction():  # a single PUT may have landed
                self.fs.keys.sent_stale(ino, record.key, None)
            await self.uploader.discard(record)

    # -- start-up ----------------------------------------------------------------------------------

    async def _reconcile(self) -> None:
        """Uploads journaled by an earlier run: keep those that can resume, abort the rest."""
        for record in self.journal.all_uploads():
            row = self.journal.get(record.inode)
            if row is None or row.parent is None:
                await self.uploader.discard(record)  # its unlink doomed what it sent
            elif row.generation != record.generation:  # an abort that fails: the sweep's
                await self.uploader.discard(record, self.table.get(record.inode))

    async def _abort_orphans(self) -> None:
        """Abort multipart uploads under our prefix that no journal entry wants. Other nodes
        may share the prefix, so only uploads older than ``orphan_age`` are touched; and an
        upload this gateway is creating is never one, although its record is not journaled
        yet (the record follows the id in the same step)."""
        cutoff = time.time() - self.config.orphan_age
        try:
            async for u in self.store.iter_uploads(self.fs.keys.prefix):
                if u.initiated >= cutoff or u.key in self.uploader.creating:
                    continue
                # Read the journal now, not before the listing: an upload created meanwhile
                # is in it by the time the listing shows it.
                if any(r.upload_id == u.upload_id for r in self.journal.all_uploads()):
                    continue
                log.info("aborting orphaned upload of %s (%s)", u.key, u.upload_id)
                await self.store.abort_multipart(u.key, u.upload_id)
        except StoreError as e:
            log.warning("could not look for orphaned uploads: %s", e)
