"""Prefetch: a whole checkpoint fetched into the cache before its files are read.

A warm-up (:meth:`Prefetcher.warmup`: ``ckptgw warmup PATH``, or the first open of a remote
file of a checkpoint when ``cache.prefetch`` is on) resolves the path, lists every directory
below it (:mod:`drain.reads.listing`), and plans: the remote files largest first, as long as they
fit in the cache's room (:meth:`fsops.space.CacheSpace.free_bytes`, less what the checkpoint
already has cached); the rest is reported as not fitting, never fetched at the cost of dirty
data. Then it fetches them (:meth:`drain.reads.fetch.Fetcher.ensure_whole`) in natural name order
(``__0_2`` before ``__0_10``: the order in which loaders read shards, so the loader follows
the fetches instead of asking for files they have not reached), at the lowest priority of
the GET slots: a reader's own ranges always go first. No HEAD comes first: a file's first
GET is pinned to the listed ETag (gone or rewritten: the fetch fails as an open would) and its
response carries the object's metadata, which describes the entry. A lookup of a planned file
that is not yet described starts its fetch and waits for that response instead of sending a
HEAD (:meth:`planned`). A prefetched file counts as used now (its ``atime``), so eviction takes
older files before it.

An automatic warm-up is speculative: it reads files no one asked for yet. While the store
refuses this gateway's reads as too many (``pushback``: a fleet restoring one checkpoint at
once, each rank reading its own shards), none starts, and one running stops starting fetches
(``held``): each file is fetched when it is read, and the read requests go to what was asked.
``ckptgw warmup`` goes on regardless: someone asked for it.

An automatic warm-up of a checkpoint is not repeated while one runs or for ``RECENT``
seconds after one ended (one that did not fit would otherwise evict its own files again
at every open). Jobs are kept for status (the last ``KEEP``).
"""

from __future__ import annotations

import collections
import errno
import itertools
import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from ckptgw.drain.checkpoints import Recognizer
from ckptgw.drain.reads.entries import Entries
from ckptgw.drain.reads.fetch import Fetcher
from ckptgw.drain.reads.listing import Listings
from ckptgw.fsops.inodes import Inode
from ckptgw.fsops.journal.rows import ROOT_INODE, InodeRow, State
from ckptgw.fsops.parts import OnParts, Parts

log = logging.getLogger(__name__)

LISTINGS = 8  # directories listed at once
RECENT = 300.0
KEEP = 20
ASKED, OPENED = "warmup", "open"


@dataclass
class Warmup:
    """One warm-up: what it planned, fetched, found cached, could not fit or could not read."""

    id: int
    path: str  # relative to the mount's root
    origin: str  # ASKED or OPENED
    started: float = field(default_factory=time.time)
    phase: str = "listing"  # listing, fetching, done
    files: int = 0  # planned: remote files that fit
    bytes: int = 0
    fetched_files: int = 0
    fetched_bytes: int = 0
    cached_files: int = 0  # in the cache already when it began
    cached_bytes: int = 0
    skipped: list[tuple[str, int]] = field(default_factory=list)  # did not fit: path, size
    failed: list[tuple[str, str]] = field(default_factory=list)  # path, why
    held: int = 0  # files not fetched: the store refused reads as too many (fetched when read)
    error: str = ""  # the warm-up itself failed (e.g. the path vanished)
    ended: float | None = None
    done: trio.Event = field(default_factory=trio.Event)

    def view(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "path": self.path,
            "origin": self.origin,
            "phase": self.phase,
            "files": self.files,
            "bytes": self.bytes,
            "fetched_files": self.fetched_files,
            "fetched_bytes": self.fetched_bytes,
            "cached_files": self.cached_files,
            "cached_bytes": self.cached_bytes,
            "skipped_files": len(self.skipped),
            "skipped_bytes": sum(n for _, n in self.skipped),
            "skipped": [{"path": p, "size": n} for p, n in self.skipped[:20]],
            "failed": [{"path": p, "error": e} for p, e in self.failed[:20]],
            "failed_files": len(self.failed),
            "held_files": self.held,
            "error": self.error,
            "elapsed": round((self.ended or time.time()) - self.started, 3),
        }


def natural(path: str) -> list[str | int]:
    """A sort key that orders numbers by value: ``__0_2`` before ``__0_10``, as DCP, Megatron
    and DeepSpeed number their shards and read them."""
    return [int(t) if i % 2 else t for i, t in enumerate(re.split(r"(\d+)", path))]


@dataclass
class PrefetchStats:
    files: int = 0  # fetched by warm-ups
    bytes: int = 0
    skipped_files: int = 0  # planned out: did not fit


class Prefetcher(OnParts):
    def __init__(
        self,
        parts: Parts,
        listings: Listings,
        entries: Entries,
        fetcher: Fetcher,
        recognizer: Recognizer,
        *,
        auto: bool,
        pushback: Callable[[], bool] = lambda: False,
    ) -> None:
        super().__init__(parts)
        self.listings = listings
        self.entries = entries
        self.fetcher = fetcher
        self.recognizer = recognizer
        self.auto = auto
        self.pushback = pushback  # whether the store refuses this gateway's reads now
        self.stats = PrefetchStats()
        self.jobs: dict[int, Warmup] = {}
        self._planned: collections.Counter[int] = collections.Counter()  # inode -> jobs
        self._ids = itertools.count(1)
        self._nursery: trio.Nursery | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    # -- starting one ----------------------------------------------------------------------------

    def opened(self, ino: Inode) -> None:
        """A remote file was opened for reading: warm up the checkpoint it belongs to."""
        if not self.auto or ino.parent is None or self.pushback():
            return
        rel = self.keys.key_of(ino.id).removeprefix(self.keys.prefix)
        path, step = self.recognizer.locate(rel)
        if step is None or path == rel:
            return  # not in a checkpoint directory; or a checkpoint of one file: being read
        now = time.time()
        for job in self.jobs.values():
            if job.path == path and (job.ended is None or now - job.ended < RECENT):
                return
        self._start(path, OPENED)

    async def warmup(self, path: str) -> Warmup:
        """Start warming up ``path`` (relative to the root), or return the one running for
        it. LookupError if there is no such entry (here or in the store)."""
        path = "/".join(p for p in path.split("/") if p and p != ".")
        for job in self.jobs.values():
            if job.path == path and job.ended is None:
                return job
        top = await self._resolve(path)  # the error comes back to the caller, not the job
        return self._start(path, ASKED, top)

    def job(self, job_id: int) -> Warmup:
        job = self.jobs.get(job_id)
        if job is None:
            raise LookupError(f"no warm-up {job_id} (the gateway keeps the last {KEEP})")
        return job

    def planned(self, ino: Inode) -> bool:
        """Whether a running warm-up is to fetch ``ino`` (and has not yet)."""
        return ino.id in self._planned

    def views(self) -> list[dict[str, Any]]:
        return [j.view() for j in sorted(self.jobs.values(), key=lambda j: -j.id)]

    def _start(self, path: str, origin: str, top: InodeRow | None = None) -> Warmup:
        job = Warmup(next(self._ids), path, origin)
        self.jobs[job.id] = job
        for old in sorted(self.jobs)[:-KEEP]:
            if self.jobs[old].ended is not None:
                del self.jobs[old]
        assert self._nursery is not None
        self._nursery.start_soon(self._run, job, top)
        return job

    # -- one warm-up -----------------------------------------------------------------------------

    async def _run(self, job: Warmup, top: InodeRow | None) -> None:
        """``top``: the entry at the job's path, if the caller resolved it already."""
        try:
            if top is None:
                top = await self._resolve(job.path)
            files = await self._collect(top, job.path)
            todo = self._plan(job, files)
            job.phase = "fetching"
            log.info(
                "warm-up of %s: %d files (%d bytes) to fetch, %d cached, %d do not fit",
                job.path or "/",
                job.files,
                job.bytes,
                job.cached_files,
                len(job.skipped),
            )
            await self._fetch_all(job, todo)
        except (LookupError, OSError) as e:
            job.error = str(e) or type(e).__name__
            log.warning("warm-up of %s failed: %s", job.path or "/", job.error)
        except Exception as e:  # a warm-up is an optimisation: it never takes the mount down
            job.error = f"internal error: {type(e).__name__}: {e}"
            log.exception("warm-up of %s failed unexpectedly", job.path or "/")
        finally:
            job.phase = "done"
            job.ended = time.time()
            job.done.set()
            if job.skipped or job.failed:
                log.warning(
                    "warm-up of %s: %d files did not fit in the cache, %d could not be read",
                    job.path or "/",
                    len(job.skipped),
                    len(job.failed),
                )

    async def _resolve(self, path: str) -> InodeRow:
        """The entry at ``path``, each directory on the way listed first."""
        row: InodeRow = self.table.get(ROOT_INODE)
        for name in [p for p in path.split("/") if p]:
            if not row.is_dir:
                raise LookupError(f"{path}: {self._rel(row)} is not a directory")
            await self.listings.refresh(self.table.adopt(row))
            found = self.journal.lookup(row.id, name.encode())
            if found is None:
                raise LookupError(f"{path}: no such file or directory (here or in the store)")
            row = self.table.current(found)
        return row

    def _rel(self, row: InodeRow) -> str:
        return self.keys.key_of(row.id).removeprefix(self.keys.prefix)

    async def _collect(self, top: InodeRow, path: str) -> list[tuple[InodeRow, str]]:
        """Every regular file at or below ``top``, each directory listed (in parallel)."""
        if not top.is_dir:
            return [(top, path)] if top.is_reg else []
        out: list[tuple[InodeRow, str]] = []
        level = [(top, path)]
        limiter = trio.CapacityLimiter(LISTINGS)
        while level:
            below: list[tuple[InodeRow, str]] = []

            async def one(d: InodeRow, rel: str, below: list[tuple[InodeRow, str]]) -> None:
                async with limiter:
                    await self.listings.refresh(self.table.adopt(d))
                after = 0
                while rows := self.table.children(d.id, after, 1000):
                    after = rows[-1].id
                    for r in rows:
                        name = r.name.decode(errors="surrogateescape") if r.name else ""
                        child = f"{rel}/{name}" if rel else name
                        if r.is_dir:
                            below.append((r, child))
                        elif r.is_reg:
                            out.append((r, child))

            async with trio.open_nursery() as nursery:
                for d, rel in level:
                    nursery.start_soon(one, d, rel, below)
            level = below
        return out

    def _plan(self, job: Warmup, files: list[tuple[InodeRow, str]]) -> list[tuple[Inode, str]]:
        """The remote files to fetch: the largest first as far as the cache has room, then
        put in natural name order."""
        remote: list[tuple[InodeRow, str]] = []
        room = self.space.free_bytes()  # clean files count as room (evictable)...
        for row, rel in files:
            row = self.table.current(row)
            if row.state is State.REMOTE:
                remote.append((row, rel))
                continue
            job.cached_files += 1
            job.cached_bytes += row.size
            if row.state is State.CLEAN:
                room -= row.size  # ...but not this checkpoint's own
        todo: list[tuple[Inode, str]] = []
        for row, rel in sorted(remote, key=lambda x: -x[0].size):
            if row.size <= room:
                room -= row.size
                todo.append((self.table.adopt(row), rel))
                job.files += 1
                job.bytes += row.size
            else:
                job.skipped.append((rel, row.size))
        self.stats.skipped_files += len(job.skipped)
        todo.sort(key=lambda x: natural(x[1]))  # fetched in the order loaders read shards
        for ino, _ in todo:
            ino.pins += 1  # in memory until fetched (released in _fetch_all)
            self._planned[ino.id] += 1
        return todo

    async def _fetch_all(self, job: Warmup, todo: list[tuple[Inode, str]]) -> None:
        """The fetches, a few files more than there are GETs in flight. A file not yet
        described needs no HEAD first: its first GET's response describes it
        (:meth:`drain.reads.fetch.Fetcher.described`), and a GET pinned to the listed ETag fails
        as an open would if the object is gone or was rewritten."""
        fetches = trio.CapacityLimiter(2 * self.fetcher.config.fetch_parallel)

        async def fetch(ino: Inode, rel: str, slot: object) -> None:
            try:
                if ino.state is State.REMOTE:
                    ino.atime_ns = time.time_ns()  # prefetched: used now, for eviction
                    ino.atime_dirty = True
                    await self.fetcher.ensure_whole(ino)  # at PREFETCH priority: not opened
                    job.fetched_files += 1
                    job.fetched_bytes += ino.size
                    self.stats.files += 1
                    self.stats.bytes += ino.size
                else:  # fetched by a reader meanwhile, or rewritten here
                    job.cached_files += 1
                    job.cached_bytes += ino.size
            except OSError as e:  # what a read of it would get
                self._failed(job, rel, e)
            finally:
                fetches.release_on_behalf_of(slot)
                self._unpin(ino)

        started = 0
        try:
            async with trio.open_nursery() as nursery:
                for ino, rel in todo:
                    slot = object()  # an inode is not hashable
                    await fetches.acquire_on_behalf_of(slot)
                    if job.origin == OPENED and self.pushback():
                        fetches.release_on_behalf_of(slot)
                        job.held = len(todo) - started
                        for held, _ in todo[started:]:  # no longer planned: a lookup of one
                            self._unpin(held)  # does not start its fetch
                        started = len(todo)
                        log.info(
                            "warm-up of %s: the store refuses reads as too many: %d files are "
                            "fetched when read instead",
                            job.path or "/",
                            job.held,
                        )
                        break
                    nursery.start_soon(fetch, ino, rel, slot)
                    started += 1
        finally:  # cancelled (unmount) before every fetch started
            for ino, _ in todo[started:]:
                self._unpin(ino)

    def _unpin(self, ino: Inode) -> None:
        ino.pins -= 1
        self._planned[ino.id] -= 1
        if self._planned[ino.id] <= 0:
            del self._planned[ino.id]
        self.table.release_if_unused(ino)

    def _failed(self, job: Warmup, rel: str, e: OSError) -> None:
        why = os.strerror(e.errno or errno.EIO)
        job.failed.append((rel, why))
        log.warning("warm-up of %s: cannot fetch %s: %s", job.path or "/", rel, why)
