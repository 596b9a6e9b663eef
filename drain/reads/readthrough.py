"""The store side of the filesystem (:class:`fsops.remote.Remote`): listings, fetches, and
the prefetch a read of a checkpoint's file starts.

A lookup or an opendir waits for the store at most ``store.lookup_wait`` seconds
(:mod:`drain.reads.lookupwait`): for the directory's listing (where the journal may answer
without it: :meth:`drain.reads.listing.Listings.has_view`), and for the description of the entry
looked up (then it is answered with attributes the kernel does not keep, and looked up again
at its next use). What was asked goes on in the background and is applied when it comes.
"""

from __future__ import annotations

import errno
import os

import trio

from ckptgw.drain.reads.entries import Entries
from ckptgw.drain.reads.fetch import Fetcher
from ckptgw.drain.reads.listing import Listings
from ckptgw.drain.reads.lookupwait import LookupWait, Pending
from ckptgw.drain.reads.prefetch import Prefetcher
from ckptgw.fsops.inodes import Inode, fs_error
from ckptgw.fsops.journal import InodeRow, State


class ReadThrough:
    def __init__(
        self, listings: Listings, entries: Entries, fetcher: Fetcher, prefetcher: Prefetcher
    ) -> None:
        self.listings = listings
        self.entries = entries
        self.fetcher = fetcher
        self.prefetcher = prefetcher
        self.waits: LookupWait = listings.waits  # the deadline, and what status may show
        self._describing: dict[int, Pending] = {}  # inode -> its description under way
        # HEADs of lookups in flight at once: past the lookup wait they go on in the
        # background, and a stalled store must not gather thousands of them (``ls -l`` or
        # ``find`` of a big tree); the others wait here, on this side of the store.
        self._heads = trio.CapacityLimiter(listings.config.heads)

    async def refresh(self, directory: Inode, *, describe: bool = False) -> None:
        deadline = trio.current_time() + self.waits.wait
        await self.listings.refresh(directory, deadline=deadline)
        if describe:
            if not self.listings.has_view(directory):
                # Its first listing failed: showing what the journal has would say "empty".
                raise fs_error(errno.EIO)
            await self.listings.describe_all(directory, deadline=deadline)

    def absent_for(self, directory: Inode) -> float:
        if not self.listings.has_view(directory):
            # Never listed (its first listing failed): the store may hold the name.
            raise fs_error(errno.EIO)
        return self.listings.fresh_for(directory)

    async def describe(self, ino: Inode) -> None:
        """Before a lookup answers: the entry's attributes from the store, waited for until
        the lookup wait; past it the lookup answers without them (the kernel is told not to
        keep them) and the description goes on, shared by the next lookups."""
        if self.entries.known(ino):
            return
        job = self._describing.get(ino.id) or await self.waits.start(
            self._describing,
            ino,
            f"HEAD {self.listings.keys.entry_key(ino) if ino.is_dir else ino.stored_key}",
            lambda job: self._describe(ino, job),
            self.listings.table,
        )
        if not await self.waits.join(job):
            self.waits.undescribed += 1

    async def _describe(self, ino: Inode, job: Pending) -> bool:
        """A file a warm-up is to fetch, or is fetching, is described by its fetch's first
        response (and fetched sooner for it) rather than by a HEAD of its own."""
        if ino.is_reg and not self.entries.known(ino):
            job.what = f"the first response of the fetch of {ino.stored_key}"
            job.of_store = False  # the fetch may wait for a GET slot first
            if await self.fetcher.described(
                ino, start=self.prefetcher.planned(ino)
            ) and self.entries.known(ino):
                return True
            job.what, job.of_store = f"HEAD {ino.stored_key}", True
        async with self._heads:
            await self.entries.describe(ino, strict=False)
        return self.entries.known(ino)

    def known(self, row: InodeRow) -> bool:
        return self.entries.known(row)

    async def prepare_open(self, ino: Inode, flags: int) -> None:
        remote = ino.state is State.REMOTE
        await self.fetcher.prepare_open(ino, flags)
        if remote and (flags & os.O_ACCMODE) == os.O_RDONLY:
            self.prefetcher.opened(ino)  # the rest of its checkpoint, in the background

    async def ensure(self, ino: Inode, off: int, size: int) -> None:
        await self.fetcher.ensure(ino, off, size)

    async def ensure_whole(self, ino: Inode) -> None:
        await self.fetcher.ensure_whole(ino)
