"""Open files and the data path: open, read, write, flush, release, fsync.

An open takes one of two data paths (:mod:`fsops.passthrough`): the kernel's, reading and
writing the cache file itself, or the daemon's, below. On the kernel's, the daemon learns
what was written at flush, fsync, release, getattr and setattr (:meth:`OpenFiles.observe`),
and a file opened for writing is made dirty at open, before the kernel can write a byte.

On the daemon's path, ``write`` returns once the bytes are in the cache file (the OS page
cache of the cache disk): it survives a crash of the daemon. ``fsync`` returns once the
cache file, its directory entry and the journal are on stable storage: it survives a crash
of the node. The write handler is the hot path: one ``pwrite``, no journal access, no
thread hop (a thread hop per 1 MiB request costs more than the copy).
"""

from __future__ import annotations

import errno
import functools
import itertools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import trio

from ckptgw.fsops.cache import start_writeback
from ckptgw.fsops.inodes import Inode, fs_error
from ckptgw.fsops.journal.rows import State
from ckptgw.fsops.parts import OnParts, Parts
from ckptgw.fsops.passthrough import Passthrough

# An fsync on the event loop's own thread (OpenFiles.barrier): files up to this size, unless
# one took longer than INLINE_SYNC_SLOW seconds in the last INLINE_SYNC_PAUSE seconds.
INLINE_SYNC_MAX = 4 << 20
INLINE_SYNC_SLOW = 0.005
INLINE_SYNC_PAUSE = 10.0


@dataclass
class Handle:
    inode: Inode
    writable: bool
    append: bool
    backing: int  # > 0: a passthrough open on this backing id; 0: the daemon path


class OpenFiles(OnParts):
    def __init__(self, parts: Parts, kernel_writeback_cache: bool, path: Passthrough) -> None:
        super().__init__(parts)
        self.path = path
        self.kernel_writeback_cache = kernel_writeback_cache
        self._handles: dict[int, Handle] = {}
        self._next_fh = itertools.count(1)
        self.written_bytes = 0  # written to the mount, either path (for the metrics)
        self.daemon_bytes = 0  # of those, accepted by write(): through the daemon
        self.fsyncs = 0  # fsync requests answered (each on the cache disk and in the journal)
        self.inline_syncs = 0  # barriers made on the event loop's thread (see barrier())
        self._inline_off_until = 0.0  # (monotonic) after an inline sync that took long
        self._kernel_writers: dict[int, Inode] = {}  # inodes open for writing on its path

    @property
    def _place_appends(self) -> bool:
        """With the kernel's write-back cache the kernel resolves O_APPEND itself and sends
        absolute offsets; without it (or in passthrough mode, which turns it off), appends
        are placed at our idea of the end of file."""
        return self.path.negotiated or not self.kernel_writeback_cache

    def handle(self, fh: int) -> Handle:
        try:
            return self._handles[fh]
        except KeyError:
            raise fs_error(errno.EBADF) from None

    async def open(self, ino: Inode, flags: int) -> tuple[int, int]:
        """Open ``ino``; returns the handle and the backing id (0: the daemon path)."""
        if not ino.is_reg:
            raise fs_error(errno.EISDIR if ino.is_dir else errno.EINVAL)
        writable = (flags & os.O_ACCMODE) in (os.O_WRONLY, os.O_RDWR)
        self.table.open_fd(ino)
        if writable:  # a writer from here on: the drain does not take a file being opened
            ino.writers += 1
        bid = -1
        try:
            now = time.time_ns()
            self.observe(ino)  # a writer on the kernel's path may have grown it
            if writable:  # refused (ENOSPC) before an O_TRUNC empties it, not after
                self.path.admits_writer(ino)
            if flags & os.O_TRUNC and writable and ino.size:
                await self.states.mark_dirty(ino)
                os.ftruncate(ino.fd, 0)
                self.space.shrink(ino, 0)
                ino.size = 0
                ino.mtime_ns = ino.ctime_ns = now
            bid = self.path.backing(ino, writable, (flags & os.O_ACCMODE) == os.O_RDWR)
            if bid:
                self.observe(ino)  # what it is now: later changes are the kernel's writes
                if writable:  # dirty before the kernel can write a byte
                    await self.space.admit()
                    self.space.keep_headroom()
                    await self.states.mark_dirty(ino)
                    self._kernel_writers[ino.id] = ino
            ino.atime_ns = now  # the last open: what eviction goes by (least recently used)
            ino.atime_dirty = True  # journaled at release: an fsync does not wait for it
        except BaseException:
            if bid >= 0:
                self.path.closed(ino, bid, writable)
            if writable:
                ino.writers -= 1
                if ino.writers == 0:  # made dirty (or created) but not opened: no release
                    self.states.quiet(ino)  # will report it, so this does
            self.table.close_fd(ino)
            raise
        return self._add(ino, writable, bool(flags & os.O_APPEND), bid), bid

    def _add(self, ino: Inode, writable: bool, append: bool, bid: int) -> int:
        fh = next(self._next_fh)
        self._handles[fh] = Handle(ino, writable, append, bid)
        return fh

    def observe(self, ino: Inode, *, adopt: bool = True) -> None:
        """Take the size and mtime of a file the kernel writes (passthrough) from its cache
        file, where they changed since last seen; ``adopt=False`` only notes them (after the
        daemon itself changed the file: a truncate, a utimens)."""
        if not ino.passthrough_opens or ino.fd < 0:
            return
        st = os.fstat(ino.fd)
        seen = (st.st_size, st.st_mtime_ns)
        if seen == ino.backing_seen:
            return
        first = ino.backing_seen[0] < 0
        ino.backing_seen = seen
        self.path.check_room()
        if adopt and not first:
            if st.st_size > ino.size:
                self.written_bytes += st.st_size - ino.size
            ino.size = st.st_size
            ino.mtime_ns = ino.ctime_ns = st.st_mtime_ns
            ino.attrs_dirty = True
        self.space.observed(ino, st.st_size)

    async def watch(self, interval: float = 0.05) -> None:
        """With passthrough, for the life of the mount: every ``interval`` seconds while files
        are open for writing on the kernel's path, learn what they wrote (charged to the
        cache) and keep room ahead of them by evicting clean files; and look after the disk
        reserve (:meth:`fsops.passthrough.Passthrough.check_room`). Idle otherwise."""
        await self.path.initialized.wait()  # the mode is known at INIT, after the mount
        if not self.path.negotiated:
            return
        while True:
            await trio.sleep(interval if self._kernel_writers else 10 * interval)
            for ino in list(self._kernel_writers.values()):
                self.observe(ino)
            if self._kernel_writers:
                self.space.keep_headroom()
            self.path.check_room()

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
                if ino.dfd < 0:  # opened at the daemon's first write, closed with ``fd``
                    ino.dfd = self.cache.open_direct(ino.id)
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
        self.daemon_bytes += n
        if off + n > ino.size:
            ino.size = off + n
        ino.mtime_ns = ino.ctime_ns = time.time_ns()
        ino.attrs_dirty = True
        return n

    def flush(self, fh: int) -> None:
        ino = self.handle(fh).inode
        self.observe(ino)
        if ino.attrs_dirty:
            self.table.persist(ino)

    def release(self, fh: int) -> None:
        # No await: pyfuse3 reads the next request only once a handler awaits, so a RELEASE
        # is done before any request the closing process sends after close() (see
        # Passthrough.flush_skipped).
        h = self._handles.pop(fh, None)
        if h is None:
            return
        ino = h.inode
        try:
            try:
                self.observe(ino)  # what the kernel wrote through this open
            finally:  # the open ends whatever failed: the kernel writes no more through it
                self.path.closed(ino, h.backing, h.writable)
                if h.writable:
                    ino.writers -= 1
                    if ino.writers == 0:
                        self._kernel_writers.pop(ino.id, None)
                        self.states.quiet(ino)
            if h.backing and h.writable:
                # The last writer on the kernel's path gone, the reserve goes back to the
                # journal (if the disk is full) before the journal writes.
                self.path.check_room()
            if (ino.attrs_dirty or ino.atime_dirty) and ino.parent is not None:
                self.table.persist(ino)
        finally:
            self.table.close_fd(ino)
            self.table.release_if_unused(ino)

    async def barrier(
        self, first: Callable[[], object] | None, size: int, *, alone: bool = False
    ) -> None:
        """The journal barrier, after ``first`` (a cache file's fsync, of a file of ``size``
        bytes). Usually on a worker thread (:meth:`Journal.barrier`: group commit). On the
        event loop's own thread when the request is ``alone`` (no other one being answered
        or waiting in the kernel's queue, which would wait behind it), the file is small
        and no barrier runs: on 2 cores a trip to a worker thread and back (thread
        wake-ups) cost 0.35 ms, as much as the fsyncs of a small file themselves. An inline
        sync that took long (a busy disk) sends the next ones to threads for a while."""
        journal = self.table.journal
        start = time.monotonic()
        inline = alone and size <= INLINE_SYNC_MAX and start >= self._inline_off_until
        if inline and journal.idle():
            self.inline_syncs += 1
            try:
                journal.barrier_sync(first)
            finally:  # a failure after a long wait (EIO) counts as slow too
                if time.monotonic() - start > INLINE_SYNC_SLOW:
                    self._inline_off_until = time.monotonic() + INLINE_SYNC_PAUSE
            return
        await journal.barrier(first=first)

    async def fsync(self, fh: int, datasync: bool, *, alone: bool = False) -> None:
        """The cache file (and, where the filesystem needs it, its directory entry the first
        time) and then the journal made durable, in one trip to a worker thread or none
        (:meth:`barrier`). The journal's fsync is shared with every fsync that runs meanwhile
        (group commit) and left out when nothing was journaled since the last one."""
        ino = self.handle(fh).inode
        ino.syncing += 1
        try:
            self.observe(ino)
            ino.unsynced_bytes = 0
            if ino.attrs_dirty:
                self.table.persist(ino)
            entry = not ino.entry_synced and self.cache.entries_need_sync
            sync = functools.partial(self.cache.sync_file, ino.fd, ino.id, datasync, entry)
            await self.barrier(sync, ino.size, alone=alone)
            self.cache.syncs.files += 1
            self.cache.syncs.entries += entry
            ino.entry_synced = True
            self.fsyncs += 1
        finally:
            ino.syncing -= 1
        # A rename usually follows an fsync at once: restart the settle delay from here, so
        # the upload goes to the final name and the temp name costs no request at all.
        if ino.writers == 0:
            self.states.quiet(ino)
