"""Inodes in memory: the journal row plus what only lives while the kernel knows the inode.

An inode stays in memory while the kernel holds lookups on it or a file handle is open. Size
and times changed by ``write`` are kept here and written to the journal on flush, release,
fsync and unmount; every other change is written through at once. After a daemon crash the
size of a cached file is taken from its cache file, which is the truth for cached contents.

Unlinked inodes that are still referenced become orphans (no name); their row and cache file
go in :meth:`InodeTable.forget` (pyfuse3's rule: contents are freed in forget, not in unlink),
or at the next mount if the daemon dies first.
"""

from __future__ import annotations

import errno
import logging
import os
from dataclasses import dataclass, field

import trio

from ckptgw.fsops.cache import CacheFiles
from ckptgw.fsops.journal import Journal
from ckptgw.fsops.journal.rows import ROOT_INODE, InodeRow, State

log = logging.getLogger(__name__)


def fs_error(code: int) -> OSError:
    return OSError(code, os.strerror(code))


@dataclass
class Inode(InodeRow):
    lookups: int = 0
    opens: int = 0
    writers: int = 0
    fd: int = -1  # cache file descriptor while opens > 0 or writes are in flight
    dfd: int = -1  # its O_DIRECT twin, when the cache disk supports direct I/O
    inflight: int = 0  # writes waiting on a worker thread (they use fd and dfd)
    pins: int = 0  # references held by the drain while it uploads the inode
    syncing: int = 0  # fsyncs in progress: the drain waits for them (temp + fsync + rename)
    attrs_dirty: bool = False  # size/times changed since the journal row was written
    atime_dirty: bool = False  # only the last open's time changed (journaled lazily)
    entry_synced: bool = True  # the cache file's directory entry is durable
    unsynced_bytes: int = 0  # written since the last early write-back kick
    charged: int = 0  # bytes of the cache file counted in the cache's use (fsops.space)
    # The data path of its opens (fsops.passthrough): the kernel serves passthrough opens
    # from the cache file, registered once under ``backing_id`` while any is open.
    passthrough_opens: int = 0
    daemon_opens: int = 0
    backing_id: int = 0
    backing_seen: tuple[int, int] = (-1, -1)  # cache file (size, mtime) when last observed
    dirtying: trio.Event | None = field(default=None, repr=False)


class InodeTable:
    def __init__(self, journal: Journal, cache: CacheFiles) -> None:
        self.journal = journal
        self.cache = cache
        self._mem: dict[int, Inode] = {}

    def peek(self, inode: int) -> Inode | None:
        """The inode if it is in memory, without loading it."""
        return self._mem.get(inode)

    def get(self, inode: int) -> Inode:
        ino = self._mem.get(inode)
        if ino is not None:
            return ino
        row = self.journal.get(inode)
        if row is None:
            raise fs_error(errno.ENOENT)
        return self._adopt(row)

    def _adopt(self, row: InodeRow) -> Inode:
        ino = self._mem.get(row.id)
        if ino is None:
            ino = Inode(**vars(row))
            if ino.is_reg and ino.state is not State.REMOTE:
                ino.charged = ino.size
            self._mem[row.id] = ino
        return ino

    def lookup(self, parent: int, name: bytes) -> Inode | None:
        """The child of ``parent`` called ``name``, without touching lookup counts."""
        row = self.journal.lookup(parent, name)
        return None if row is None else self._adopt(row)

    def children(self, parent: int, after: int, limit: int) -> list[InodeRow]:
        """Directory entries after ``after``; the in-memory inode where there is one (its size
        and times are fresher). Use :meth:`adopt` for entries handed to the kernel."""
        return [self._mem.get(r.id, r) for r in self.journal.children(parent, after, limit)]

    def current(self, row: InodeRow) -> InodeRow:
        """The freshest view of a journal row: its in-memory inode if there is one."""
        return self._mem.get(row.id, row)

    def adopt(self, row: InodeRow) -> Inode:
        return row if isinstance(row, Inode) else self._adopt(row)

    # -- references ------------------------------------------------------------------------------

    def forget(self, inode: int, nlookup: int) -> None:
        ino = self._mem.get(inode)
        if ino is None:
            return
        ino.lookups = max(0, ino.lookups - nlookup)
        self.release_if_unused(ino)

    def release_if_unused(self, ino: Inode) -> None:
        if ino.lookups > 0 or ino.opens > 0 or ino.pins > 0 or ino.id == ROOT_INODE:
            return
        if self._mem.get(ino.id) is not ino:
            return  # already released
        del self._mem[ino.id]
        if ino.parent is None:
            self.destroy(ino.id)
        elif ino.attrs_dirty or ino.atime_dirty:
            self.persist(ino)

    def unlink(self, ino: Inode) -> bool:
        """Remove the name in the journal; delete the row too if nothing references the inode.

        Returns True when the row went: the caller removes the cache file after its
        transaction commits, so a rolled-back transaction never loses content."""
        ino.parent, ino.name = None, None
        if ino.lookups > 0 or ino.opens > 0 or ino.pins > 0:
            self.journal.set_name(ino.id, None, None)
            return False
        self._mem.pop(ino.id, None)
        self.journal.delete(ino.id)
        return True

    def destroy(self, inode: int) -> None:
        self.journal.delete(inode)
        self.cache.remove(inode)

    # -- persistence -----------------------------------------------------------------------------

    def persist(self, ino: Inode) -> None:
        """Write size, times, mode and owner (never the state: see :mod:`fsops.state`)."""
        if ino.attrs_dirty:
            self.journal.update_attrs(ino)
        else:
            with self.journal.lazily():  # only the atime: no barrier needs to wait for it
                self.journal.update_attrs(ino)
        ino.attrs_dirty = ino.atime_dirty = False

    def persist_all(self) -> None:
        for ino in list(self._mem.values()):
            if ino.attrs_dirty or ino.atime_dirty:
                self.persist(ino)

    def open_fd(self, ino: Inode) -> int:
        if ino.fd < 0:
            ino.fd = self.cache.open(ino.id)  # the O_DIRECT twin at the daemon's first write
        ino.opens += 1
        return ino.fd

    def close_fd(self, ino: Inode) -> None:
        ino.opens -= 1
        self.close_if_idle(ino)

    def close_if_idle(self, ino: Inode) -> None:
        if ino.opens == 0 and ino.inflight == 0 and ino.fd >= 0:
            os.close(ino.fd)
            if ino.dfd >= 0:
                os.close(ino.dfd)
            ino.fd = ino.dfd = -1
