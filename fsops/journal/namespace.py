"""The namespace: inodes by number and by (parent, name), their attributes and state columns,
paths, scans of the whole journal for recovery and the cache space, and xattrs."""

from __future__ import annotations

import json
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path

from ckptgw.fsops.journal.rows import ROOT_INODE, InodeRow, State
from ckptgw.fsops.journal.schema import INODE_COLS, IS_DIR, IS_REG, NAMED, NOT_DURABLE, inode_row
from ckptgw.fsops.journal.status import Touched

_PATHS_KEPT = 4096  # paths remembered (directories a save creates files in, mostly)


class NamespaceQueries(Touched):
    def __init__(self, path: Path) -> None:
        self._paths: dict[int, tuple[bytes, ...]] = {}  # path_components, until a name changes
        super().__init__(path)

    def _forget(self) -> None:
        self._paths.clear()
        super()._forget()

    def get(self, inode: int) -> InodeRow | None:
        r = self.db.execute(f"SELECT {INODE_COLS} FROM inodes WHERE id = ?", (inode,)).fetchone()
        return None if r is None else inode_row(r)

    def lookup(self, parent: int, name: bytes) -> InodeRow | None:
        r = self.db.execute(
            f"SELECT {INODE_COLS} FROM inodes WHERE parent = ? AND name = ?", (parent, name)
        ).fetchone()
        return None if r is None else inode_row(r)

    def insert(self, row: InodeRow) -> int:
        """Insert a new inode with the next number of this epoch (``row.id`` is ignored; its
        ``epoch`` is set) and return the number."""
        number = self._next_id
        row.epoch = self.epoch
        self.db.execute(
            f"INSERT INTO inodes ({INODE_COLS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                number,
                row.parent,
                row.name,
                row.mode,
                row.uid,
                row.gid,
                row.size,
                row.atime_ns,
                row.mtime_ns,
                row.ctime_ns,
                row.target,
                row.state,
                row.generation,
                row.stored_key,
                row.stored_etag,
                row.checksum,
                row.rdev,
                row.epoch,
            ),
        )
        self._next_id = number + 1  # only once the row is in: a failed insert uses no number
        self._touch(row.parent)
        return number

    def update_attrs(self, row: InodeRow) -> None:
        """Write an inode's attributes (mode, owner, size, times). Never its state columns:
        those change only through :mod:`fsops.state` (:meth:`set_state`)."""
        rows = self.db.execute(
            "UPDATE inodes SET mode=?, uid=?, gid=?, size=?, atime_ns=?, mtime_ns=?, ctime_ns=? "
            "WHERE id=? RETURNING parent",
            (
                row.mode,
                row.uid,
                row.gid,
                row.size,
                row.atime_ns,
                row.mtime_ns,
                row.ctime_ns,
                row.id,
            ),
        ).fetchall()
        self._touch_rows(rows)

    def set_state(self, row: InodeRow) -> None:
        """Write an inode's state columns (state, generation, stored_key, stored_etag,
        checksum). Called by :mod:`fsops.state` only; a test checks that."""
        rows = self.db.execute(
            "UPDATE inodes SET state=?, generation=?, stored_key=?, stored_etag=?, checksum=? "
            "WHERE id=? RETURNING parent",
            (row.state, row.generation, row.stored_key, row.stored_etag, row.checksum, row.id),
        ).fetchall()
        self._touch_rows(rows)

    def set_name(self, inode: int, parent: int | None, name: bytes | None) -> None:
        """Move an inode to (parent, name); (None, None) makes it an orphan."""
        if self._touched is not None:
            self._touch_rows(
                self.db.execute("SELECT parent FROM inodes WHERE id = ?", (inode,)).fetchall()
            )
        self.db.execute("UPDATE inodes SET parent=?, name=? WHERE id=?", (parent, name, inode))
        self._touch(parent)
        self._paths.clear()  # every path below it changed

    def touch_dir(self, inode: int, now_ns: int) -> None:
        self.db.execute(
            "UPDATE inodes SET mtime_ns=?, ctime_ns=? WHERE id=?", (now_ns, now_ns, inode)
        )

    def delete(self, inode: int) -> None:
        self.db.execute("DELETE FROM xattrs WHERE inode = ?", (inode,))
        self.db.execute("DELETE FROM parts WHERE inode = ?", (inode,))
        self.db.execute("DELETE FROM uploads WHERE inode = ?", (inode,))
        rows = self.db.execute("DELETE FROM inodes WHERE id = ? RETURNING parent", (inode,))
        self._touch_rows(rows.fetchall())
        self._paths.pop(inode, None)

    def has_children(self, inode: int) -> bool:
        return (
            self.db.execute("SELECT 1 FROM inodes WHERE parent = ? LIMIT 1", (inode,)).fetchone()
            is not None
        )

    def count_subdirs(self, inode: int) -> int:
        r = self.db.execute(
            f"SELECT count(*) FROM inodes WHERE parent = ? AND {IS_DIR}",
            (inode,),
        ).fetchone()
        return int(r[0])

    def children(self, parent: int, after: int, limit: int) -> list[InodeRow]:
        rows = self.db.execute(
            f"SELECT {INODE_COLS} FROM inodes WHERE parent = ? AND id > ? ORDER BY id LIMIT ?",
            (parent, after, limit),
        ).fetchall()
        return [inode_row(r) for r in rows]

    def path_components(self, inode: int) -> list[bytes]:
        """The names from the root down to ``inode`` (empty for the root). Remembered until a
        name changes: a sharded save asks for its directory's path at every create."""
        known = self._paths.get(inode)
        if known is not None:
            return list(known)
        rows = self.db.execute(
            """
            WITH RECURSIVE up(id, parent, name, depth) AS (
                SELECT id, parent, name, 0 FROM inodes WHERE id = ?
                UNION ALL
                SELECT i.id, i.parent, i.name, up.depth + 1
                  FROM inodes i JOIN up ON i.id = up.parent
            )
            SELECT name FROM up WHERE parent IS NOT NULL ORDER BY depth DESC
            """,
            (inode,),
        ).fetchall()
        names = [bytes(r[0]) for r in rows]
        if len(self._paths) >= _PATHS_KEPT:
            self._paths.clear()
        self._paths[inode] = tuple(names)
        return names

    def is_ancestor(self, ancestor: int, inode: int) -> bool:
        """True if ``ancestor`` is ``inode`` or one of its parent directories."""
        r = self.db.execute(
            """
            WITH RECURSIVE up(id, parent) AS (
                SELECT id, parent FROM inodes WHERE id = ?
                UNION ALL
                SELECT i.id, i.parent FROM inodes i JOIN up ON i.id = up.parent
            )
            SELECT 1 FROM up WHERE id = ? LIMIT 1
            """,
            (inode, ancestor),
        ).fetchone()
        return r is not None

    def longest_suffix(self, inode: int) -> int:
        """Bytes that the deepest descendant adds to this inode's path ("/a/b" -> 4)."""
        r = self.db.execute(
            """
            WITH RECURSIVE sub(id, len) AS (
                SELECT id, 0 FROM inodes WHERE id = ?
                UNION ALL
                SELECT i.id, sub.len + 1 + length(i.name)
                  FROM inodes i JOIN sub ON i.parent = sub.id
            )
            SELECT max(len) FROM sub
            """,
            (inode,),
        ).fetchone()
        return int(r[0] or 0)

    def stored_at(self, key: str, other_than: int = 0) -> InodeRow | None:
        """The file (other than inode ``other_than``) whose content the store holds, or will
        hold after a pending move, at ``key``, if any."""
        # Two rows may name one key: a clean one whose content is (or will be) there first,
        # then one whose older version it is (a dirty row's, to be overwritten or deleted).
        r = self.db.execute(
            f"SELECT {INODE_COLS} FROM inodes WHERE stored_key = ? AND id != ? "
            f"ORDER BY state IN ('{State.CLEAN.value}', '{State.REMOTE.value}') DESC LIMIT 1",
            (key, other_than),
        ).fetchone()
        return None if r is None else inode_row(r)

    def orphans(self) -> list[int]:
        rows = self.db.execute(
            "SELECT id FROM inodes WHERE parent IS NULL AND id != ?", (ROOT_INODE,)
        ).fetchall()
        return [int(r[0]) for r in rows]

    def remote_files(self) -> list[int]:
        rows = self.db.execute(
            f"SELECT id FROM inodes WHERE {IS_REG} AND state = ?", (State.REMOTE,)
        ).fetchall()
        return [int(r[0]) for r in rows]

    def count_remote_files(self) -> int:
        r = self.db.execute(
            f"SELECT count(*) FROM inodes WHERE {IS_REG} AND state = ?", (State.REMOTE,)
        ).fetchone()
        return int(r[0])

    def remote_among(self, inodes: Sequence[int]) -> list[int]:
        """Those of ``inodes`` that are regular files only in the store (remote)."""
        rows = self.db.execute(
            f"SELECT id FROM inodes WHERE id IN (SELECT value FROM json_each(?)) "
            f"AND {IS_REG} AND state = ?",
            (json.dumps(list(inodes)), State.REMOTE),
        ).fetchall()
        return [int(r[0]) for r in rows]

    def cached_files(self) -> Iterator[tuple[int, int]]:
        """(id, size) of every regular file not remote-only, named or orphaned (those
        that have cache files), read as they are iterated: memory does not grow with them.
        Nothing may change the journal until the iteration ends."""
        for r in self.db.execute(
            f"SELECT id, size FROM inodes WHERE {IS_REG} AND state != ?", (State.REMOTE,)
        ):
            yield int(r[0]), int(r[1])

    def regular_files(self) -> list[InodeRow]:
        """Every regular file, named or orphaned (those that have cache files)."""
        rows = self.db.execute(f"SELECT {INODE_COLS} FROM inodes WHERE {IS_REG}").fetchall()
        return [inode_row(r) for r in rows]

    def totals_by_state(self) -> dict[State, tuple[int, int]]:
        """(entries, bytes of content) per state: every entry but the root, and the sizes of
        regular files (a symlink's or a directory's size is not content in the cache)."""
        rows = self.db.execute(
            f"SELECT state, count(*), coalesce(sum(CASE WHEN {IS_REG} THEN size END), 0) "
            "FROM inodes WHERE parent IS NOT NULL GROUP BY state"
        ).fetchall()
        return {State(r[0]): (int(r[1]), int(r[2])) for r in rows}

    def cached_bytes(self) -> int:
        """Bytes of content the cache files hold (every regular file not remote-only)."""
        r = self.db.execute(
            f"SELECT coalesce(sum(size), 0) FROM inodes WHERE {IS_REG} AND state != ?",
            (State.REMOTE,),
        ).fetchone()
        return int(r[0])

    def eviction_candidates(self, limit: int) -> list[InodeRow]:
        """Clean files, least recently opened first."""
        rows = self.db.execute(
            f"SELECT {INODE_COLS} FROM inodes WHERE {IS_REG} AND state = ? "
            "AND parent IS NOT NULL ORDER BY atime_ns LIMIT ?",
            (State.CLEAN, limit),
        ).fetchall()
        return [inode_row(r) for r in rows]

    def subtree(self, inode: int) -> list[tuple[int, str]]:
        """Every descendant of a directory with its path relative to it ("a/b")."""
        rows = self.db.execute(
            """
            WITH RECURSIVE sub(id, rel) AS (
                SELECT id, CAST(name AS TEXT) FROM inodes WHERE parent = ?
                UNION ALL
                SELECT i.id, sub.rel || '/' || CAST(i.name AS TEXT)
                  FROM inodes i JOIN sub ON i.parent = sub.id
            )
            SELECT id, rel FROM sub
            """,
            (inode,),
        ).fetchall()
        return [(int(r[0]), str(r[1])) for r in rows]

    def resolve(self, path: str) -> InodeRow | None:
        """The entry at a path relative to the root ("" is the root), or None."""
        row = self.get(ROOT_INODE)
        for name in [p for p in path.split("/") if p and p != "."]:
            if row is None:
                return None
            row = self.lookup(row.id, name.encode())
        return row

    def files_under(self, inode: int, *, dirs: bool = False) -> list[tuple[InodeRow, str]]:
        """Every entry below a directory but directories (regular files, symlinks, special
        files; with ``dirs``, directories too), with its path relative to it ("a/b"). Those
        that may not be durable, of the whole journal: :meth:`maybe_pending`."""
        cols = ", ".join(f"i.{c.strip()}" for c in INODE_COLS.split(","))
        rows = self.db.execute(
            f"""
            WITH RECURSIVE sub(id, rel) AS (
                SELECT id, CAST(name AS TEXT) FROM inodes WHERE parent = ?
                UNION ALL
                SELECT i.id, sub.rel || '/' || CAST(i.name AS TEXT)
                  FROM inodes i JOIN sub ON i.parent = sub.id
            )
            SELECT {cols}, sub.rel FROM sub JOIN inodes i ON i.id = sub.id
             WHERE (? OR (i.mode & {stat.S_IFMT(0xFFFFFFFF)}) != {stat.S_IFDIR})
            """,
            (inode, dirs),
        ).fetchall()
        return [(inode_row(r[:-1]), str(r[-1])) for r in rows]

    def files_in_state(self, state: State) -> list[InodeRow]:
        """Entries of every kind in ``state`` (the root, never drained, is always clean)."""
        rows = self.db.execute(
            f"SELECT {INODE_COLS} FROM inodes WHERE state = ? AND id != ?", (state, ROOT_INODE)
        ).fetchall()
        return [inode_row(r) for r in rows]

    def dirty_files(self) -> list[int]:
        """Named entries of every kind that the store lacks (dirty) or is being sent."""
        rows = self.db.execute(f"SELECT id FROM inodes WHERE {NOT_DURABLE} AND {NAMED}").fetchall()
        return [int(r[0]) for r in rows]

    # -- xattrs --------------------------------------------------------------------------------

    def xattrs(self, inode: int) -> list[tuple[bytes, bytes]]:
        rows = self.db.execute(
            "SELECT name, value FROM xattrs WHERE inode = ? ORDER BY name", (inode,)
        )
        return [(bytes(r[0]), bytes(r[1])) for r in rows]

    def replace_xattrs(self, inode: int, pairs: list[tuple[bytes, bytes]]) -> None:
        self.db.execute("DELETE FROM xattrs WHERE inode = ?", (inode,))
        self.db.executemany(
            "INSERT INTO xattrs VALUES (?, ?, ?)", [(inode, n, v) for n, v in pairs]
        )

    def get_xattr(self, inode: int, name: bytes) -> bytes | None:
        r = self.db.execute(
            "SELECT value FROM xattrs WHERE inode = ? AND name = ?", (inode, name)
        ).fetchone()
        return None if r is None else bytes(r[0])

    def set_xattr(self, inode: int, name: bytes, value: bytes) -> None:
        self.db.execute("INSERT OR REPLACE INTO xattrs VALUES (?, ?, ?)", (inode, name, value))

    def list_xattrs(self, inode: int) -> Sequence[bytes]:
        rows = self.db.execute("SELECT name FROM xattrs WHERE inode = ? ORDER BY name", (inode,))
        return [bytes(r[0]) for r in rows]

    def remove_xattr(self, inode: int, name: bytes) -> bool:
        cur = self.db.execute("DELETE FROM xattrs WHERE inode = ? AND name = ?", (inode, name))
        return cur.rowcount > 0

    def subdirs(self, parent: int) -> list[InodeRow]:
        """The directories in ``parent`` (a chown of it changes the owner a listing gives
        those of them that have no marker object: see :mod:`fsops.namespace`)."""
        rows = self.db.execute(
            f"SELECT {INODE_COLS} FROM inodes WHERE parent = ? AND {IS_DIR}", (parent,)
        ).fetchall()
        return [inode_row(r) for r in rows]
