"""The store side of the filesystem (:class:`fsops.remote.Remote`): listings and fetches."""

from __future__ import annotations

from ckptgw.drain.entries import Entries
from ckptgw.drain.fetch import Fetcher
from ckptgw.drain.listing import Listings
from ckptgw.fsops.inodes import Inode
from ckptgw.fsops.journal import InodeRow


class ReadThrough:
    def __init__(self, listings: Listings, entries: Entries, fetcher: Fetcher) -> None:
        self.listings = listings
        self.entries = entries
        self.fetcher = fetcher

    async def refresh(self, directory: Inode) -> None:
        await self.listings.refresh(directory)

    async def describe(self, ino: Inode) -> None:
        await self.entries.describe(ino, strict=False)

    def known(self, row: InodeRow) -> bool:
        return self.entries.known(row)

    async def prepare_open(self, ino: Inode, flags: int) -> None:
        await self.fetcher.prepare_open(ino, flags)

    async def ensure(self, ino: Inode, off: int, size: int) -> None:
        await self.fetcher.ensure(ino, off, size)

    async def ensure_whole(self, ino: Inode) -> None:
        await self.fetcher.ensure_whole(ino)
