"""The store layer against a real S3 HTTP API on loopback (moto), through a fault-injecting
proxy, and against the file store: the same contract for both, and the retry policy."""

from __future__ import annotations

import base64
import functools
import itertools
import json
import logging
import os
import re
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import pytest
import trio
import trio.testing

from ckptgw.drain.reads.entries import read_meta
from ckptgw.fsops.contentsum import Hasher, parts_checksum
from ckptgw.fsops.objectmeta import PART_SIZE
from ckptgw.store.deadlines import Deadlines
from ckptgw.store.faultproxy import Fault, FaultProxy
from ckptgw.store.interface import (
    Listing,
    NotFound,
    ObjectInfo,
    Stale,
    Store,
    StoreError,
    part_size_for,
)
from ckptgw.store.open import open_store
from ckptgw.store.retry import RetryPolicy, RetryStats, retrying
from ckptgw.store.url import parse_store_url, without_userinfo

StoreFactory = Callable[[], AbstractAsyncContextManager[Store]]


@pytest.fixture(params=["file", "s3"])
def store_cm(request: pytest.FixtureRequest, tmp_path: Path) -> StoreFactory:
    if request.param == "file":
        url = parse_store_url(f"file://{tmp_path / 'store'}")
        return lambda: open_store(url)
    endpoint = request.getfixturevalue("s3_endpoint")
    bucket = request.getfixturevalue("bucket")
    url = parse_store_url(f"s3://{bucket}/pre/")
    return lambda: open_store(url, endpoint)


def run(store_cm: StoreFactory, body: Callable[[Store], Awaitable[None]]) -> None:
    async def go() -> None:
        async with store_cm() as store:
            await store.check()
            await body(store)

    trio.run(go)


def test_put_get_head_range_delete(store_cm: StoreFactory) -> None:
    data = os.urandom(3 << 20) + b"end"

    async def body(s: Store) -> None:
        await s.put("run1/step_1/a.pt", data, {"xxh3-128": "abc", "mode": "420"})
        assert await s.get("run1/step_1/a.pt") == data
        assert await s.get("run1/step_1/a.pt", 10, 20) == data[10:20]
        info = await s.head("run1/step_1/a.pt")
        assert info is not None and info.size == len(data)
        assert info.metadata == {"xxh3-128": "abc", "mode": "420"}
        assert await s.head("run1/missing") is None
        with pytest.raises(NotFound):
            await s.get("run1/missing")
        await s.delete("run1/step_1/a.pt")
        await s.delete("run1/step_1/a.pt")  # deleting what is gone is fine
        assert await s.head("run1/step_1/a.pt") is None

    run(store_cm, body)


def test_a_multipart_uploads_head_gives_the_crc32_that_checks_its_content(
    store_cm: StoreFactory,
) -> None:
    """The checksum of a multipart upload is the store's CRC32 of its parts (a HEAD's), which
    the content hashed in parts of the size its metadata names matches, and content hashed
    in other parts does not; a copy's checksum still matches its content."""
    parts = [os.urandom(5 << 20), os.urandom(5 << 20), os.urandom(3000)]
    content = b"".join(parts)

    def hashed(part_size: int) -> Hasher:
        h = Hasher(part_size)
        for i in range(0, len(content), 1 << 20):
            h.update(content[i : i + (1 << 20)])
        return h

    async def body(s: Store) -> None:
        uid = await s.create_multipart("big.bin", {PART_SIZE: str(5 << 20)})
        etags = [
            # the caller's CRC32 (the uploader's, from the read that sent the part) or none
            await s.upload_part("big.bin", uid, n, p, zlib.crc32(p) if n != 2 else None)
            for n, p in enumerate(parts, 1)
        ]
        await s.complete_multipart("big.bin", uid, etags)
        info = await s.head("big.bin")
        assert info is not None and info.crc32 is not None
        assert hashed(5 << 20).matches(parts_checksum(5 << 20, info.crc32)) is True
        # The same CRC32s, said by the count S3 adds, or by none (moto).
        value = info.crc32.split("-")[0]
        assert hashed(5 << 20).matches(parts_checksum(5 << 20, f"{value}-3")) is True
        assert hashed(4 << 20).matches(parts_checksum(4 << 20, info.crc32)) is False
        assert hashed(5 << 20).matches("0" * 32) is None  # an xxh3-128: another form
        await s.copy("big.bin", "copy.bin")
        copied = await s.head("copy.bin")
        assert copied is not None and copied.crc32 is not None
        assert copied.metadata[PART_SIZE] == str(5 << 20)
        assert hashed(5 << 20).matches(parts_checksum(5 << 20, copied.crc32)) is True
        assert read_meta(copied).checksum == parts_checksum(5 << 20, copied.crc32)

    run(store_cm, body)


def test_multipart_out_of_order_resume_and_abort(store_cm: StoreFactory) -> None:
    parts = [os.urandom(5 << 20) for _ in range(3)] + [b"last"]

    async def body(s: Store) -> None:
        uid = await s.create_multipart("big.bin", {"xxh3-128": "x"})
        etags = {n: await s.upload_part("big.bin", uid, n, parts[n - 1]) for n in (3, 1)}
        # A restart reconciles with ListParts and sends only what is missing.
        assert await s.list_parts("big.bin", uid) == etags
        assert [u.upload_id async for u in s.iter_uploads("") if u.key == "big.bin"] == [uid]
        for n in (2, 4):
            etags[n] = await s.upload_part("big.bin", uid, n, parts[n - 1])
        assert await s.complete_multipart("big.bin", uid, [etags[n] for n in range(1, 5)])
        assert await s.get("big.bin") == b"".join(parts)
        assert (await s.head("big.bin")).metadata == {"xxh3-128": "x"}  # type: ignore[union-attr]
        gone = await s.create_multipart("gone.bin", {})
        await s.abort_multipart("gone.bin", gone)
        await s.abort_multipart("gone.bin", gone)
        with pytest.raises(NotFound):
            await s.list_parts("gone.bin", gone)

    run(store_cm, body)


def test_copy_list_prefix(store_cm: StoreFactory) -> None:
    async def body(s: Store) -> None:
        for k in ("a/1", "a/2", "b/1"):
            await s.put(k, k.encode(), {"k": k})
        await s.copy("a/1", "c/1")
        assert await s.get("c/1") == b"a/1"
        assert (await s.head("c/1")).metadata == {"k": "a/1"}  # type: ignore[union-attr]
        assert [o.key async for o in s.iter_objects("a/")] == ["a/1", "a/2"]
        assert [o.key async for o in s.iter_objects("")] == ["a/1", "a/2", "b/1", "c/1"]

    run(store_cm, body)


def test_listing_one_level_and_etags_that_name_a_version(store_cm: StoreFactory) -> None:
    """list_dir is one level (files and next-level prefixes); the ETag that put, copy and
    complete return is the one head and the listings show, and a GET pinned to an ETag
    fails with Stale once the object is rewritten."""

    async def body(s: Store) -> None:
        etags = {k: await s.put(k, k.encode(), {}) for k in ("r/a.pt", "r/s1/x", "r/s2/y/z")}
        uid = await s.create_multipart("r/big", {})
        part = await s.upload_part("r/big", uid, 1, b"big")
        etags["r/big"] = await s.complete_multipart("r/big", uid, [part])
        etags["r/copy"] = await s.copy("r/big", "r/copy")
        listing = await s.list_dir("r/")
        assert {o.key: o.etag for o in listing.objects} == {
            k: etags[k] for k in ("r/a.pt", "r/big", "r/copy")
        }
        assert listing.dirs == ["r/s1/", "r/s2/"]
        assert [o.size for o in listing.objects] == [6, 3, 3]
        assert all(o.mtime > 1.6e9 for o in listing.objects)
        root = await s.list_dir("")
        assert root.dirs == ["r/"] and root.objects == []
        assert await s.list_dir("nothing/") == Listing([], [])
        for k, etag in etags.items():
            info = await s.head(k)
            assert info is not None and info.etag == etag
        assert await s.get("r/big", 1, 3, etag=etags["r/big"]) == b"ig"
        await s.put("r/big", b"rewritten", {})
        with pytest.raises(Stale):
            await s.get("r/big", 0, 3, etag=etags["r/big"])

    run(store_cm, body)


def test_copy_with_new_metadata_and_in_place(store_cm: StoreFactory) -> None:
    """A copy with metadata gets exactly that metadata; onto the source itself it is an
    in-place metadata update (data unchanged), which needs metadata."""
    data = os.urandom(1 << 20)

    async def body(s: Store) -> None:
        await s.put("m/a", data, {"xxh3-128": "abc", "mode": "420"})
        etag = await s.copy("m/a", "m/b", {"xxh3-128": "abc", "uid": "1000"})
        info = await s.head("m/b")
        assert info is not None and info.etag == etag and info.size == len(data)
        assert info.metadata == {"xxh3-128": "abc", "uid": "1000"}  # replaced, not merged
        assert await s.get("m/b") == data
        assert (await s.head("m/a")).metadata == {"xxh3-128": "abc", "mode": "420"}  # type: ignore[union-attr]

        etag = await s.copy("m/a", "m/a", {"xxh3-128": "abc", "mode": "384"})
        info = await s.head("m/a")
        assert info is not None and info.etag == etag and info.size == len(data)
        assert info.metadata == {"xxh3-128": "abc", "mode": "384"}
        assert await s.get("m/a") == data
        assert await s.get("m/a", 0, 10, etag=etag) == data[:10]
        assert [o.key async for o in s.iter_objects("m/")] == ["m/a", "m/b"]

        assert await s.copy("m/a", "m/a", {}) == (await s.head("m/a")).etag  # type: ignore[union-attr]
        assert (await s.head("m/a")).metadata == {}  # type: ignore[union-attr]
        assert await s.get("m/a") == data
        with pytest.raises(StoreError) as e:
            await s.copy("m/a", "m/a")  # nothing would change: S3 refuses it too
        assert not e.value.temporary
        with pytest.raises(NotFound):
            await s.copy("m/missing", "m/missing", {"mode": "384"})
        assert await s.head("m/missing") is None

    run(store_cm, body)


def test_directory_markers(store_cm: StoreFactory) -> None:
    """A key ending in "/" is an empty marker object standing for a directory: next to
    objects under the same prefix, listed by iter_objects (before them), a dir of the level
    above in list_dir but never one of its objects, and deleted alone."""

    async def body(s: Store) -> None:
        etag = await s.put("d/run/step_5/", b"", {"mode": "493", "uid": "1000"})
        await s.put("d/run/step_5/x.pt", b"x", {})
        await s.put("d/run/a.pt", b"aa", {})
        await s.put("d/run/empty/", b"", {"mode": "448"})
        info = await s.head("d/run/step_5/")
        assert info is not None and (info.key, info.size, info.etag) == ("d/run/step_5/", 0, etag)
        assert info.metadata == {"mode": "493", "uid": "1000"}
        assert await s.get("d/run/step_5/") == b""
        assert await s.head("d/run/") is None  # a directory with objects, but no marker
        assert await s.head("d/run/step_5") is None  # the key without "/" is another one
        with pytest.raises(NotFound):
            await s.get("d/run/")

        listed = [(o.key, o.size) async for o in s.iter_objects("d/")]
        assert listed == [
            ("d/run/a.pt", 2),
            ("d/run/empty/", 0),
            ("d/run/step_5/", 0),
            ("d/run/step_5/x.pt", 1),
        ]
        assert [o.key async for o in s.iter_objects("d/run/step_5/")] == [
            "d/run/step_5/",
            "d/run/step_5/x.pt",
        ]
        level = await s.list_dir("d/run/")
        assert [o.key for o in level.objects] == ["d/run/a.pt"]
        assert level.dirs == ["d/run/empty/", "d/run/step_5/"]
        below = await s.list_dir("d/run/step_5/")  # its own marker is not among its objects
        assert [o.key for o in below.objects] == ["d/run/step_5/x.pt"] and below.dirs == []
        assert await s.list_dir("d/run/empty/") == Listing([], [])
        assert (await s.list_dir("d/")).dirs == ["d/run/"]

        with pytest.raises(StoreError) as e:
            await s.put("d/bad/", b"data", {})  # markers are always empty
        assert not e.value.temporary
        assert await s.head("d/bad/") is None
        with pytest.raises(StoreError) as e:
            await s.create_multipart("d/bad/", {})
        assert not e.value.temporary
        with pytest.raises(StoreError) as e:
            await s.copy("d/run/a.pt", "d/bad/")  # data under a marker
        assert not e.value.temporary
        assert await s.head("d/bad/") is None

        copied = await s.copy("d/run/step_5/", "d/other/")
        info = await s.head("d/other/")
        assert info is not None and info.etag == copied and info.size == 0
        assert info.metadata == {"mode": "493", "uid": "1000"}
        await s.copy("d/run/step_5/", "d/third/", {"mode": "511"})
        assert (await s.head("d/third/")).metadata == {"mode": "511"}  # type: ignore[union-attr]
        updated = await s.copy("d/run/step_5/", "d/run/step_5/", {"mode": "448"})
        info = await s.head("d/run/step_5/")
        assert info is not None and info.etag == updated and info.size == 0
        assert info.metadata == {"mode": "448"}
        assert (await s.list_dir("d/")).dirs == ["d/other/", "d/run/", "d/third/"]

        await s.delete("d/run/step_5/")  # the marker only: the object under it stays
        await s.delete("d/run/step_5/")
        assert await s.head("d/run/step_5/") is None
        assert await s.get("d/run/step_5/x.pt") == b"x"
        assert [o.key async for o in s.iter_objects("d/run/step_5/")] == ["d/run/step_5/x.pt"]
        assert (await s.list_dir("d/run/")).dirs == ["d/run/empty/", "d/run/step_5/"]

        await s.delete("d/run/empty/")  # nothing left under it: the directory goes too
        assert (await s.list_dir("d/run/")).dirs == ["d/run/step_5/"]
        await s.delete_many(["d/run/step_5/x.pt", "d/run/a.pt", "d/other/", "d/third/"])
        assert await s.list_dir("d/") == Listing([], [])
        assert [o.key async for o in s.iter_objects("d/")] == []

    run(store_cm, body)


def test_file_store_markers_and_reserved_names(tmp_path: Path) -> None:
    """FileStore's layout: a marker is ``<dir>/.ckptgw-dir``; ``.ckptgw-`` names below the
    root are no keys and never listed; the gateway's pins at the root still are keys."""

    async def go() -> None:
        root = tmp_path / "store"
        async with open_store(parse_store_url(f"file://{root}")) as s:
            await s.check()
            await s.put("a/b/", b"", {"mode": "493"})
            await s.put("a/b/c", b"c", {})
            marker = root / "a" / "b" / ".ckptgw-dir"
            assert marker.is_file() and marker.stat().st_size == 0
            assert json.loads(os.getxattr(marker, "user.ckptgw")) == {"mode": "493"}
            for key in ("a/.ckptgw-dir", "a/b/.ckptgw-x", "a/.ckptgw-tmp/y", ".ckptgw-dir"):
                with pytest.raises(StoreError) as e:
                    await s.put(key, b"x", {})
                assert e.value.code == "BadKey" and not e.value.temporary
            (root / "a" / ".ckptgw-junk").write_bytes(b"j")  # the store's own: never listed
            (root / "a" / ".ckptgw-junkdir").mkdir()
            (root / "a" / ".ckptgw-junkdir" / "f").write_bytes(b"f")
            assert [o.key async for o in s.iter_objects("")] == ["a/b/", "a/b/c"]
            listing = await s.list_dir("a/")
            assert listing.objects == [] and listing.dirs == ["a/b/"]

            await s.put(".ckptgw-pins/run1", b"", {"pinned-at": "1"})  # the gateway's pins
            assert [o.key async for o in s.iter_objects(".ckptgw-pins/")] == [".ckptgw-pins/run1"]
            assert (await s.list_dir("")).dirs == ["a/"]  # the mount never shows them

            await s.copy("a/b/", "a/b/", {"mode": "448"})  # in place: the same file
            assert marker.is_file()
            assert json.loads(os.getxattr(marker, "user.ckptgw")) == {"mode": "448"}
            await s.delete("a/b/")
            assert not marker.exists() and (root / "a" / "b" / "c").is_file()

    trio.run(go)


def test_get_into_writes_a_range_in_place_as_it_arrives(
    store_cm: StoreFactory, tmp_path: Path
) -> None:
    data = os.urandom(11 << 20)
    target = tmp_path / "cache-file"

    async def body(s: Store) -> None:
        await s.put("big.bin", data, {"xxh3-128": "0123abcd", "mode": "33188"})
        info = await s.head("big.bin")
        assert info is not None
        reports: list[int] = []
        told: list[ObjectInfo] = []

        def described(got: ObjectInfo) -> None:
            told.append(got)
            assert reports == []  # before any bytes

        fd = os.open(target, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.ftruncate(fd, len(data))
            await s.get_into(
                "big.bin",
                1 << 20,
                10 << 20,
                fd,
                etag=info.etag,
                progress=reports.append,
                described=described,
            )
            await trio.sleep(0.1)  # reports from the client's thread arrive through trio
            # What a HEAD says (the whole object's size, not the range's), once; then pieces
            # of about 4 MiB, reported in order, the last one the whole range.
            assert told == [info] and info.size == len(data), (told, info)
            assert len(reports) >= 2 and reports == sorted(reports), reports
            assert reports[-1] == 9 << 20
            got = os.pread(fd, len(data), 0)
            assert got[1 << 20 : 10 << 20] == data[1 << 20 : 10 << 20]
            assert got[: 1 << 20] == bytes(1 << 20)  # nothing outside the range
            with pytest.raises(Stale):
                await s.get_into("big.bin", 0, 10, fd, etag='"not-its-etag"')
            with pytest.raises(StoreError) as e:  # the object ends before the range does
                await s.get_into("big.bin", len(data) - 10, len(data) + 10, fd)
            assert e.value.code == "ShortRead" and not e.value.temporary
            with pytest.raises(NotFound):
                await s.get_into("missing.bin", 0, 10, fd)
        finally:
            os.close(fd)

    run(store_cm, body)


# -- faults ------------------------------------------------------------------------------------


@asynccontextmanager
async def proxied(
    endpoint: str, bucket: str, deadlines: Deadlines | None = None
) -> AsyncIterator[tuple[Store, FaultProxy]]:
    proxy = FaultProxy(int(endpoint.rsplit(":", 1)[1]))
    try:
        url = parse_store_url(f"s3://{bucket}/")
        async with open_store(url, proxy.url, deadlines=deadlines) as store:
            yield store, proxy
    finally:
        proxy.close()


FAST = RetryPolicy(attempts=6, base=0.01, cap=2)


@pytest.mark.parametrize("method", ["DELETE", "PUT"])
def test_a_request_whose_answer_is_lost_is_retried_in_the_one_place_and_counted(
    s3_endpoint: str, bucket: str, method: str
) -> None:
    """The store closes a kept-alive connection after reading a DELETE (or a PUT) without
    answering it: aiohttp would send an idempotent request again by itself (RFC 9112 lets a
    client), neither counted nor logged. The error reaches ckptgw.store.retry, which retries it,
    counts it and logs it, as every other retry."""

    async def go() -> None:
        async with proxied(s3_endpoint, bucket) as (store, proxy):
            await store.put("k", b"first", {})  # a connection to keep alive
            lost = proxy.add(Fault("hold", method, r"/k$", seconds=0.05, drop=True))
            stats = RetryStats()
            if method == "DELETE":
                await retrying("delete k", lambda: store.delete("k"), FAST, stats)
                assert await store.head("k") is None
            else:
                await retrying("put k", lambda: store.put("k", b"second", {}), FAST, stats)
                assert await store.get("k") == b"second"
            assert lost.hits == 1
            sent = [what for m, p, what in proxy.log if m == method and p.endswith("/k")]
            assert sent[-2:] == ["hold", "ok"]  # once lost, once answered
            assert stats.retries == 1 and stats.errors == {"Transport": 1}

    trio.run(go)


def test_slowdown_and_resets_are_retried_to_an_exact_object(s3_endpoint: str, bucket: str) -> None:
    parts = [os.urandom(5 << 20), os.urandom(1 << 20)]

    async def go() -> None:
        async with proxied(s3_endpoint, bucket) as (store, proxy):
            stats = RetryStats()
            proxy.add(Fault("slowdown", "PUT", r"partNumber=1", count=2))
            proxy.add(Fault("reset", "PUT", r"partNumber=2", count=2))
            uid = await retrying("create", lambda: store.create_multipart("k", {}), FAST, stats)
            etags = []
            for n, data in enumerate(parts, 1):
                call = functools.partial(store.upload_part, "k", uid, n, data)
                etags.append(await retrying(f"part {n}", call, FAST, stats))
            await retrying(
                "complete", lambda: store.complete_multipart("k", uid, etags), FAST, stats
            )
            assert await store.get("k") == b"".join(parts)
            assert stats.retries == 4
            outcomes = [o for _, _, o in proxy.log]
            assert outcomes.count("slowdown") == 2 and outcomes.count("reset") == 2

    trio.run(go)


def _crc32(data: bytes) -> str:
    return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


def test_every_body_carries_its_crc32_and_a_damaged_part_goes_again(
    s3_endpoint: str, bucket: str
) -> None:
    """Each PUT and part carries its CRC32, which S3 checks (the proxy checks it here, as moto
    does not): a part damaged on the way is refused with BadDigest and sent again. A multipart
    object's checksum is S3's COMPOSITE CRC32 of its parts' CRC32s; a resumed upload (a new
    client, as after a restart) still completes with them; a copy names CRC32 too, so it
    has a checksum of its own content that a validating GET accepts."""
    parts = [os.urandom(5 << 20), os.urandom(5 << 20), os.urandom(1 << 20)]

    async def go() -> None:
        async with proxied(s3_endpoint, bucket) as (store, proxy):
            stats = RetryStats()
            proxy.add(Fault("corrupt", "PUT", r"partNumber=2", count=1))
            uid = await retrying("create", lambda: store.create_multipart("k", {}), FAST, stats)
            etags = []
            for n, data in enumerate(parts[:2], 1):
                call = functools.partial(store.upload_part, "k", uid, n, data)
                etags.append(await retrying(f"part {n}", call, FAST, stats))
            assert stats.retries == 1
            assert [o for _, p, o in proxy.log if "partNumber=2" in p] == ["bad-digest", "ok"]
            await store.put("small", b"x" * 100, {})
            # The request target may be absolute (http://host/...): its path and part number.
            checked = [re.sub(r"^http://[^/]*|uploadId=[^&]*&?", "", p) for p in proxy.checked]
            assert checked == [f"/{bucket}/k?partNumber={n}" for n in (1, 2)] + [f"/{bucket}/small"]
        # A restart: a new client resumes. (S3's ListParts says the upload's algorithm, so
        # the last part carries its CRC32 too; moto's does not, so here it goes without.)
        async with proxied(s3_endpoint, bucket) as (store, proxy):
            assert await store.list_parts("k", uid) == dict(enumerate(etags, 1))
            etags.append(await store.upload_part("k", uid, 3, parts[2]))
            await store.complete_multipart("k", uid, etags)
            assert await store.get("k") == b"".join(parts)
            await store.copy("k", "copy")  # a move's copy gets a checksum of its own

    trio.run(go)
    import boto3

    client = boto3.client("s3", endpoint_url=s3_endpoint)  # validates checksums on GET
    assert client.get_object(Bucket=bucket, Key="copy")["Body"].read() == b"".join(parts)
    head = client.head_object(Bucket=bucket, Key="k", ChecksumMode="ENABLED")
    composite = b"".join(zlib.crc32(p).to_bytes(4, "big") for p in parts)
    # The CRC32 of the parts' CRC32s (S3 adds "-3"), not the CRC of the content: composite.
    assert head["ChecksumCRC32"].split("-")[0] == _crc32(composite) != _crc32(b"".join(parts))


def test_a_stall_beyond_the_read_timeout_is_retried(s3_endpoint: str, bucket: str) -> None:
    async def go() -> None:
        async with proxied(s3_endpoint, bucket, Deadlines(first_byte_timeout=0.5)) as (
            store,
            proxy,
        ):
            proxy.add(Fault("stall", "PUT", "/stalled", count=1, seconds=2))
            stats = RetryStats()
            await retrying("put", lambda: store.put("stalled", b"x" * 1000, {}), FAST, stats)
            assert await store.get("stalled") == b"x" * 1000
            assert stats.retries >= 1

    trio.run(go)


def test_missing_bucket_is_permanent_and_not_retried(s3_endpoint: str, s3_env: object) -> None:
    async def go() -> None:
        url = parse_store_url("s3://no-such-bucket-ckptgw/")
        async with open_store(url, s3_endpoint) as store:
            stats = RetryStats()
            with pytest.raises(StoreError) as e:
                await retrying("check", store.check, FAST, stats)
            assert not e.value.temporary and stats.retries == 0
            with pytest.raises(StoreError, match="bucket does not exist"):
                await store.put("k", b"x", {})

    trio.run(go)


def test_wrong_credentials_are_permanent_and_never_echoed(
    s3_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.s3server import moto_server

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-value")
    with moto_server({"INITIAL_NO_AUTH_ACTION_COUNT": "0"}) as endpoint:

        async def go() -> None:
            async with open_store(parse_store_url("s3://any-bucket/"), endpoint) as store:
                with pytest.raises(StoreError) as e:
                    await store.check()
                assert not e.value.temporary
                assert "credentials" in str(e.value) and "wrong-secret-value" not in str(e.value)

        trio.run(go)


def test_unreachable_endpoint_is_temporary(s3_env: object) -> None:
    from tests.s3server import free_port

    async def go() -> None:
        url = parse_store_url("s3://bkt/")
        async with open_store(url, f"http://127.0.0.1:{free_port()}") as store:
            with pytest.raises(StoreError) as e:
                await store.check()
            assert e.value.temporary

    trio.run(go)


def test_retry_backoff_honours_retry_after_and_gives_up() -> None:
    """Deterministic: trio's mock clock records every wait the policy chooses."""
    calls: list[float] = []

    async def go() -> None:
        async def flaky() -> str:
            calls.append(trio.current_time())
            if len(calls) < 3:
                raise StoreError("503", temporary=True, retry_after=5.0)
            return "ok"

        assert await retrying("x", flaky, RetryPolicy(attempts=5, base=0.1, cap=30)) == "ok"
        waits = [b - a for a, b in itertools.pairwise(calls)]
        assert all(w >= 5.0 for w in waits)  # never sooner than Retry-After

        async def always() -> None:
            raise StoreError("503", temporary=True)

        with pytest.raises(StoreError):
            await retrying("y", always, RetryPolicy(attempts=4, base=0.1, cap=1))

    trio.run(go, clock=trio.testing.MockClock(autojump_threshold=0))


def test_part_sizes_respect_s3_limits() -> None:
    assert part_size_for(1 << 30, 16 << 20) == 16 << 20
    assert part_size_for(10, 1 << 20) == 5 << 20  # never below 5 MiB
    big = 4 << 40  # 4 TiB in 10,000 parts needs > 16 MiB parts
    p = part_size_for(big, 16 << 20)
    assert -(-big // p) <= 10_000 and p % (1 << 20) == 0
    with pytest.raises(StoreError):
        part_size_for(6 << 40, 16 << 20)


def test_a_cancelled_s3_call_has_ended_on_the_asyncio_side_when_it_returns() -> None:
    """So a delete journaled after a cancelled PUT of the same key cannot be overtaken by
    that PUT from our side."""
    import asyncio

    from ckptgw.store.loopthread import LoopThread

    loop = LoopThread()
    events: list[str] = []

    async def request() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            await asyncio.sleep(0.2)  # the transport winding down
            events.append("request ended")

    async def main() -> None:
        with trio.move_on_after(0.1):
            await loop.run(request)
        events.append("cancel returned")

    try:
        trio.run(main)
    finally:
        loop.close()
    assert events == ["request ended", "cancel returned"]


def test_a_broken_connection_in_a_task_nobody_awaits_is_no_error_in_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """aiohttp sends a request's body in a task of its own; when the connection breaks, that
    task ends with the error its request already raised (and the retry place reports), and
    nobody awaits it. asyncio would log it as an ERROR with a traceback: seen in CI when a
    proxy went away under a draining gateway. Other errors in such tasks still are."""
    import asyncio
    import gc

    from ckptgw.store.loopthread import LoopThread

    loop = LoopThread()

    async def orphans() -> None:
        async def fails(e: BaseException) -> None:
            raise e

        for e in (ConnectionResetError("Cannot write to closing transport"), ValueError("x")):
            asyncio.get_running_loop().create_task(fails(e))
        await asyncio.sleep(0.05)
        gc.collect()  # the tasks are dropped: asyncio reports what they raised

    try:
        with caplog.at_level(logging.DEBUG):
            trio.run(loop.run, orphans)
    finally:
        loop.close()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [str(r.exc_info[1]) if r.exc_info else r.getMessage() for r in errors] == ["x"]
    assert "Cannot write to closing transport" in caplog.text  # kept, at DEBUG


def test_an_endpoint_is_shown_without_a_user_or_password() -> None:
    """Status, the log and the metrics name the endpoint; AWS_ENDPOINT_URL_S3 or a profile's
    endpoint_url (which the config does not check) may carry credentials."""
    assert without_userinfo("https://key:secret@s3.example:9000/x") == "https://s3.example:9000/x"
    assert without_userinfo("http://127.0.0.1:9000") == "http://127.0.0.1:9000"
