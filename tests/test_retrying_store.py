"""RetryingStore: every call retried, listings restarted without repeats, copies above the
store's copy limit done part by part with each step retried and the abort shielded.

Deterministic: an in-memory store injects the faults, and trio's mock clock jumps over every
backoff wait. The part copy primitive is also run against the file store and, through S3's
UploadPartCopy, against moto."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import trio
import trio.testing

from ckptgw.store.interface import (
    NotFound,
    ObjectInfo,
    Stale,
    Store,
    StoreError,
)
from ckptgw.store.memory import MemoryStore
from ckptgw.store.open import open_store
from ckptgw.store.pacing import Pace, Pacing
from ckptgw.store.retry import ABORT_TIMEOUT, RetryingStore, RetryPolicy, RetryStats
from ckptgw.store.url import parse_store_url

POLICY = RetryPolicy(attempts=4, base=0.1, cap=1.0)


def temporary(message: str = "500 InternalError") -> StoreError:
    """A temporary error that says nothing of the rate (refusals as too many, which the pace
    answers: tests/test_pacing.py)."""
    return StoreError(message, temporary=True, code="InternalError")


def run(fn: Callable[[], Awaitable[None]]) -> None:
    trio.run(fn, clock=trio.testing.MockClock(autojump_threshold=0))


def wrapped(store: Store, policy: RetryPolicy = POLICY) -> RetryingStore:
    return RetryingStore(store, policy, RetryStats())


async def seeded() -> tuple[MemoryStore, str, str]:
    """A store with object "k" and an upload of "up" that has part 1; the calls so far are
    not counted."""
    s = MemoryStore()
    await s.put("k", b"hello world", {"m": "1"})
    uid = await s.create_multipart("up", {})
    part = await s.upload_part("up", uid, 1, b"part one")
    s.calls.clear()
    return s, uid, part


# Each method family through the wrapper: (method name, the call on the wrapper, upload id,
# ETag of the upload's part 1).
FAMILIES: dict[str, Callable[[RetryingStore, str, str], Awaitable[object]]] = {
    "check": lambda rs, uid, part: rs.check(),
    "put": lambda rs, uid, part: rs.put("new", b"x", {}),
    "get": lambda rs, uid, part: rs.get("k", 0, 5),
    "head": lambda rs, uid, part: rs.head("k"),
    "delete": lambda rs, uid, part: rs.delete("k"),
    "delete_many": lambda rs, uid, part: rs.delete_many(["k", "gone"]),
    "copy": lambda rs, uid, part: rs.copy("k", "k2"),
    "list_dir": lambda rs, uid, part: rs.list_dir(""),
    "put_tags": lambda rs, uid, part: rs.put_tags("k", {"a": "b"}),
    "get_lifecycle": lambda rs, uid, part: rs.get_lifecycle(),
    "put_lifecycle": lambda rs, uid, part: rs.put_lifecycle([]),
    "create_multipart": lambda rs, uid, part: rs.create_multipart("k3", {}),
    "upload_part": lambda rs, uid, part: rs.upload_part("up", uid, 2, b"two"),
    "copy_part": lambda rs, uid, part: rs.copy_part("k", "up", uid, 2, 0, 5),
    "list_parts": lambda rs, uid, part: rs.list_parts("up", uid),
    "complete_multipart": lambda rs, uid, part: rs.complete_multipart("up", uid, [part]),
    "abort_multipart": lambda rs, uid, part: rs.abort_multipart("up", uid),
}


@pytest.mark.parametrize("method", sorted(FAMILIES))
def test_every_call_is_retried_until_it_succeeds(method: str) -> None:
    async def go() -> None:
        s, uid, part = await seeded()
        rs = wrapped(s)
        s.fail(method, temporary("first"), temporary("second"))
        await FAMILIES[method](rs, uid, part)
        assert s.calls[method] == 3
        assert rs.stats.retries == 2 and rs.stats.errors == {"InternalError": 2}
        assert trio.current_time() > 0  # the backoff waited (in mock time)

    run(go)


@pytest.mark.parametrize("method", sorted(FAMILIES))
def test_a_permanent_error_is_raised_after_one_call(method: str) -> None:
    async def go() -> None:
        s, uid, part = await seeded()
        rs = wrapped(s)
        denied = StoreError("403 AccessDenied", temporary=False, code="AccessDenied")
        s.fail(method, denied)
        with pytest.raises(StoreError) as e:
            await FAMILIES[method](rs, uid, part)
        assert e.value is denied and s.calls[method] == 1
        assert rs.stats.retries == 0 and rs.stats.errors == {"AccessDenied": 1}

    run(go)


def test_not_found_and_stale_are_not_retried() -> None:
    async def go() -> None:
        s, _, _ = await seeded()
        rs = wrapped(s)
        with pytest.raises(NotFound):
            await rs.get("missing")
        assert s.calls["get"] == 1
        with pytest.raises(Stale):
            await rs.get("k", etag="an old version")
        assert s.calls["get"] == 2
        with pytest.raises(NotFound):
            await rs.list_parts("up", "no-such-upload")
        assert s.calls["list_parts"] == 1
        assert rs.stats.retries == 0
        assert await rs.head("missing") is None  # HEAD of nothing is an answer, not an error

    run(go)


class CutStreams(MemoryStore):
    """``get_into`` that delivers the first ``cut`` bytes of a range, then fails (once per
    queued cut), as a connection reset mid-body does; the ranges asked for are recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.cuts_left: list[int] = []
        self.asked: list[tuple[int, int]] = []
        self.told_to_describe: list[bool] = []

    async def get_into(
        self,
        key: str,
        start: int,
        end: int,
        fd: int,
        *,
        etag: str | None = None,
        progress: Callable[[int], None] | None = None,
        described: Callable[[ObjectInfo], None] | None = None,
    ) -> None:
        self.asked.append((start, end))
        self.told_to_describe.append(described is not None)
        data = await self.get(key, start, end, etag=etag)
        if described is not None:  # the response's headers, before its body
            whole, metadata, version = self.objects[key]
            described(ObjectInfo(key, len(whole), version, dict(metadata)))
        cut = self.cuts_left.pop(0) if self.cuts_left else len(data)
        os.pwrite(fd, data[:cut], start)
        if progress is not None and cut:
            progress(cut)
        if cut < len(data):
            raise temporary("Transport: connection reset")


def test_get_into_resumes_where_the_bytes_end(tmp_path: Path) -> None:
    data = os.urandom(1000)
    reports: list[int] = []

    async def go() -> None:
        s = CutStreams()
        etag = await s.put("k", data, {"xxh3-128": "abc"})
        s.cuts_left = [300, 0, 200]  # reset after 300 bytes, at once, after 200 more
        rs = wrapped(s)
        told: list[ObjectInfo] = []
        fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            await rs.get_into(
                "k", 100, 900, fd, etag=etag, progress=reports.append, described=told.append
            )
            assert os.pread(fd, 1000, 0)[100:900] == data[100:900]
        finally:
            os.close(fd)
        # Each retry asks only for what is missing; progress is over the whole range.
        assert s.asked == [(100, 900), (400, 900), (400, 900), (600, 900)]
        assert reports == [300, 500, 800]
        assert rs.stats.retries == 3
        # The object is described once, by the first response; the retries are not asked to.
        assert told == [ObjectInfo("k", 1000, etag, {"xxh3-128": "abc"})]
        assert s.told_to_describe == [True, False, False, False]

    run(go)


def test_attempts_are_bounded_and_the_last_error_is_raised() -> None:
    async def go() -> None:
        s, _, _ = await seeded()
        rs = wrapped(s)
        errors = [temporary(f"500 number {n}") for n in range(1, 11)]
        s.fail("put", *errors)
        with pytest.raises(StoreError) as e:
            await rs.put("k", b"x", {})
        assert e.value is errors[POLICY.attempts - 1]
        assert s.calls["put"] == POLICY.attempts
        assert rs.stats.retries == POLICY.attempts - 1
        assert rs.stats.errors == {"InternalError": POLICY.attempts}
        assert rs.stats.last_error == "put k: 500 number 4"

    run(go)


def test_retry_after_is_honoured() -> None:
    async def go() -> None:
        s, _, _ = await seeded()
        rs = wrapped(s, RetryPolicy(attempts=3, base=0.01, cap=30))
        s.fail("head", StoreError("throttled", temporary=True, retry_after=7.0))
        await rs.head("k")
        assert trio.current_time() >= 7.0

    run(go)


def test_labels_name_the_call_and_the_key() -> None:
    async def go() -> None:
        s, uid, _ = await seeded()
        rs = wrapped(s)
        expected: dict[str, tuple[str, Callable[[], Awaitable[object]]]] = {
            "get": ("GET k [2, 5)", lambda: rs.get("k", 2, 5)),
            "copy_part": ("part 2 of up", lambda: rs.copy_part("k", "up", uid, 2, 0, 5)),
            "create_multipart": ("create upload of x", lambda: rs.create_multipart("x", {})),
            "list_parts": ("list parts of up", lambda: rs.list_parts("up", uid)),
            "delete": ("delete k", lambda: rs.delete("k")),
            "complete_multipart": ("complete up", lambda: rs.complete_multipart("up", uid, [])),
            "abort_multipart": ("abort upload of up", lambda: rs.abort_multipart("up", uid)),
        }
        for method, (label, call) in expected.items():
            s.fail(method, temporary("boom"))
            await call()
            assert rs.stats.last_error.startswith(label), (method, rs.stats.last_error)
            assert rs.stats.last_error.endswith(": boom")

    run(go)


# Every call that is one call of the inner store, retried: the label its errors and log lines
# start with, and the pace its attempts wait in (ckptgw.store.pacing: reads or writes).
ONE_CALL: dict[str, tuple[str, str, Callable[[RetryingStore, str, str], Awaitable[object]]]] = {
    "check": ("checking the store mem://test/", "reads", lambda rs, uid, part: rs.check()),
    "put": ("put new", "writes", lambda rs, uid, part: rs.put("new", b"x", {})),
    "head": ("HEAD k", "reads", lambda rs, uid, part: rs.head("k")),
    "delete": ("delete k", "writes", lambda rs, uid, part: rs.delete("k")),
    "put_tags": ("tag k", "writes", lambda rs, uid, part: rs.put_tags("k", {"a": "b"})),
    "get_lifecycle": ("get lifecycle rules", "reads", lambda rs, uid, part: rs.get_lifecycle()),
    "put_lifecycle": (
        "put lifecycle rules",
        "writes",
        lambda rs, uid, part: rs.put_lifecycle([]),
    ),
    "list_dir": ("list d/", "reads", lambda rs, uid, part: rs.list_dir("d/")),
    "copy_part": (
        "part 2 of up (copy of k [0, 5))",
        "writes",
        lambda rs, uid, part: rs.copy_part("k", "up", uid, 2, 0, 5),
    ),
    "create_multipart": (
        "create upload of k3",
        "writes",
        lambda rs, uid, part: rs.create_multipart("k3", {}),
    ),
    "upload_part": (
        "part 2 of up",
        "writes",
        lambda rs, uid, part: rs.upload_part("up", uid, 2, b"two", crc32=None),
    ),
    "list_parts": ("list parts of up", "reads", lambda rs, uid, part: rs.list_parts("up", uid)),
    "complete_multipart": (
        "complete up",
        "writes",
        lambda rs, uid, part: rs.complete_multipart("up", uid, [part]),
    ),
    "abort_multipart": (
        "abort upload of up",
        "writes",
        lambda rs, uid, part: rs.abort_multipart("up", uid),
    ),
}


class KindsAsked(Pacing):
    """Pacing that keeps the kind of every pace asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.kinds: list[str] = []

    def of(self, kind: str) -> Pace:
        self.kinds.append(kind)
        return super().of(kind)


@pytest.mark.parametrize("method", sorted(ONE_CALL))
def test_each_call_has_its_label_and_waits_in_its_pace(method: str) -> None:
    label, kind, call = ONE_CALL[method]

    async def go() -> None:
        s, uid, part = await seeded()
        pacing = KindsAsked()
        rs = RetryingStore(s, POLICY, RetryStats(), pacing)
        s.fail(method, temporary("boom"))
        await call(rs, uid, part)
        assert s.calls[method] == 2
        assert rs.stats.last_error == f"{label}: boom"
        assert pacing.kinds == [kind]

    run(go)


def test_with_policy_shares_the_store_and_the_stats() -> None:
    async def go() -> None:
        s, _, _ = await seeded()
        rs = wrapped(s)
        quick = rs.with_policy(RetryPolicy(attempts=2, base=0.01, cap=0.1))
        assert quick.inner is s and quick.stats is rs.stats and quick.url == s.url
        assert quick.policy.attempts == 2 and rs.policy is POLICY
        s.fail("list_dir", temporary(), temporary(), temporary())
        with pytest.raises(StoreError):
            await quick.list_dir("")
        assert s.calls["list_dir"] == 2 and rs.stats.retries == 1
        assert sum(rs.stats.errors.values()) == 2
        await rs.list_dir("")  # the third fault, then a success under the longer policy
        assert rs.stats.retries == 2

    run(go)


def test_a_retrying_store_is_not_wrapped_twice() -> None:
    rs = wrapped(MemoryStore())
    with pytest.raises(TypeError):
        RetryingStore(rs, POLICY, RetryStats())


# -- listings ----------------------------------------------------------------------------------


def test_object_listing_restarts_and_yields_each_key_once_in_order() -> None:
    async def go() -> None:
        s = MemoryStore()
        for k in ("a/1", "a/3", "a/5", "a/7", "b/1"):
            await s.put(k, k.encode(), {})
        rs = wrapped(s)
        s.cut("iter_objects", 2, temporary())
        s.cut("iter_objects", 3, temporary())
        keys = []
        async for o in rs.iter_objects("a/"):
            keys.append(o.key)
            if o.key == "a/3":  # changes between the attempts: before the last yielded key
                await s.put("a/2", b"", {})  # stays out (keys in order), after it comes in
                await s.put("a/6", b"", {})
        assert keys == ["a/1", "a/3", "a/5", "a/6", "a/7"]
        assert s.calls["iter_objects"] == 3 and rs.stats.retries == 2

    run(go)


def test_upload_listing_restarts_and_yields_each_upload_once() -> None:
    async def go() -> None:
        s = MemoryStore()
        for k in ("u/1", "u/2", "u/3"):
            await s.create_multipart(k, {})
        rs = wrapped(s)
        s.cut("iter_uploads", 1, temporary())
        s.cut("iter_uploads", 2, temporary())
        found = [(u.key, u.upload_id) async for u in rs.iter_uploads("u/")]
        assert sorted(found) == sorted((k, i) for i, (k, _, _) in s.uploads.items())
        assert len(found) == 3 and s.calls["iter_uploads"] == 3 and rs.stats.retries == 2

    run(go)


def test_a_listing_gives_up_after_the_attempts_and_on_a_permanent_error() -> None:
    async def go() -> None:
        s = MemoryStore()
        for k in ("a", "b", "c"):
            await s.put(k, b"", {})
        rs = wrapped(s)
        for _ in range(POLICY.attempts):
            s.cut("iter_objects", 1, temporary())
        keys = []
        with pytest.raises(StoreError):
            async for o in rs.iter_objects(""):
                keys.append(o.key)
        assert keys == ["a"] and s.calls["iter_objects"] == POLICY.attempts

        s.calls.clear()
        denied = StoreError("403", temporary=False, code="AccessDenied")
        s.cut("iter_uploads", 0, denied)
        await s.create_multipart("x", {})
        with pytest.raises(StoreError) as e:
            async for _ in rs.iter_uploads(""):
                pass
        assert e.value is denied and s.calls["iter_uploads"] == 1

    run(go)


# -- copies ------------------------------------------------------------------------------------


def test_small_copies_are_one_retried_call() -> None:
    async def go() -> None:
        s = MemoryStore(copy_limit=100)
        await s.put("src", b"0123456789", {"m": "1"})
        rs = wrapped(s)
        assert rs.copy_limit is None  # the wrapper copies any size
        s.fail("copy", temporary())
        await rs.copy("src", "dst")
        assert s.objects["dst"][:2] == (b"0123456789", {"m": "1"})
        assert s.calls["copy"] == 2 and s.calls["copy_part"] == 0
        with pytest.raises(NotFound):
            await rs.copy("missing", "dst2")
        assert s.calls["copy"] == 2  # the HEAD said so: no copy sent

    run(go)


def test_a_large_copy_goes_in_parts_each_retried_alone() -> None:
    async def go() -> None:
        s = MemoryStore(copy_limit=4)
        await s.put("src", b"0123456789", {"m": "1"})
        rs = wrapped(s)
        s.fail("copy_part", temporary())
        s.fail("complete_multipart", temporary())
        etag = await rs.copy("src", "dst")
        data, metadata, stored = s.objects["dst"]
        assert (data, metadata, stored) == (b"0123456789", {"m": "1"}, etag)
        assert s.calls["copy"] == 0 and s.calls["create_multipart"] == 1
        assert s.calls["copy_part"] == 4  # parts [0, 4) [4, 8) [8, 10), the first one twice
        assert s.calls["complete_multipart"] == 2
        assert s.uploads == {} and s.calls["abort_multipart"] == 0
        assert rs.stats.retries == 2

    run(go)


def test_a_small_copy_passes_new_metadata_through() -> None:
    """Up to the copy limit (and with no limit) the metadata goes to the one copy call,
    which may then be a copy onto the source itself; without metadata that is refused."""

    async def go() -> None:
        for limit in (100, None):
            s = MemoryStore(copy_limit=limit)
            await s.put("src", b"0123456789", {"m": "1"})
            rs = wrapped(s)
            s.fail("copy", temporary())
            etag = await rs.copy("src", "dst", {"m": "2", "mode": "384"})
            assert s.objects["dst"] == (b"0123456789", {"m": "2", "mode": "384"}, etag)
            assert s.objects["src"][1] == {"m": "1"}
            etag = await rs.copy("src", "src", {"m": "3"})
            assert s.objects["src"] == (b"0123456789", {"m": "3"}, etag)
            assert s.calls["copy"] == 3 and s.calls["copy_part"] == 0
            with pytest.raises(StoreError) as e:
                await rs.copy("src", "src")
            assert not e.value.temporary and s.calls["copy"] == 3  # refused before any call
            assert s.objects["src"][2] == etag

    run(go)


def test_a_large_copy_in_parts_takes_the_new_metadata() -> None:
    async def go() -> None:
        s = MemoryStore(copy_limit=4)
        await s.put("src", b"0123456789", {"m": "1"})
        rs = wrapped(s)
        etag = await rs.copy("src", "dst", {"m": "2"})
        assert s.objects["dst"] == (b"0123456789", {"m": "2"}, etag)
        assert s.objects["src"][1] == {"m": "1"}
        assert s.calls["copy"] == 0 and s.calls["create_multipart"] == 1
        assert s.calls["copy_part"] == 3 and s.uploads == {}

    run(go)


def test_a_copy_in_parts_names_its_own_part_size_under_the_key_it_was_given() -> None:
    """The store's CRC32 of a copy made part by part is of the copy's parts: the metadata key
    that names an object's part size (handed in: the filesystem's) then names the copy's. A
    copy in one request, or a store given no key, keeps the metadata as it is."""

    async def go() -> None:
        s = MemoryStore(copy_limit=4)
        await s.put("src", b"0123456789", {"part-size": "5242880", "m": "1"})
        rs = RetryingStore(s, POLICY, RetryStats(), part_size_key="part-size")
        await rs.copy("src", "dst")
        assert s.objects["dst"][1] == {"part-size": "4", "m": "1"}
        await rs.with_policy(RetryPolicy(attempts=1)).copy("src", "dst2", {"part-size": "7"})
        assert s.objects["dst2"][1] == {"part-size": "4"}
        await wrapped(s).copy("src", "dst3")
        assert s.objects["dst3"][1] == {"part-size": "5242880", "m": "1"}
        s.copy_limit = None
        await rs.copy("src", "dst4")
        assert s.objects["dst4"][1] == {"part-size": "5242880", "m": "1"}

    run(go)


def test_a_large_copy_onto_itself_leaves_the_source_alone_until_complete() -> None:
    """An in-place metadata update above the copy limit: the parts are read from the object
    itself, which stays as it was (same data, metadata and ETag) until the upload completes,
    also when a step is retried; a failure aborts the upload and leaves it untouched."""

    async def go() -> None:
        s = MemoryStore(copy_limit=4)
        before = (b"0123456789", {"m": "1"}, await s.put("k", b"0123456789", {"m": "1"}))
        rs = wrapped(s)
        seen: list[tuple[bytes, dict[str, str], str]] = []

        async def look() -> None:
            seen.append(s.objects["k"])

        s.fail("copy_part", temporary(), look)
        s.fail("complete_multipart", temporary(), look)
        etag = await rs.copy("k", "k", {"m": "2", "mode": "384"})
        assert seen == [before, before]  # at a part and at the complete that lands
        assert s.objects["k"] == (b"0123456789", {"m": "2", "mode": "384"}, etag)
        assert etag != before[2] and s.uploads == {} and s.calls["copy"] == 0
        assert s.calls["create_multipart"] == 1 and s.calls["copy_part"] == 4
        assert s.calls["complete_multipart"] == 2

        now = s.objects["k"]
        s.fail("copy_part", trio.lowlevel.checkpoint, StoreError("bad", temporary=False))
        with pytest.raises(StoreError, match="bad"):
            await rs.copy("k", "k", {"m": "3"})
        assert s.objects["k"] == now and s.uploads == {}
        assert s.calls["abort_multipart"] == 1

    run(go)


def test_a_part_that_fails_for_good_aborts_the_copy() -> None:
    async def go() -> None:
        s = MemoryStore(copy_limit=4)
        await s.put("src", b"0123456789", {})
        rs = wrapped(s)
        s.fail("copy_part", temporary(), StoreError("bad", temporary=False))
        s.fail("abort_multipart", temporary())  # the abort is retried too
        with pytest.raises(StoreError, match="bad"):
            await rs.copy("src", "dst")
        assert s.calls["copy_part"] == 2 and s.calls["abort_multipart"] == 2
        assert s.uploads == {} and "dst" not in s.objects

    run(go)


def test_a_source_rewritten_during_the_copy_is_stale_not_mixed() -> None:
    async def go() -> None:
        s = MemoryStore(copy_limit=4)
        await s.put("src", b"0123456789", {})
        rs = wrapped(s)

        async def rewrite() -> None:
            await s.put("src", b"abcdefghij", {})

        # Part 1 is retried and lands, part 2 finds the source rewritten.
        s.fail("copy_part", temporary(), trio.lowlevel.checkpoint, rewrite)
        with pytest.raises(Stale):
            await rs.copy("src", "dst")
        assert s.calls["copy_part"] == 3 and s.uploads == {} and "dst" not in s.objects

    run(go)


def test_a_cancelled_copy_still_aborts_its_upload() -> None:
    async def go() -> None:
        s = MemoryStore(copy_limit=4)
        await s.put("src", b"0123456789", {})
        rs = wrapped(s)
        with trio.CancelScope() as scope:

            async def cancel_and_hang() -> None:
                scope.cancel()
                await trio.sleep_forever()

            async def slow_abort() -> None:
                await trio.sleep(1)  # a checkpoint: cancelled unless shielded

            s.fail("copy_part", StoreError("x", temporary=True), cancel_and_hang)
            s.fail("abort_multipart", slow_abort)
            await rs.copy("src", "dst")
        assert scope.cancelled_caught
        assert s.calls["abort_multipart"] == 1 and s.uploads == {}

    run(go)


def test_an_abort_that_hangs_gives_up_after_its_timeout() -> None:
    async def go() -> None:
        s = MemoryStore(copy_limit=4)
        await s.put("src", b"0123456789", {})
        rs = wrapped(s)
        s.fail("copy_part", StoreError("bad", temporary=False))
        s.fail("abort_multipart", trio.sleep_forever)
        t0 = trio.current_time()
        with pytest.raises(StoreError, match="bad"):
            await rs.copy("src", "dst")
        assert trio.current_time() - t0 == pytest.approx(ABORT_TIMEOUT)
        assert len(s.uploads) == 1  # left for the orphan sweep

    run(go)


def test_file_store_copies_in_parts(tmp_path: Path) -> None:
    async def go() -> None:
        async with open_store(parse_store_url(f"file://{tmp_path}")) as fs:
            data = os.urandom(10_000)
            etag = await fs.put("src", data, {"m": "1"})
            fs.copy_limit = 4096  # as if it were S3 with a tiny limit: three parts
            rs = wrapped(fs)
            await rs.copy("src", "dst")
            assert await fs.get("dst") == data
            info = await fs.head("dst")
            assert info is not None and info.metadata == {"m": "1"}
            assert [u async for u in fs.iter_uploads("")] == []
            new = await rs.copy("src", "dst3", {"m": "3"})
            info = await fs.head("dst3")
            assert info is not None and info.metadata == {"m": "3"} and info.etag == new
            assert await fs.get("dst3") == data
            # In place, part by part: the parts are read from the file the upload replaces.
            new = await rs.copy("src", "src", {"m": "2", "mode": "384"})
            info = await fs.head("src")
            assert info is not None and info.metadata == {"m": "2", "mode": "384"}
            assert info.etag == new != etag  # a new file
            assert await fs.get("src") == data
            assert [u async for u in fs.iter_uploads("")] == []
            etag = new
            uid = await fs.create_multipart("dst2", {})
            with pytest.raises(Stale):
                await fs.copy_part("src", "dst2", uid, 1, 0, 10, etag=etag + "x")
            assert await fs.copy_part("src", "dst2", uid, 1, 0, 10, etag=etag)
            with pytest.raises(NotFound):
                await fs.copy_part("missing", "dst2", uid, 2, 0, 10)

    trio.run(go)


def test_s3_copies_in_parts_with_upload_part_copy(s3_endpoint: str, bucket: str) -> None:
    """UploadPartCopy against moto, with the copy limit lowered to S3's minimum part size
    (a real 5 GiB object is too big for a test)."""

    async def go() -> None:
        url = parse_store_url(f"s3://{bucket}/pre/")
        async with open_store(url, s3_endpoint) as s3:
            data = os.urandom((5 << 20) + 1000)
            etag = await s3.put("pre/src", data, {"xxh3-128": "abc"})
            with pytest.raises(NotFound):
                await s3.copy("pre/missing", "pre/x")
            s3.copy_limit = 5 << 20
            rs = wrapped(s3)
            new = await rs.copy("pre/src", "pre/dst")
            assert await s3.get("pre/dst") == data
            info = await s3.head("pre/dst")
            assert info is not None and info.etag == new and info.metadata == {"xxh3-128": "abc"}
            assert [u async for u in s3.iter_uploads("pre/")] == []
            # In place with new metadata, part by part (UploadPartCopy from the key itself).
            new = await rs.copy("pre/src", "pre/src", {"xxh3-128": "abc", "mode": "384"})
            assert await s3.get("pre/src") == data
            info = await s3.head("pre/src")
            assert info is not None and info.etag == new
            assert info.metadata == {"xxh3-128": "abc", "mode": "384"}
            assert [u async for u in s3.iter_uploads("pre/")] == []
            etag = new
            uid = await s3.create_multipart("pre/dst2", {})
            try:
                with pytest.raises(NotFound):
                    await s3.copy_part("pre/missing", "pre/dst2", uid, 1, 0, 10)
                assert await s3.copy_part("pre/src", "pre/dst2", uid, 1, 0, 10, etag=etag)
                # (moto ignores CopySourceIfMatch, so a stale source is not tested here)
            finally:
                await s3.abort_multipart("pre/dst2", uid)

    trio.run(go)
