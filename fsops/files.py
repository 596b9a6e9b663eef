"""Open files and the data path: open, read, write, flush, release, fsync.

``write`` returns once the bytes are in the cache file (the OS page cache of the cache disk):
it survives a crash of the daemon. ``fsync`` returns once the cache file, its directory entry
and the journal are on stable storage: it survives a crash of the node. The write handler is
the hot path: one ``pwrite``, no journal access, no thread hop (a thread hop per 1 MiB request
costs more than the copy).
"""

from __future__ import annotations

import errno
import itertools
import os
import time
from dataclasses import dataclass

import trio

from fsops.cache import start_writeback
from fsops.inodes import Inode, InodeTable, fs_error
from fsops.journal import State
from fsops.space import CacheSpace
from fsops.state import FileStates


@dataclass
class Handle:
    inode: Inode
    writable: bool
    append: bool


class OpenFiles:
    def __init__(
        self,
        table: InodeTable,
        space: CacheSpace,
        states: FileStates,
        kernel_writeback_cache: bool,
    ) -> None:
        self.table = table
        self.cache = table.cache
        self.space = space
        self.states = states
        # With the kernel's write-back cache the kernel resolves O_APPEND itself and sends
        # absolute offsets; without it, appends are placed at our idea of the end of file.
        self._place_appends = not kernel_writeback_cache
        self._handles: dict[int, Handle] = {}
        self._next_fh = itertools.count(1)
        self.written_bytes = 0  # accepted by write(), for the metrics

    def handle(self, fh: int) -> Handle:
        try:
            return self._handles[fh]
        except KeyError:
            raise fs_error(errno.EBADF) from None

    async def open(self, ino: Inode, flags: int) -> int:
        if not ino.is_reg:
            raise fs_error(errno.EISDIR if ino.is_dir else errno.EINVAL)
        writable = (flags & os.O_ACCMODE) in (os.O_WRONLY, os.O_RDWR)
        self.table.open_fd(ino)
        try:
            now = time.time_ns()
            if flags & os.O_TRUNC and writable and ino.size:
                await self.states.mark_dirty(ino)
                os.ftruncate(ino.fd, 0)
                self.space.shrink(ino, 0)
                ino.size = 0
                ino.mtime_ns = ino.ctime_ns = now
            ino.atime_ns = now  # the last open: what eviction goes by (least recently used)
            ino.attrs_dirty = True
        except BaseException:
            self.table.close_fd(ino)
            raise
        return self._add(ino, writable, bool(flags & os.O_APPEND))

    def _add(self, ino: Inode, writable: bool, append: bool) -> int:
        fh = next(self._next_fh)
        self._handles[fh] = Handle(ino, writable, append)
        if writable:
            ino.writers += 1
        return fh

    def read(self, fh: int, off: int, size: int) -> bytes:
        return os.pread(self.handle(fh).inode.fd, size, off)

    async def write(self, fh: int, off: int, buf: bytes) -> int:
        h = self.handle(fh)
        ino = h.inode
        if ino.dirtying is not None or ino.state is not State.DIRTY:
            await self.states.mark_dirty(ino)
        if h.append and self._place_appends:
            off = ino.size
        end = off + len(buf)
        charged = await self.space.grow(ino, end) if end > ino.charged else 0
        if self.cache.direct is not None:
            ino.inflight += 1
            try:
                n = await self.cache.direct.write(ino.fd, ino.dfd, buf, off)
            finally:
                ino.inflight -= 1
                self.space.landed(charged)
                self.table.close_if_idle(ino)
        else:
            try:
                n = os.pwrite(ino.fd, buf, off)
            finally:
                self.space.landed(charged)
            ino.unsynced_bytes += n
            if ino.unsynced_bytes >= self.cache.early_writeback > 0:
                ino.unsynced_bytes = 0
                start_writeback(ino.fd)
        self.written_bytes += n
        if off + n > ino.size:
            ino.size = off + n
        ino.mtime_ns = ino.ctime_ns = time.time_ns()
        ino.attrs_dirty = True
        return n

    def flush(self, fh: int) -> None:
        ino = self.handle(fh).inode
        if ino.attrs_dirty:
            self.table.persist(ino)

    def release(self, fh: int) -> None:
        h = self._handles.pop(fh, None)
        if h is None:
            return
        ino = h.inode
        if h.writable:
            ino.writers -= 1
        if ino.attrs_dirty and ino.parent is not None:
            self.table.persist(ino)
        if h.writable and ino.writers == 0:
            self.states.quiet(ino)
        self.table.close_fd(ino)
        self.table.release_if_unused(ino)

    async def fsync(self, fh: int, datasync: bool) -> None:
        ino = self.handle(fh).inode
        sync = os.fdatasync if datasync else os.fsync
        ino.syncing += 1
        try:
            await trio.to_thread.run_sync(sync, ino.fd)
            ino.unsynced_bytes = 0
            if not ino.entry_synced:
                await trio.to_thread.run_sync(self.cache.sync_entry, ino.id)
                ino.entry_synced = True
            if ino.attrs_dirty:
                self.table.persist(ino)
            await self.table.journal.barrier()
        finally:
            ino.syncing -= 1
        # A rename usually follows an fsync at once: restart the settle delay from here, so
        # the upload goes to the final name and the temp name costs no request at all.
        if ino.writers == 0:
            self.states.quiet(ino)
