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
from dataclasses import dataclass

from ckptgw.fsops.cache import CacheFiles
from ckptgw.fsops.journal import Journal, State
from ckptgw.fsops.state import FileStates

log = logging.getLogger(__name__)


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
    for inode in journal.remote_files():
        cache.remove(inode)  # a fetch cut short: remote files keep no content across mounts
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
    present = cache.known_inodes()
    wanted: set[int] = set()
    with journal.transaction():
        for row in journal.regular_files():
            if row.state is State.REMOTE:
                continue
            wanted.add(row.id)
            if row.id in present:
                size = cache.size(row.id)
                if size != row.size:
                    row.size = size
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
    for inode in present - wanted:
        cache.remove(inode)
        report.stray_removed += 1
