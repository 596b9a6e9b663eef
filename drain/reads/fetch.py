"""Read-through: the content of remote files, fetched into the cache with parallel ranged GETs.

Opening a remote file checks that the object still exists (a HEAD, which also brings its
checksum and attributes, unless its lookup or a prefetch just did: :mod:`drain.reads.entries`;
ENOENT if it is gone) and starts fetching it into a sparse cache file of the full size, with
ranged GETs pinned to the object's ETag (a rewrite during the fetch is ESTALE, never a mix of
versions).

Range size adapts to the object (:func:`range_size`): the object is cut into about as many
ranges as there are GETs in flight (``cache.fetch_parallel``), each between 8 MiB and
``cache.fetch_chunk_max``, so a big object costs few requests (a store with a per-request
cost, or one that reads the whole object for every range, pays for each) and still fills
every connection; ``cache.fetch_chunk`` fixes the size instead. A range is written into the
cache file as its body arrives (:meth:`ckptgw.store.interface.Store.get_into`, pieces of
4 MiB), and a read returns as soon as its own bytes are there, so a large range does not
delay the first bytes; a retry resumes where the bytes end.

GETs in flight are shared by every fetch (:class:`Slots`); a freed one goes to a range a
reader is waiting for first, then to read-ahead of files that are open, then to prefetches
(:mod:`drain.reads.prefetch`). Ranges go in file order from where the reader is (sequential
read-ahead), ranges a reader waits for first.

The content checksum (:mod:`fsops.contentsum`: the xxh3-128 in a single PUT's metadata, or
the CRC32 of each part of a multipart upload, whose part size the metadata names) is computed
as the bytes become contiguous from the start (read back from the page cache by one hashing
task per fetch), so verification needs no pass after the last byte but the unhashed tail; the
read that completes the file returns only after it. A multipart upload's value is the store's
CRC32, which a ranged GET does not report: unless a HEAD brought it (a lookup's), one HEAD
asks for it at the end. A mismatch fails every read of the file with EIO and is logged; the
cache file is dropped and the next open tries again. Objects without a checksum (written by
other tools, or a multipart upload on a store that keeps no CRC32) are not verified. A
verified file becomes clean: cached, evictable, read locally from then on.

Opening for writing fetches the whole file first (O_TRUNC fetches nothing).
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import trio

from ckptgw.drain.reads.entries import Entries, read_meta
from ckptgw.fsops.contentsum import Hasher, part_size_of
from ckptgw.fsops.inodes import Inode, fs_error
from ckptgw.fsops.journal.rows import State
from ckptgw.fsops.parts import OnParts, Parts
from ckptgw.store.interface import NotFound, ObjectInfo, Stale, Store, StoreError

log = logging.getLogger(__name__)

MIN_RANGE = 8 << 20
HASH_PIECE = 4 << 20
INLINE_HASH = 1 << 20  # less than this is hashed on the event loop (about 0.1 ms)
# What a range is fetched for, most urgent first: a reader waits for it; read-ahead of a file
# that is open; a prefetch (nobody has opened the file yet).
WAITED, OPEN, PREFETCH = 0, 1, 2


@dataclass(frozen=True)
class FetchConfig:
    fetch_chunk: int | None = None  # fixed range size; None: adapt to each object (range_size)
    fetch_chunk_max: int = 256 << 20
    fetch_parallel: int = 8  # ranged GETs in flight, over all files
    failed_for: float = 5.0  # a failed fetch answers reads with its error this long


def range_size(size: int, config: FetchConfig) -> int:
    """The ranged GET size for an object of ``size`` bytes: ``config.fetch_chunk`` if set, else
    about ``size / fetch_parallel`` (whole MiB), at least 8 MiB and at most ``fetch_chunk_max``."""
    if config.fetch_chunk is not None:
        return config.fetch_chunk
    each = -(-size // config.fetch_parallel)
    each = -(-each // (1 << 20)) * (1 << 20)
    return max(MIN_RANGE, min(config.fetch_chunk_max, each))


@dataclass
class FetchStats:
    files: int = 0
    bytes: int = 0
    requests: int = 0  # ranged GETs started (a retry inside one counts once)


class Slots:
    """``n`` requests in flight. A freed slot goes to the waiter whose priority is the lowest
    when the slot frees (asked then: a prefetched file a reader opens meanwhile moves up),
    then the longest waiting."""

    def __init__(self, n: int) -> None:
        self.free = n
        self._waiters: list[tuple[Callable[[], int], int, trio.Event]] = []
        self._seq = itertools.count()

    @asynccontextmanager
    async def slot(self, priority: Callable[[], int]) -> AsyncIterator[None]:
        await self._acquire(priority)
        try:
            yield
        finally:
            self._release()

    async def _acquire(self, priority: Callable[[], int]) -> None:
        if self.free and not self._waiters:
            await trio.lowlevel.checkpoint_if_cancelled()
            self.free -= 1
            await trio.lowlevel.cancel_shielded_checkpoint()
            return
        waiter = (priority, next(self._seq), trio.Event())
        self._waiters.append(waiter)
        try:
            await waiter[2].wait()
        except BaseException:
            if waiter[2].is_set():
                self._release()  # handed a slot while being cancelled: pass it on
            else:
                self._waiters.remove(waiter)
            raise

    def _release(self) -> None:
        if not self._waiters:
            self.free += 1
            return
        best = min(self._waiters, key=lambda w: (w[0](), w[1]))
        self._waiters.remove(best)
        best[2].set()


class _Fetch:
    def __init__(self, ino: Inode, key: str, etag: str | None, chunk: int, known: bool) -> None:
        self.ino, self.key, self.etag = ino, key, etag
        self.fd = -1  # the cache file, once made
        self.size = ino.size
        self.checksum = ino.checksum
        self.part_size = part_size_of(ino.checksum)  # of a multipart upload: hash CRC32s
        self.ask_checksum = False  # its metadata names a part size, the store's CRC32 unknown
        self.hasher: Hasher | None = None  # made when hashing starts (the form known by then)
        # Set once the object's metadata (its checksum, the entry's attributes) is known:
        # from the first GET's response for an entry not yet described (no HEAD), or when
        # the fetch ends.
        self.described = trio.Event()
        if known:
            self.described.set()
        self.made = trio.Event()  # set once the cache file exists (or could not be made)
        self.chunk = chunk
        self.count = max(1, -(-self.size // chunk))
        self.started = [False] * self.count
        self.filled = [0] * self.count  # bytes in the file from each range's start
        self.changed = trio.Event()  # set (and replaced) whenever bytes arrive or it ends
        self.wanted: list[int] = []  # ranges a reader waits for, not yet started
        self.cursor = 0  # read-ahead continues from here
        self.waiting = 0  # reads waiting for bytes now
        self.opened = False  # opened by a reader (not only prefetched)
        self.hashed = 0  # bytes hashed, from the start
        self.error: int | None = None
        self.verified = False
        self.landing = 0  # charged to the cache space, not yet written
        self.failed_at = 0.0
        self.finished = trio.Event()

    def span(self, i: int) -> tuple[int, int]:
        return i * self.chunk, min(self.size, (i + 1) * self.chunk)

    def priority(self) -> int:
        return WAITED if self.waiting else OPEN if self.opened else PREFETCH

    def wake(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

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

    def has(self, start: int, end: int) -> bool:
        """Whether bytes [start, end) are all in the file."""
        for i in range(start // self.chunk, (end - 1) // self.chunk + 1):
            lo, hi = self.span(i)
            if lo + self.filled[i] < min(end, hi):
                return False
        return True

    def contiguous(self) -> int:
        """How many bytes from the start of the file are in it."""
        i = self.hashed // self.chunk
        while i < self.count:
            lo, hi = self.span(i)
            if lo + self.filled[i] < hi:
                return lo + self.filled[i]
            i += 1
        return self.size

    def fail(self, code: int) -> None:
        if self.error is None:
            self.error = code
            self.failed_at = time.monotonic()
        self.wake()
        self.described.set()
        self.finished.set()


class Fetcher(OnParts):
    """``store`` retries temporary errors itself (:class:`ckptgw.store.retry.RetryingStore`)."""

    def __init__(
        self,
        parts: Parts,
        entries: Entries,
        store: Store,
        config: FetchConfig,
    ) -> None:
        super().__init__(parts)
        self.entries = entries
        self.store = store
        self.config = config
        self.stats = FetchStats()
        self._active: dict[int, _Fetch] = {}
        self.slots = Slots(config.fetch_parallel)
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
            f = await self._start(ino)  # read-ahead starts now, before the first read
            if f is not None:
                f.opened = True

    async def ensure(self, ino: Inode, off: int, size: int) -> None:
        f = await self._start(ino)
        if f is None:
            return
        end = min(off + size, f.size)
        if off < end and f.error is None:
            f.want(off // f.chunk, (end - 1) // f.chunk)
        f.waiting += 1
        try:
            # A read returns once its bytes are in, except the read that finds the whole
            # file there: that one waits for the checksum.
            while f.error is None and not f.verified and off < end:
                if f.has(off, end) and f.contiguous() < f.size:
                    break
                await f.changed.wait()
        finally:
            f.waiting -= 1
        if f.error is not None:
            raise fs_error(f.error)

    async def described(self, ino: Inode, *, start: bool) -> bool:
        """Wait for a fetch of ``ino`` (started now if ``start``: its content is wanted
        anyway) to learn the object's metadata from its first response, as urgently as a
        reader waiting for bytes. False if there is no such fetch, or it cannot start at once
        (no room in the cache now: a lookup must not wait for the drain): the caller HEADs."""
        f = self._active.get(ino.id)
        if f is None or f.error is not None:
            if not start or ino.state is not State.REMOTE or not self.space.fits_now(ino.size):
                return False
            try:
                f = await self._start(ino)
            except OSError:
                return False
            if f is None:
                return False
        f.waiting += 1
        try:
            await f.described.wait()
        finally:
            f.waiting -= 1
        return f.error is None

    async def ensure_whole(self, ino: Inode) -> None:
        """The whole file in the cache (or the OSError a read would get). A fetch started
        here and not opened by a reader runs at the lowest priority (a prefetch)."""
        f = await self._start(ino)
        if f is not None:
            await f.finished.wait()
            if f.error is not None:
                raise fs_error(f.error)

    # -- one fetch -------------------------------------------------------------------------------

    async def _start(self, ino: Inode) -> _Fetch | None:
        f = self._active.get(ino.id)
        if f is not None:
            await f.made.wait()  # an open goes on to use the cache file
            if f.fd < 0:
                assert f.error is not None
                raise fs_error(f.error)
            if f.error is None or time.monotonic() - f.failed_at < self.config.failed_for:
                return f
            if self._active.get(ino.id) is f:
                del self._active[ino.id]  # failed a while ago: try again
            return await self._start(ino)
        if ino.state is not State.REMOTE:
            return None
        if ino.stored_key is None:
            raise fs_error(errno.EIO)
        f = self._active[ino.id] = _Fetch(
            ino,
            ino.stored_key,
            ino.stored_etag,
            range_size(ino.size, self.config),
            self.entries.known(ino),
        )
        ino.pins += 1
        try:  # others find the fetch in _active from here on, and wait for its events
            f.landing = await self.space.grow(ino, ino.size, patient=True)
            f.fd = await trio.to_thread.run_sync(self.cache.create_sized, ino.id, ino.size)
        except BaseException as e:
            self.space.landed(f.landing)
            f.landing = 0
            f.fail(e.errno if isinstance(e, OSError) and e.errno else errno.EIO)
            f.made.set()
            if self._active.get(ino.id) is f:
                del self._active[ino.id]
            ino.pins -= 1
            self.table.release_if_unused(ino)
            raise
        f.made.set()
        assert self._nursery is not None
        self._nursery.start_soon(self._fetch, f)
        return f

    async def _fetch(self, f: _Fetch) -> None:
        started = time.monotonic()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._hash, f)
                for _ in range(min(self.config.fetch_parallel, f.count)):
                    nursery.start_soon(self._worker, f)
            if f.error is None and (not f.described.is_set() or f.ask_checksum):
                await self._head(f)  # the store's GETs said nothing of the object, or not all
            if f.error is None:
                await self._verify(f)
        except Exception:
            log.exception("fetching %s failed unexpectedly", f.key)
            f.fail(errno.EIO)
        finally:  # also on cancellation (unmount): the partial file is removed at next mount
            self.space.landed(f.landing)
            f.landing = 0
            os.close(f.fd)
            f.described.set()
            f.ino.pins -= 1
            if f.verified:
                self._active.pop(f.ino.id, None)
                self.stats.files += 1
                log.info(
                    "fetched %s (%d bytes, %d ranges) in %.2f s",
                    f.key,
                    f.size,
                    f.count,
                    time.monotonic() - started,
                )
            elif f.error is not None:
                self._drop(f)
            else:  # cancelled: nobody may take the sparse file for content
                f.fail(errno.EIO)
                self._active.pop(f.ino.id, None)
            f.wake()
            f.finished.set()
            self.table.release_if_unused(f.ino)

    async def _worker(self, f: _Fetch) -> None:
        while f.error is None:
            async with self.slots.slot(f.priority):
                i = f.next_chunk()
                if i is None or f.error is not None:
                    return
                await self._get(f, i)

    def _arrived(self, f: _Fetch, i: int, n: int) -> None:
        """The first ``n`` bytes of range ``i`` are in the cache file."""
        grew = n - f.filled[i]
        if grew <= 0:
            return
        f.filled[i] = n
        landed = min(f.landing, grew)
        f.landing -= landed
        self.space.landed(landed)
        self.stats.bytes += grew
        f.wake()

    async def _get(self, f: _Fetch, i: int) -> None:
        """Range ``i`` into the cache file; a failure fails the fetch."""
        start, end = f.span(i)
        if start == end:
            return
        self.stats.requests += 1
        try:
            await self.store.get_into(
                f.key,
                start,
                end,
                f.fd,
                etag=f.etag,
                progress=lambda n: self._arrived(f, i, n),
                described=None if f.described.is_set() else lambda info: self._told(f, info),
            )
        except Stale as e:
            log.warning("%s; reads of it fail with ESTALE until it is opened again", e)
            f.fail(errno.ESTALE)
        except NotFound:
            log.warning("%s vanished from the store while being read", f.key)
            f.fail(errno.ENOENT)
        except StoreError as e:
            log.warning("cannot read %s: %s", f.key, e)
            f.fail(errno.EIO)

    def _told(self, f: _Fetch, info: ObjectInfo) -> None:
        """A GET's response described the object (the version pinned by the fetch's ETag):
        its checksum verifies the content, and the entry takes its attributes unless it
        changed meanwhile."""
        if f.described.is_set() or f.error is not None:
            return
        if f.etag is not None and info.etag != f.etag:
            f.fail(errno.ESTALE)  # a store that ignored If-Match
            return
        self._checksum_of(f, info)
        self.entries.read_by_get(f.ino, info)
        f.described.set()

    def _checksum_of(self, f: _Fetch, info: ObjectInfo) -> None:
        if f.checksum is not None:
            return
        meta = read_meta(info)
        f.checksum = meta.checksum
        if meta.checksum is None and meta.part_size is not None:
            f.part_size = meta.part_size  # known before any byte: the GET's headers say it
            f.ask_checksum = info.crc32 is None

    async def _head(self, f: _Fetch) -> None:
        """The object's metadata for a fetch whose GETs did not bring it."""
        try:
            info = await self.store.head(f.key)
        except StoreError as e:
            log.warning("cannot read the metadata of %s: %s", f.key, e)
            f.fail(errno.EIO)
            return
        if info is None:
            f.fail(errno.ENOENT)
        elif not f.described.is_set():
            self._told(f, info)
        elif f.etag is not None and info.etag != f.etag:
            f.fail(errno.ESTALE)  # rewritten since the fetch's GETs
        else:
            f.ask_checksum = False
            self._checksum_of(f, info)

    async def _hash(self, f: _Fetch) -> None:
        """Hash the content as it becomes contiguous from the start, reading it back from the
        cache file (the page cache: it was just written)."""
        while f.error is None and f.hashed < f.size:
            upto = f.contiguous()
            if upto == f.hashed:
                await f.changed.wait()
                continue
            start = f.hashed
            # Made at the first bytes: the first response described the object before them.
            hasher = f.hasher = f.hasher or Hasher(f.part_size)

            if upto - start <= INLINE_HASH:
                _feed(hasher, f.fd, start, upto)  # a thread's round trip costs more than this
            else:
                await trio.to_thread.run_sync(_feed, hasher, f.fd, start, upto)
            f.hashed = upto

    async def _verify(self, f: _Fetch) -> None:
        hasher = f.hasher or Hasher(f.part_size)  # (none: an empty file)
        ino = f.ino
        if f.checksum is None:
            got = hasher.digest()
        else:
            ok = hasher.matches(f.checksum)
            if ok is None:  # hashed in another form before the checksum was known
                ok = await trio.to_thread.run_sync(_rehash, f.fd, f.size, f.checksum)
            if not ok:
                log.error(
                    "checksum mismatch in %s: the store says %s, the content is %s; "
                    "reads of it fail with EIO",
                    f.key,
                    f.checksum,
                    hasher.digest(),
                )
                f.fail(errno.EIO)
                return
            got = f.checksum
        if ino.state is State.REMOTE and ino.stored_etag == f.etag:
            self.states.fetched(ino, got)
        f.verified = True
        f.wake()

    def _drop(self, f: _Fetch) -> None:
        """A failed fetch keeps no content; the file stays remote. The cache file is emptied,
        not removed: open handles hold it, and the next fetch refills the same file."""
        if f.ino.state is State.REMOTE:
            self.cache.create(f.ino.id)
            self.space.shrink(f.ino, 0)


def _feed(hasher: Hasher, fd: int, start: int, upto: int) -> None:
    """Hash bytes [start, upto) of the cache file."""
    buf = bytearray(min(HASH_PIECE, upto - start))
    view = memoryview(buf)
    pos = start
    while pos < upto:
        n = os.preadv(fd, [view[: min(len(buf), upto - pos)]], pos)
        if n <= 0:
            raise OSError(errno.EIO, "short read of a cache file being fetched")
        hasher.update(view[:n])
        pos += n


def _rehash(fd: int, size: int, expected: str) -> bool:
    """Whether the cache file's content has the checksum ``expected``, read whole again."""
    hasher = Hasher(part_size_of(expected))
    _feed(hasher, fd, 0, size)
    return bool(hasher.matches(expected))
