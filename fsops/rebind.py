"""Binding a cache dir to another store (``ckptgw cache rebind``), e.g. after a mount against a
misspelled bucket took checkpoints that could never drain.

Every entry whose content is here (dirty, or clean: drained to the old store) becomes dirty
and stored nowhere, so the next mount uploads it to the new store. Entries only the old store
has (remote) are forgotten here, where nothing refers to them: they stay in the old store.
Uploads in progress and pending store operations name objects of the old store, so they are
dropped. All of it, and the new binding, is one journal transaction."""

from __future__ import annotations

from dataclasses import dataclass

from ckptgw.fsops.filesystem import Filesystem
from ckptgw.fsops.journal import ROOT_INODE, State


@dataclass
class RebindReport:
    old: str
    new: str
    entries: int = 0  # entries that go to the new store at the next mount
    bytes: int = 0  # their content
    forgotten: int = 0  # entries only the old store has, no longer listed here
    uploads: int = 0  # multipart uploads to the old store abandoned
    store_ops: int = 0  # moves and deletes in the old store not carried out


def rebind(fs: Filesystem, new_url: str) -> RebindReport:
    """Bind ``fs``'s cache dir to ``new_url``; ``fs`` must not be mounted."""
    journal = fs.journal
    report = RebindReport(old=journal.get_meta("store_url") or "", new=new_url)
    # Deepest first: a remote directory is forgotten once its remote entries are.
    tree = sorted(journal.subtree(ROOT_INODE), key=lambda e: -e[1].count("/"))
    with journal.transaction():
        for inode, _ in tree:
            row = journal.get(inode)
            if row is None or row.parent is None:
                continue
            if row.state is State.REMOTE and not (row.is_dir and journal.has_children(inode)):
                journal.delete(inode)
                report.forgotten += 1
                continue
            fs.states.rebind(row)
            report.entries += 1
            report.bytes += row.size if row.is_reg else 0
        report.uploads, report.store_ops = journal.forget_store()
        journal.set_meta("store_url", new_url)
    journal.barrier_sync()
    return report
