"""What status counts: totals per directory, the directories touched since it last asked, the
entries that may not be durable. Used by the gateway's status only."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from ckptgw.fsops.journal.connection import Connection
from ckptgw.fsops.journal.rows import InodeRow, State
from ckptgw.fsops.journal.schema import INODE_COLS, IS_DIR, NAMED, NOT_DURABLE, inode_row


def _starts_with(prefixes: Sequence[bytes]) -> tuple[str, list[bytes]]:
    """An SQL test that a name begins with one of ``prefixes`` (byte ranges of the names,
    compared as BLOBs: no text conversion per row), and its arguments."""
    if not prefixes:
        return "(0)", []
    args = [a for p in prefixes for a in _after(p)]
    return "(" + " OR ".join("(name >= ? AND name < ?)" for _ in prefixes) + ")", args


def _after(prefix: bytes) -> tuple[bytes, bytes]:
    """The range of names that begin with ``prefix`` (not empty; a name's last byte is never
    0xFF in the prefixes of checkpoint patterns, which are ASCII)."""
    return prefix, prefix[:-1] + bytes([prefix[-1] + 1])


def _durable_files(parents: Sequence[int] | None) -> tuple[str, list[object]]:
    """The files (not directories) the store holds, named in ``parents`` (None: any; an empty
    list: the caller's own ``parent = ?``), and the arguments."""
    where = f"NOT {IS_DIR} AND state IN ('{State.CLEAN.value}', '{State.REMOTE.value}')"
    if parents is None:
        return f"{where} AND parent IS NOT NULL", []
    if not parents:
        return where, []
    return f"{where} AND parent IN (SELECT value FROM json_each(?))", [json.dumps(list(parents))]


class Touched(Connection):
    """Which directories had entries added, removed, renamed or changed: the namespace's
    writes note them, status takes them."""

    def __init__(self, path: Path) -> None:
        # Directories whose files changed since take_touched last asked; None until it first
        # asks (then nothing is tracked: no cost for a mount that nobody asks for status).
        self._touched: set[int] | None = None
        super().__init__(path)

    def _touch(self, parent: int | None) -> None:
        if self._touched is not None and parent is not None:
            self._touched.add(parent)

    def _touch_rows(self, rows: list[tuple[object, ...]]) -> None:
        if self._touched is not None:
            for (parent,) in rows:
                if parent is not None:
                    self._touched.add(int(parent))  # type: ignore[call-overload]

    def take_touched(self) -> set[int] | None:
        """The directories whose entries were added, removed, renamed or changed (attributes
        or state) since the last call, and from now on tracked; None at the first call (every
        directory may have). A rolled-back change stays in it: it only means asking again."""
        touched, self._touched = self._touched, set()
        return touched


class StatusQueries(Touched):
    # A status of a cache that holds a long run's checkpoints counts a million drained files:
    # it reads them as totals per directory (one pass of SQL, then only the directories whose
    # files changed since: take_touched) and builds rows only for the few that are not durable.

    def directories(self) -> list[tuple[int, int | None, bytes]]:
        """(id, parent, name) of every named directory (the root's name is b"")."""
        rows = self.db.execute(
            f"SELECT id, parent, name FROM inodes WHERE {IS_DIR} AND parent IS NOT NULL"
        ).fetchall()
        return [(int(r[0]), int(r[1]), bytes(r[2])) for r in rows]

    def durable_totals(
        self, parents: Sequence[int] | None, prefixes: Sequence[bytes]
    ) -> tuple[dict[int, tuple[int, int, int]], list[tuple[int, int]]]:
        """Of the files (every entry but directories) in the store (clean or remote) in each
        directory of ``parents`` (None: every directory): (count, bytes, latest mtime_ns) per
        directory, with no entry for a directory without such files; and apart, not in the
        totals, (id, parent) of those whose names begin with one of ``prefixes``. One pass over
        those files (through the index on parent), then a look-up per prefix and directory
        (the index on (parent, name))."""
        where, args = _durable_files(parents)
        rows = self.db.execute(
            f"SELECT parent, count(*), sum(size), max(mtime_ns) FROM inodes WHERE {where} "
            "GROUP BY parent",
            args,
        ).fetchall()
        totals = {int(r[0]): (int(r[1]), int(r[2]), int(r[3])) for r in rows}
        if not totals or not prefixes:
            return totals, []
        where, args = _durable_files(list(totals))
        apart: list[tuple[int, int]] = []
        for p in prefixes:
            apart += self.db.execute(
                f"SELECT id, parent FROM inodes WHERE {where} AND name >= ? AND name < ?",
                [*args, *_after(p)],
            ).fetchall()
        if apart:  # those directories again, without them
            named, named_args = _starts_with(prefixes)
            again = sorted({int(r[1]) for r in apart})
            for parent in again:
                del totals[parent]
            where, args = _durable_files(again)
            for r in self.db.execute(
                f"SELECT parent, count(*), sum(size), max(mtime_ns) FROM inodes WHERE {where} "
                f"AND NOT {named} GROUP BY parent",
                [*args, *named_args],
            ):
                totals[int(r[0])] = (int(r[1]), int(r[2]), int(r[3]))
        return totals, [(int(r[0]), int(r[1])) for r in apart]

    def durable_files_in(
        self, parent: int, prefixes: Sequence[bytes]
    ) -> list[tuple[bytes, int, int]]:
        """(name, size, mtime_ns) of the files :meth:`durable_totals` counts in ``parent``."""
        named, named_args = _starts_with(prefixes)
        rows = self.db.execute(
            f"SELECT name, size, mtime_ns FROM inodes WHERE parent = ? AND "
            f"{_durable_files([])[0]} AND NOT {named}",
            [parent, *named_args],
        ).fetchall()
        return [(bytes(r[0]), int(r[1]), int(r[2])) for r in rows]

    def rows(self, ids: Sequence[int]) -> list[InodeRow]:
        """The rows of these inodes (those that exist)."""
        rows = self.db.execute(
            f"SELECT {INODE_COLS} FROM inodes WHERE id IN (SELECT value FROM json_each(?))",
            (json.dumps(list(ids)),),
        ).fetchall()
        return [inode_row(r) for r in rows]

    def maybe_pending(self) -> list[InodeRow]:
        """Named entries of every kind that may not be durable: dirty or uploading, or stored
        under a key that a pending store operation reads or writes. Every other named entry
        is durable: clean or remote, its content in the store at its stored key, which no
        pending move or delete touches. Read through indexes: as many rows as there are such
        entries, however many the journal holds."""
        rows = self.db.execute(
            f"SELECT {INODE_COLS} FROM inodes WHERE {NOT_DURABLE} AND {NAMED}"
        ).fetchall()
        rows += self.db.execute(
            f"SELECT {INODE_COLS} FROM inodes WHERE stored_key IN "
            "(SELECT src FROM store_ops UNION SELECT dst FROM store_ops WHERE dst IS NOT NULL) "
            f"AND parent IS NOT NULL AND NOT ({NOT_DURABLE})"
        ).fetchall()
        return [inode_row(r) for r in rows]
