"""The store side of the filesystem (:class:`fsops.remote.Remote`): listings, fetches, and
the prefetch a read of a checkpoint's file starts."""

from __future__ import annotations

import os

from ckptgw.drain.entries import Entries
from ckptgw.drain.fetch import Fetcher
from ckptgw.drain.listing import Listings
from ckptgw.drain.prefetch import Prefetcher
from ckptgw.fsops.inodes import Inode
from ckptgw.fsops.journal import InodeRow, State


class ReadThrough:
    def __init__(
        self, listings: Listings, entries: Entries, fetcher: Fetcher, prefetcher: Prefetcher
    ) -> None:
        self.listings = listings
        self.entries = entries
        self.fetcher = fetcher
        self.prefetcher = prefetcher

    async def refresh(self, directory: Inode, *, describe: bool = False) -> None:
        await self.listings.refresh(directory)
        if describe:
            await self.listings.describe_all(directory)

    def absent_for(self, directory: Inode) -> float:
        return self.listings.fresh_for(directory)

    async def describe(self, ino: Inode) -> None:
        """A file a warm-up is to fetch, or is fetching, is described by its fetch's first
        response (and fetched sooner for it) rather than by a HEAD of its own."""
        if (
            ino.is_reg
            and not self.entries.known(ino)
            and await self.fetcher.described(ino, start=self.prefetcher.planned(ino))
            and self.entries.known(ino)
        ):
            return
        await self.entries.describe(ino, strict=False)

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
