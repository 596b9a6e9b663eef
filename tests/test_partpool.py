"""Part worker processes (ckptgw.store.partpool, ckptgw.store.partworker) against a real S3
HTTP API on loopback (moto), through the fault-injecting proxy where a part must be caught in
flight: parts read and sent by other processes make the right object, a worker killed with a
part in flight loses nothing (the part is sent again by its replacement), a cancelled part
stops, a short file is a permanent error, and workers that cannot start leave the parts to the
daemon."""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import zlib
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import boto3
import pytest
import trio

from ckptgw.store.crc import composite, crc32_b64
from ckptgw.store.faultproxy import Fault, FaultProxy
from ckptgw.store.interface import READ_ERROR, SHORT_FILE, StoreError, read_part
from ckptgw.store.open import open_store
from ckptgw.store.partpool import DEATHS, WORKER_DIED, PartPool
from ckptgw.store.retry import RetryingStore, RetryPolicy, RetryStats
from ckptgw.store.s3 import S3Store
from ckptgw.store.url import parse_store_url

PART = 5 << 20


@pytest.fixture
def proxy(s3_endpoint: str) -> Iterator[FaultProxy]:
    p = FaultProxy(int(s3_endpoint.rsplit(":", 1)[1]))
    yield p
    p.close()


@contextlib.asynccontextmanager
async def pooled(bucket: str, endpoint: str, workers: int) -> AsyncIterator[S3Store]:
    async with open_store(
        parse_store_url(f"s3://{bucket}/w/"), endpoint, part_workers=workers
    ) as store:
        assert isinstance(store, S3Store)
        yield store


def pool_of(store: S3Store) -> PartPool:
    assert isinstance(store.part_sender, PartPool)
    return store.part_sender


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


async def until(what: str, predicate: Callable[[], bool], timeout: float = 60) -> None:
    """Poll until ``predicate`` holds (a bounded wait, not a timing assertion)."""
    with trio.move_on_after(timeout):
        while not predicate():
            await trio.sleep(0.05)
        return
    raise AssertionError(f"timed out waiting for {what}")


def replaced(pool: PartPool, n: int) -> bool:
    return pool.replaced == n


def held(proxy: FaultProxy, number: int) -> bool:
    return any(o == "hold" and f"partNumber={number}" in p for _, p, o in proxy.log)


def cache_file(tmp_path: Path, size: int) -> tuple[bytes, int]:
    data = os.urandom(size)
    path = tmp_path / "cache-file"
    path.write_bytes(data)
    return data, os.open(path, os.O_RDONLY)


def stored(endpoint: str, bucket: str, key: str) -> bytes:
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    body: bytes = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    return body


def test_parts_sent_by_worker_processes_make_the_object(
    tmp_path: Path, s3_endpoint: str, bucket: str
) -> None:
    data, fd = cache_file(tmp_path, 2 * PART + 12345)
    got: dict[int, tuple[str, int]] = {}
    pids: list[int] = []

    async def go() -> None:
        async with pooled(bucket, s3_endpoint, 2) as store:
            pool = pool_of(store)
            pids.extend(pool.pids)
            assert len(set(pids)) == 2 and os.getpid() not in pids
            upload = await store.create_multipart("w/model.pt", {})

            async def part(n: int) -> None:
                off = (n - 1) * PART
                got[n] = await store.upload_part_from(
                    "w/model.pt", upload, n, fd, off, min(PART, len(data) - off)
                )

            async with trio.open_nursery() as nursery:
                for n in (1, 2, 3):
                    nursery.start_soon(part, n)
            assert pool.sent == pool.answered == 3  # the workers sent them, not this process
            await store.complete_multipart("w/model.pt", upload, [got[n][0] for n in (1, 2, 3)])
            info = await store.head("w/model.pt")
            assert info is not None and info.crc32 is not None
            crcs = [zlib.crc32(data[(n - 1) * PART : n * PART]) for n in (1, 2, 3)]
            assert [got[n][1] for n in (1, 2, 3)] == crcs
            # the store's own checksum, of the parts' CRC32s ("-3" on S3, no count on moto)
            assert info.crc32.removesuffix("-3") == crc32_b64(composite(crcs))

    try:
        trio.run(go)
    finally:
        os.close(fd)
    assert stored(s3_endpoint, bucket, "w/model.pt") == data
    assert pids and not [p for p in pids if alive(p)], "part workers left behind"


def test_a_worker_killed_with_a_part_in_flight_loses_nothing(
    tmp_path: Path, s3_endpoint: str, bucket: str, proxy: FaultProxy
) -> None:
    data, fd = cache_file(tmp_path, 2 * PART)
    hold = proxy.add(Fault("hold", "PUT", r"partNumber=2(&|$)", drop=True))
    stats = RetryStats()

    async def go() -> None:
        async with pooled(bucket, proxy.url, 1) as raw:
            store = RetryingStore(raw, RetryPolicy(), stats)
            pool = pool_of(raw)
            [first] = pool.pids
            upload = await store.create_multipart("w/model.pt", {})
            etags: dict[int, str] = {}

            async def part(n: int) -> None:
                etags[n], _ = await store.upload_part_from(
                    "w/model.pt", upload, n, fd, (n - 1) * PART, PART
                )

            async with trio.open_nursery() as nursery:
                nursery.start_soon(part, 1)
                nursery.start_soon(part, 2)
                await until("part 2 to reach the store", lambda: held(proxy, 2))
                await until("part 1 to be sent", lambda: 1 in etags)
                os.kill(first, signal.SIGKILL)
                await until("the worker to be replaced", lambda: pool.replaced == 1)
                hold.release()
            [second] = pool.pids
            assert second != first and not alive(first)
            await store.complete_multipart("w/model.pt", upload, [etags[1], etags[2]])

    try:
        trio.run(go)
    finally:
        os.close(fd)
    assert stats.errors.get(WORKER_DIED) == 1, stats.errors
    assert len([p for m, p, _ in proxy.log if m == "PUT" and "partNumber=2" in p]) == 2
    assert stored(s3_endpoint, bucket, "w/model.pt") == data


def test_a_cancelled_part_stops_and_its_worker_goes_on(
    tmp_path: Path, s3_endpoint: str, bucket: str, proxy: FaultProxy
) -> None:
    data, fd = cache_file(tmp_path, PART)
    # Dropped once released: two PUTs of one part number at once make moto answer 500.
    hold = proxy.add(Fault("hold", "PUT", r"partNumber=1(&|$)", drop=True))

    async def go() -> None:
        async with pooled(bucket, proxy.url, 1) as store:
            pool = pool_of(store)
            [pid] = pool.pids
            upload = await store.create_multipart("w/model.pt", {})
            with trio.CancelScope() as scope:

                async def cancel_when_held() -> None:
                    await until("part 1 to reach the store", lambda: held(proxy, 1))
                    scope.cancel()

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(cancel_when_held)
                    await store.upload_part_from("w/model.pt", upload, 1, fd, 0, PART)
                    raise AssertionError("the held part returned")
            assert scope.cancelled_caught
            # The worker answered "cancelled" in time: one that had not would have been
            # killed (and replaced) for the part to be no longer in flight.
            assert (pool.answered, pool.sent) == (1, 0)
            hold.release()  # the held copy is dropped, not sent after the next one
            etag, crc = await store.upload_part_from("w/model.pt", upload, 1, fd, 0, PART)
            assert crc == zlib.crc32(data)
            assert pool.pids == [pid] and pool.replaced == 0
            await store.complete_multipart("w/model.pt", upload, [etag])

    try:
        trio.run(go)
    finally:
        os.close(fd)
    assert stored(s3_endpoint, bucket, "w/model.pt") == data


def test_a_file_shorter_than_its_part_is_a_permanent_error(
    tmp_path: Path, s3_endpoint: str, bucket: str
) -> None:
    _, fd = cache_file(tmp_path, PART - 1)

    async def go() -> None:
        async with pooled(bucket, s3_endpoint, 1) as store:
            upload = await store.create_multipart("w/model.pt", {})
            with pytest.raises(StoreError) as caught:
                await store.upload_part_from("w/model.pt", upload, 1, fd, 0, PART)
            assert caught.value.code == SHORT_FILE and not caught.value.temporary
            await store.abort_multipart("w/model.pt", upload)

    try:
        trio.run(go)
    finally:
        os.close(fd)


def test_workers_that_cannot_start_leave_the_parts_to_the_daemon(
    tmp_path: Path, s3_endpoint: str, bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    data, fd = cache_file(tmp_path, PART)

    async def go() -> None:
        async with pooled(bucket, s3_endpoint, 1) as store:
            pool = pool_of(store)
            pool._opening = dict(pool._opening, url="no-such-scheme://x")  # the next start fails
            os.kill(pool.pids[0], signal.SIGKILL)
            await until("the pool to give up", lambda: not pool.usable)
            assert pool.pids == []
            upload = await store.create_multipart("w/model.pt", {})
            etag, crc = await store.upload_part_from("w/model.pt", upload, 1, fd, 0, PART)
            assert crc == zlib.crc32(data) and pool.answered == 0
            await store.complete_multipart("w/model.pt", upload, [etag])

    try:
        trio.run(go)
    finally:
        os.close(fd)
    assert "parts are sent from the daemon" in caplog.text
    assert "StoreURLError" in caplog.text  # why, as the worker said it before it exited
    assert stored(s3_endpoint, bucket, "w/model.pt") == data


def test_workers_that_keep_dying_leave_the_parts_to_the_daemon(
    tmp_path: Path, s3_endpoint: str, bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Ready workers that end, DEATHS of them within DEATH_WINDOW: the pool stops starting
    them (something kills them: memory, a bug) instead of doing so for ever."""
    data, fd = cache_file(tmp_path, PART)

    async def go() -> None:
        async with pooled(bucket, s3_endpoint, 1) as store:
            pool = pool_of(store)
            for n in range(DEATHS):
                await until("a ready worker", lambda: any(w.ready for w in pool._workers))
                os.kill(pool.pids[0], signal.SIGKILL)
                if n < DEATHS - 1:
                    await until("its replacement", functools.partial(replaced, pool, n + 1))
            await until("the pool to give up", lambda: not pool.usable)
            assert pool.pids == [] and pool.replaced == DEATHS - 1
            upload = await store.create_multipart("w/model.pt", {})
            etag, crc = await store.upload_part_from("w/model.pt", upload, 1, fd, 0, PART)
            assert crc == zlib.crc32(data) and pool.sent == 0
            await store.complete_multipart("w/model.pt", upload, [etag])

    try:
        trio.run(go)
    finally:
        os.close(fd)
    assert f"{DEATHS} ended within" in caplog.text
    assert stored(s3_endpoint, bucket, "w/model.pt") == data


def test_a_failed_read_of_the_cache_file_is_a_classified_store_error(tmp_path: Path) -> None:
    """The same on the daemon's path and in a worker (both call read_part)."""
    fd = os.open(tmp_path, os.O_RDONLY)  # a directory: EISDIR, which no retry fixes
    try:
        with pytest.raises(StoreError) as caught:
            read_part(fd, 0, PART)
    finally:
        os.close(fd)
    assert caught.value.code == READ_ERROR and not caught.value.temporary
