"""The parts of one filesystem that its services are built on, handed over as one.

The inode table (with the journal and the cache files under it), the state machine of the
files, the store keys and the cache space are made first, by :class:`fsops.filesystem.
Filesystem`; the services built on them (the namespace, the open files, and the drain's
uploader, listings, fetcher, prefetcher and store operations) take them as one
:class:`Parts` and, by :class:`OnParts`, have each as an attribute of the same name, so that
a service's constructor states only what is its own."""

from __future__ import annotations

from dataclasses import dataclass

from ckptgw.fsops.cache import CacheFiles
from ckptgw.fsops.inodes import InodeTable
from ckptgw.fsops.journal import Journal
from ckptgw.fsops.space import CacheSpace
from ckptgw.fsops.state import FileStates
from ckptgw.fsops.storekeys import StoreKeys


@dataclass(frozen=True)
class Parts:
    table: InodeTable
    states: FileStates
    keys: StoreKeys
    space: CacheSpace

    @property
    def journal(self) -> Journal:
        return self.table.journal

    @property
    def cache(self) -> CacheFiles:
        return self.table.cache


class OnParts:
    """A service built on a filesystem's parts: each is its attribute (read on every call,
    so an attribute, not a property)."""

    def __init__(self, parts: Parts) -> None:
        self.parts = parts
        self.table = parts.table
        self.journal = parts.journal
        self.cache = parts.cache
        self.states = parts.states
        self.keys = parts.keys
        self.space = parts.space
