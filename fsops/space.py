"""The cache as a bounded tier: charging growth against the limit, eviction, back-pressure.

Two bounds apply to every byte a cache file grows by: the configured cache size (``limit``,
optional) and the disk reserve (the journal must always be able to commit). When growth does
not fit, clean files are evicted, least recently used first (``atime`` is the last open, and a
checkpoint's files were written together, so older checkpoints go first unless read since);
dirty, uploading, open and fetching files are never evicted. When that is not enough the
writer waits, up to ``write_wait`` seconds, for the drain to make files clean (or for anything
else to free space), and only then gets ENOSPC. Nothing is acknowledged that is not in a cache
file.

Growth is charged per inode up to ``Inode.charged`` (the size already paid for), so writes
that overlap or race do not count twice.
"""

from __future__ import annotations

import errno
import logging
from dataclasses import dataclass

import trio

from ckptgw.fsops.inodes import Inode, InodeTable, fs_error
from ckptgw.fsops.journal.rows import InodeRow, State
from ckptgw.fsops.signal import Signal
from ckptgw.fsops.state import FileStates

log = logging.getLogger(__name__)


@dataclass
class SpaceStats:
    evictions: int = 0
    evicted_bytes: int = 0
    waits: int = 0  # writes that had to wait for the drain
    enospc: int = 0  # writes refused after waiting


class CacheSpace:
    def __init__(
        self, table: InodeTable, states: FileStates, limit: int | None, write_wait: float
    ) -> None:
        self.table = table
        self.states = states
        self.cache = table.cache
        self.journal = table.journal
        self.limit = limit
        self.write_wait = write_wait
        self.stats = SpaceStats()
        self.room: Signal = self.cache.room
        self._full_at = -1  # room.version when a write last gave up; -1: not full
        self._waiting = 0  # writes waiting for room now
        # Charged but not yet written (statvfs does not show it yet): writes on their way to
        # the cache file, and the unfetched rest of fetches.
        self._landing = 0
        self.cache.used = self.journal.cached_bytes()

    @property
    def _full(self) -> bool:
        """A write got ENOSPC after the full wait and nothing has freed room since: the next
        writes fail at once (the kernel's write-back would otherwise wait once per page)."""
        return self._full_at == self.room.version

    def capacity(self) -> int:
        """The most the cache files could ever hold: the limit, or the disk less the reserve."""
        st = self.cache.space()
        disk = st.total_blocks * st.block_size - self.cache.reserve_bytes
        return disk if self.limit is None else min(self.limit, disk)

    def fits_now(self, nbytes: int) -> bool:
        """Whether ``nbytes`` more can be charged at once, without evicting or waiting."""
        if self.limit is not None and self.cache.used + nbytes > self.limit:
            return False
        return self.cache.disk_room() - self._landing >= nbytes

    def landed(self, nbytes: int) -> None:
        """Bytes charged by :meth:`grow` are now written (or will never be)."""
        self._landing = max(0, self._landing - nbytes)
        self.cache.disk_changed()  # statvfs shows them now

    async def grow(self, ino: Inode, end: int, *, patient: bool = False) -> int:
        """Charge the cache file of ``ino`` growing to ``end`` bytes; ENOSPC if it cannot.
        Returns the bytes charged: the caller reports them :meth:`landed` once written.
        ``patient`` (fetches) waits the full time even right after another write gave up."""
        need = end - ino.charged
        if need <= 0:
            return 0
        if not self.fits_now(need):
            await self._make_room(need, patient)
            need = end - ino.charged  # another write may have charged part of it meanwhile
            if need <= 0:
                return 0
        self.cache.used += need
        self._landing += need
        ino.charged = end
        return need

    async def admit(self) -> None:
        """Before an open for writing whose bytes the daemon will not see (passthrough): the
        cache must have room for more, else the writer waits for the drain like a write, then
        gets ENOSPC. What it writes is charged as it is observed (:meth:`observed`)."""
        if not self.fits_now(1):
            await self._make_room(1, patient=False)

    def keep_headroom(self) -> None:
        """Writers on the kernel's path write without asking: keep room ahead of them, by
        evicting clean files, up to an eighth of the cache (at most 1 GiB). Dirty files
        cannot go: a disk full of them gives the writer the disk's own ENOSPC."""
        headroom = min(1 << 30, self.capacity() // 8)
        if not self.fits_now(headroom):
            self.evict(headroom)

    def observed(self, ino: Inode, size: int) -> None:
        """The cache file of ``ino`` was found ``size`` bytes long, written by the kernel
        (passthrough): charge the growth, then evict clean files if that passed the limit."""
        if size > ino.charged:
            self.cache.used += size - ino.charged
            ino.charged = size
            if not self.fits_now(0):
                self.evict(0)

    def shrink(self, ino: Inode, size: int) -> None:
        if size < ino.charged:
            self.cache.uncharge(ino.charged - size)
            ino.charged = size

    async def _make_room(self, need: int, patient: bool) -> None:
        self.evict(need)
        if self.fits_now(need):
            return
        if need > self.capacity():
            raise fs_error(errno.ENOSPC)  # could never fit, however long it waited
        if self._full and not patient:
            raise fs_error(errno.ENOSPC)
        if self._waiting == 0:
            self.stats.waits += 1
            log.info("cache full of dirty data: writes wait for the drain")
        self._waiting += 1
        try:
            deadline = trio.current_time() + self.write_wait
            while True:
                remaining = deadline - trio.current_time()
                if remaining <= 0 or (self._full and not patient):
                    break
                # disk space freed by others, too
                await self.room.wait(self.room.version, min(remaining, 1.0))
                self.evict(need)
                if self.fits_now(need):
                    return
        finally:
            self._waiting -= 1
        if not self._full:
            self._full_at = self.room.version
            self.stats.enospc += 1
            log.warning(
                "cache full: %d bytes in use%s, no clean file left to evict; writes get "
                "ENOSPC after waiting %.0f s for the drain, until room is freed",
                self.cache.used,
                "" if self.limit is None else f" of {self.limit}",
                self.write_wait,
            )
        raise fs_error(errno.ENOSPC)

    def evict(self, need: int) -> None:
        """Evict clean files, least recently used first, until ``need`` bytes fit."""
        while not self.fits_now(need):
            rows = self.journal.eviction_candidates(64)
            evicted = 0
            for row in rows:
                if self.fits_now(need):
                    return
                evicted += self._evict_one(row)
            if not evicted:
                return

    def _evict_one(self, row: InodeRow) -> int:
        ino = self.table.peek(row.id)
        if ino is not None and (ino.opens or ino.pins or ino.inflight or ino.fd >= 0):
            return 0
        if self.table.current(row).state is not State.CLEAN:
            return 0
        self.states.evict(row)  # journal first: a crash then leaves a stray file
        self.cache.remove(row.id)
        self.stats.evictions += 1
        self.stats.evicted_bytes += row.size
        log.debug("evicted inode %d (%d bytes)", row.id, row.size)
        return 1

    def free_bytes(self) -> int:
        """Room for new data: the disk's, capped by the limit (clean files count as free)."""
        room = self.cache.disk_room()
        if self.limit is not None:
            clean = self.journal.totals_by_state().get(State.CLEAN, (0, 0))[1]
            room = min(room, self.limit - self.cache.used + clean)
        return max(0, room)
