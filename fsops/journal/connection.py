"""The journal's SQLite connection: opened with its settings, the schema made or migrated, its
WAL given room on the cache disk; transactions and the meta table. Used from the trio thread
only."""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

from ckptgw.fsops.journal.rows import ROOT_INODE, State
from ckptgw.fsops.journal.schema import (
    INODE_COLS,
    IS_REG,
    NOT_DURABLE_INDEX,
    SCHEMA_VERSION,
    STORE_OPS_INDEX,
    SUBDIRS_INDEX,
    create_tables,
)

# The journal's own room on the cache disk: its WAL is allocated to this size at open
# (Connection._keep_room), so commits land in blocks it already has and need no free space.
# SQLite reuses the WAL from its start after each checkpoint (every 1000 pages, 4 MiB) and
# cuts it back only to journal_size_limit (64 MiB), so about 12 MiB of commits can be made
# on a disk without a free block (a checkpoint that cannot grow the database leaves its
# frames in the WAL). A writer on the kernel's path, which can take every free block of
# the disk, cannot take these (see fsops.passthrough.Passthrough.check_room). This holds
# where a file is overwritten in place (ext4, XFS, tmpfs), not on copy-on-write filesystems
# (btrfs, ZFS), which need new blocks for each rewrite.
WAL_ROOM = 16 << 20

log = logging.getLogger(__name__)


class JournalError(Exception):
    """The journal cannot be used (wrong store, newer schema, corrupt)."""


class Connection:
    """Owner of the SQLite connection and of its WAL's descriptor."""

    def __init__(self, path: Path) -> None:
        self.path = path
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
                    f"INSERT INTO inodes ({INODE_COLS}) VALUES "
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
        self.db.execute(SUBDIRS_INDEX)
        self.db.execute(STORE_OPS_INDEX)
        self.db.execute(NOT_DURABLE_INDEX)
        self.epoch = int(self.get_meta("epoch") or 0)
        self._next_id = self._max_id() + 1

    def _migrate_from_1(self) -> None:
        """Version 1 had no device numbers, and only regular files had a drain state: its
        directories and symlinks were never in the store, so they start dirty here (their
        marker or object is uploaded)."""
        with self.transaction():
            self.db.execute("ALTER TABLE inodes ADD COLUMN rdev INTEGER NOT NULL DEFAULT 0")
            self.db.execute(
                f"UPDATE inodes SET state = ? WHERE NOT {IS_REG} AND id != ? "
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
            self._forget()
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")
            raise

    def _forget(self) -> None:
        """A transaction rolled back: forget what was read inside it (the query sets that
        remember rows override this)."""

    def close(self) -> None:
        self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        os.close(self._wal_fd)
        self.db.close()

    # -- meta ----------------------------------------------------------------------------------

    def get_meta(self, key: str) -> str | None:
        r = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if r is None else str(r[0])

    def set_meta(self, key: str, value: str) -> None:
        self.db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    def _max_id(self) -> int:
        return int(self.db.execute("SELECT max(id) FROM inodes").fetchone()[0] or ROOT_INODE)
