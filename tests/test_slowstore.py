"""A slow store never freezes the filesystem (the lookup path's deadline:
drain/reads/lookupwait.py).

The filesystem's operations are called directly (no mount) on a node wired as the daemon
wires it (``gateway.daemon.main._read_through``), over a file store whose listings and HEADs can
be held at a gate. Time is trio's MockClock, moved by hand: what is asserted is exactly when
a lookup answers, in the clock's time. The same on a real mount, against S3 behind a proxy
that holds the LIST requests: tests/test_readthrough.py.

The rule under test: past ``store.lookup_wait`` a lookup is answered from the journal where
the journal's view of the directory can say "no such name" (listed since the mount, or made
by this mount); a directory never listed waits for its first listing, and a failed one is
EIO, never a false ENOENT.
"""

from __future__ import annotations

import errno
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pyfuse3
import pytest
import trio
import trio.testing

from ckptgw.drain.reads.readthrough import ReadThrough
from ckptgw.fsops.filesystem import Filesystem, FsOptions
from ckptgw.fsops.journal.rows import ROOT_INODE
from ckptgw.fsops.operations import Operations
from ckptgw.gateway.config import Config
from ckptgw.gateway.daemon.main import _read_through
from ckptgw.store.interface import Listing, ObjectInfo, StoreError
from ckptgw.store.retry import RetryingStore, RetryPolicy, RetryStats
from ckptgw.store.url import parse_store_url
from tests.test_drain_races import GatedStore
from tests.test_ops import ME

WAIT = 2.0  # store.lookup_wait's default
CTX = cast(pyfuse3.RequestContext, ME)
BIG = b"w" * 5000  # above SMALL_OBJECT: a listing does not HEAD it


class SlowStore(GatedStore):
    """A gated file store (tests/test_drain_races.py) whose gates can be armed again, with a
    gate on HEADs, listings that fail, and a record of what was asked."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.lists: list[str] = []  # prefixes listed (attempts that reached the store)
        self.heads: list[str] = []
        self.failing: dict[str, StoreError] = {}  # prefix -> the error every LIST of it gets
        self.resets = 0  # the next N listings fail with a temporary error (then retried)

    def arm(self, name: str) -> None:
        self.gates[name] = (trio.Event(), trio.Event())

    async def list_dir(self, prefix: str) -> Listing:
        if self.resets:
            self.resets -= 1
            raise StoreError(f"LIST {prefix}: connection reset", temporary=True, code="Transport")
        if prefix in self.failing:
            raise self.failing[prefix]
        self.lists.append(prefix)
        return await super().list_dir(prefix)

    async def head(self, key: str) -> ObjectInfo | None:
        info = await super().head(key)
        self.heads.append(key)
        await self.gate("head")
        return info


@dataclass
class Node:
    fs: Filesystem
    remote: ReadThrough
    ops: Operations
    stats: RetryStats
    nursery: trio.Nursery
    clock: trio.testing.MockClock  # trio's clock, if not a MockClock: then never moved here

    def ino(self, parent: int, name: bytes) -> int:
        row = self.fs.journal.lookup(parent, name)
        assert row is not None, name
        return row.id

    def call(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> Call:
        return Call(self.nursery, fn, *args)

    def lookup(self, parent: int, name: bytes) -> Call:
        return self.call(self.ops.lookup, parent, name, CTX)

    async def settle(self) -> None:
        """Every task is waiting (on the clock, a gate or a thread)."""
        await trio.testing.wait_all_tasks_blocked()

    async def until(self, what: str, cond: Callable[[], bool]) -> None:
        """Wait in real time, the clock standing still, for a thread or a task to finish."""
        for _ in range(2000):
            await self.settle()
            if cond():
                return
            await trio.to_thread.run_sync(time.sleep, 0.005)
        raise AssertionError(f"{what}: not within 10 s")


class Call:
    """One filesystem call in a task of its own: its answer, or its errno, once done."""

    def __init__(self, nursery: trio.Nursery, fn: Callable[..., Awaitable[Any]], *args: Any):
        self.done = False
        self.result: Any = None
        self.errno: int | None = None
        nursery.start_soon(self._run, fn, args)

    async def _run(self, fn: Callable[..., Awaitable[Any]], args: tuple[Any, ...]) -> None:
        try:
            self.result = await fn(*args)
        except pyfuse3.FUSEError as e:
            self.errno = e.errno
        finally:
            self.done = True

    @property
    def found(self) -> bool:
        return self.done and self.errno is None and self.result.st_ino != 0


@asynccontextmanager
async def node(tmp_path: Path, store: SlowStore, ttl: float = 5.0) -> AsyncIterator[Node]:
    cache = tmp_path / "cache"
    cache.mkdir()
    fs = Filesystem(cache, FsOptions(store_url=store.url, reserve_bytes=0))
    cfg = Config(
        mountpoint=tmp_path / "mnt",
        store=parse_store_url(store.url),
        cache_dir=cache,
        listing_ttl=ttl,
    )
    stats = RetryStats()
    clock = cast(trio.testing.MockClock, trio.lowlevel.current_clock())
    try:
        async with trio.open_nursery() as nursery:
            retrying = RetryingStore(store, RetryPolicy(), stats)
            _, _, remote = await nursery.start(_read_through, fs, retrying, cfg)
            yield Node(fs, remote, fs.operations(remote), stats, nursery, clock)
            nursery.cancel_scope.cancel()
    finally:
        fs.close()


def run(test: Callable[[], Awaitable[None]]) -> None:
    trio.run(test, clock=trio.testing.MockClock())  # still unless moved: clock.jump()


async def slow_store(tmp_path: Path, objects: dict[str, bytes]) -> SlowStore:
    store = SlowStore(tmp_path / "store")
    await store.check()
    for key, data in objects.items():
        await store.put(key, data, {"mode": "600"})
    return store


def messages(caplog: pytest.LogCaptureFixture, logger: str, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == logger and r.levelno == level]


def test_a_stalled_listing_holds_a_lookup_no_longer_than_lookup_wait(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A directory listed before: the next listing stalls (after one reset, retried); the
    lookup that started it answers from the journal at exactly ``WAIT``, later ones at once
    (they share it, no second LIST); "no such name" is not kept by the kernel meanwhile;
    local entries win. The WARNING names the store and the LIST, once; the merge happens
    when the listing completes, then an INFO."""
    caplog.set_level(logging.INFO)

    async def test() -> None:
        store = await slow_store(tmp_path, {"run/old.pt": BIG})
        async with node(tmp_path, store, ttl=0.0) as n:  # every lookup lists
            assert (await n.ops.lookup(ROOT_INODE, b"run", CTX)).st_ino != 0
            run_dir = n.ino(ROOT_INODE, b"run")
            assert (await n.ops.lookup(run_dir, b"old.pt", CTX)).st_ino != 0
            n.fs.namespace.create_file(run_dir, b"mine.pt", 0o644, ME)  # saved here
            await store.put("run/new.pt", BIG, {})  # by another node, after our listing

            store.arm("list_dir")  # the next listing of run/ stalls
            store.resets = 1
            t0 = trio.current_time()
            first = n.lookup(run_dir, b"other.pt")
            await n.settle()  # the reset: its retry waits (at most 0.05 s)
            n.clock.jump(0.05)
            await n.until("the list_dir gate", store.entered("list_dir").is_set)
            n.clock.jump(WAIT - 0.1)
            await n.settle()
            assert not first.done  # within the deadline, the lookup waits
            n.clock.jump(0.1)
            await n.settle()
            assert first.done and first.errno == errno.ENOENT  # an error: not kept by the kernel
            assert trio.current_time() - t0 == pytest.approx(WAIT + 0.05)

            # Later lookups share the stalled listing and answer at once.
            later = [
                n.lookup(run_dir, b"other2.pt"),
                n.lookup(run_dir, b"mine.pt"),
                n.lookup(run_dir, b"old.pt"),
                n.call(n.ops.opendir, run_dir, CTX),
            ]
            await n.settle()
            assert [c.done for c in later] == [True] * 4
            assert later[0].errno == errno.ENOENT
            assert later[1].found and later[2].found and later[3].result == run_dir
            assert store.lists == ["", "run/", "run/"]  # one listing for all of them
            assert n.stats.retries == 1  # the reset, counted like every other retry
            assert any("list run/" in m and "retry 1" in m for m in messages(
                caplog, "ckptgw.store.retry", logging.INFO))  # fmt: skip
            warnings = messages(caplog, "ckptgw.drain.reads.lookupwait", logging.WARNING)
            assert len(warnings) == 1 and store.url in warnings[0], warnings
            assert "LIST run/" in warnings[0]
            view = n.remote.waits.view()
            assert view.stalled_since is not None and view.stalled_on.startswith("LIST run/")
            assert (view.from_journal, view.episodes) == (5, 1)  # 4 lookups, 1 opendir

            # The listing completes: its merge brings what another node stored meanwhile.
            store.open("list_dir")
            await n.until("the merge", lambda: n.fs.journal.lookup(run_dir, b"new.pt") is not None)
            await n.until("the stall's end", lambda: n.remote.waits.stalled_since is None)
            assert (await n.ops.lookup(run_dir, b"new.pt", CTX)).st_ino != 0
            infos = messages(caplog, "ckptgw.drain.reads.lookupwait", logging.INFO)
            assert any("answers again" in m and "LIST run/" in m for m in infos), infos
            assert len(messages(caplog, "ckptgw.drain.reads.lookupwait", logging.WARNING)) == 1

    run(test)


def test_a_directory_never_listed_waits_for_its_first_listing_and_a_failed_one_is_eio(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A fresh node restoring a checkpoint: nothing in the journal to answer from. Its lookup
    waits for the listing past the deadline (no false ENOENT); a listing that fails makes a
    name it lacks, and reading the directory, EIO, not "no such file" or empty."""
    caplog.set_level(logging.INFO)

    async def test() -> None:
        store = await slow_store(tmp_path, {"ckpt/step_1/model.pt": BIG})
        async with node(tmp_path, store) as n:
            store.arm("list_dir")
            ckpt = n.lookup(ROOT_INODE, b"ckpt")
            await n.until("the list_dir gate", store.entered("list_dir").is_set)
            n.clock.jump(WAIT + 0.1)
            await n.settle()
            assert not ckpt.done  # the journal has nothing to say: the listing is the answer
            n.clock.jump(60.0)
            await n.settle()
            assert not ckpt.done
            store.open("list_dir")
            await n.until("the first listing", lambda: ckpt.done)
            assert ckpt.found

            ckpt_dir = n.ino(ROOT_INODE, b"ckpt")
            store.failing["ckpt/"] = StoreError(
                "LIST ckpt/: Access Denied", temporary=False, code="AccessDenied"
            )
            step = n.lookup(ckpt_dir, b"step_1")
            read = n.call(n.ops.opendir, ckpt_dir, CTX)
            await n.until("the failed listing", lambda: step.done and read.done)
            assert (step.errno, read.errno) == (errno.EIO, errno.EIO)

            del store.failing["ckpt/"]
            n.clock.jump(6.0)  # tried again once due (listing_ttl: 5 s)
            step = n.lookup(ckpt_dir, b"step_1")
            await n.until("the listing", lambda: step.done)
            assert step.found, (step.errno, step.result, store.lists)
            assert any("cannot list the store" in m for m in messages(
                caplog, "ckptgw.drain.reads.listing", logging.WARNING))  # fmt: skip

    run(test)


def test_a_save_into_a_directory_made_here_waits_once_per_directory_however_many_files(
    tmp_path: Path,
) -> None:
    """The saving node, every listing stalled: a new checkpoint directory under one listed
    before, 50 shards in it. Each directory's first lookup waits ``WAIT`` for its stalled
    listing; the other 50 lookups answer at once from the journal (the directory was made
    here: the journal is right about it). The listings are still under way at the end."""

    async def test() -> None:
        store = await slow_store(tmp_path, {"ckpt/step_0/model.pt": BIG})
        async with node(tmp_path, store, ttl=0.0) as n:  # every lookup lists
            assert (await n.ops.lookup(ROOT_INODE, b"ckpt", CTX)).st_ino != 0
            ckpt = n.ino(ROOT_INODE, b"ckpt")
            assert (await n.ops.lookup(ckpt, b"step_0", CTX)).st_ino != 0
            store.arm("list_dir")

            async def save() -> None:
                attrs = await n.ops.mkdir(ckpt, b"step_1", 0o755, CTX)
                for i in range(50):
                    name = f"shard_{i:02}.distcp".encode()
                    try:
                        await n.ops.lookup(attrs.st_ino, name, CTX)
                        raise AssertionError(f"{name!r} exists")
                    except pyfuse3.FUSEError as e:
                        assert e.errno == errno.ENOENT
                    fh, _ = await n.ops.create(attrs.st_ino, name, 0o644, 0o1, CTX)
                    await n.ops.release(fh.fh)

            async def lookup_then_save() -> None:
                with pytest.raises(pyfuse3.FUSEError) as e:
                    await n.ops.lookup(ckpt, b"step_1", CTX)
                assert e.value.errno == errno.ENOENT
                await save()

            t0 = trio.current_time()
            saving = n.call(lookup_then_save)
            await n.until("the listing of ckpt/", store.entered("list_dir").is_set)  # stalled
            store.arm("list_dir")
            n.clock.jump(WAIT)
            # The lookup in ckpt/ answered: the save goes on into step_1, whose listing stalls.
            await n.until("the listing of ckpt/step_1/", store.entered("list_dir").is_set)
            n.clock.jump(WAIT)
            await n.until("the save", lambda: saving.done)
            assert saving.errno is None and saving.result is None
            assert trio.current_time() - t0 == 2 * WAIT  # no more waiting than that
            step_1 = n.ino(ckpt, b"step_1")
            assert len(n.fs.table.children(step_1, 0, 100)) == 50
            assert store.lists == ["", "ckpt/", "ckpt/", "ckpt/step_1/"]  # one LIST each

    run(test)


def test_a_lookup_waits_for_an_entrys_metadata_no_longer_than_lookup_wait(tmp_path: Path) -> None:
    """A HEAD on the lookup path that stalls: the lookup answers at ``WAIT`` with the
    listing's attributes, which the kernel is told not to keep; the next lookup shares the
    HEAD; when it comes, the entry has its own mode and may be kept."""

    async def test() -> None:
        store = await slow_store(tmp_path, {"big.bin": BIG})
        async with node(tmp_path, store) as n:
            store.arm("head")
            first = n.lookup(ROOT_INODE, b"big.bin")
            await n.until("the head gate", store.entered("head").is_set)
            n.clock.jump(WAIT - 0.1)
            await n.settle()
            assert not first.done
            n.clock.jump(0.1)
            await n.settle()
            assert first.done and first.errno is None
            assert first.result.entry_timeout == first.result.attr_timeout == 0
            assert first.result.st_mode & 0o777 == 0o644  # not described yet
            again = n.lookup(ROOT_INODE, b"big.bin")
            await n.settle()
            assert again.done and again.result.entry_timeout == 0
            assert store.heads == ["big.bin"]  # shared, not sent again
            assert n.remote.waits.view().undescribed == 2

            store.open("head")
            ino = n.ino(ROOT_INODE, b"big.bin")
            await n.until("the HEAD", lambda: n.remote.known(n.fs.table.get(ino)))
            attrs = await n.ops.lookup(ROOT_INODE, b"big.bin", CTX)
            assert attrs.st_mode & 0o777 == 0o600 and attrs.entry_timeout > 0
            assert n.remote.waits.view().stalled_since is None

    run(test)


def test_no_such_name_is_kept_by_the_kernel_only_while_the_listing_is_fresh(tmp_path: Path) -> None:
    """A negative entry lives as long as the listing it comes from is fresh (listing_ttl);
    one answered from the journal because the listing is late is not kept at all: the name
    may show up when the listing completes. (Trio's real clock: the listing's TTL is short.)"""

    async def test() -> None:
        store = await slow_store(tmp_path, {"run/old.pt": BIG})
        async with node(tmp_path, store, ttl=0.5) as n:
            assert (await n.ops.lookup(ROOT_INODE, b"run", CTX)).st_ino != 0
            run_dir = n.ino(ROOT_INODE, b"run")
            fresh = await n.ops.lookup(run_dir, b"step_9", CTX)
            assert fresh.st_ino == 0 and 0 < fresh.entry_timeout <= 0.5  # kept, while fresh

            await store.put("run/step_9", BIG, {})  # another node's: the next listing has it
            await trio.sleep(0.6)  # due again
            store.arm("list_dir")
            with trio.fail_after(30), pytest.raises(pyfuse3.FUSEError) as late:
                await n.ops.lookup(run_dir, b"step_9", CTX)
            # Not there yet, for as long as the listing is late: an error, which the kernel
            # does not keep, not a negative entry.
            assert late.value.errno == errno.ENOENT
            assert store.entered("list_dir").is_set() and n.remote.waits.stalled_since

            store.open("list_dir")
            with trio.fail_after(30):
                while n.fs.journal.lookup(run_dir, b"step_9") is None:
                    await trio.sleep(0.01)
            assert (await n.ops.lookup(run_dir, b"step_9", CTX)).st_ino != 0

    trio.run(test)
