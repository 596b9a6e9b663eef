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
from ckptgw.fsops.journal.rows import ROOT_INODE, InodeRow, State
from ckptgw.fsops.names import KEY_MAX


@dataclass
class RebindReport:
    old: str
    new: str
    entries: int = 0  # entries that go to the new store at the next mount
    bytes: int = 0  # their content
    forgotten: int = 0  # entries only the old store has, no longer listed here
    uploads: int = 0  # multipart uploads to the old store abandoned
    store_ops: int = 0  # moves and deletes in the old store not carried out


class RebindError(ValueError):
    """The cache cannot go to that store as it is; nothing was changed."""


def rebind(fs: Filesystem, new_url: str, key_prefix: str) -> RebindReport:
    """Bind ``fs``'s cache dir to ``new_url``, whose keys start with ``key_prefix``; ``fs``
    must not be mounted. RebindError, with nothing changed, if a key would be too long."""
    journal = fs.journal
    report = RebindReport(old=journal.get_meta("store_url") or "", new=new_url)
    # Deepest first: a remote directory is forgotten once its remote entries are.
    subtree = sorted(journal.subtree(ROOT_INODE), key=lambda e: -e[1].count("/"))
    tree = [(row, rel) for inode, rel in subtree if (row := journal.get(inode)) is not None]
    _check_keys(tree, key_prefix)
    with journal.transaction():
        for row, _ in tree:
            if row.parent is None:
                continue
            if row.state is State.REMOTE and not (row.is_dir and journal.has_children(row.id)):
                journal.delete(row.id)
                report.forgotten += 1
                continue
            fs.states.rebind(row)
            report.entries += 1
            report.bytes += row.size if row.is_reg else 0
        report.uploads, report.store_ops = journal.forget_store()
        journal.set_meta("store_url", new_url)
    journal.barrier_sync()
    return report


def _check_keys(tree: list[tuple[InodeRow, str]], key_prefix: str) -> None:
    """Every entry that goes to the new store must have a key S3 takes (a longer prefix can
    push a deep path past 1,024 bytes; the drain could then never send it)."""
    too_long = []
    for row, rel in tree:
        if row.state is State.REMOTE and not row.is_dir:
            continue
        key = key_prefix + rel + ("/" if row.is_dir else "")  # a directory's marker key
        if len(key.encode()) > KEY_MAX:
            too_long.append(rel)
    if too_long:
        shown = ", ".join(sorted(too_long)[:3]) + (", ..." if len(too_long) > 3 else "")
        raise RebindError(
            f"{len(too_long)} path{'s' if len(too_long) != 1 else ''} would have keys longer "
            f"than {KEY_MAX} bytes under the prefix {key_prefix!r} ({shown}): choose a "
            "shorter prefix"
        )
