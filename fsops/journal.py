"""The metadata journal: namespace, per-file state and xattrs in one SQLite database (WAL).

Every SQL statement of the project lives in this module. Callers get plain rows back.

Durability model
----------------
The connection runs with ``synchronous=NORMAL``: a commit reaches the WAL file in the OS page
cache, so it survives a crash of the daemon (``kill -9``) but not yet a power loss.
:meth:`Journal.barrier` makes every commit so far durable by fsyncing the WAL; ``fsync`` and
``fsyncdir`` of the filesystem call it, which is what makes their promise hold. SQLite
guarantees that frames moved out of the WAL by a checkpoint are fsynced in the main database
before the WAL is reused, so fsyncing the WAL covers every earlier commit.
"""

from __future__ import annotations

import contextlib
import enum
import json
import logging
import os
import sqlite3
import stat
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import trio

SCHEMA_VERSION = 4
_PATHS_KEPT = 4096  # paths remembered (directories a save creates files in, mostly)
ROOT_INODE = 1
# The journal's own room on the cache disk: its WAL is allocated to this size at open
# (Journal._keep_room), so commits land in blocks it already has and need no free space.
# SQLite reuses the WAL from its start after each checkpoint (every 1000 pages, 4 MiB) and
# cuts it back only to journal_size_limit (64 MiB), so about 12 MiB of commits can be made
# on a disk without a free block (a checkpoint that cannot grow the database leaves its
# frames in the WAL). A writer on the kernel's path, which can take every free block of
# the disk, cannot take these (see fsops.passthrough.Passthrough.check_room). This holds
# where a file is overwritten in place (ext4, XFS, tmpfs), not on copy-on-write filesystems
# (btrfs, ZFS), which need new blocks for each rewrite.
WAL_ROOM = 16 << 20

log = logging.getLogger(__name__)


class State(enum.StrEnum):
    """Per-file state; see ARCHITECTURE.md for the transitions and invariants."""

    DIRTY = "dirty"  # the cache holds content the store lacks
    UPLOADING = "uploading"  # an upload of `generation` is under way
    CLEAN = "clean"  # the object under the current path has this generation's content
    REMOTE = "remote"  # known from the store, not in the cache


class JournalError(Exception):
    """The journal cannot be used (wrong store, newer schema, corrupt)."""


@dataclass
class InodeRow:
    id: int
    parent: int | None
    name: bytes | None
    mode: int
    uid: int
    gid: int
    size: int
    atime_ns: int
    mtime_ns: int
    ctime_ns: int
    target: bytes | None
    state: State
    generation: int
    stored_key: str | None = None
    stored_etag: str | None = None
    checksum: str | None = None
    rdev: int = 0
    # The mount epoch that gave this inode its number: the generation in its FUSE (and so
    # NFS) file handles. Numbers are never reused within an epoch, so (id, epoch) names one
    # inode for the life of the journal, and a handle of a deleted file is stale, never another.
    epoch: int = 0

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)

    @property
    def is_reg(self) -> bool:
        return stat.S_ISREG(self.mode)


_INODE_COLS = (
    "id, parent, name, mode, uid, gid, size, atime_ns, mtime_ns, ctime_ns, target, state, "
    "generation, stored_key, stored_etag, checksum, rdev, epoch"
)


_IS_DIR = f"(mode & {stat.S_IFMT(0xFFFFFFFF)}) = {stat.S_IFDIR}"
_IS_REG = f"(mode & {stat.S_IFMT(0xFFFFFFFF)}) = {stat.S_IFREG}"
# A directory's link count (2 + its subdirectories) is asked with every reply about it: this
# index answers it without walking the directory's files (added to older journals at open).
_SUBDIRS_INDEX = f"CREATE INDEX IF NOT EXISTS inodes_subdirs ON inodes (parent) WHERE {_IS_DIR}"
# An entry that takes a name looks for pending operations on its key (StoreKeys.claim): a
# create in the middle of an `rm -rf` of thousands of files must not scan them all.
_STORE_OPS_INDEX = "CREATE INDEX IF NOT EXISTS store_ops_by_src ON store_ops (src)"
# The entries not in the store yet (dirty_files: the drain's audit, flush, the emergency
# drain's end) are read without a scan of every entry the journal holds.
_NOT_DURABLE = f"state IN ('{State.DIRTY.value}', '{State.UPLOADING.value}')"
# "Named" (not the root, not an orphan) without the index on parent: a scan of it from the
# first parent on would cost a read of every entry (the planner, without statistics, takes it
# over the small index on entries not durable).
_NAMED = "+parent IS NOT NULL"
_NOT_DURABLE_INDEX = (
    f"CREATE INDEX IF NOT EXISTS inodes_not_durable ON inodes (id) WHERE {_NOT_DURABLE}"
)


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
    where = f"NOT {_IS_DIR} AND state IN ('{State.CLEAN.value}', '{State.REMOTE.value}')"
    if parents is None:
        return f"{where} AND parent IS NOT NULL", []
    if not parents:
        return where, []
    return f"{where} AND parent IN (SELECT value FROM json_each(?))", [json.dumps(list(parents))]


@dataclass
class UploadRow:
    inode: int
    generation: int
    key: str
    upload_id: str | None
    part_size: int
    size: int
    checksum: str


@dataclass
class StoreOp:
    id: int
    kind: str
    src: str
    dst: str | None
    etag: str | None


def _row(r: tuple[object, ...]) -> InodeRow:
    row = InodeRow(*r)  # type: ignore[arg-type]
    row.state = State(row.state)
    return row


def create_tables(db: sqlite3.Connection) -> None:
    """Create the schema. Sentinels: ``parent IS NULL`` marks the root (id 1) and inodes that
    were unlinked while still open or looked up (orphans, freed in ``forget`` or at the next
    mount); ``target`` is only set for symlinks."""
    statement = ""
    for line in _SCHEMA.splitlines(keepends=True):
        statement += line
        if sqlite3.complete_statement(statement):
            db.execute(statement)
            statement = ""


_SCHEMA = """
        -- Key/value facts about this cache: schema_version, store_url, clean_shutdown (0/1),
        -- epoch (mounts so far: see Journal.begin_epoch).
        CREATE TABLE meta (
            key   TEXT PRIMARY KEY,
            value TEXT NOT NULL
        );

        -- One row per inode: every kind of entry (regular file, directory, symlink, FIFO,
        -- socket, device). Hard links are not supported (EPERM), so every inode has at most
        -- one name and the namespace lives in the same row: (parent, name).
        CREATE TABLE inodes (
            id         INTEGER PRIMARY KEY,   -- FUSE inode number; 1 is the root
            parent     INTEGER,               -- NULL: root or orphan (see above)
            name       BLOB,                  -- one path component, bytes as given by the kernel
            mode       INTEGER NOT NULL,      -- st_mode including the file type bits
            uid        INTEGER NOT NULL,
            gid        INTEGER NOT NULL,
            size       INTEGER NOT NULL DEFAULT 0,
            atime_ns   INTEGER NOT NULL,
            mtime_ns   INTEGER NOT NULL,
            ctime_ns   INTEGER NOT NULL,
            target     BLOB,                  -- symlink target, NULL otherwise
            state      TEXT NOT NULL,         -- dirty | uploading | clean | remote (State)
            generation INTEGER NOT NULL DEFAULT 1, -- bumped on every transition into dirty
            stored_key  TEXT,                 -- where the store holds this inode's content
            stored_etag TEXT,                 --   (NULL: nowhere; see ARCHITECTURE.md)
            checksum   TEXT,                  -- of the content at stored_key (fsops.contentsum)
            rdev       INTEGER NOT NULL DEFAULT 0, -- device number (character, block devices)
            epoch      INTEGER NOT NULL DEFAULT 0, -- mount epoch that gave out `id` (see InodeRow)
            UNIQUE (parent, name)
        );
        -- readdir walks a directory in inode-number order: offsets stay stable while entries
        -- are added or removed, and a rename never moves an entry within its directory.
        CREATE INDEX inodes_by_parent ON inodes (parent, id);
        CREATE INDEX inodes_by_stored_key ON inodes (stored_key) WHERE stored_key IS NOT NULL;

        -- One row per upload in progress: what is being uploaded, so that a restart
        -- resumes it (same generation) or aborts it (anything changed).
        CREATE TABLE uploads (
            inode      INTEGER PRIMARY KEY,
            generation INTEGER NOT NULL,      -- the content generation being uploaded
            key        TEXT NOT NULL,         -- the object key it goes to
            upload_id  TEXT,                  -- multipart upload id; NULL for a single PUT
            part_size  INTEGER NOT NULL,
            size       INTEGER NOT NULL,
            checksum   TEXT NOT NULL          -- a single PUT's xxh3-128; "crc32:<part size>"
        );

        -- Finished parts of multipart uploads.
        CREATE TABLE parts (
            inode  INTEGER NOT NULL,
            number INTEGER NOT NULL,
            etag   TEXT NOT NULL,
            crc32  INTEGER,               -- of the bytes sent (NULL: journaled by version 3)
            PRIMARY KEY (inode, number)
        ) WITHOUT ROWID;

        -- Store operations a namespace change implies, committed with it and done in id order:
        -- 'move' (server-side copy src -> dst, then delete src unless an entry holds src by
        -- then), 'delete' (src, unless an entry holds it by then; an entry that takes the
        -- name before the delete starts drops it: StoreKeys.claim) and 'meta' (src copied
        -- onto itself with the entry's metadata).
        CREATE TABLE store_ops (
            id     INTEGER PRIMARY KEY,
            kind   TEXT NOT NULL,            -- move | delete | meta
            src    TEXT NOT NULL,
            dst    TEXT,
            etag   TEXT                      -- src's etag when journaled (move, delete), if known
        );

        CREATE TABLE xattrs (
            inode INTEGER NOT NULL,
            name  BLOB NOT NULL,
            value BLOB NOT NULL,
            PRIMARY KEY (inode, name)
        ) WITHOUT ROWID;
"""


class _FirstFailed(OSError):
    """What a barrier ran first failed, not the journal's own fsync."""


class Journal:
    """Owner of the SQLite connection. Used from the trio thread only."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._paths: dict[int, tuple[bytes, ...]] = {}  # path_components, until a name changes
        # Directories whose files changed since take_touched last asked; None until it first
        # asks (then nothing is tracked: no cost for a mount that nobody asks for status).
        self._touched: set[int] | None = None
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        try:
            self._prepare(path)
        except BaseException:
            self.db.close()  # its lock goes with it: the next open may try again
            raise
        # The WAL exists from the first commit on and is never deleted while we hold the
        # connection open (it is only truncated), so one descriptor serves every barrier.
        self._wal_fd = os.open(f"{path}-wal", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self._keep_room()
        self._durable = -1  # total_changes that the last WAL fsync covered
        self._syncing: trio.Event | None = None  # the WAL fsync running now
        self._broken: OSError | None = None  # a WAL fsync failed
        self.barriers = 0  # WAL fsyncs done

    def _keep_room(self) -> None:
        """Allocate the WAL's blocks up to :data:`WAL_ROOM` (what it holds stays; SQLite
        reads frames only up to the first invalid one, and zeros are invalid): the
        journal's room, which no other writer of the disk can take. Best effort: a disk
        without that much free keeps the WAL as it is (said once, here)."""
        try:
            os.posix_fallocate(self._wal_fd, 0, WAL_ROOM)
        except OSError as e:
            log.warning(
                "journal %s: no room kept in its WAL (%s): a full cache disk may refuse its "
                "commits",
                self.path,
                e.strerror,
            )

    def _prepare(self, path: Path) -> None:
        """Settings, a fresh schema or the migrations to this version, and the inode count."""
        # One connection, one process: holding the lock from the first statement to close
        # spares each statement its lock and unlock calls (fcntl) and keeps the WAL index in
        # memory, not in a shared -shm file. A second process opening it gets "locked".
        self.db.execute("PRAGMA locking_mode=EXCLUSIVE")
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("PRAGMA foreign_keys=OFF")
        self.db.execute("PRAGMA journal_size_limit=67108864")
        fresh = not self.db.execute("SELECT 1 FROM sqlite_master WHERE name = 'meta'").fetchone()
        if fresh:
            with self.transaction():
                create_tables(self.db)
                now = time.time_ns()
                self.db.execute(
                    f"INSERT INTO inodes ({_INODE_COLS}) VALUES "
                    "(?, NULL, NULL, ?, ?, ?, 0, ?, ?, ?, NULL, ?, 1, NULL, NULL, NULL, 0, 0)",
                    (ROOT_INODE, 0o40755, os.getuid(), os.getgid(), now, now, now, State.CLEAN),
                )
                self.db.executemany(
                    "INSERT INTO meta VALUES (?, ?)",
                    [("schema_version", str(SCHEMA_VERSION)), ("clean_shutdown", "1")],
                )
        version = int(self.get_meta("schema_version") or 0)
        if version == 1:
            self._migrate_from_1()
            version = 2
        if version == 2:
            self._migrate_from_2()
            version = 3
        if version == 3:
            self._migrate_from_3()
            version = SCHEMA_VERSION
        if version != SCHEMA_VERSION:
            raise JournalError(
                f"journal {path} has schema version {version}, this ckptgw reads {SCHEMA_VERSION}"
            )
        self.db.execute(_SUBDIRS_INDEX)
        self.db.execute(_STORE_OPS_INDEX)
        self.db.execute(_NOT_DURABLE_INDEX)
        self.epoch = int(self.get_meta("epoch") or 0)
        self._next_id = self._max_id() + 1

    def _migrate_from_1(self) -> None:
        """Version 1 had no device numbers, and only regular files had a drain state: its
        directories and symlinks were never in the store, so they start dirty here (their
        marker or object is uploaded)."""
        with self.transaction():
            self.db.execute("ALTER TABLE inodes ADD COLUMN rdev INTEGER NOT NULL DEFAULT 0")
            self.db.execute(
                f"UPDATE inodes SET state = ? WHERE NOT {_IS_REG} AND id != ? "
                "AND parent IS NOT NULL AND state = ?",
                (State.DIRTY, ROOT_INODE, State.CLEAN),
            )
            self.set_meta("schema_version", "2")

    def _migrate_from_2(self) -> None:
        """Version 2 had no epochs: its inodes keep epoch 0 (their handles stay valid), and
        every mount from now on gives out numbers in an epoch of its own."""
        with self.transaction():
            self.db.execute("ALTER TABLE inodes ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0")
            self.set_meta("schema_version", "3")

    def _migrate_from_3(self) -> None:
        """Version 3 journaled no part's CRC32: its uploads in progress (their metadata has
        an xxh3-128 of the whole file) are not resumed but begun again (drain.uploads.upload)."""
        with self.transaction():
            self.db.execute("ALTER TABLE parts ADD COLUMN crc32 INTEGER")
            self.set_meta("schema_version", str(SCHEMA_VERSION))

    # -- transactions and durability ---------------------------------------------------------

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """One atomic change. Inside another transaction it joins that one (which commits or
        rolls back the whole), so a step that commits on its own can also be part of more."""
        if self.db.in_transaction:
            yield
            return
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield
            self.db.execute("COMMIT")
        except BaseException:
            # A path read inside may be one that is not committed (SQLite may also have
            # rolled back by itself, or the COMMIT failed): forget them all.
            self._paths.clear()
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")
            raise

    @contextlib.contextmanager
    def lazily(self) -> Iterator[None]:
        """Commits whose loss in a crash is harmless (an open's atime): they ask for no
        barrier of their own, and the next barrier makes them durable with the rest."""
        synced = self._durable >= self.db.total_changes
        yield
        if synced and not self.db.in_transaction:
            self._durable = self.db.total_changes

    def unsynced(self) -> bool:
        """Whether a commit was made since the last barrier began."""
        return self.db.total_changes > self._durable

    async def barrier(self, first: Callable[[], object] | None = None) -> None:
        """Return once every commit so far is on stable storage; with ``first``, call it on
        the same worker thread just before (an fsync of a cache file: one trip for both).

        Group commit: one fsync of the WAL covers every commit made before it started, so
        a barrier asked for while one runs waits for it (and, if its own commits came
        later, for the next, which covers everything asked meanwhile); a barrier with no
        commit since the last one does nothing but ``first``. Commits are counted by the
        rows they changed (``total_changes``). A failed fsync of the WAL leaves the journal
        broken: every barrier after it fails too, as the kernel may have dropped the pages
        it could not write (retrying would report them durable)."""
        want = self.db.total_changes
        while True:
            if self._broken is not None:
                raise self._broken
            if self._durable >= want:
                if first is not None:
                    await trio.to_thread.run_sync(first)
                return
            if self._syncing is not None:
                running = self._syncing
                if first is not None:  # its own work now, while the other sync runs
                    await trio.to_thread.run_sync(first)
                    first = None
                await running.wait()  # (set already if it ended meanwhile)
                continue
            covers = self._covers()
            self._syncing = done = trio.Event()
            try:
                await trio.to_thread.run_sync(self._sync_wal, first)
            except OSError as e:
                if not isinstance(e, _FirstFailed):
                    self._broken = e
                raise
            finally:
                self._syncing = None
                done.set()
            self._wal_synced(covers)
            return

    def _sync_wal(self, first: Callable[[], object] | None) -> None:
        if first is not None:
            try:
                first()
            except OSError as e:
                raise _FirstFailed(e.errno, e.strerror) from e
        os.fsync(self._wal_fd)

    def barrier_sync(self, first: Callable[[], object] | None = None) -> None:
        """What :meth:`barrier` promises, on the calling thread: ``first`` (its error is its
        own), then the WAL's fsync unless nothing was committed since the last one. For a
        caller that must not wait for a worker thread (startup, shutdown, a small file's
        fsync with nothing else to do: see :meth:`fsops.files.OpenFiles.barrier`); not while
        a barrier runs on a worker thread (:meth:`idle`)."""
        self.check()
        if first is not None:
            first()
        if self._durable >= self.db.total_changes:
            return
        covers = self._covers()
        try:
            os.fsync(self._wal_fd)
        except OSError as e:
            self._broken = e
            raise
        self._wal_synced(covers)

    def _covers(self) -> int:
        """What a WAL fsync starting now covers: every commit so far (``total_changes``), or
        -1 inside an open transaction (its commit comes later; the caller's are in)."""
        return -1 if self.db.in_transaction else self.db.total_changes

    def _wal_synced(self, covers: int) -> None:
        self.barriers += 1
        self._durable = max(self._durable, covers)

    def check(self) -> None:
        """Raise the error of a failed WAL fsync, if one failed: the journal is broken."""
        if self._broken is not None:
            raise self._broken

    def idle(self) -> bool:
        """Whether no barrier is running on a worker thread now."""
        return self._syncing is None

    def close(self) -> None:
        self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        os.close(self._wal_fd)
        self.db.close()

    def begin_epoch(self) -> int:
        """Start a mount epoch, durably, before any inode number is given out in it. Within an
        epoch numbers only grow (a deleted newest inode does not give its number back); a
        number freed in an earlier epoch may come back, with the new epoch as its handle
        generation, so a client's handle of the old file gets ESTALE. Durable first: after a
        power loss that rolled back creates a client had seen, the next epoch still differs."""
        with self.transaction():
            self.epoch = (self.epoch + 1) & 0xFFFFFFFF  # the kernel keeps 32 bits of it
            self.set_meta("epoch", str(self.epoch))
        self.barrier_sync()
        return self.epoch

    # -- meta ----------------------------------------------------------------------------------

    def get_meta(self, key: str) -> str | None:
        r = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if r is None else str(r[0])

    def set_meta(self, key: str, value: str) -> None:
        self.db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    # -- inodes ----------------------------------------------------------------------------------

    def get(self, inode: int) -> InodeRow | None:
        r = self.db.execute(f"SELECT {_INODE_COLS} FROM inodes WHERE id = ?", (inode,)).fetchone()
        return None if r is None else _row(r)

    def lookup(self, parent: int, name: bytes) -> InodeRow | None:
        r = self.db.execute(
            f"SELECT {_INODE_COLS} FROM inodes WHERE parent = ? AND name = ?", (parent, name)
        ).fetchone()
        return None if r is None else _row(r)

    def _max_id(self) -> int:
        return int(self.db.execute("SELECT max(id) FROM inodes").fetchone()[0] or ROOT_INODE)

    def insert(self, row: InodeRow) -> int:
        """Insert a new inode with the next number of this epoch (``row.id`` is ignored; its
        ``epoch`` is set) and return the number."""
        number = self._next_id
        row.epoch = self.epoch
        self.db.execute(
            f"INSERT INTO inodes ({_INODE_COLS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
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
            f"SELECT count(*) FROM inodes WHERE parent = ? AND {_IS_DIR}",
            (inode,),
        ).fetchone()
        return int(r[0])

    def children(self, parent: int, after: int, limit: int) -> list[InodeRow]:
        rows = self.db.execute(
            f"SELECT {_INODE_COLS} FROM inodes WHERE parent = ? AND id > ? ORDER BY id LIMIT ?",
            (parent, after, limit),
        ).fetchall()
        return [_row(r) for r in rows]

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
            f"SELECT {_INODE_COLS} FROM inodes WHERE stored_key = ? AND id != ? "
            f"ORDER BY state IN ('{State.CLEAN.value}', '{State.REMOTE.value}') DESC LIMIT 1",
            (key, other_than),
        ).fetchone()
        return None if r is None else _row(r)

    def orphans(self) -> list[int]:
        rows = self.db.execute(
            "SELECT id FROM inodes WHERE parent IS NULL AND id != ?", (ROOT_INODE,)
        ).fetchall()
        return [int(r[0]) for r in rows]

    def remote_files(self) -> list[int]:
        rows = self.db.execute(
            f"SELECT id FROM inodes WHERE {_IS_REG} AND state = ?", (State.REMOTE,)
        ).fetchall()
        return [int(r[0]) for r in rows]

    def count_remote_files(self) -> int:
        r = self.db.execute(
            f"SELECT count(*) FROM inodes WHERE {_IS_REG} AND state = ?", (State.REMOTE,)
        ).fetchone()
        return int(r[0])

    def remote_among(self, inodes: Sequence[int]) -> list[int]:
        """Those of ``inodes`` that are regular files only in the store (remote)."""
        rows = self.db.execute(
            f"SELECT id FROM inodes WHERE id IN (SELECT value FROM json_each(?)) "
            f"AND {_IS_REG} AND state = ?",
            (json.dumps(list(inodes)), State.REMOTE),
        ).fetchall()
        return [int(r[0]) for r in rows]

    def cached_files(self) -> Iterator[tuple[int, int]]:
        """(id, size) of every regular file not remote-only, named or orphaned (those
        that have cache files), read as they are iterated: memory does not grow with them.
        Nothing may change the journal until the iteration ends."""
        for r in self.db.execute(
            f"SELECT id, size FROM inodes WHERE {_IS_REG} AND state != ?", (State.REMOTE,)
        ):
            yield int(r[0]), int(r[1])

    def regular_files(self) -> list[InodeRow]:
        """Every regular file, named or orphaned (those that have cache files)."""
        rows = self.db.execute(f"SELECT {_INODE_COLS} FROM inodes WHERE {_IS_REG}").fetchall()
        return [_row(r) for r in rows]

    def totals_by_state(self) -> dict[State, tuple[int, int]]:
        """(entries, bytes of content) per state: every entry but the root, and the sizes of
        regular files (a symlink's or a directory's size is not content in the cache)."""
        rows = self.db.execute(
            f"SELECT state, count(*), coalesce(sum(CASE WHEN {_IS_REG} THEN size END), 0) "
            "FROM inodes WHERE parent IS NOT NULL GROUP BY state"
        ).fetchall()
        return {State(r[0]): (int(r[1]), int(r[2])) for r in rows}

    def cached_bytes(self) -> int:
        """Bytes of content the cache files hold (every regular file not remote-only)."""
        r = self.db.execute(
            f"SELECT coalesce(sum(size), 0) FROM inodes WHERE {_IS_REG} AND state != ?",
            (State.REMOTE,),
        ).fetchone()
        return int(r[0])

    def eviction_candidates(self, limit: int) -> list[InodeRow]:
        """Clean files, least recently opened first."""
        rows = self.db.execute(
            f"SELECT {_INODE_COLS} FROM inodes WHERE {_IS_REG} AND state = ? "
            "AND parent IS NOT NULL ORDER BY atime_ns LIMIT ?",
            (State.CLEAN, limit),
        ).fetchall()
        return [_row(r) for r in rows]

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
        cols = ", ".join(f"i.{c.strip()}" for c in _INODE_COLS.split(","))
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
        return [(_row(r[:-1]), str(r[-1])) for r in rows]

    def files_in_state(self, state: State) -> list[InodeRow]:
        """Entries of every kind in ``state`` (the root, never drained, is always clean)."""
        rows = self.db.execute(
            f"SELECT {_INODE_COLS} FROM inodes WHERE state = ? AND id != ?", (state, ROOT_INODE)
        ).fetchall()
        return [_row(r) for r in rows]

    def dirty_files(self) -> list[int]:
        """Named entries of every kind that the store lacks (dirty) or is being sent."""
        rows = self.db.execute(
            f"SELECT id FROM inodes WHERE {_NOT_DURABLE} AND {_NAMED}"
        ).fetchall()
        return [int(r[0]) for r in rows]

    # -- what status counts ----------------------------------------------------------------------
    # A status of a cache that holds a long run's checkpoints counts a million drained files:
    # it reads them as totals per directory (one pass of SQL, then only the directories whose
    # files changed since: take_touched) and builds rows only for the few that are not durable.

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

    def directories(self) -> list[tuple[int, int | None, bytes]]:
        """(id, parent, name) of every named directory (the root's name is b"")."""
        rows = self.db.execute(
            f"SELECT id, parent, name FROM inodes WHERE {_IS_DIR} AND parent IS NOT NULL"
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
            f"SELECT {_INODE_COLS} FROM inodes WHERE id IN (SELECT value FROM json_each(?))",
            (json.dumps(list(ids)),),
        ).fetchall()
        return [_row(r) for r in rows]

    def maybe_pending(self) -> list[InodeRow]:
        """Named entries of every kind that may not be durable: dirty or uploading, or stored
        under a key that a pending store operation reads or writes (every entry that
        drain.uploads.engine.DrainEngine.durability does not call durable is one). Read through
        indexes: as many rows as there are such entries, however many the journal holds."""
        rows = self.db.execute(
            f"SELECT {_INODE_COLS} FROM inodes WHERE {_NOT_DURABLE} AND {_NAMED}"
        ).fetchall()
        rows += self.db.execute(
            f"SELECT {_INODE_COLS} FROM inodes WHERE stored_key IN "
            "(SELECT src FROM store_ops UNION SELECT dst FROM store_ops WHERE dst IS NOT NULL) "
            f"AND parent IS NOT NULL AND NOT ({_NOT_DURABLE})"
        ).fetchall()
        return [_row(r) for r in rows]

    # -- uploads and store operations ------------------------------------------------------------

    def get_upload(self, inode: int) -> UploadRow | None:
        r = self.db.execute(
            "SELECT inode, generation, key, upload_id, part_size, size, checksum FROM uploads "
            "WHERE inode = ?",
            (inode,),
        ).fetchone()
        return None if r is None else UploadRow(*r)

    def all_uploads(self) -> list[UploadRow]:
        rows = self.db.execute(
            "SELECT inode, generation, key, upload_id, part_size, size, checksum FROM uploads"
        ).fetchall()
        return [UploadRow(*r) for r in rows]

    def put_upload(self, u: UploadRow) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO uploads VALUES (?, ?, ?, ?, ?, ?, ?)",
            (u.inode, u.generation, u.key, u.upload_id, u.part_size, u.size, u.checksum),
        )

    def drop_upload(self, inode: int) -> None:
        self.db.execute("DELETE FROM uploads WHERE inode = ?", (inode,))
        self.db.execute("DELETE FROM parts WHERE inode = ?", (inode,))

    def parts(self, inode: int) -> dict[int, tuple[str, int | None]]:
        """Part number -> (ETag, CRC32 of the bytes sent)."""
        rows = self.db.execute("SELECT number, etag, crc32 FROM parts WHERE inode = ?", (inode,))
        return {int(r[0]): (str(r[1]), None if r[2] is None else int(r[2])) for r in rows}

    def add_part(self, inode: int, number: int, etag: str, crc32: int) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO parts VALUES (?, ?, ?, ?)", (inode, number, etag, crc32)
        )

    def add_store_op(
        self, kind: str, src: str, dst: str | None = None, etag: str | None = None
    ) -> None:
        self.db.execute(
            "INSERT INTO store_ops (kind, src, dst, etag) VALUES (?, ?, ?, ?)",
            (kind, src, dst, etag),
        )

    def has_store_op(self, kind: str, src: str) -> bool:
        r = self.db.execute(
            "SELECT 1 FROM store_ops WHERE kind = ? AND src = ? LIMIT 1", (kind, src)
        ).fetchone()
        return r is not None

    def store_ops_from(self, key: str) -> list[StoreOp]:
        """Pending operations that delete ``key`` or move its object away, in order."""
        rows = self.db.execute(
            "SELECT id, kind, src, dst, etag FROM store_ops "
            "WHERE src = ? AND kind IN ('delete', 'move') ORDER BY id",
            (key,),
        ).fetchall()
        return [StoreOp(*r) for r in rows]

    def store_op_pending(self, op_id: int) -> bool:
        r = self.db.execute("SELECT 1 FROM store_ops WHERE id = ?", (op_id,)).fetchone()
        return r is not None

    def store_ops(self, limit: int = 1000) -> list[StoreOp]:
        rows = self.db.execute(
            "SELECT id, kind, src, dst, etag FROM store_ops ORDER BY id LIMIT ?", (limit,)
        ).fetchall()
        return [StoreOp(*r) for r in rows]

    def done_store_op(self, op_id: int) -> None:
        self.db.execute("DELETE FROM store_ops WHERE id = ?", (op_id,))

    def count_store_ops(self) -> int:
        return int(self.db.execute("SELECT count(*) FROM store_ops").fetchone()[0])

    def holds_nothing(self) -> bool:
        """No entry but the root, no upload and no store operation: nothing that belongs to
        the store this cache is bound to."""
        return not self.db.execute(
            "SELECT EXISTS (SELECT 1 FROM inodes WHERE id != ?) "
            "OR EXISTS (SELECT 1 FROM uploads) OR EXISTS (SELECT 1 FROM store_ops)",
            (ROOT_INODE,),
        ).fetchone()[0]

    def forget_store(self) -> tuple[int, int]:
        """Drop every upload in progress, its parts and every pending store operation: they
        name objects of a store this cache is no longer bound to. Returns (multipart uploads,
        store operations) dropped."""
        uploads = self.db.execute(
            "SELECT count(*) FROM uploads WHERE upload_id IS NOT NULL"
        ).fetchone()[0]
        ops = self.count_store_ops()
        self.db.execute("DELETE FROM parts")
        self.db.execute("DELETE FROM uploads")
        self.db.execute("DELETE FROM store_ops")
        return int(uploads), ops

    def pending_keys(self) -> set[str]:
        """Keys that a pending store operation reads or writes."""
        rows = self.db.execute("SELECT src, dst FROM store_ops").fetchall()
        return {k for r in rows for k in r if k is not None}

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
            f"SELECT {_INODE_COLS} FROM inodes WHERE parent = ? AND {_IS_DIR}", (parent,)
        ).fetchall()
        return [_row(r) for r in rows]
