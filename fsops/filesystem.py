"""Assemble the filesystem from a cache directory: journal, cache files, recovery, operations.

The drain is attached at construction: ``events`` (:class:`fsops.events.DrainEvents`) is
what the filesystem tells it, and :meth:`Filesystem.operations` takes the
:class:`fsops.remote.Remote` that serves files only the store has.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from ckptgw.fsops.cache import CacheFiles
from ckptgw.fsops.events import DrainEvents, NoDrain
from ckptgw.fsops.files import OpenFiles
from ckptgw.fsops.inodes import InodeTable
from ckptgw.fsops.journal import Journal, JournalError
from ckptgw.fsops.names import KeyRules
from ckptgw.fsops.namespace import Namespace
from ckptgw.fsops.operations import Operations
from ckptgw.fsops.parts import Parts
from ckptgw.fsops.passthrough import Passthrough
from ckptgw.fsops.recovery import RecoveryReport, recover
from ckptgw.fsops.remote import LocalOnly, Remote
from ckptgw.fsops.requeststats import RequestStats
from ckptgw.fsops.space import CacheSpace
from ckptgw.fsops.state import FileStates
from ckptgw.fsops.storekeys import StoreKeys

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FsOptions:
    store_url: str
    key_prefix: str = ""
    reserve_bytes: int = 256 << 20
    early_writeback: int = 8 << 20
    direct_io: bool = True
    writeback_cache: bool = True
    passthrough: bool = True  # FUSE passthrough where the kernel and the build allow it
    attr_timeout: float = 1.0
    cache_size: int | None = None  # bytes the cache files may hold; None: the disk's room
    write_wait: float = 60.0  # how long a write waits for the drain to free room


class Filesystem:
    """Everything fsops owns for one cache directory, opened and recovered."""

    def __init__(self, cache_dir: Path, opts: FsOptions, events: DrainEvents | None = None) -> None:
        self.opts = opts
        self.events: DrainEvents = events if events is not None else NoDrain()
        self.journal = Journal(cache_dir / "journal.db")
        try:
            bound = self.journal.get_meta("store_url")
            if bound is None:
                self.journal.set_meta("store_url", opts.store_url)
            elif bound != opts.store_url and self.journal.holds_nothing():
                # Nothing here to strand (e.g. a mount refused for a misspelled bucket made
                # this cache dir): bound to the store asked for now.
                log.info("cache dir %s held nothing for %s: bound to %s", cache_dir, bound,
                         opts.store_url)  # fmt: skip
                self.journal.set_meta("store_url", opts.store_url)
            elif bound != opts.store_url:
                raise JournalError(
                    f"cache dir {cache_dir} belongs to store {bound}, not {opts.store_url}; "
                    "use another --cache-dir (its dirty data would go to the wrong store)"
                )
            self.cache = CacheFiles(
                cache_dir, opts.reserve_bytes, opts.early_writeback, opts.direct_io
            )
        except BaseException:
            self.journal.db.close()
            raise
        self.table = InodeTable(self.journal, self.cache)
        self.states = FileStates(self.table, self.events, self.cache.room)
        try:
            self.recovery: RecoveryReport = recover(self.journal, self.cache, self.states)
            self.journal.begin_epoch()
        except BaseException:  # the journal's lock goes too: the next open may try again
            self.cache.close()
            self.journal.db.close()
            raise
        self.space = CacheSpace(self.table, self.states, opts.cache_size, opts.write_wait)
        self.keys = StoreKeys(self.table, self.states, self.events, opts.key_prefix)
        self.parts = Parts(self.table, self.states, self.keys, self.space)
        self.namespace = Namespace(self.parts, KeyRules(opts.key_prefix))
        self.path = Passthrough(opts.passthrough, self.cache, writers=opts.cache_size is None)
        self.files = OpenFiles(self.parts, opts.writeback_cache, self.path)
        self.requests = RequestStats()  # what the kernel asked, by kind

    def operations(self, remote: Remote | None = None) -> Operations:
        """The FUSE request handlers, with ``remote`` serving files only the store has."""
        return Operations(
            self.namespace,
            self.files,
            self.space,
            remote if remote is not None else LocalOnly(),
            writeback_cache=self.opts.writeback_cache,
            attr_timeout=self.opts.attr_timeout,
            stats=self.requests,
        )

    def close(self) -> None:
        """Persist what is only in memory and mark the shutdown clean."""
        self.table.persist_all()
        self.cache.sync_all()
        try:
            self.journal.check()  # a journal whose WAL fsync failed is not marked clean
        except OSError:
            self.cache.close()  # (the reserve's blocks go back; the WAL stays as it is)
            raise
        with self.journal.transaction():
            self.journal.set_meta("clean_shutdown", "1")
        self.journal.barrier_sync()
        self.cache.close()
        self.journal.close()
