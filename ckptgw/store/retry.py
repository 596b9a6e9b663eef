"""The one place where store calls are retried.

Temporary errors (503 SlowDown, 500, throttling, connection resets, timeouts) are retried with
exponential backoff and full jitter, never sooner than a ``Retry-After`` the server sent, up to
``attempts`` tries; then the last error is raised. Permanent errors (403, a missing bucket, a
bad request, :class:`~ckptgw.store.interface.NotFound`,
:class:`~ckptgw.store.interface.Stale`) are raised at once: retrying cannot fix them, and the
caller keeps the data dirty and tries again later (e.g. after the credentials were refreshed).

Every attempt first waits for its turn in the gateway's pace for its kind of request (reads or
writes, :mod:`ckptgw.store.pacing`), and tells the pace how it was answered: a refusal as too
many (SlowDown, throttling) slows this gateway down, other answers let it speed up again.

:class:`RetryingStore` is how the rest of the drain talks to a store: it wraps one and sends
every call through :func:`retrying`, so no call site can forget. It is also where calls are
composed: a copy above the store's ``copy_limit`` is a multipart upload of server-side part
copies, each step retried on its own.
"""

from __future__ import annotations

import inspect
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import trio

from ckptgw.store.interface import (
    MAX_PART,
    Described,
    NotFound,
    ObjectInfo,
    Progress,
    Store,
    StoreError,
    Upload,
    check_copy,
)
from ckptgw.store.pacing import READ, THROTTLED, WRITE, Pace, Pacing

log = logging.getLogger(__name__)
T = TypeVar("T")
Method = TypeVar("Method", bound=Callable[..., Coroutine[Any, Any, Any]])
_JITTER = random.Random()
ABORT_TIMEOUT = 30.0  # seconds an abort of a failed multipart copy may take, cancelled or not


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 8
    refusals: int = 32  # refusals as too many, retried in the pace's turns (ckptgw.store.pacing)
    refusal_seconds: float = 30.0  # ... within this long from the call's first attempt
    base: float = 0.1  # seconds before the first retry (before jitter)
    cap: float = 20.0  # the longest single wait


@dataclass
class RetryStats:
    """What went wrong with store calls: shown by ``ckptgw status`` and the metrics."""

    retries: int = 0
    last_error: str = ""
    last_error_at: float = 0.0  # seconds since the epoch
    errors: dict[str, int] = field(default_factory=dict)  # by kind: the error code

    def failed(self, what: str, e: StoreError) -> None:
        """Count one failed store call (retried or not)."""
        kind = e.code or ("temporary" if e.temporary else "permanent")
        self.errors[kind] = self.errors.get(kind, 0) + 1
        said = str(e)
        self.last_error = f"{what}: {said}" if what and not _names(said, what) else said
        self.last_error_at = time.time()


def _names(message: str, what: str) -> bool:
    """Whether an error message already starts with the call's label ("PUT k" for "put k")."""
    return message.lower().startswith(what.lower())


async def _may_retry(
    what: str,
    e: StoreError,
    attempt: int,
    attempts: int,
    policy: RetryPolicy,
    stats: RetryStats | None,
    rng: random.Random,
    *,
    backoff: bool = True,
) -> bool:
    """Count a failed attempt (the ``attempt``-th of its kind, of ``attempts`` allowed);
    False if it must be raised, else wait out the backoff (without ``backoff``: only a
    ``Retry-After`` the server sent, the pace being the wait)."""
    if stats is not None:
        stats.failed(what, e)
    if not e.temporary or attempt >= attempts:
        return False
    delay = rng.uniform(0, min(policy.cap, policy.base * 2 ** (attempt - 1))) if backoff else 0
    if e.retry_after is not None:
        delay = max(delay, min(e.retry_after, policy.cap))
    if stats is not None:
        stats.retries += 1
    log.info("%s: %s; retry %d in %.2f s", what, e, attempt, delay)
    await trio.sleep(delay)
    return True


async def retrying(
    what: str,
    call: Callable[[], Awaitable[T]],
    policy: RetryPolicy = RetryPolicy(),
    stats: RetryStats | None = None,
    *,
    rng: random.Random = _JITTER,
    pace: Pace | None = None,
) -> T:
    """Run ``call`` until it succeeds, fails permanently or runs out of attempts; each
    attempt in its turn of ``pace``, if given. While that pace adapts, a refusal as too many
    is retried in its next turn, with no backoff of its own, up to ``policy.refusals`` times
    and ``policy.refusal_seconds`` from the first attempt (a reader waits for it); other
    failures up to ``policy.attempts``."""
    attempt = refusals = 0
    started = trio.current_time()
    while True:
        ticket = 0.0 if pace is None else await pace.turn()
        try:
            result = await call()
        except StoreError as e:
            paced = pace is not None and _answered(pace, ticket, e)
            if paced:
                refusals += 1
                late = trio.current_time() - started >= policy.refusal_seconds
                tries, allowed = refusals, refusals if late else policy.refusals
            else:
                attempt += 1
                tries, allowed = attempt, policy.attempts
            if not await _may_retry(what, e, tries, allowed, policy, stats, rng, backoff=not paced):
                raise
        else:
            if pace is not None:
                pace.accepted()
            return result


def _answered(pace: Pace, ticket: float, e: StoreError) -> bool:
    """Tell ``pace`` what a failed attempt says of the rate: a refusal as too many slows
    down (returns whether the pace adapts to it); a permanent error (a 404, a 412, a 403)
    was an answer like any other; a temporary one (a 500, a reset, a timeout) says nothing
    of the rate."""
    if e.code in THROTTLED:
        pace.refusal(ticket)
        return pace.config.adaptive_rate
    if not e.temporary:
        pace.accepted()
    return False


def _retried(method: Method, kind: str, what: str) -> Method:
    """``RetryingStore``'s version of the interface's ``method``: the same call on the inner
    store, one request per attempt, retried as a ``kind`` request (:data:`READ` or
    :data:`WRITE`: the pace it waits in) and labelled ``what`` in logs and errors, a format
    string of the call's arguments by name ("put {key}"). Typed as ``method`` itself, so the
    signature and its contract are written once, in :class:`Store`."""
    signature = inspect.signature(method)
    name = method.__name__

    async def forward(self: RetryingStore, *args: Any, **kwargs: Any) -> Any:
        call = signature.bind(self, *args, **kwargs)
        call.apply_defaults()  # every argument passed on, as the caller's call states it
        return await self._retry(
            what.format(**call.arguments),
            lambda: getattr(self.inner, name)(*call.args[1:], **call.kwargs),
            kind,
        )

    forward.__name__ = name
    forward.__qualname__ = f"RetryingStore.{name}"
    forward.__doc__ = method.__doc__
    return cast(Method, forward)


class RetryingStore(Store):
    """A store whose every call is retried under one policy, failures counted in one stats.

    It holds no state of its own beyond the policy: views with other policies
    (:meth:`with_policy`) share the inner store, the stats and the pacing. Listings restart after a
    temporary error and never yield an item twice. :meth:`copy` is the only place that
    copies part by part (objects above the inner store's ``copy_limit``), so its own
    ``copy_limit`` is None: its ``copy`` takes any size.

    ``part_size_key``: the metadata key under which an object names the part size its
    checksum was computed in (the filesystem's, :data:`ckptgw.fsops.objectmeta.PART_SIZE`); a
    copy made part by part names its own part size there, since the store's CRC32 of the copy
    is of its own parts. None: the metadata is copied as it is.
    """

    def __init__(
        self,
        inner: Store,
        policy: RetryPolicy,
        stats: RetryStats,
        pacing: Pacing | None = None,
        *,
        part_size_key: str | None = None,
    ) -> None:
        if isinstance(inner, RetryingStore):  # attempts would multiply
            raise TypeError("the store already retries: use with_policy() for another policy")
        self.inner = inner
        self.policy = policy
        self.stats = stats
        self.pacing = pacing if pacing is not None else Pacing()
        self.part_size_key = part_size_key
        self.url = inner.url

    def with_policy(self, policy: RetryPolicy) -> RetryingStore:
        """The same store, stats and pacing, retried under ``policy`` (e.g. fewer attempts
        for a listing a user waits for)."""
        return RetryingStore(
            self.inner, policy, self.stats, self.pacing, part_size_key=self.part_size_key
        )

    async def _retry(self, what: str, call: Callable[[], Awaitable[T]], kind: str = WRITE) -> T:
        pace = self.pacing.of(kind)
        return await retrying(what, call, self.policy, self.stats, pace=pace)

    def requests_view(self) -> dict[str, Any] | None:
        """The inner store's view, with this gateway's pace of reads and writes."""
        view = self.inner.requests_view()
        return None if view is None else {**view, "pacing": self.pacing.view()}

    def part_workers_view(self) -> dict[str, object] | None:
        return self.inner.part_workers_view()

    # The calls that are one inner call, retried: each with its kind of request and its label.
    check = _retried(Store.check, READ, "checking the store {self.url}")
    put = _retried(Store.put, WRITE, "put {key}")
    head = _retried(Store.head, READ, "HEAD {key}")
    delete = _retried(Store.delete, WRITE, "delete {key}")
    put_tags = _retried(Store.put_tags, WRITE, "tag {key}")
    get_lifecycle = _retried(Store.get_lifecycle, READ, "get lifecycle rules")
    put_lifecycle = _retried(Store.put_lifecycle, WRITE, "put lifecycle rules")
    list_dir = _retried(Store.list_dir, READ, "list {prefix}")
    copy_part = _retried(
        Store.copy_part, WRITE, "part {number} of {dst} (copy of {src} [{start}, {end}))"
    )
    create_multipart = _retried(Store.create_multipart, WRITE, "create upload of {key}")
    upload_part = _retried(Store.upload_part, WRITE, "part {number} of {key}")
    # Each attempt reads the part again: a retry holds no copy of it meanwhile.
    upload_part_from = _retried(Store.upload_part_from, WRITE, "part {number} of {key}")
    list_parts = _retried(Store.list_parts, READ, "list parts of {key}")
    complete_multipart = _retried(Store.complete_multipart, WRITE, "complete {key}")
    abort_multipart = _retried(Store.abort_multipart, WRITE, "abort upload of {key}")

    # The calls that do more than that: a label of their own, a resumed range, a copy in
    # parts, a listing restarted.

    async def get(
        self, key: str, start: int = 0, end: int | None = None, *, etag: str | None = None
    ) -> bytes:
        span = f" [{start}, {'end' if end is None else end})" if start or end is not None else ""
        return await self._retry(
            f"GET {key}{span}", lambda: self.inner.get(key, start, end, etag=etag), READ
        )

    async def get_into(
        self,
        key: str,
        start: int,
        end: int,
        fd: int,
        *,
        etag: str | None = None,
        progress: Progress | None = None,
        described: Described | None = None,
    ) -> None:
        """A retry resumes where the failed attempt's bytes end: what is in the file is not
        fetched again (the ETag pins the version, so the rest belongs to the same one).
        ``described`` is called at most once, by the first attempt that got a response."""
        told = False

        def tell(info: ObjectInfo) -> None:
            nonlocal told
            told = True
            assert described is not None  # passed on only when there is one
            described(info)

        done = 0

        def advanced(n: int) -> None:
            nonlocal done
            done = max(done, n)
            if progress is not None:
                progress(done)

        async def attempt() -> None:
            base = done
            if base and start + base >= end:
                return  # every byte arrived before the error
            await self.inner.get_into(
                key,
                start + base,
                end,
                fd,
                etag=etag,
                progress=lambda n: advanced(base + n),
                described=None if told or described is None else tell,
            )

        await self._retry(f"GET {key} [{start}, {end})", attempt, READ)

    async def delete_many(self, keys: list[str]) -> None:
        what = f"delete {len(keys)} objects" + (f" from {keys[0]}" if keys else "")
        await self._retry(what, lambda: self.inner.delete_many(keys))

    # -- copies ------------------------------------------------------------------------------------

    async def copy(self, src: str, dst: str, metadata: dict[str, str] | None = None) -> str:
        """Server-side copy of any size; returns the new object's ETag. Its metadata is
        ``src``'s, or exactly ``metadata`` if given (then ``dst`` may be ``src``: an in-place
        metadata update), as :meth:`ckptgw.store.interface.Store.copy` says.

        Up to the inner store's ``copy_limit`` (S3: 5 GiB) it is one retried ``copy``, given
        ``metadata``. Above it, a multipart upload to ``dst`` created with ``metadata`` (or
        the metadata the source's HEAD returned): each part is a ``copy_part`` of the source
        pinned to the ETag that HEAD returned (a source rewritten meanwhile raises Stale
        instead of mixing two versions), and create, every part and complete are retried one
        by one, so a temporary error costs one part, not the whole copy. The source is only
        read: with ``src == dst`` the object stays as it was until CompleteMultipartUpload
        replaces it whole. Any failure, cancellation included, aborts the upload under a
        shielded scope of at most ``ABORT_TIMEOUT``, which leaves the source as it was.
        """
        check_copy(src, dst, metadata)
        what = f"copy {src} -> {dst}"
        limit = self.inner.copy_limit
        if limit is None:
            return await self._retry(what, lambda: self.inner.copy(src, dst, metadata))
        info = await self.head(src)
        if info is None:
            raise NotFound(f"{what}: source not found")
        if info.size <= limit:
            return await self._retry(what, lambda: self.inner.copy(src, dst, metadata))
        new_metadata = info.metadata if metadata is None else metadata
        part = min(limit, MAX_PART)
        key = self.part_size_key
        if key is not None and key in new_metadata:  # the copy's CRC32 is of its own parts
            new_metadata = {**new_metadata, key: str(part)}
        return await self._copy_in_parts(info, dst, new_metadata, part)

    async def _copy_in_parts(
        self, src: ObjectInfo, dst: str, metadata: dict[str, str], part: int
    ) -> str:
        upload_id = await self.create_multipart(dst, metadata)
        try:
            etags = []
            for n, start in enumerate(range(0, src.size, part), 1):
                end = min(src.size, start + part)
                etags.append(
                    await self.copy_part(src.key, dst, upload_id, n, start, end, etag=src.etag)
                )
            return await self.complete_multipart(dst, upload_id, etags)
        except BaseException:
            with trio.CancelScope(shield=True), trio.move_on_after(ABORT_TIMEOUT):
                try:
                    await self.abort_multipart(dst, upload_id)
                except StoreError as e:  # the orphan sweep at the next start gets it
                    log.warning("could not abort the copy to %s: %s", dst, e)
            raise

    # -- listings ----------------------------------------------------------------------------------

    async def iter_objects(self, prefix: str) -> AsyncIterator[ObjectInfo]:
        """The inner listing; after a temporary error it starts again and skips every key up
        to the last one yielded, so keys stay in order and none comes twice."""
        last: str | None = None

        def fresh(o: ObjectInfo) -> bool:
            nonlocal last
            if last is not None and o.key <= last:
                return False
            last = o.key
            return True

        async for o in self._relisting(f"list {prefix}", self.inner.iter_objects, prefix, fresh):
            yield o

    async def iter_uploads(self, prefix: str) -> AsyncIterator[Upload]:
        """The inner listing; after a temporary error it starts again and skips the uploads
        already yielded."""
        seen: set[tuple[str, str]] = set()

        def fresh(u: Upload) -> bool:
            if (u.key, u.upload_id) in seen:
                return False
            seen.add((u.key, u.upload_id))
            return True

        what = f"list uploads under {prefix}"
        async for u in self._relisting(what, self.inner.iter_uploads, prefix, fresh):
            yield u

    async def _relisting(
        self,
        what: str,
        listing: Callable[[str], AsyncIterator[T]],
        prefix: str,
        fresh: Callable[[T], bool],
    ) -> AsyncIterator[T]:
        """Items of ``listing(prefix)`` that ``fresh`` lets through, the listing restarted
        after each temporary error, within the policy's attempts (restarts count, progress
        does not earn more)."""
        pace = self.pacing.reads
        for attempt in range(1, self.policy.attempts + 1):
            ticket = await pace.turn()
            items = listing(prefix)
            try:
                async for item in items:
                    if fresh(item):
                        yield item
                pace.accepted()
                return
            except StoreError as e:
                paced = _answered(pace, ticket, e)
                if not await _may_retry(
                    what,
                    e,
                    attempt,
                    self.policy.attempts,
                    self.policy,
                    self.stats,
                    _JITTER,
                    backoff=not paced,
                ):
                    raise
            finally:
                aclose = getattr(items, "aclose", None)
                if aclose is not None:  # a listing left early (or failed) ends here, not at GC
                    await aclose()
        raise AssertionError("a retry policy needs at least one attempt")
