"""The filesystem's operations called directly, without a mount: namespace, data path, journal,
recovery. Each test ends with a consistency check of journal against cache files."""

from __future__ import annotations

import errno
import os
import select
import sqlite3
import stat
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pyfuse3
import pytest
import trio

from ckptgw.drain.checkpoints import DURABLE
from ckptgw.drain.uploads.engine import DrainEngine
from ckptgw.fsops import files as files_mod
from ckptgw.fsops import objectmeta
from ckptgw.fsops.filesystem import Filesystem, FsOptions
from ckptgw.fsops.journal import ROOT_INODE, JournalError, State
from ckptgw.fsops.namespace import AttrChange
from ckptgw.fsops.requeststats import RequestStats
from tests.conftest import errno_of

STORE = "file:///srv/store"


@dataclass
class Caller:
    uid: int = 1000
    gid: int = 1000
    umask: int = 0o022


ME = Caller()


def open_fs(path: Path, **kw: object) -> Filesystem:
    return Filesystem(path, FsOptions(store_url=STORE, reserve_bytes=0, **kw))  # type: ignore[arg-type]


@pytest.fixture
def fs(tmp_path: Path) -> Iterator[Filesystem]:
    f = open_fs(tmp_path)
    yield f
    check_consistent(f)
    f.close()


def check_consistent(f: Filesystem) -> None:
    """fsck: every local regular file has a cache file of its journal size; no stray files."""
    rows = {r.id: r for r in f.journal.regular_files()}
    for ino, row in rows.items():
        mem = f.table._mem.get(ino)
        size = mem.size if mem is not None else row.size
        assert f.cache.exists(ino), f"inode {ino} has no cache file"
        assert f.cache.size(ino) == size, f"inode {ino}: cache {f.cache.size(ino)} != {size}"
    assert f.cache.known_inodes() <= set(rows), "cache files without a journal row"


def write_file(f: Filesystem, parent: int, name: bytes, data: bytes) -> int:
    async def go() -> int:
        ino = f.namespace.create_file(parent, name, 0o644, ME)
        fh, _ = await f.files.open(ino, os.O_WRONLY)
        await f.files.write(fh, 0, data)
        await f.files.fsync(fh, False)
        f.files.release(fh)
        return ino.id

    return trio.run(go)


def read_file(f: Filesystem, inode: int) -> bytes:
    async def go() -> bytes:
        fh, _ = await f.files.open(f.table.get(inode), os.O_RDONLY)
        try:
            return f.files.read(fh, 0, 1 << 30)
        finally:
            f.files.release(fh)

    return trio.run(go)


def test_create_write_read_and_attributes(fs: Filesystem) -> None:
    ino = write_file(fs, ROOT_INODE, b"a.pt", b"hello" * 1000)
    assert read_file(fs, ino) == b"hello" * 1000
    got = fs.namespace.lookup(ROOT_INODE, b"a.pt")
    assert got.id == ino and got.size == 5000 and got.uid == 1000
    assert stat.S_IMODE(got.mode) == 0o644 and stat.S_ISREG(got.mode)
    assert got.state is State.DIRTY
    assert fs.namespace.nlink(got) == 1


def test_unaligned_and_aligned_writes_land_byte_for_byte(fs: Filesystem) -> None:
    """Writes with heads and tails off page boundaries mix direct and buffered I/O."""
    payload = os.urandom(3 << 20)

    async def go() -> int:
        ino = fs.namespace.create_file(ROOT_INODE, b"mix", 0o644, ME)
        fh, _ = await fs.files.open(ino, os.O_RDWR)
        pos = 0
        for n in (1, 4095, 4097, 1 << 20, 12345, 3 << 19, 77):
            await fs.files.write(fh, pos, payload[pos : pos + n])
            pos += n
        await fs.files.write(fh, pos, payload[pos:])
        await fs.files.write(fh, 4096 * 3 + 5, payload[100:200])  # overwrite inside
        fs.files.release(fh)
        return ino.id

    ino = trio.run(go)
    expect = bytearray(payload)
    expect[4096 * 3 + 5 : 4096 * 3 + 105] = payload[100:200]
    assert read_file(fs, ino) == bytes(expect)


def test_mkdir_rmdir_enotempty_and_nlink(fs: Filesystem) -> None:
    d = fs.namespace.mkdir(ROOT_INODE, b"run1", 0o777, ME)
    assert stat.S_IMODE(d.mode) == 0o755  # umask applied
    fs.namespace.mkdir(d.id, b"step_1", 0o755, ME)
    assert fs.namespace.nlink(d) == 3
    assert errno_of(fs.namespace.rmdir, ROOT_INODE, b"run1") == errno.ENOTEMPTY
    assert errno_of(fs.namespace.unlink, ROOT_INODE, b"run1") == errno.EISDIR
    fs.namespace.rmdir(d.id, b"step_1")
    fs.namespace.rmdir(ROOT_INODE, b"run1")
    assert errno_of(fs.namespace.lookup, ROOT_INODE, b"run1") == errno.ENOENT


def test_rename_replaces_atomically_and_frees_the_old_target(fs: Filesystem) -> None:
    old = write_file(fs, ROOT_INODE, b"ckpt.pt", b"old")
    new = write_file(fs, ROOT_INODE, b"ckpt.pt.tmp", b"new")
    fs.namespace.rename(ROOT_INODE, b"ckpt.pt.tmp", ROOT_INODE, b"ckpt.pt", 0)
    assert fs.namespace.lookup(ROOT_INODE, b"ckpt.pt").id == new
    assert read_file(fs, new) == b"new"
    # The replaced inode is still looked up by the kernel: an orphan until forget.
    assert fs.journal.get(old) is not None and fs.journal.get(old).parent is None  # type: ignore[union-attr]
    fs.table.forget(old, 10)
    assert fs.journal.get(old) is None and not fs.cache.exists(old)


def test_rename_flags(fs: Filesystem) -> None:
    a = write_file(fs, ROOT_INODE, b"a", b"A")
    b = write_file(fs, ROOT_INODE, b"b", b"B")
    assert (
        errno_of(fs.namespace.rename, ROOT_INODE, b"a", ROOT_INODE, b"b", pyfuse3.RENAME_NOREPLACE)
        == errno.EEXIST
    )
    fs.namespace.rename(ROOT_INODE, b"a", ROOT_INODE, b"b", pyfuse3.RENAME_EXCHANGE)
    assert fs.namespace.lookup(ROOT_INODE, b"a").id == b
    assert fs.namespace.lookup(ROOT_INODE, b"b").id == a
    assert (
        errno_of(fs.namespace.rename, ROOT_INODE, b"a", ROOT_INODE, b"zz", pyfuse3.RENAME_EXCHANGE)
        == errno.ENOENT
    )


def test_rename_directory_rules(fs: Filesystem) -> None:
    d = fs.namespace.mkdir(ROOT_INODE, b"d", 0o755, ME)
    sub = fs.namespace.mkdir(d.id, b"sub", 0o755, ME)
    full = fs.namespace.mkdir(ROOT_INODE, b"full", 0o755, ME)
    write_file(fs, full.id, b"x", b"x")
    f = write_file(fs, ROOT_INODE, b"f", b"f")
    ns = fs.namespace
    assert errno_of(ns.rename, ROOT_INODE, b"d", sub.id, b"loop", 0) == errno.EINVAL
    assert errno_of(ns.rename, ROOT_INODE, b"d", ROOT_INODE, b"full", 0) == errno.ENOTEMPTY
    assert errno_of(ns.rename, ROOT_INODE, b"d", ROOT_INODE, b"f", 0) == errno.ENOTDIR
    assert errno_of(ns.rename, ROOT_INODE, b"f", ROOT_INODE, b"d", 0) == errno.EISDIR
    # A directory with contents moves as a whole, descendants keep their inodes.
    ns.rename(ROOT_INODE, b"d", full.id, b"moved", 0)
    assert fs.journal.path_components(sub.id) == [b"full", b"moved", b"sub"]
    assert ns.lookup(ROOT_INODE, b"f").id == f


def test_a_remembered_path_follows_every_rename_and_rollback(fs: Filesystem) -> None:
    """path_components is remembered (a save asks for its directory's path at every create):
    a rename anywhere above, or a transaction rolled back after a path was read inside it,
    must not leave a stale path behind."""
    ns, j = fs.namespace, fs.journal
    a = ns.mkdir(ROOT_INODE, b"a", 0o755, ME)
    b = ns.mkdir(a.id, b"b", 0o755, ME)
    assert j.path_components(b.id) == [b"a", b"b"]
    assert j.path_components(b.id) == [b"a", b"b"]  # the remembered answer
    ns.rename(ROOT_INODE, b"a", ROOT_INODE, b"a2", 0)  # an ancestor moves
    assert j.path_components(b.id) == [b"a2", b"b"]
    with pytest.raises(RuntimeError), j.transaction():
        j.set_name(a.id, ROOT_INODE, b"a3")
        assert j.path_components(b.id) == [b"a3", b"b"]  # read inside, then rolled back
        raise RuntimeError
    assert j.path_components(b.id) == [b"a2", b"b"]
    f = write_file(fs, b.id, b"f", b"x")
    assert j.path_components(f) == [b"a2", b"b", b"f"]
    ns.rename(a.id, b"b", ROOT_INODE, b"top", 0)  # the directory itself moves
    assert j.path_components(f) == [b"top", b"f"]


def test_a_path_read_in_a_transaction_sqlite_undid_itself_is_forgotten(fs: Filesystem) -> None:
    """SQLITE_FULL rolls the transaction back inside SQLite: the journal must neither fail on
    its own ROLLBACK (hiding the error) nor keep the path it read in there."""
    ns, j = fs.namespace, fs.journal
    a = ns.mkdir(ROOT_INODE, b"a", 0o755, ME)
    b = ns.mkdir(a.id, b"b", 0o755, ME)
    assert j.path_components(b.id) == [b"a", b"b"]
    pages = j.db.execute("PRAGMA page_count").fetchone()[0]
    j.db.execute(f"PRAGMA max_page_count = {pages}")
    with pytest.raises(sqlite3.OperationalError, match="full"), j.transaction():
        j.set_name(a.id, ROOT_INODE, b"renamed")
        assert j.path_components(b.id) == [b"renamed", b"b"]
        for i in range(10_000):  # until the database cannot grow
            j.set_meta(f"filler{i}", "x" * 1000)
    j.db.execute("PRAGMA max_page_count = 1073741823")
    assert not j.db.in_transaction
    assert j.path_components(b.id) == [b"a", b"b"]
    assert ns.lookup(ROOT_INODE, b"a").id == a.id


def test_a_small_files_fsync_with_nothing_else_in_flight_skips_the_thread_trip(
    fs: Filesystem, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the event loop's thread when alone and small (a trip to a worker thread costs as
    much as the fsyncs); on a worker thread otherwise, and for a while after an inline one
    was slow. Either way the cache file and then the journal are fsynced."""
    files, journal = fs.files, fs.journal
    monkeypatch.setattr(files_mod, "INLINE_SYNC_PAUSE", 0.2)
    synced: list[tuple[int, bool]] = []  # (inode, on the event loop's thread)
    real_sync = fs.cache.sync_file

    def sync_file(fd: int, inode: int, datasync: bool, entry: bool) -> None:
        synced.append((inode, threading.current_thread() is threading.main_thread()))
        real_sync(fd, inode, datasync, entry)

    monkeypatch.setattr(fs.cache, "sync_file", sync_file)

    async def fsync_new(name: bytes, size: int, alone: bool) -> tuple[int, int]:
        """(inline syncs, journal barriers) that an fsync of a new file of ``size`` added."""
        ino = fs.namespace.create_file(ROOT_INODE, name, 0o644, ME)
        fh, _ = await files.open(ino, os.O_WRONLY)
        await files.write(fh, 0, b"x" * size)
        inline, barriers = files.inline_syncs, journal.barriers
        await files.fsync(fh, False, alone=alone)
        files.release(fh)
        assert synced[-1] == (ino.id, files.inline_syncs > inline) and not journal.unsynced()
        return files.inline_syncs - inline, journal.barriers - barriers

    async def main() -> None:
        assert await fsync_new(b"small", 4096, alone=True) == (1, 1)
        files._inline_off_until = 0.0  # (the same)
        assert await fsync_new(b"busy", 4096, alone=False) == (0, 1)  # others in flight
        assert await fsync_new(b"big", files_mod.INLINE_SYNC_MAX + 1, alone=True) == (0, 1)

        def slow(fd: int, inode: int, datasync: bool, entry: bool) -> None:
            time.sleep(files_mod.INLINE_SYNC_SLOW * 2)
            sync_file(fd, inode, datasync, entry)

        monkeypatch.setattr(fs.cache, "sync_file", slow)
        files._inline_off_until = 0.0  # (in case a real fsync above was slow on a busy disk)
        assert await fsync_new(b"slow", 4096, alone=True) == (1, 1)  # inline, but slow
        monkeypatch.setattr(fs.cache, "sync_file", sync_file)
        assert await fsync_new(b"after", 4096, alone=True) == (0, 1)  # threads for a while
        await trio.sleep(0.25)
        assert await fsync_new(b"later", 4096, alone=True) == (1, 1)

    trio.run(main)


def test_a_request_is_alone_with_none_other_answered_or_queued() -> None:
    """What lets an fsync skip its thread trip: no other request being answered, and none
    the kernel holds unread (a pipe stands in for the mount's /dev/fuse)."""
    stats = RequestStats()
    r, w = os.pipe()
    try:
        stats._queue = select.poll()
        stats._queue.register(r, select.POLLIN)
        stats.in_flight = 1
        assert stats.alone()
        os.write(w, b"x")  # a request waits in the queue
        assert not stats.alone()
        os.read(r, 1)
        assert stats.alone()
        stats.in_flight = 2  # another is being answered
        assert not stats.alone()
    finally:
        os.close(r)
        os.close(w)


@pytest.mark.skipif(not os.access("/dev/fuse", os.R_OK | os.W_OK), reason="no /dev/fuse")
def test_a_dev_fuse_of_no_mount_is_not_taken_for_the_queue() -> None:
    """Only a connected /dev/fuse is the session's (an unconnected one polls POLLERR, which
    would make every request look alone); a real mount's is found (test_manyfiles)."""
    stats = RequestStats()
    fd = os.open("/dev/fuse", os.O_RDWR)
    try:
        stats.watch_queue()
        assert stats.queue_fd == -1
    finally:
        os.close(fd)


def test_the_journal_is_its_daemons_alone(fs: Filesystem, tmp_path: Path) -> None:
    """The journal holds its lock from open to close (no lock calls per statement, no
    shared-memory index): another process cannot read or write it meanwhile."""
    other = sqlite3.connect(tmp_path / "journal.db", timeout=0)
    try:
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            other.execute("SELECT count(*) FROM inodes").fetchone()
    finally:
        other.close()
    assert not (tmp_path / "journal.db-shm").exists()


def test_the_cache_disks_statvfs_is_reused_briefly_and_taken_again_after_a_change(
    fs: Filesystem, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    real = os.fstatvfs

    def counted(fd: int) -> os.statvfs_result:
        calls.append(fd)
        return real(fd)

    monkeypatch.setattr(os, "fstatvfs", counted)
    fs.cache.disk_changed()
    first = fs.cache.free_bytes()
    for _ in range(5):  # what one create asks
        fs.cache.disk_room()
        fs.cache.space()
    assert len(calls) <= 2, calls  # (1 ms may pass between them on a loaded machine)
    write_file(fs, ROOT_INODE, b"big", os.urandom(4 << 20))
    before = len(calls)
    fs.cache.free_bytes()
    assert len(calls) == before + 1  # the daemon wrote: asked again at once
    fs.cache.create(999_999)
    fs.cache.free_bytes()
    before = len(calls)
    fs.cache.remove(999_999)
    assert fs.cache.free_bytes() > 0
    assert len(calls) == before + 1  # it removed a cache file: asked again at once
    assert first > 0


def test_names_that_cannot_become_object_keys(tmp_path: Path) -> None:
    f = Filesystem(tmp_path, FsOptions(store_url=STORE, key_prefix="p" * 900, reserve_bytes=0))
    try:
        ns = f.namespace
        assert errno_of(ns.create_file, ROOT_INODE, b"n" * 256, 0o644, ME) == errno.ENAMETOOLONG
        assert errno_of(ns.mkdir, ROOT_INODE, b"\xff\xfe", 0o755, ME) == errno.EILSEQ
        d = ns.mkdir(ROOT_INODE, b"d" * 100, 0o755, ME)
        # 900 prefix + 100 + "/" + 24 = 1025 bytes: one too many for an S3 key.
        assert errno_of(ns.create_file, d.id, b"x" * 24, 0o644, ME) == errno.ENAMETOOLONG
        ns.create_file(d.id, b"x" * 23, 0o644, ME)
        # Renaming the directory to a longer name would push its child over the limit.
        assert errno_of(ns.rename, ROOT_INODE, b"d" * 100, ROOT_INODE, b"e" * 101, 0) == (
            errno.ENAMETOOLONG
        )
        ns.rename(ROOT_INODE, b"d" * 100, ROOT_INODE, b"e" * 100, 0)
    finally:
        f.close()


def test_setattr_truncate_chmod_times(fs: Filesystem) -> None:
    ino = write_file(fs, ROOT_INODE, b"f", b"0123456789")
    got = trio.run(fs.namespace.setattr, ino, AttrChange(size=4, mode=0o600, mtime_ns=10**18))
    assert got.size == 4 and stat.S_IMODE(got.mode) == 0o600 and got.mtime_ns == 10**18
    assert read_file(fs, ino) == b"0123"
    trio.run(fs.namespace.setattr, ino, AttrChange(size=8))
    assert read_file(fs, ino) == b"0123\0\0\0\0"


def test_open_with_o_trunc(fs: Filesystem) -> None:
    ino = write_file(fs, ROOT_INODE, b"f", b"data")

    async def go() -> None:
        fh, _ = await fs.files.open(fs.table.get(ino), os.O_WRONLY | os.O_TRUNC)
        fs.files.release(fh)

    trio.run(go)
    assert read_file(fs, ino) == b""


def test_a_clean_file_becomes_dirty_with_a_new_generation_before_it_changes(
    fs: Filesystem,
) -> None:
    ino = write_file(fs, ROOT_INODE, b"f", b"v1")
    node = fs.table.get(ino)
    node.state = State.CLEAN  # as the drain would leave it
    fs.table.persist(node)
    gen = node.generation

    async def go() -> None:
        fh, _ = await fs.files.open(node, os.O_WRONLY)
        await fs.files.write(fh, 0, b"v2")
        fs.files.release(fh)

    trio.run(go)
    row = fs.journal.get(ino)
    assert row is not None and row.state is State.DIRTY and row.generation == gen + 1


def test_symlink_readlink_and_hard_link_refused(fs: Filesystem) -> None:
    s = fs.namespace.symlink(ROOT_INODE, b"latest", b"step_100/ckpt.pt", ME)
    assert stat.S_ISLNK(s.mode) and fs.namespace.readlink(s.id) == b"step_100/ckpt.pt"
    with pytest.raises(pyfuse3.FUSEError) as e:
        trio.run(fs.operations().link, s.id, ROOT_INODE, b"x", cast(pyfuse3.RequestContext, ME))
    assert e.value.errno == errno.EPERM


def test_xattrs(fs: Filesystem) -> None:
    ino = write_file(fs, ROOT_INODE, b"f", b"")
    trio.run(fs.namespace.setxattr, ino, b"user.step", b"100")
    assert fs.namespace.getxattr(ino, b"user.step") == b"100"
    assert fs.namespace.listxattr(ino) == [b"user.step"]
    trio.run(fs.namespace.removexattr, ino, b"user.step")
    assert errno_of(fs.namespace.getxattr, ino, b"user.step") == pyfuse3.ENOATTR
    assert errno_of(trio.run, fs.namespace.removexattr, ino, b"user.step") == pyfuse3.ENOATTR
    # Only "user.": the others would mean something to this node's kernel only; reading or
    # removing one says so too (not "no such attribute": ls caches ENOTSUP per filesystem).
    for name in (b"system.posix_acl_access", b"trusted.x", b"security.x", b"security.selinux"):
        assert errno_of(trio.run, fs.namespace.setxattr, ino, name, b"") == errno.ENOTSUP
        assert errno_of(fs.namespace.getxattr, ino, name) == errno.ENOTSUP
        assert errno_of(trio.run, fs.namespace.removexattr, ino, name) == errno.ENOTSUP
    # ...and one in a foreign object's metadata is left out when it is read.
    pairs = [(b"user.a", b"1"), (b"security.selinux", b"x"), (b"trusted.t", b"2")]
    assert objectmeta.decode({"xattrs": objectmeta.encode_xattrs(pairs)}).xattrs == {
        b"user.a": b"1"
    }
    # They travel in the object's metadata, so they must fit there: refused, never kept
    # on this node only.
    trio.run(fs.namespace.setxattr, ino, b"user.a", b"x" * 1000)
    assert errno_of(trio.run, fs.namespace.setxattr, ino, b"user.b", b"y" * 200) == errno.ENOSPC
    assert fs.namespace.listxattr(ino) == [b"user.a"]


def test_special_files_are_names_with_attributes(fs: Filesystem) -> None:
    kinds = {
        b"fifo": (stat.S_IFIFO, 0),
        b"sock": (stat.S_IFSOCK, 0),
        b"chr": (stat.S_IFCHR, os.makedev(1, 3)),
        b"blk": (stat.S_IFBLK, os.makedev(7, 0)),
    }
    for name, (kind, rdev) in kinds.items():
        ino = fs.namespace.mknod(ROOT_INODE, name, kind | 0o640, rdev, ME)
        row = fs.journal.get(ino.id)
        assert row is not None
        assert stat.S_IFMT(row.mode) == kind and row.mode & 0o7777 == 0o640 & ~ME.umask
        assert row.rdev == rdev and row.size == 0
        assert row.state is State.DIRTY  # the store gets an object that says what it is
        assert ino.id not in fs.table.cache.known_inodes()  # no content, no cache file
    assert errno_of(fs.namespace.mknod, ROOT_INODE, b"fifo", stat.S_IFIFO | 0o600, 0, ME) == (
        errno.EEXIST
    )
    fs.namespace.unlink(ROOT_INODE, b"fifo")
    assert fs.table.lookup(ROOT_INODE, b"fifo") is None
    # A regular file made by mknod is a file like any other.
    f = fs.namespace.mknod(ROOT_INODE, b"plain", stat.S_IFREG | 0o600, 0, ME)
    assert stat.S_ISREG(f.mode) and f.state is State.DIRTY


def test_a_changed_attribute_of_a_stored_entry_is_journaled_for_the_store(
    fs: Filesystem,
) -> None:
    d = fs.namespace.mkdir(ROOT_INODE, b"d", 0o755, ME)
    assert fs.table.get(d.id).state == State.DIRTY  # its marker is not in the store yet
    # As the drain leaves it once the marker is stored:
    gen = fs.states.begin_upload(d)
    fs.states.finish_upload(d, gen, 0, "d/", "etag-1", None)
    trio.run(fs.namespace.setattr, d.id, AttrChange(mode=0o700))
    ops = fs.journal.store_ops()
    assert [(o.kind, o.src, o.etag) for o in ops] == [("meta", "d/", "etag-1")]
    assert fs.table.get(d.id).state == State.CLEAN  # the content (none) does not go again
    # An attribute that does not change journals nothing; atime is not kept in the store.
    trio.run(fs.namespace.setattr, d.id, AttrChange(mode=0o700, atime_ns=1))
    assert len(fs.journal.store_ops()) == 1


def test_a_version_1_journal_is_migrated_and_its_directories_and_symlinks_drained(
    tmp_path: Path,
) -> None:
    f = open_fs(tmp_path)
    d = f.namespace.mkdir(ROOT_INODE, b"step_1", 0o755, ME)
    link = f.namespace.symlink(ROOT_INODE, b"last", b"step_1", ME)
    f.close()
    # As version 1 left it: no device numbers, and only regular files were ever drained.
    db = sqlite3.connect(tmp_path / "journal.db")
    db.execute("ALTER TABLE inodes DROP COLUMN rdev")
    db.execute("ALTER TABLE inodes DROP COLUMN epoch")
    db.execute("ALTER TABLE parts DROP COLUMN crc32")
    db.execute("DELETE FROM meta WHERE key = 'epoch'")
    db.execute("UPDATE inodes SET state = 'clean' WHERE id IN (?, ?)", (d.id, link.id))
    db.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    db.commit()
    db.close()
    f = open_fs(tmp_path)
    try:
        assert f.journal.get_meta("schema_version") == "4"
        cols = [r[1] for r in f.journal.db.execute("PRAGMA table_info(parts)")]
        assert cols == ["inode", "number", "etag", "crc32"]
        for ino in (d.id, link.id):
            row = f.journal.get(ino)
            assert row is not None and row.state is State.DIRTY and row.rdev == 0
            assert row.epoch == 0  # the handles clients may hold stay valid
        assert set(f.journal.dirty_files()) == {d.id, link.id}
        assert f.journal.epoch == 1
        assert f.namespace.create_file(ROOT_INODE, b"new", 0o644, ME).epoch == 1
        root = f.journal.get(ROOT_INODE)
        assert root is not None and root.state is State.CLEAN  # the root is never drained
    finally:
        f.close()


def test_inode_numbers_are_not_reused_in_an_epoch_and_each_mount_is_a_new_epoch(
    tmp_path: Path,
) -> None:
    """(number, epoch) is what a file handle names: it must never name two files."""
    f = open_fs(tmp_path)
    first = f.namespace.create_file(ROOT_INODE, b"a", 0o644, ME)
    newest = f.namespace.create_file(ROOT_INODE, b"b", 0o644, ME)
    f.namespace.unlink(ROOT_INODE, b"b")
    again = f.namespace.create_file(ROOT_INODE, b"c", 0o644, ME)
    assert (first.epoch, newest.epoch, again.epoch) == (1, 1, 1)
    assert again.id > newest.id > first.id  # the deleted newest number is not given back
    f.namespace.unlink(ROOT_INODE, b"c")
    f.close()
    f = open_fs(tmp_path)
    try:
        assert f.journal.get_meta("epoch") == "2"
        row = f.journal.get(first.id)
        assert row is not None and row.epoch == 1  # an inode keeps its epoch across mounts
        later = f.namespace.create_file(ROOT_INODE, b"d", 0o644, ME)
        assert later.epoch == 2  # its number may be one freed before: the epoch tells apart
        assert (later.id, later.epoch) not in {(x.id, x.epoch) for x in (first, newest, again)}
    finally:
        f.close()


def test_readdir_pages_are_stable_while_the_directory_changes(fs: Filesystem) -> None:
    d = fs.namespace.mkdir(ROOT_INODE, b"big", 0o755, ME)
    for i in range(1200):
        fs.namespace.create_file(d.id, f"f{i:05}".encode(), 0o644, ME)
    first = fs.table.children(d.id, 0, 500)
    # Changes behind the cursor neither repeat nor skip entries ahead of it.
    fs.namespace.unlink(d.id, b"f00000")
    fs.namespace.create_file(d.id, b"zz-new", 0o644, ME)
    rest: list[bytes] = []
    after = first[-1].id
    while batch := fs.table.children(d.id, after, 500):
        rest += [r.name for r in batch if r.name is not None]
        after = batch[-1].id
    names = [r.name for r in first] + rest
    assert len(names) == len(set(names)) == 1201
    assert names[-1] == b"zz-new"


def test_store_binding_is_checked(tmp_path: Path) -> None:
    fs = open_fs(tmp_path)
    fs.namespace.create_file(ROOT_INODE, b"a.pt", 0o644, ME)
    fs.close()
    with pytest.raises(JournalError, match="belongs to store"):
        Filesystem(tmp_path, FsOptions(store_url="s3://other-bucket/"))


def test_a_cache_that_holds_nothing_takes_the_store_asked_for(tmp_path: Path) -> None:
    """A mount refused for a misspelled bucket leaves a cache dir bound to it with nothing in
    it: the next mount, with the right bucket, is not refused for that."""
    open_fs(tmp_path).close()
    fs = Filesystem(tmp_path, FsOptions(store_url="s3://right-bucket/"))
    try:
        assert fs.journal.get_meta("store_url") == "s3://right-bucket/"
    finally:
        fs.close()


def test_recovery_after_a_crash(tmp_path: Path) -> None:
    """A daemon that dies without close(): sizes come from cache files, orphans and stray
    cache files go, fsynced data stays."""
    f = open_fs(tmp_path)
    keep = write_file(f, ROOT_INODE, b"keep", b"k" * 10000)
    orphan = write_file(f, ROOT_INODE, b"orphan", b"o")
    f.namespace.lookup(ROOT_INODE, b"orphan")
    f.namespace.unlink(ROOT_INODE, b"orphan")  # still looked up: orphaned, not freed

    async def grow() -> None:  # written but never flushed to the journal
        fh, _ = await f.files.open(f.table.get(keep), os.O_WRONLY)
        await f.files.write(fh, 10000, b"more")

    trio.run(grow)
    f.cache.create(999)  # a cache file whose create never committed
    f.journal.db.close()  # the crash: no close(), no clean_shutdown flag

    g = open_fs(tmp_path)
    try:
        assert g.recovery.unclean
        assert g.recovery.orphans_removed == 1 and g.recovery.stray_removed == 1
        assert g.recovery.sizes_fixed == 1
        assert read_file(g, keep) == b"k" * 10000 + b"more"
        assert g.journal.get(orphan) is None and not g.cache.exists(orphan)
        check_consistent(g)
    finally:
        g.close()
    h = open_fs(tmp_path)
    assert not h.recovery.unclean
    h.close()


def test_buffered_mode_without_direct_io(tmp_path: Path) -> None:
    f = open_fs(tmp_path, direct_io=False, early_writeback=1 << 16)
    try:
        assert f.cache.direct is None
        data = os.urandom(1 << 20)
        ino = write_file(f, ROOT_INODE, b"f", data)
        assert read_file(f, ino) == data
        check_consistent(f)
    finally:
        f.close()


def test_rebind_refuses_a_prefix_that_makes_a_key_too_long(tmp_path: Path) -> None:
    """Keys were checked against the old prefix when the files were made; a longer one could
    leave a file the drain can never send. Nothing changes then."""
    from ckptgw.fsops.rebind import RebindError, rebind

    fs = open_fs(tmp_path)
    d = fs.namespace.mkdir(ROOT_INODE, b"d" * 250, 0o755, ME)
    d = fs.namespace.mkdir(d.id, b"e" * 250, 0o755, ME)
    fs.namespace.create_file(d.id, b"f" * 250 + b".pt", 0o644, ME)
    with pytest.raises(RebindError, match="1 path would have keys longer than 1024 bytes"):
        rebind(fs, "s3://other-bucket/" + "p" * 300 + "/", "p" * 300 + "/")
    assert fs.journal.get_meta("store_url") == STORE
    report = rebind(fs, "s3://other-bucket/short/", "short/")
    assert (report.entries, fs.journal.get_meta("store_url")) == (3, "s3://other-bucket/short/")
    fs.close()


def test_a_fresh_cache_has_every_shard_directory_and_a_lost_one_comes_back(
    tmp_path: Path,
) -> None:
    """The 256 shard directories are made at mount, private, not at the first create of each
    (which cost a sharded save 0.5 ms for each of its first 256 files)."""
    f = open_fs(tmp_path)
    data = f.cache.data
    shards = sorted(p.name for p in data.iterdir())
    assert shards == [f"{i:02x}" for i in range(256)]
    assert {stat.S_IMODE(p.stat().st_mode) for p in data.iterdir()} == {0o700}
    f.close()
    (data / "7f").rmdir()
    f = open_fs(tmp_path)
    try:
        assert (data / "7f").is_dir()
        ino = f.namespace.create_file(ROOT_INODE, b"x", 0o644, ME)
        assert f.cache.exists(ino.id)
        check_consistent(f)
    finally:
        f.close()


def test_entries_that_may_be_pending_are_every_entry_not_durable(fs: Filesystem) -> None:
    """`pending` of a large checkpoint reads only the entries that may not be durable: the
    same ones drain.uploads.engine.DrainEngine.durability does not call durable, in every state."""
    d = fs.namespace.mkdir(ROOT_INODE, b"step_7", 0o755, ME)
    sub = fs.namespace.mkdir(d.id, b"sub", 0o755, ME)
    names = (b"dirty", b"uploading", b"clean", b"moved_to", b"moved_from", b"deleted", b"remote")
    ids = {name: write_file(fs, d.id, name, b"x") for name in names}
    db = fs.journal.db
    states = {
        b"uploading": (State.UPLOADING, None),
        b"clean": (State.CLEAN, "step_7/clean"),
        b"moved_to": (State.CLEAN, "step_7/moved_to"),
        b"moved_from": (State.CLEAN, "old/moved_from"),
        b"deleted": (State.CLEAN, "step_7/deleted"),
        b"remote": (State.REMOTE, "step_7/remote"),
    }
    for name, (state, key) in states.items():
        db.execute(
            "UPDATE inodes SET state = ?, stored_key = ? WHERE id = ?", (state, key, ids[name])
        )
    for dir_id in (d.id, sub.id):  # clean directories without a marker key
        db.execute(
            "UPDATE inodes SET state = ?, stored_key = NULL WHERE id = ?", (State.CLEAN, dir_id)
        )
    fs.journal.add_store_op("move", "old/x", "step_7/moved_to")  # a move to its key
    fs.journal.add_store_op("move", "old/moved_from", "step_7/y")  # a move from its key
    fs.journal.add_store_op("delete", "step_7/deleted")  # a delete of its key
    rows = fs.journal.files_under(d.id, dirs=True)
    below = {r.id: rel for r, rel in rows}
    maybe = {below[r.id] for r in fs.journal.maybe_pending() if r.id in below}
    assert maybe == {"dirty", "uploading", "moved_to", "moved_from", "deleted"}
    moving = fs.journal.pending_keys()
    engine = cast(DrainEngine, SimpleNamespace(_progress={}))  # durability reads only this
    for row, rel in rows:
        durable = DrainEngine.durability(engine, row, moving) == DURABLE
        assert durable == (rel not in maybe), rel
