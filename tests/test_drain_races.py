"""Races between the filesystem and the drain, made deterministic: a store step is held open
(a gate) while the filesystem changes, then let go. The filesystem's operations are called
directly (no mount), on a real file store; what the store ends up holding is read back."""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyfuse3
import pytest
import trio
import trio.testing
import xxhash

from ckptgw.drain.reads.entries import Entries
from ckptgw.drain.reads.fetch import FetchConfig, Fetcher
from ckptgw.drain.reads.listing import ListingConfig, Listings
from ckptgw.drain.uploads.engine import DrainConfig, DrainEngine
from ckptgw.drain.uploads.scheduler import Hold, ScheduleConfig, Scheduler
from ckptgw.drain.uploads.upload import META_CHECKSUM, UploadConfig
from ckptgw.fsops.contentsum import Hasher, parts_checksum
from ckptgw.fsops.filesystem import Filesystem, FsOptions
from ckptgw.fsops.journal.rows import ROOT_INODE, State
from ckptgw.fsops.namespace import AttrChange
from ckptgw.fsops.objectmeta import CHECKSUM, PART_SIZE
from ckptgw.store.files import FileStore
from ckptgw.store.interface import Body, Listing, ObjectInfo, Store, Upload
from ckptgw.store.retry import RetryingStore, RetryPolicy, RetryStats
from ckptgw.store.url import parse_store_url
from tests.conftest import errno_of
from tests.test_ops import ME

MiB = 1 << 20


class GatedStore(FileStore):
    """A file store whose chosen steps wait at a gate: ``entered`` is set when a call
    reaches it, and it goes on once ``opened`` is set."""

    def __init__(self, root: Path, *gated: str) -> None:
        super().__init__(parse_store_url(f"file://{root}"))
        self.gates = {name: (trio.Event(), trio.Event()) for name in gated}
        self.initiated_long_ago = False
        self.parts_sent: list[int] = []
        self.parts_waiting: set[int] = set()  # read, at the "later_parts" gate

    async def gate(self, name: str) -> None:
        if name in self.gates:
            entered, opened = self.gates[name]
            entered.set()
            await opened.wait()

    def entered(self, name: str) -> trio.Event:
        return self.gates[name][0]

    def open(self, name: str) -> None:
        self.gates[name][1].set()

    def close(self, name: str) -> None:
        """Make the gate hold the next call again (a fresh ``entered`` too)."""
        self.gates[name] = (trio.Event(), trio.Event())

    async def create_multipart(self, key: str, metadata: dict[str, str]) -> str:
        await self.gate("before_create")  # the request is slow to reach the store
        upload_id = await super().create_multipart(key, metadata)
        await self.gate("create_multipart")  # created, but its answer is slow to come back
        return upload_id

    async def complete_multipart(self, key: str, upload_id: str, etags: list[str]) -> str:
        await self.gate("complete")
        return await super().complete_multipart(key, upload_id, etags)

    async def put(self, key: str, data: bytes, metadata: dict[str, str]) -> str:
        etag = await super().put(key, data, metadata)
        await self.gate("put")  # landed, but the answer is slow: a cancel now loses it
        return etag

    async def list_dir(self, prefix: str) -> Listing:
        listing = await super().list_dir(prefix)  # taken now, handed over after the gate
        await self.gate("list_dir")
        return listing

    async def delete(self, key: str) -> None:
        await self.gate("delete")
        await super().delete(key)

    async def upload_part(
        self, key: str, upload_id: str, number: int, data: Body, crc32: int | None = None
    ) -> str:
        if number > 1:
            self.parts_waiting.add(number)
            await self.gate("later_parts")  # part 1 goes; the rest wait
        etag = await super().upload_part(key, upload_id, number, data, crc32)
        self.parts_sent.append(number)
        return etag

    async def iter_uploads(self, prefix: str) -> AsyncIterator[Upload]:
        await self.gate("iter_uploads")
        async for u in super().iter_uploads(prefix):
            if self.initiated_long_ago:  # as moto reports it: a fixed time in the past
                u = Upload(u.key, u.upload_id, 0.0)
            yield u


@dataclass
class Node:
    fs: Filesystem
    store: GatedStore
    engine: DrainEngine
    listings: Listings

    async def write(self, parent: int, name: bytes, data: bytes, flags: int = 0) -> int:
        ino = self.fs.table.lookup(parent, name)
        if ino is None:
            ino = self.fs.namespace.create_file(parent, name, 0o644, ME)
        fh, _ = await self.fs.files.open(ino, os.O_WRONLY | flags)
        await self.fs.files.write(fh, 0, data)
        await self.fs.files.fsync(fh, False)
        self.fs.files.release(fh)
        return ino.id

    async def until(self, what: str, cond: Callable[[], bool], limit: float = 30) -> None:
        with trio.fail_after(limit):
            while not cond():
                await trio.sleep(0.01)

    async def drained(self) -> None:
        await self.until("drained", self.engine.is_idle)

    async def stored(self, key: str) -> tuple[bytes, dict[str, str]]:
        info = await self.store.head(key)
        assert info is not None, f"{key} is not in the store"
        return await self.store.get(key), info.metadata


@asynccontextmanager
async def node(
    tmp_path: Path, *gated: str, store_cls: type[GatedStore] = GatedStore, **drain: Any
) -> AsyncIterator[Node]:
    store = store_cls(tmp_path / "store", *gated)
    await store.check()
    scheduler = Scheduler(ScheduleConfig())
    cache = tmp_path / "cache"
    cache.mkdir(exist_ok=True)
    fs = Filesystem(cache, FsOptions(store_url=store.url, reserve_bytes=0), scheduler)
    config = DrainConfig(
        upload=UploadConfig(multipart_threshold=5 * MiB, part_size=5 * MiB),
        **drain,
    )
    scheduler.config = ScheduleConfig(settle=0.01)
    retrying = RetryingStore(store, RetryPolicy(attempts=2, base=0.01), RetryStats())
    engine = DrainEngine(fs, retrying, config, scheduler)
    entries = Entries(fs.parts, retrying)
    listings = Listings(fs.parts, entries, retrying, ListingConfig(listing_ttl=0))
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(engine.run)
            yield Node(fs, store, engine, listings)
            nursery.cancel_scope.cancel()
    finally:
        fs.close()
    assert scheduler.lost_wakeups == 0, "a dirty, quiet file was left unqueued"


def run(test: Callable[[], Awaitable[None]]) -> None:
    trio.run(test)


def xxh(data: bytes) -> str:
    return xxhash.xxh3_128(data).hexdigest()


def parts_sum(data: bytes) -> str:
    """The checksum of a multipart upload of ``data`` in this node's 5 MiB parts."""
    h = Hasher(5 * MiB)
    h.update(data)
    return h.digest()


async def assert_stored_whole(n: Node, key: str, data: bytes) -> None:
    """``key`` holds ``data`` as a multipart upload: its metadata names the part size, and
    the store's CRC32 of it (a HEAD's) is the one of ``data`` in parts of that size."""
    info = await n.store.head(key)
    assert info is not None and info.crc32 is not None
    assert await n.store.get(key) == data
    assert info.metadata[PART_SIZE] == str(5 * MiB) and META_CHECKSUM not in info.metadata
    h = Hasher(5 * MiB)
    h.update(data)
    assert h.matches(parts_checksum(5 * MiB, info.crc32))


def test_a_rewrite_in_place_while_the_upload_starts_is_stored_right(tmp_path: Path) -> None:
    """The `latest.pt` pattern: the drain has taken the file and is creating its multipart
    upload when the trainer rewrites it (O_TRUNC, same size, new bytes, fsync, close)."""
    old, new = os.urandom(12 * MiB), os.urandom(12 * MiB)

    async def test() -> None:
        async with node(tmp_path, "create_multipart") as n:
            inode = await n.write(ROOT_INODE, b"latest.pt", old)
            await n.store.entered("create_multipart").wait()
            assert n.fs.table.get(inode).state is State.UPLOADING
            await n.write(ROOT_INODE, b"latest.pt", new, os.O_TRUNC)
            n.store.open("create_multipart")
            await n.drained()
            await assert_stored_whole(n, "latest.pt", new)
            row = n.fs.table.get(inode)
            assert (row.state, row.checksum) == (State.CLEAN, parts_sum(new))
            assert n.fs.journal.all_uploads() == []

    run(test)


HELD = (Hold.WRITING, Hold.SYNCING)  # not quiet: a writer's release or an fsync's end reports it


def assert_queued_or_uploading(n: Node) -> None:
    """Every dirty, quiet entry of the journal (no writer, no fsync) is uploading or has a
    current entry in the scheduler's queue (issue 47's invariant)."""
    s = n.engine.scheduler
    quiet = [i for i in n.fs.journal.dirty_files() if n.engine.look(i) not in HELD]
    assert not s._unqueued(quiet), f"dirty and quiet but not queued: {s._unqueued(quiet)}"


@pytest.mark.parametrize(
    "gate",
    ["before_create", "create_multipart", "later_parts", "complete", "put"],
    ids=["creating", "created", "parts", "completing", "single-put"],
)
@pytest.mark.parametrize("how", [os.O_TRUNC, 0], ids=["o_trunc", "in-place"])
@pytest.mark.parametrize("flush", [False, True], ids=["", "flushed"])
def test_a_rewrite_at_any_step_of_the_upload_is_queued_again_and_stored(
    tmp_path: Path, gate: str, how: int, flush: bool
) -> None:
    """No lost wake-up: the file is rewritten (and fsynced, closed) while its upload is held
    at each of its steps in turn, and maybe flushed then (``ckptgw flush``/``wait``: issue
    47); the new version is uploaded once the held step ends, the file is uploading or
    queued at every step, and the scheduler's audit never finds it lost (``node``)."""
    size = 1 * MiB if gate == "put" else 12 * MiB
    old, new = os.urandom(size), os.urandom(size)

    async def test() -> None:
        async with node(tmp_path, gate) as n:
            inode = await n.write(ROOT_INODE, b"latest.pt", old)
            await n.store.entered(gate).wait()
            assert n.fs.table.get(inode).state is State.UPLOADING
            await n.write(ROOT_INODE, b"latest.pt", new, how)
            assert_queued_or_uploading(n)
            if flush:
                n.engine.flush([inode])
                assert_queued_or_uploading(n)
            n.store.open(gate)
            for _ in range(100):  # through the abort and the new upload's start
                await trio.sleep(0.005)
                assert_queued_or_uploading(n)
            await n.drained()
            assert (await n.stored("latest.pt"))[0] == new
            assert n.fs.table.get(inode).state is State.CLEAN

    run(test)


def test_a_longer_rewrite_during_the_upload_is_stored_whole(tmp_path: Path) -> None:
    old, new = os.urandom(12 * MiB), os.urandom(14 * MiB)

    async def test() -> None:
        async with node(tmp_path, "create_multipart") as n:
            inode = await n.write(ROOT_INODE, b"latest.pt", old)
            await n.store.entered("create_multipart").wait()
            await n.write(ROOT_INODE, b"latest.pt", new, os.O_TRUNC)
            n.store.open("create_multipart")
            await n.drained()
            await assert_stored_whole(n, "latest.pt", new)
            assert n.fs.table.get(inode).state is State.CLEAN

    run(test)


def test_deleted_files_do_not_come_back_from_a_listing_older_than_the_delete(
    tmp_path: Path,
) -> None:
    async def test() -> None:
        async with node(tmp_path, "list_dir") as n:
            d = n.fs.namespace.mkdir(ROOT_INODE, b"step_10", 0o755, ME)
            for i in range(3):
                await n.write(d.id, b"shard_%d" % i, os.urandom(1000))
            await n.drained()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(n.listings.refresh, d)
                await n.store.entered("list_dir").wait()  # it has seen the three objects
                for i in range(3):
                    n.fs.namespace.unlink(d.id, b"shard_%d" % i)
                await n.drained()  # the deletes are done: tombstones
                n.store.open("list_dir")
            assert n.fs.journal.children(d.id, 0, 10) == []
            n.fs.namespace.rmdir(ROOT_INODE, b"step_10")  # not ENOTEMPTY

    run(test)


def test_deleted_files_do_not_come_back_while_their_delete_is_pending(tmp_path: Path) -> None:
    async def test() -> None:
        async with node(tmp_path, "delete") as n:
            d = n.fs.namespace.mkdir(ROOT_INODE, b"step_10", 0o755, ME)
            await n.write(d.id, b"shard", os.urandom(1000))
            await n.drained()
            n.fs.namespace.unlink(d.id, b"shard")
            await n.store.entered("delete").wait()
            await n.listings.refresh(d)  # the object is still there: the delete waits
            assert n.fs.journal.children(d.id, 0, 10) == []
            n.fs.namespace.rmdir(ROOT_INODE, b"step_10")
            # Nor does the directory come back from a listing of its parent.
            await n.listings.refresh(n.fs.table.get(ROOT_INODE))
            assert n.fs.table.lookup(ROOT_INODE, b"step_10") is None
            n.store.open("delete")
            await n.drained()
            assert not (n.store.root / "step_10" / "shard").exists()

    run(test)


def test_an_upload_created_while_orphans_are_listed_is_not_aborted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = os.urandom(12 * MiB)

    async def test() -> None:
        async with node(tmp_path, "iter_uploads", "create_multipart") as n:
            n.store.initiated_long_ago = True
            await n.store.entered("iter_uploads").wait()  # the orphan scan has begun
            await n.write(ROOT_INODE, b"big.pt", data)
            await n.store.entered("create_multipart").wait()  # created; not journaled yet
            n.store.open("iter_uploads")  # the listing sees it now
            await trio.sleep(0.05)
            n.store.open("create_multipart")
            await n.drained()
            assert (await n.stored("big.pt"))[0] == data

    with caplog.at_level(logging.INFO, logger="ckptgw.drain.uploads.engine"):
        run(test)
    assert "aborting orphaned upload" not in caplog.text


def test_orphans_older_than_the_guard_and_unknown_to_the_journal_are_aborted(
    tmp_path: Path,
) -> None:
    async def test() -> None:
        store = FileStore(parse_store_url(f"file://{tmp_path / 'store'}"))
        await store.check()
        old = await store.create_multipart("old.pt", {})
        young = await store.create_multipart("young.pt", {})
        day_ago = time.time() - 2 * 86400
        os.utime(store.root / ".ckptgw-uploads" / old, (day_ago, day_ago))
        async with node(tmp_path, orphan_age=86400) as n:
            await n.until("scan", lambda: old not in _uploads(n.store))
            assert young in _uploads(n.store)

    run(test)


def _uploads(store: FileStore) -> set[str]:
    root = store.root / ".ckptgw-uploads"
    return {p.name for p in root.iterdir()} if root.exists() else set()


def test_an_upload_interrupted_by_a_restart_resumes_as_dirty(tmp_path: Path) -> None:
    async def first() -> None:
        async with node(tmp_path, "create_multipart") as n:
            await n.write(ROOT_INODE, b"f", os.urandom(12 * MiB))
            await n.store.entered("create_multipart").wait()
            n.store.open("create_multipart")
            await n.until("recorded", lambda: bool(n.fs.journal.all_uploads()))
            # the gateway stops here, mid-upload

    async def second() -> None:
        async with node(tmp_path) as n:
            await n.drained()
            row = n.fs.journal.lookup(ROOT_INODE, b"f")
            assert row is not None and row.state is State.CLEAN

    run(first)
    url = f"file://{tmp_path / 'store'}"
    fs = Filesystem(tmp_path / "cache", FsOptions(store_url=url, reserve_bytes=0))
    try:  # recovery: what was uploading is dirty again, to be taken by the drain anew
        row = fs.journal.lookup(ROOT_INODE, b"f")
        assert row is not None and row.state is State.DIRTY
    finally:
        fs.close()
    run(second)


@pytest.mark.parametrize("journal", ["current", "version-3"])
def test_an_upload_reads_each_byte_once_and_resumes_without_sending_a_part_again(
    tmp_path: Path, journal: str
) -> None:
    """The checksum is computed in the read that sends (DrainStats.read counts the bytes
    read from the cache file). Resumed after a stop, part 1, sent before, is read once to
    check its CRC32 against the journal's and kept; only parts 2 and 3 go. An upload that
    an older version began (an xxh3-128 of the whole file in its record and metadata, no
    CRC32 journaled) starts over instead: its metadata would be wrong for the parts form."""
    data = os.urandom(12 * MiB)  # parts of 5, 5 and 2 MiB

    async def first() -> None:
        async with node(tmp_path, "later_parts") as n:
            inode = await n.write(ROOT_INODE, b"big.pt", data)
            await n.until("part 1 is sent", lambda: bool(n.fs.journal.parts(inode)))
            await n.until("parts 2 and 3 are read", lambda: n.store.parts_waiting == {2, 3})
            assert n.store.parts_sent == [1]
            assert n.engine.drained.read == 5 * MiB  # a part counts once it is sent
            # the gateway stops here, mid-upload

    async def second() -> None:
        async with node(tmp_path) as n:
            await n.drained()
            await assert_stored_whole(n, "big.pt", data)
            assert n.engine.drained.read == len(data)
            assert sorted(n.store.parts_sent) == ([2, 3] if journal == "current" else [1, 2, 3])
            row = n.fs.journal.lookup(ROOT_INODE, b"big.pt")
            assert row is not None and row.state is State.CLEAN
            assert row.checksum == parts_sum(data)

    run(first)
    if journal == "version-3":
        db = sqlite3.connect(tmp_path / "cache" / "journal.db")
        db.execute("UPDATE uploads SET checksum = ?", (xxh(data),))
        db.execute("UPDATE parts SET crc32 = NULL")
        db.commit()
        db.close()
    run(second)


def test_a_file_rewritten_before_its_upload_resumes_is_sent_anew(tmp_path: Path) -> None:
    """Parts of an upload are in the store when the gateway stops; after the restart the
    file (dirty, same generation, same size) is rewritten before the drain takes it again:
    the resumed upload must not mix those old parts with the new content."""
    old, new = os.urandom(12 * MiB), os.urandom(12 * MiB)

    async def first() -> None:
        async with node(tmp_path, "later_parts") as n:
            inode = await n.write(ROOT_INODE, b"latest.pt", old)
            await n.until("part 1 is sent", lambda: bool(n.fs.journal.parts(inode)))
            # the gateway stops here, mid-upload

    async def rewrite() -> None:  # mounted again; the trainer writes before the drain runs
        url = f"file://{tmp_path / 'store'}"
        fs = Filesystem(tmp_path / "cache", FsOptions(store_url=url, reserve_bytes=0))
        try:
            ino = fs.table.lookup(ROOT_INODE, b"latest.pt")
            assert ino is not None and ino.state is State.DIRTY
            assert fs.journal.parts(ino.id), "no part of the first upload to resume"
            fh, _ = await fs.files.open(ino, os.O_WRONLY)  # in place: no O_TRUNC
            await fs.files.write(fh, 0, new)
            await fs.files.fsync(fh, False)
            fs.files.release(fh)
        finally:
            fs.close()

    async def second() -> None:
        async with node(tmp_path) as n:
            await n.drained()
            await assert_stored_whole(n, "latest.pt", new)
            # Part 1's bytes are not the ones whose CRC32 the journal has: sent again, under
            # its number; every byte read once.
            assert sorted(n.store.parts_sent) == [1, 2, 3]
            assert n.engine.drained.read == len(new)

    run(first)
    run(rewrite)
    run(second)


def test_an_unlink_during_the_upload_leaves_nothing_in_the_store(tmp_path: Path) -> None:
    async def test() -> None:
        async with node(tmp_path, "create_multipart") as n:
            await n.write(ROOT_INODE, b"tmp.pt", os.urandom(12 * MiB))
            await n.store.entered("create_multipart").wait()
            n.fs.namespace.unlink(ROOT_INODE, b"tmp.pt")
            n.store.open("create_multipart")
            await n.drained()
            await n.until("no uploads", lambda: not _uploads(n.store))
            assert not (n.store.root / "tmp.pt").exists()

    run(test)


def test_a_rename_over_a_file_being_uploaded_keeps_the_renamed_files_object(
    tmp_path: Path,
) -> None:
    """temp + rename over a file whose single PUT is in flight: the PUT lands after it was
    cancelled; the renamed file's object must be what ends up at the key, and stay there."""
    b, a = os.urandom(3000), os.urandom(2000)

    async def test() -> None:
        async with node(tmp_path, "put") as n:
            n.store.open("put")
            await n.write(ROOT_INODE, b"b.tmp", b)
            await n.drained()
            n.store.gates["put"] = (trio.Event(), trio.Event())
            await n.write(ROOT_INODE, b"a.pt", a)
            await n.store.entered("put").wait()  # a.pt's PUT has landed, unanswered
            n.fs.namespace.rename(ROOT_INODE, b"b.tmp", ROOT_INODE, b"a.pt", 0)
            n.store.open("put")
            await n.drained()
            assert (await n.stored("a.pt"))[0] == b
            row = n.fs.journal.lookup(ROOT_INODE, b"a.pt")
            assert row is not None and row.state is State.CLEAN and row.stored_key == "a.pt"
            assert not (n.store.root / "b.tmp").exists()

    run(test)


@pytest.mark.parametrize("then_unlink", [False, True])
def test_a_file_moved_onto_the_old_key_of_a_file_being_uploaded_keeps_its_object(
    tmp_path: Path, then_unlink: bool
) -> None:
    """A is renamed away while its PUT is in flight, C is renamed onto A's old name: the old
    key is C's now. A goes again to its new key (or, unlinked, leaves nothing behind)."""
    a, c = os.urandom(2000), os.urandom(3000)

    async def test() -> None:
        async with node(tmp_path, "put") as n:
            n.store.open("put")
            await n.write(ROOT_INODE, b"c.tmp", c)
            await n.drained()
            n.store.gates["put"] = (trio.Event(), trio.Event())
            await n.write(ROOT_INODE, b"a.pt", a)
            await n.store.entered("put").wait()
            n.fs.namespace.rename(ROOT_INODE, b"a.pt", ROOT_INODE, b"a2.pt", 0)
            n.fs.namespace.rename(ROOT_INODE, b"c.tmp", ROOT_INODE, b"a.pt", 0)
            if then_unlink:
                n.fs.namespace.unlink(ROOT_INODE, b"a2.pt")
            n.store.open("put")
            await n.drained()
            assert (await n.stored("a.pt"))[0] == c
            if then_unlink:
                assert await n.store.head("a2.pt") is None
            else:
                assert (await n.stored("a2.pt"))[0] == a
            assert await n.store.head("c.tmp") is None
            for name, data in [(b"a.pt", c)] + ([] if then_unlink else [(b"a2.pt", a)]):
                row = n.fs.journal.lookup(ROOT_INODE, name)
                assert row is not None and row.state is State.CLEAN
                assert row.checksum == xxh(data)

    run(test)


def test_a_file_renamed_during_its_upload_is_moved_once_complete(tmp_path: Path) -> None:
    data = os.urandom(12 * MiB)

    async def test() -> None:
        async with node(tmp_path, "create_multipart") as n:
            await n.write(ROOT_INODE, b"x.tmp", data)
            await n.store.entered("create_multipart").wait()
            n.fs.namespace.rename(ROOT_INODE, b"x.tmp", ROOT_INODE, b"x.pt", 0)
            n.store.open("create_multipart")
            await n.drained()
            assert (await n.stored("x.pt"))[0] == data
            assert await n.store.head("x.tmp") is None
            row = n.fs.journal.lookup(ROOT_INODE, b"x.pt")
            assert row is not None and (row.state, row.stored_key) == (State.CLEAN, "x.pt")

    run(test)


# -- truncate and the bounded cache -------------------------------------------------------------


def test_a_sparse_truncate_charges_nothing_and_a_huge_one_gets_the_disks_efbig(
    tmp_path: Path,
) -> None:
    from ckptgw.fsops.namespace import AttrChange

    probe = tmp_path / "probe"
    probe.write_bytes(b"")
    want = errno_of(os.truncate, probe, 1 << 62)  # what the cache disk says (EFBIG on ext4)

    async def test() -> None:
        fs = Filesystem(
            tmp_path / "c",
            FsOptions(store_url="file:///x", reserve_bytes=0, cache_size=MiB, write_wait=60),
        )
        try:
            ino = fs.namespace.create_file(ROOT_INODE, b"sparse", 0o644, ME)
            t0 = trio.current_time()
            await fs.namespace.setattr(ino.id, AttrChange(size=200 << 30))  # 200 GiB of hole
            assert fs.table.get(ino.id).size == 200 << 30
            assert fs.cache.used == 0
            with pytest.raises(OSError) as e:
                await fs.namespace.setattr(ino.id, AttrChange(size=1 << 62))
            assert e.value.errno == want
            assert trio.current_time() - t0 < 60  # never waited for room
        finally:
            fs.close()

    (tmp_path / "c").mkdir()
    trio.run(test, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_write_larger_than_the_whole_cache_fails_at_once(tmp_path: Path) -> None:
    async def test() -> None:
        fs = Filesystem(
            tmp_path,
            FsOptions(store_url="file:///x", reserve_bytes=0, cache_size=MiB, write_wait=60),
        )
        try:
            ino = fs.namespace.create_file(ROOT_INODE, b"big", 0o644, ME)
            fh, _ = await fs.files.open(ino, os.O_WRONLY)
            t0 = trio.current_time()
            with pytest.raises(OSError) as e:
                await fs.files.write(fh, 0, b"x" * (2 * MiB))
            assert e.value.errno == errno.ENOSPC
            assert trio.current_time() == t0  # no wait: it could never fit
            await fs.files.write(fh, 0, b"x" * 1000)  # what fits still goes
            fs.files.release(fh)
        finally:
            fs.close()

    trio.run(test, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_directory_rename_keeps_its_ctime_across_a_remount(tmp_path: Path) -> None:
    opts = FsOptions(store_url="file:///x", reserve_bytes=0)
    fs = Filesystem(tmp_path, opts)
    d = fs.namespace.mkdir(ROOT_INODE, b"a", 0o755, ME)
    before = d.ctime_ns
    fs.namespace.rename(ROOT_INODE, b"a", ROOT_INODE, b"b", 0)
    after = fs.table.get(d.id).ctime_ns
    assert after > before
    fs.close()
    fs = Filesystem(tmp_path, opts)
    try:
        row = fs.journal.lookup(ROOT_INODE, b"b")
        assert row is not None and row.ctime_ns == after
    finally:
        fs.close()


def test_an_exchange_of_two_stored_files_keeps_both_objects(tmp_path: Path) -> None:
    """RENAME_EXCHANGE: each takes the other's key; neither move may overwrite the object
    the other still has to copy."""

    async def test() -> None:
        async with node(tmp_path) as n:
            await n.write(ROOT_INODE, b"a", b"AAAA")
            await n.write(ROOT_INODE, b"b", b"BBBBBB")
            await n.drained()
            n.fs.namespace.rename(ROOT_INODE, b"a", ROOT_INODE, b"b", pyfuse3.RENAME_EXCHANGE)
            await n.drained()
            assert (await n.stored("a"))[0] == b"BBBBBB"
            assert (await n.stored("b"))[0] == b"AAAA"
            assert [o.key async for o in n.store.iter_objects("")] == ["a", "b"]

    run(test)


def test_a_metadata_change_then_a_rename_reaches_the_new_key(tmp_path: Path) -> None:
    async def test() -> None:
        async with node(tmp_path) as n:
            inode = await n.write(ROOT_INODE, b"f", b"content")
            await n.drained()
            await n.fs.namespace.setattr(inode, AttrChange(mode=0o600))
            await n.fs.namespace.setxattr(inode, b"user.step", b"7")
            n.fs.namespace.rename(ROOT_INODE, b"f", ROOT_INODE, b"g", 0)
            await n.drained()
            data, meta = await n.stored("g")
            assert data == b"content" and meta["mode"] == "600" and "xattrs" in meta
            assert await n.store.head("f") is None

    run(test)


# -- read-through: the description a fetch's GET brings -----------------------------------------


class Counting(FileStore):
    """A file store that counts HEADs; ``mute``: its GETs say nothing of the object (the
    :class:`Store` default, as a store without headers to read would)."""

    def __init__(self, root: Path, *, mute: bool, crc_in_get: bool = True) -> None:
        super().__init__(parse_store_url(f"file://{root}"))
        self.heads = 0
        self.mute = mute
        self.crc_in_get = crc_in_get  # False: as S3's ranged GETs, which omit the CRC32

    async def head(self, key: str) -> ObjectInfo | None:
        self.heads += 1
        return await super().head(key)

    async def get_into(self, *args: Any, **kwargs: Any) -> None:
        if self.mute:
            kwargs.pop("described", None)
            await Store.get_into(self, *args, **kwargs)
            return
        told = kwargs.get("described")
        if told is not None and not self.crc_in_get:
            kwargs["described"] = lambda info: told(dataclasses.replace(info, crc32=None))
        await super().get_into(*args, **kwargs)


@asynccontextmanager
async def reader(
    tmp_path: Path, store: FileStore, **opts: Any
) -> AsyncIterator[tuple[Filesystem, Entries, Listings, Fetcher]]:
    """A fresh node's read-through over ``store``: its filesystem, entries, listings and a
    running fetcher (no drain). ``opts`` go to :class:`FsOptions`."""
    cache = tmp_path / "cache"
    cache.mkdir()
    fs = Filesystem(
        cache,
        FsOptions(store_url=store.url, reserve_bytes=0, **opts),
        Scheduler(ScheduleConfig()),
    )
    entries = Entries(fs.parts, store)
    listings = Listings(fs.parts, entries, store, ListingConfig())
    fetcher = Fetcher(fs.parts, entries, store, FetchConfig())
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(fetcher.run)
            yield fs, entries, listings, fetcher
            nursery.cancel_scope.cancel()
    finally:
        fs.close()


def test_a_lookup_does_not_wait_for_room_to_describe_by_fetching(tmp_path: Path) -> None:
    """A lookup of a file a warm-up plans would start its fetch, but never waits for the
    drain to free room for it (``write_wait``): without room now it HEADs instead."""
    big = os.urandom(3 * MiB)

    async def test() -> None:
        store = Counting(tmp_path / "store", mute=False)
        await store.put("big.bin", big, {CHECKSUM: xxh(big)})
        async with reader(tmp_path, store, cache_size=4 * MiB, write_wait=60) as node:
            fs, entries, listings, fetcher = node
            await listings.refresh(fs.table.get(ROOT_INODE))
            ino = fs.table.lookup(ROOT_INODE, b"big.bin")
            assert ino is not None and not entries.known(ino)
            # 2 of the 4 MiB are dirty (no drain runs here): 3 MiB fits only later.
            dirty = fs.namespace.create_file(ROOT_INODE, b"dirty.bin", 0o644, ME)
            fh, _ = await fs.files.open(dirty, os.O_WRONLY)
            await fs.files.write(fh, 0, os.urandom(2 * MiB))
            fs.files.release(fh)
            with trio.fail_after(5):
                assert not await fetcher.described(ino, start=True)
            assert ino.state is State.REMOTE and store.heads == 0

    run(test)


@pytest.mark.parametrize("mute", [False, True], ids=["get-describes", "store-says-nothing"])
def test_a_fetch_is_described_by_its_get_or_by_one_head(tmp_path: Path, mute: bool) -> None:
    good, bad = os.urandom(3 * MiB), os.urandom(2 * MiB)

    async def test() -> None:
        store = Counting(tmp_path / "store", mute=mute)
        meta = {"mode": "600", "uid": "1234", "gid": "1234", "mtime-ns": "5000000000"}
        await store.put("d/good.bin", good, {**meta, CHECKSUM: xxh(good)})
        await store.put("d/bad.bin", bad, {**meta, CHECKSUM: xxh(b"something else")})
        async with reader(tmp_path, store) as node:
            fs, entries, listings, fetcher = node
            await listings.refresh(fs.table.get(ROOT_INODE))  # HEADs d/, its marker
            d = fs.table.lookup(ROOT_INODE, b"d")
            assert d is not None
            base = store.heads
            await listings.refresh(d)
            assert store.heads == base  # big objects: described later
            ino = fs.table.lookup(d.id, b"good.bin")
            assert ino is not None and not entries.known(ino)
            # Two lookups at once (of a file a warm-up is to fetch) share one fetch and
            # wait for what its GET says; then an open needs no HEAD of its own.
            said: list[bool] = []

            async def lookup() -> None:
                said.append(await fetcher.described(ino, start=True))
                os.close(fs.cache.open(ino.id))  # the cache file is made by now

            async with trio.open_nursery() as both:
                for _ in range(2):
                    both.start_soon(lookup)
            assert said == [True, True] and entries.known(ino)
            await fetcher.prepare_open(ino, os.O_RDONLY)
            await fetcher.ensure_whole(ino)
            assert ino.state is State.CLEAN and entries.known(ino)
            assert (ino.mode & 0o7777, ino.uid, ino.mtime_ns) == (0o600, 1234, 5 * 10**9)
            assert os.pread(fs.cache.open(ino.id), len(good) + 1, 0) == good
            assert store.heads == base + (1 if mute else 0)
            # The checksum from either source is checked: a mismatch is EIO.
            other = fs.table.lookup(d.id, b"bad.bin")
            assert other is not None
            with pytest.raises(OSError) as e:
                await fetcher.ensure_whole(other)
            assert e.value.errno == errno.EIO and other.state is State.REMOTE
            assert store.heads == base + (2 if mute else 0)

    run(test)


async def put_in_parts(store: Store, key: str, data: bytes, meta: dict[str, str]) -> None:
    """``data`` at ``key`` as the drain uploads a big file: 5 MiB parts, named in the metadata."""
    uid = await store.create_multipart(key, {**meta, PART_SIZE: str(5 * MiB)})
    etags = [
        await store.upload_part(key, uid, n, data[off : off + 5 * MiB])
        for n, off in enumerate(range(0, len(data), 5 * MiB), 1)
    ]
    await store.complete_multipart(key, uid, etags)


@pytest.mark.parametrize("how", ["get-says-all", "get-without-crc", "store-says-nothing"])
def test_a_multipart_objects_crc32_is_checked_on_read_and_damage_found(
    tmp_path: Path, how: str
) -> None:
    """A fresh node reads two multipart uploads: one intact, verified against the store's
    CRC32 of its parts; one with a byte flipped at rest in the store (same ETag: nothing but
    the checksum can tell), whose read is EIO. Where the GET does not report the CRC32 (S3's
    ranged GETs), one HEAD at the end of the fetch asks for it."""
    good, bad = os.urandom(12 * MiB), os.urandom(12 * MiB)

    async def test() -> None:
        store = Counting(tmp_path / "store", mute=how == "store-says-nothing")
        store.crc_in_get = how == "get-says-all"
        meta = {"mode": "644", "uid": "0", "gid": "0", "mtime-ns": "5000000000"}
        await put_in_parts(store, "good.bin", good, meta)
        await put_in_parts(store, "bad.bin", bad, meta)
        path = tmp_path / "store" / "bad.bin"
        st = path.stat()
        with open(path, "r+b") as f:  # damaged at rest: one byte of part 2
            f.seek(7 * MiB)
            byte = f.read(1)
            f.seek(7 * MiB)
            f.write(bytes([byte[0] ^ 0xFF]))
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        before = await store.head("good.bin"), await store.head("bad.bin")
        assert before[0] is not None and before[0].crc32 is not None
        async with reader(tmp_path, store) as node:
            fs, entries, listings, fetcher = node
            await listings.refresh(fs.table.get(ROOT_INODE))
            base = store.heads
            ino = fs.table.lookup(ROOT_INODE, b"good.bin")
            assert ino is not None and not entries.known(ino)
            # As a lookup of a file a warm-up fetches: described by the fetch, not a HEAD.
            assert await fetcher.described(ino, start=True)
            await fetcher.ensure_whole(ino)
            assert ino.state is State.CLEAN
            assert ino.checksum == parts_checksum(5 * MiB, before[0].crc32)
            assert os.pread(fs.cache.open(ino.id), len(good) + 1, 0) == good
            heads = 0 if how == "get-says-all" else 1
            assert store.heads == base + heads
            other = fs.table.lookup(ROOT_INODE, b"bad.bin")
            assert other is not None
            with pytest.raises(OSError) as e:
                await fetcher.ensure_whole(other)
            assert e.value.errno == errno.EIO and other.state is State.REMOTE
            assert store.heads == base + 2 * heads
        assert (await store.head("bad.bin")) == before[1]  # the same ETag: not a rewrite

    run(test)


def test_a_listing_of_a_directory_renamed_meanwhile_is_not_merged(tmp_path: Path) -> None:
    """A listing may outlive its lookup (a slow store): the directory is renamed, and its
    files moved in the store, before the listing ends. What it shows is of the old name:
    merged, the moved-away keys would read as files of the renamed directory deleted or
    rewritten elsewhere, and their cached copies would be dropped."""

    async def test() -> None:
        async with node(tmp_path, "list_dir") as n:
            d = n.fs.namespace.mkdir(ROOT_INODE, b"step_100", 0o755, ME)
            for i in range(3):
                await n.write(d.id, b"shard_%d" % i, b"data %d" % i)
            await n.drained()
            n.store.open("list_dir")
            await n.listings.refresh(d)  # listed once
            n.store.close("list_dir")
            async with trio.open_nursery() as nursery:
                nursery.start_soon(n.listings.refresh, d)
                await n.store.entered("list_dir").wait()  # it has seen the three objects
                n.fs.namespace.rename(ROOT_INODE, b"step_100", ROOT_INODE, b"best", 0)
                await n.drained()  # moved in the store
                n.store.open("list_dir")
            rows = n.fs.journal.children(d.id, 0, 10)
            assert [(r.name, r.state) for r in rows] == [
                (b"shard_%d" % i, State.CLEAN) for i in range(3)
            ]

    run(test)
