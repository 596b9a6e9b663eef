"""Bring the journal and the cache files back into agreement when a cache dir is mounted.

After a clean unmount only orphans need removing, and files left ``uploading`` become
``dirty`` (the drain takes them again; a journaled upload record lets it resume). After a
crash (the ``clean_shutdown`` flag is still 0) the cache files are the truth for cached
contents: sizes are taken from them, cache files without a row are removed, and a clean file
whose cache file is gone becomes remote (the store has it). A dirty file whose cache file is
gone cannot be recovered: it is logged as an error and kept as an empty dirty file so that
the name does not silently vanish.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from ckptgw.fsops.cache import CacheFiles
from ckptgw.fsops.journal import Journal
from ckptgw.fsops.journal.rows import State
from ckptgw.fsops.state import FileStates

log = logging.getLogger(__name__)

FEW = 10_000  # remote files: looked for one by one in the cache (else the cache is listed)
CHUNK = 10_000  # inode numbers asked of the journal at once


@dataclass
class RecoveryReport:
    unclean: bool
    orphans_removed: int = 0
    sizes_fixed: int = 0
    stray_removed: int = 0
    lost: int = 0
    dirty_files: int = 0
    dirty_bytes: int = 0


def recover(journal: Journal, cache: CacheFiles, states: FileStates) -> RecoveryReport:
    report = RecoveryReport(unclean=journal.get_meta("clean_shutdown") != "1")
    orphans = journal.orphans()
    with journal.transaction():
        journal.set_meta("clean_shutdown", "0")
        for inode in orphans:
            journal.delete(inode)
        for row in journal.files_in_state(State.UPLOADING):
            states.abandon_upload(row)  # no upload runs before the drain takes it again
    for inode in orphans:
        cache.remove(inode)
    # A fetch cut short: remote files keep no content across mounts. Asked of the remote files
    # where they are few, else of the cache files (a long run's journal holds a million
    # files only in the store, and the cache few of them).
    if journal.count_remote_files() <= FEW:
        remote = journal.remote_files()
    else:
        present = sorted(cache.each_inode())
        remote = []
        for i in range(0, len(present), CHUNK):
            remote += journal.remote_among(present[i : i + CHUNK])
    for inode in remote:
        cache.remove(inode)
    report.orphans_removed = len(orphans)
    if report.unclean:
        _reconcile(journal, cache, states, report)
        cache.sync_all()
    journal.barrier_sync()
    files, nbytes = journal.totals_by_state().get(State.DIRTY, (0, 0))
    report.dirty_files, report.dirty_bytes = files, nbytes
    return report


def _reconcile(
    journal: Journal, cache: CacheFiles, states: FileStates, report: RecoveryReport
) -> None:
    """The cache files against the journal. The files with cache files are read as a stream
    and the cache files present kept as one bit per inode number: a journal of a million
    files is gone through in memory that does not grow with it."""
    present = _Bits(cache.each_inode())
    wanted = _Bits()
    fixes: list[tuple[int, int | None]] = []  # (inode, size of its cache file; None: missing)
    for inode, size in journal.cached_files():
        wanted.add(inode)
        if inode in present:
            found = cache.size(inode)
            if found != size:
                fixes.append((inode, found))
        else:
            fixes.append((inode, None))
    with journal.transaction():
        for inode, actual in fixes:
            row = journal.get(inode)
            if row is None:
                continue
            if actual is not None:
                row.size = actual
                journal.update_attrs(row)
                report.sizes_fixed += 1
            elif row.state is State.CLEAN:
                states.cache_file_missing(row)
            else:
                log.error("cache file of dirty inode %d is missing; its content is lost", row.id)
                report.lost += 1
                row.size = 0
                journal.update_attrs(row)
                cache.create(row.id)
    for inode in present.ints():
        if inode not in wanted:
            cache.remove(inode)
            report.stray_removed += 1


class _Bits:
    """A set of inode numbers, one bit each (they are dense: numbered from 1 up)."""

    def __init__(self, ints: Iterable[int] = ()) -> None:
        self._bits = bytearray()
        for i in ints:
            self.add(i)

    def add(self, i: int) -> None:
        byte = i >> 3
        if byte >= len(self._bits):
            self._bits.extend(bytes(max(byte + 1 - len(self._bits), len(self._bits))))
        self._bits[byte] |= 1 << (i & 7)

    def __contains__(self, i: int) -> bool:
        byte = i >> 3
        return byte < len(self._bits) and bool(self._bits[byte] & (1 << (i & 7)))

    def ints(self) -> Iterator[int]:
        for byte, b in enumerate(self._bits):
            if b:
                for bit in range(8):
                    if b & (1 << bit):
                        yield (byte << 3) | bit
