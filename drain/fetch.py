"""Read-through: the content of remote files, fetched into the cache with parallel ranged GETs.

Opening a remote file checks that the object still exists (a HEAD, which also brings its
checksum and attributes, unless its lookup just did: :mod:`drain.entries`; ENOENT if it is
gone) and starts fetching it: ``parallel`` ranged
GETs of ``chunk`` bytes, pinned to the object's ETag (a rewrite during the fetch is ESTALE,
never a mix of versions), written into a sparse cache file of the full size. Chunks go in
file order from where the reader is (sequential read-ahead), chunks a reader waits for first.
A read returns as soon as its chunks are there.

The xxh3-128 of the content is computed as the chunks arrive in order, so verification costs
no second pass; the read that completes the file returns only after it. A mismatch fails every
read of the file with EIO and is logged; the cache file is dropped and the next open tries
again. Objects without a checksum (written by other tools) are not verified. A verified file
becomes clean: cached, evictable, read locally from then on.

Opening for writing fetches the whole file first (O_TRUNC fetches nothing).
"""

from __future__ import annotations

import errno
import logging
import os
import time
from dataclasses import dataclass

import trio
import xxhash

from ckptgw.drain.entries import Entries
from ckptgw.drain.store import NotFound, Stale, Store, StoreError
from ckptgw.fsops.inodes import Inode, InodeTable, fs_error
from ckptgw.fsops.journal import State
from ckptgw.fsops.space import CacheSpace
from ckptgw.fsops.state import FileStates

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FetchConfig:
    chunk: int = 8 << 20
    parallel: int = 8  # ranged GETs in flight, over all files
    failed_for: float = 5.0  # a failed fetch answers reads with its error this long


@dataclass
class FetchStats:
    files: int = 0
    bytes: int = 0


class _Fetch:
    def __init__(self, ino: Inode, key: str, etag: str | None, chunk: int, fd: int) -> None:
        self.ino, self.key, self.etag, self.fd = ino, key, etag, fd
        self.size = ino.size
        self.checksum = ino.checksum
        self.chunk = chunk
        self.count = max(1, -(-self.size // chunk))
        self.started = [False] * self.count
        self.done = [False] * self.count
        self.arrived = [trio.Event() for _ in range(self.count)]
        self.wanted: list[int] = []  # chunks a reader waits for, not yet started
        self.cursor = 0  # read-ahead continues from here
        self.remaining = self.count
        self.hasher = xxhash.xxh3_128()
        self.hashed = 0  # chunks hashed, in order
        self.hash_lock = trio.Lock()
        self.error: int | None = None
        self.verified = False
        self.landing = 0  # charged to the cache space, not yet written
        self.failed_at = 0.0
        self.finished = trio.Event()

    def span(self, i: int) -> tuple[int, int]:
        return i * self.chunk, min(self.size, (i + 1) * self.chunk)

    def next_chunk(self) -> int | None:
        while self.wanted:
            i = self.wanted.pop(0)
            if not self.started[i]:
                return self._take(i)
        for i in [*range(self.cursor, self.count), *range(0, self.cursor)]:
            if not self.started[i]:
                return self._take(i)
        return None

    def _take(self, i: int) -> int:
        self.started[i] = True
        self.cursor = i + 1
        return i

    def want(self, first: int, last: int) -> None:
        for i in range(first, last + 1):
            if not self.started[i] and i not in self.wanted:
                self.wanted.append(i)
        if not self.started[first]:
            self.cursor = first

    def fail(self, code: int) -> None:
        if self.error is None:
            self.error = code
            self.failed_at = time.monotonic()
        for e in self.arrived:
            e.set()
        self.finished.set()


class Fetcher:
    """``store`` retries temporary errors itself (:class:`drain.retry.RetryingStore`)."""

    def __init__(
        self,
        table: InodeTable,
        states: FileStates,
        space: CacheSpace,
        entries: Entries,
        store: Store,
        config: FetchConfig,
    ) -> None:
        self.table = table
        self.states = states
        self.journal = table.journal
        self.cache = table.cache
        self.space = space
        self.entries = entries
        self.store = store
        self.config = config
        self.stats = FetchStats()
        self._active: dict[int, _Fetch] = {}
        self._limiter = trio.CapacityLimiter(config.parallel)
        self._nursery: trio.Nursery | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    # -- what the filesystem calls ---------------------------------------------------------------

    async def prepare_open(self, ino: Inode, flags: int) -> None:
        writable = (flags & os.O_ACCMODE) in (os.O_WRONLY, os.O_RDWR)
        if ino.id not in self._active or self._active[ino.id].error is not None:
            self._active.pop(ino.id, None)
            await self.entries.describe(ino, strict=True)
        if writable and flags & os.O_TRUNC and ino.id not in self._active:
            self.cache.create(ino.id)
            ino.size = 0
            await self.states.mark_dirty(ino)  # remote -> dirty: nothing to fetch
            return
        if writable:
            await self.ensure_whole(ino)
        else:
            await self._start(ino)  # read-ahead starts now, before the first read

    async def ensure(self, ino: Inode, off: int, size: int) -> None:
        f = await self._start(ino)
        if f is None:
            return
        end = min(off + size, f.size)
        if off < end and f.error is None:
            first, last = off // f.chunk, (end - 1) // f.chunk
            f.want(first, last)
            for i in range(first, last + 1):
                await f.arrived[i].wait()
        if f.error is not None:
            raise fs_error(f.error)

    async def ensure_whole(self, ino: Inode) -> None:
        f = await self._start(ino)
        if f is not None:
            await f.finished.wait()
            if f.error is not None:
                raise fs_error(f.error)

    # -- one fetch -------------------------------------------------------------------------------

    async def _start(self, ino: Inode) -> _Fetch | None:
        f = self._active.get(ino.id)
        if f is not None:
            if f.error is None or time.monotonic() - f.failed_at < self.config.failed_for:
                return f
            del self._active[ino.id]  # failed a while ago: try again
        if ino.state is not State.REMOTE:
            return None
        if ino.stored_key is None:
            raise fs_error(errno.EIO)
        landing = await self.space.grow(ino, ino.size, patient=True)
        self.cache.create(ino.id)
        fd = self.cache.open(ino.id)
        os.ftruncate(fd, ino.size)
        f = self._active[ino.id] = _Fetch(
            ino, ino.stored_key, ino.stored_etag, self.config.chunk, fd
        )
        f.landing = landing
        ino.pins += 1
        assert self._nursery is not None
        self._nursery.start_soon(self._fetch, f)
        return f

    async def _fetch(self, f: _Fetch) -> None:
        started = time.monotonic()
        try:
            async with trio.open_nursery() as nursery:
                for _ in range(min(self.config.parallel, f.count)):
                    nursery.start_soon(self._worker, f)
            if f.error is None:
                await self._verify(f)
        except Exception:
            log.exception("fetching %s failed unexpectedly", f.key)
            f.fail(errno.EIO)
        finally:  # also on cancellation (unmount): the partial file is removed at next mount
            self.space.landed(f.landing)
            f.landing = 0
            os.close(f.fd)
            f.ino.pins -= 1
            if f.verified:
                self._active.pop(f.ino.id, None)
                self.stats.files += 1
                log.info(
                    "fetched %s (%d bytes) in %.2f s", f.key, f.size, time.monotonic() - started
                )
            elif f.error is not None:
                self._drop(f)
            else:  # cancelled: nobody may take the sparse file for content
                f.fail(errno.EIO)
                self._active.pop(f.ino.id, None)
            f.finished.set()
            self.table.release_if_unused(f.ino)

    async def _worker(self, f: _Fetch) -> None:
        while f.error is None and (i := f.next_chunk()) is not None:
            start, end = f.span(i)
            data = b"" if start == end else await self._get(f, start, end)
            if data is None:
                return
            await trio.to_thread.run_sync(os.pwrite, f.fd, data, start)
            landed = min(f.landing, len(data))
            f.landing -= landed
            self.space.landed(landed)
            self.stats.bytes += len(data)
            f.done[i] = True
            f.remaining -= 1
            await self._hash_ahead(f, i, data)
            if f.remaining:  # the read that completes the file waits for verification
                f.arrived[i].set()

    async def _get(self, f: _Fetch, start: int, end: int) -> bytes | None:
        """Bytes [start, end) of the object, or None after failing the fetch."""
        try:
            async with self._limiter:
                data = await self.store.get(f.key, start, end, etag=f.etag)
        except Stale as e:
            log.warning("%s; reads of it fail with ESTALE until it is opened again", e)
            f.fail(errno.ESTALE)
            return None
        except NotFound:
            log.warning("%s vanished from the store while being read", f.key)
            f.fail(errno.ENOENT)
            return None
        except StoreError as e:
            log.warning("cannot read %s: %s", f.key, e)
            f.fail(errno.EIO)
            return None
        if len(data) != end - start:
            log.error("%s: got %d bytes for [%d, %d)", f.key, len(data), start, end)
            f.fail(errno.EIO)
            return None
        return data

    async def _hash_ahead(self, f: _Fetch, arrived: int = -1, data: bytes = b"") -> None:
        """Hash the chunks done in order since the last call: the one that just ``arrived``
        from its bytes in memory, the others read back from the cache file."""
        async with f.hash_lock:
            todo: list[int] = []
            while f.hashed + len(todo) < f.count and f.done[f.hashed + len(todo)]:
                todo.append(f.hashed + len(todo))
            if not todo:
                return

            def run() -> None:
                for i in todo:
                    start, end = f.span(i)
                    f.hasher.update(data if i == arrived else os.pread(f.fd, end - start, start))

            await trio.to_thread.run_sync(run)
            f.hashed += len(todo)

    async def _verify(self, f: _Fetch) -> None:
        await self._hash_ahead(f)
        got = f.hasher.hexdigest()
        ino = f.ino
        if f.checksum is not None and got != f.checksum:
            log.error(
                "checksum mismatch in %s: the store's metadata says %s, the content is %s; "
                "reads of it fail with EIO",
                f.key,
                f.checksum,
                got,
            )
            f.fail(errno.EIO)
            return
        if ino.state is State.REMOTE and ino.stored_etag == f.etag:
            self.states.fetched(ino, got)
        f.verified = True
        for e in f.arrived:
            e.set()

    def _drop(self, f: _Fetch) -> None:
        """A failed fetch keeps no content; the file stays remote. The cache file is emptied,
        not removed: open handles hold it, and the next fetch refills the same file."""
        if f.ino.state is State.REMOTE:
            self.cache.create(f.ino.id)
            self.space.shrink(f.ino, 0)
