"""Every request to the store has a deadline, and a stall is seen (ckptgw.store.deadlines).

First the rule alone (``judge``: a pure function of a request and the time, no clock), and
the watchdog on a real asyncio loop; then :class:`S3Store` against a real S3 HTTP API (moto)
behind the fault proxy, as servers misbehave: one that never answers ``Expect:
100-continue``, one that accepts a request and never answers, one that stops reading a body
and one that stops sending one; part workers; and a real mount, where a user sees the
status, the metrics, the log and ``ckptgw mount`` itself. Bounds are wide ("within 60 s"
where the defect was "never"); no assertion depends on timing.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import re
import time
import urllib.request
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from importlib import resources
from pathlib import Path

import boto3
import jsonschema
import pytest
import trio

from ckptgw.store.deadlines import (
    ANSWER,
    CONTINUE,
    EXPIRE,
    NO_CONTINUE,
    PREPARING,
    RECEIVING,
    RESUME,
    SENDING,
    SLOW_ANSWER,
    STALL,
    STALLED,
    TIMEOUT,
    WAIT,
    Deadlines,
    RequestWatch,
    Watchdog,
    judge,
)
from ckptgw.store.faultproxy import Fault, FaultProxy
from ckptgw.store.interface import StoreError
from ckptgw.store.loopthread import LoopThread
from ckptgw.store.open import open_store
from ckptgw.store.retry import RetryPolicy, RetryStats, retrying
from ckptgw.store.s3 import S3Store
from ckptgw.store.url import parse_store_url
from tests.conftest import CheckedGateway, GatewayFactory, any_data_path, needs_fuse
from tests.s3server import free_port
from tests.test_drain import wait_for

D = Deadlines(
    connect_timeout=10, first_byte_timeout=30, stall_timeout=20, stall_warning=5, continue_wait=1
)


def watch_in(phase: str, at: float = 100.0, *, slow: bool = False) -> RequestWatch:
    dog = Watchdog(D, "http://store", 32, lambda w, s: None)
    w = dog.watch("PART 3 of run/x.pt", "run/x.pt", size=16 << 20, slow=slow, now=0.0)
    w.phase, w.progress_at = phase, at
    return w


# -- the rule ------------------------------------------------------------------------------------


def test_waiting_for_an_answer_is_stalled_at_the_warning_and_cancelled_at_first_byte() -> None:
    w = watch_in(ANSWER)
    assert judge(w, 104.9, D) == (WAIT, None, 105.0)  # look again at the warning
    assert judge(w, 105.0, D) == (STALL, None, 130.0)  # stalled; look again at the deadline
    w.stalled = True
    assert judge(w, 129.9, D) == (WAIT, None, 130.0)
    assert judge(w, 130.0, D) == (EXPIRE, TIMEOUT, 130.0)
    for phase in (PREPARING, "connecting"):  # no answer yet either way
        assert judge(watch_in(phase), 130.0, D)[:2] == (EXPIRE, TIMEOUT)


def test_bytes_moving_keep_a_request_alive_and_silence_ends_it_at_the_stall_deadline() -> None:
    for phase in (SENDING, RECEIVING):
        w = watch_in(phase)
        assert judge(w, 119.9, D)[:2] == (STALL, None)
        w.stalled = True
        w.moved(119.9, sent=1 << 20)  # a chunk went: it moves again
        assert judge(w, 120.0, D) == (RESUME, None, 124.9)
        w.stalled = False
        assert judge(w, 139.8, D)[0] == STALL
        assert judge(w, 139.9, D) == (EXPIRE, STALLED, 139.9)


def test_no_100_continue_within_the_wait_ends_the_attempt_unless_the_pool_is_full() -> None:
    w = watch_in(CONTINUE)
    assert judge(w, 100.5, D) == (WAIT, None, 101.0)
    assert judge(w, 101.0, D) == (EXPIRE, NO_CONTINUE, 101.0)
    # Every connection may be taken: it may still wait for one; only the answer's deadline.
    assert judge(w, 101.0, D, pool_full=True) == (WAIT, None, 105.0)
    assert judge(w, 130.0, D, pool_full=True)[:2] == (EXPIRE, TIMEOUT)


def test_a_call_the_store_works_on_waits_ten_times_longer() -> None:
    w = watch_in(ANSWER, slow=True)  # CompleteMultipartUpload, copies
    assert judge(w, 100 + 30 * SLOW_ANSWER - 0.1, D)[0] == STALL
    assert judge(w, 100 + 30 * SLOW_ANSWER, D)[:2] == (EXPIRE, TIMEOUT)
    assert judge(w, 100 + 5 * SLOW_ANSWER - 0.1, D)[0] == WAIT  # and warns later too
    w.phase = SENDING  # bytes moving: the same stall deadline as any request
    assert judge(w, 120.0, D)[:2] == (EXPIRE, STALLED)


def test_an_expired_request_says_what_where_and_why() -> None:
    w = watch_in(SENDING)
    w.sent, w.ended_by = 3 << 20, STALLED
    e = w.error("http://store:9000", D)
    assert e.temporary and e.code == STALLED
    assert str(e) == (
        f"PART 3 of run/x.pt: stalled: no progress for 20 s while sending ({3 << 20} of "
        f"{16 << 20} bytes sent) at http://store:9000; cancelled"
    )
    w.phase, w.ended_by = ANSWER, TIMEOUT
    assert str(w.error("http://store:9000", D)) == (
        "PART 3 of run/x.pt: no answer from http://store:9000 in 30 s (waiting for the "
        "answer); cancelled"
    )


def test_the_watchdog_cancels_a_silent_call_and_spares_a_moving_one() -> None:
    """On a real asyncio loop (the S3 client's thread): a call that never moves ends with
    the deadline's error, within a bound; one that moves more often than the stall
    deadline runs well past it."""
    quick = Deadlines(first_byte_timeout=0.3, stall_timeout=0.3, stall_warning=0.1)
    stalls: list[tuple[str, bool]] = []
    dog = Watchdog(quick, "http://store", 32, lambda w, s: stalls.append((w.what, s)))
    loop = LoopThread()

    async def silent() -> None:
        await asyncio.sleep(3600)

    async def moving(watch: RequestWatch) -> str:
        watch.to(SENDING, time.monotonic())
        for _ in range(12):  # 1.2 s in all, 4x the stall deadline
            await asyncio.sleep(0.1)
            watch.moved(time.monotonic(), sent=1)
        return "sent"

    async def main() -> None:
        w = dog.watch("HEAD k", "k", now=time.monotonic())
        with trio.fail_after(30), pytest.raises(StoreError) as e:
            await loop.run(lambda: dog.watched(w, silent))
        assert e.value.code == TIMEOUT and "HEAD k: no answer from http://store" in str(e.value)
        assert stalls == [("HEAD k", True)]  # said once, as it stalled
        m = dog.watch("PUT k", "k", size=12, now=time.monotonic())
        with trio.fail_after(30):
            assert await loop.run(lambda: dog.watched(m, functools.partial(moving, m))) == "sent"
        assert m.sent == 12 and dog.cancelled == 1

    try:
        trio.run(main)
    finally:
        loop.close()


# -- S3Store through the fault proxy -------------------------------------------------------------

# Short enough for a quick test, long enough that a healthy answer of moto on a loaded
# machine never reaches them; and counts asserted as "at least", never exact where a slow
# moment could add a retry.
QUICK = Deadlines(connect_timeout=5, first_byte_timeout=3, stall_timeout=3, stall_warning=0.5)
FAST = RetryPolicy(attempts=6, base=0.01, cap=1)


@asynccontextmanager
async def proxied(
    endpoint: str, bucket: str, deadlines: Deadlines = QUICK, part_workers: int = 0
) -> AsyncIterator[tuple[S3Store, FaultProxy]]:
    proxy = FaultProxy(int(endpoint.rsplit(":", 1)[1]))
    try:
        url = parse_store_url(f"s3://{bucket}/")
        async with open_store(
            url, proxy.url, deadlines=deadlines, part_workers=part_workers
        ) as store:
            assert isinstance(store, S3Store)
            yield store, proxy
    finally:
        proxy.close()


def outcomes(proxy: FaultProxy, pattern: str) -> list[str]:
    return [o for _, p, o in proxy.log if pattern in p]


def test_expect_is_asked_while_the_endpoint_answers_it_and_dropped_when_it_does_not(
    s3_endpoint: str, bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Our handler (in place of botocore's) asks for a 100 on every PUT and part with a body
    (a request the store refuses then costs no upload), not on an empty one (a marker).
    Behind an endpoint that never answers it, the first request left without a 100 goes
    again at once without Expect and no later one asks: a PUT and a multipart upload end in
    the store (before: they waited for the 100 for ever, nothing in status or the log)."""
    parts = [os.urandom(5 << 20), os.urandom(1 << 20)]

    async def go() -> None:
        async with proxied(s3_endpoint, bucket, Deadlines()) as (store, proxy):
            await store.put("a.pt", b"x" * 5000, {})
            await store.put("dir/", b"", {})
            uid = await store.create_multipart("b.pt", {})
            etag = await store.upload_part("b.pt", uid, 1, b"y" * 1000)
            await store.complete_multipart("b.pt", uid, [etag])
            asked = [p.split("?")[0] for p in proxy.expected]
            assert asked == [f"/{bucket}/a.pt", f"/{bucket}/b.pt"]
            assert store.requests_view()["expect_continue"] is True

            proxy.ignore_expect = True  # from now on the endpoint never answers it
            proxy.expected.clear()
            with trio.fail_after(60):
                await store.put("small.pt", b"x" * 5000, {})
                uid = await store.create_multipart("big.pt", {})
                etags = [
                    await store.upload_part("big.pt", uid, n, p) for n, p in enumerate(parts, 1)
                ]
                await store.complete_multipart("big.pt", uid, etags)
            assert await store.get("small.pt") == b"x" * 5000
            assert await store.get("big.pt") == b"".join(parts)
            assert proxy.expected == [f"/{bucket}/small.pt"]  # asked once, never again
            # the PUT left without its 100, its body never sent ("gone": logged by the proxy's
            # thread of that connection whenever it sees it closed), the PUT again, the GET
            seen = outcomes(proxy, "small.pt")
            assert seen[0] == "no-100" and sorted(seen[1:]) == ["gone", "ok", "ok"], seen
            view = store.requests_view()
            assert view["expect_continue"] is False
            assert view["no_continue"] == (
                f"PUT small.pt: {proxy.url} did not answer Expect: 100-continue in 1 s"
            )

    trio.run(go)
    said = [r for r in caplog.records if "100-continue" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING
    assert "did not answer Expect: 100-continue" in said[0].getMessage()
    assert "http://127.0.0.1:" in said[0].getMessage()


def test_a_server_that_never_answers_times_out_and_the_call_is_retried(
    s3_endpoint: str, bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A connection accepted, the request read, nothing said: each attempt ends at the
    first-byte deadline (a warning at the stall warning), the retry gets through."""

    async def go() -> None:
        async with proxied(s3_endpoint, bucket) as (store, proxy):
            await store.put("k.pt", b"data", {})
            stats = RetryStats()
            proxy.add(Fault("silent", "HEAD", "/k.pt", count=2))
            # A PUT: without a 100 it goes again without Expect, and is not answered either.
            proxy.add(Fault("silent", "PUT", "/p.pt", count=2))
            with trio.fail_after(60):
                info = await retrying("head", lambda: store.head("k.pt"), FAST, stats)
                assert info is not None and info.size == 4
                await retrying("put", lambda: store.put("p.pt", b"z" * 3000, {}), FAST, stats)
            assert set(stats.errors) == {TIMEOUT} and stats.errors[TIMEOUT] >= 3
            assert "no answer from" in stats.last_error and proxy.url in stats.last_error
            assert await store.get("p.pt") == b"z" * 3000
            seen = outcomes(proxy, "/k.pt")
            assert seen[:3] == ["ok", "silent", "silent"] and seen[-1] == "ok"

    trio.run(go)
    assert any(
        r.levelno == logging.WARNING and "HEAD k.pt: stalled at http://127.0.0.1:" in r.getMessage()
        for r in caplog.records
    )


async def until(what: str, predicate: Callable[[], bool], timeout: float = 60) -> None:
    """Poll until ``predicate`` holds (a bounded wait, not a timing assertion)."""
    with trio.move_on_after(timeout):
        while not predicate():
            await trio.sleep(0.02)
        return
    raise AssertionError(f"timed out waiting for {what}")


def stalled_requests(store: S3Store) -> list[dict[str, object]]:
    return [r for r in store.requests_view()["requests"] if r["stalled"]]


def test_a_body_the_server_stops_reading_is_seen_stalled_then_sent_again(
    s3_endpoint: str, bucket: str
) -> None:
    """Bytes stop moving mid-body (before: until the kernel gave up, with nothing said):
    the request is listed as stalled, naming what it is and how far it got, then cancelled
    and sent again."""
    data = os.urandom(32 << 20)  # more than the loopback socket buffers hold

    async def go() -> None:
        deadlines = Deadlines(stall_timeout=3, stall_warning=0.5)
        async with proxied(s3_endpoint, bucket, deadlines) as (store, proxy):
            stats = RetryStats()
            proxy.add(Fault("stop-reading", "PUT", "/big.pt"))
            put = functools.partial(store.put, "big.pt", data, {})
            with trio.fail_after(60):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(functools.partial(retrying, "put", put, FAST, stats))
                    await until("the PUT to be stalled", lambda: bool(stalled_requests(store)))
                    [r] = [r for r in stalled_requests(store) if r["what"] == "PUT big.pt"]
                    assert r["key"] == "big.pt"
                    assert r["phase"] == SENDING and 0 < int(str(r["sent"])) < len(data)
                    assert store.requests_view()["stalled"] >= 1
            assert stats.errors.get(STALLED, 0) >= 1
            assert "PUT big.pt: stalled: no progress for 3 s while sending" in stats.last_error
            assert await store.get("big.pt") == data
            assert store.requests_view()["stalls"] >= 1

    trio.run(go)


def test_an_answer_that_stops_mid_body_is_a_stall_and_the_get_is_retried(
    s3_endpoint: str, bucket: str, tmp_path: Path
) -> None:
    """A GET whose answer stops half-way (whole, or into a file) is cancelled at the stall
    deadline and read again; what arrived before counts (get_into resumes)."""
    data = os.urandom(6 << 20)

    async def go(tmp: Path) -> None:
        async with proxied(s3_endpoint, bucket) as (store, proxy):
            await store.put("obj.pt", data, {})
            stats = RetryStats()
            proxy.add(Fault("stop-sending", "GET", "/obj.pt", count=2))
            with trio.fail_after(60):
                got = await retrying("get", lambda: store.get("obj.pt"), FAST, stats)
                assert got == data
                fd = os.open(tmp, os.O_RDWR | os.O_CREAT, 0o600)
                try:
                    get = functools.partial(store.get_into, "obj.pt", 0, len(data), fd)
                    await retrying("get_into", get, FAST, stats)
                finally:
                    os.close(fd)
            assert tmp.read_bytes() == data
            assert stats.errors.get(STALLED, 0) >= 2
            assert "while receiving" in stats.last_error
            assert outcomes(proxy, "obj.pt").count("stop-sending") == 2

    trio.run(go, tmp_path / "got")


def test_part_workers_hold_to_the_same_deadlines_and_say_so(
    s3_endpoint: str, bucket: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A part sent by a worker process: the worker finds the endpoint ignores Expect and
    the daemon's store learns it; a part that stalls there is logged by the daemon and
    listed as stalled in its status, then cancelled there and sent again."""
    parts = [os.urandom(5 << 20), os.urandom(24 << 20)]
    path = tmp_path / "cache-file"
    path.write_bytes(b"".join(parts))

    async def go() -> None:
        deadlines = Deadlines(stall_timeout=3, stall_warning=0.5)
        async with proxied(s3_endpoint, bucket, deadlines, part_workers=1) as (store, proxy):
            proxy.ignore_expect = True
            stats = RetryStats()
            fd = os.open(path, os.O_RDONLY)
            try:
                uid = await store.create_multipart("w.pt", {})
                with trio.fail_after(60):
                    etag1, _ = await store.upload_part_from("w.pt", uid, 1, fd, 0, len(parts[0]))
                assert store.expect_continue is False  # the worker found out; the daemon knows
                assert store.no_continue is not None and proxy.url in store.no_continue
                proxy.add(Fault("stop-reading", "PUT", r"partNumber=2(&|$)"))
                send = functools.partial(
                    store.upload_part_from, "w.pt", uid, 2, fd, len(parts[0]), len(parts[1])
                )
                with trio.fail_after(60):
                    async with trio.open_nursery() as nursery:
                        result: list[tuple[str, int]] = []

                        async def part2() -> None:
                            result.append(await retrying("part 2", send, FAST, stats))

                        nursery.start_soon(part2)
                        await until("part 2 to stall", lambda: bool(stalled_requests(store)))
                        [r] = [r for r in stalled_requests(store) if r["what"] == "PART 2 of w.pt"]
                        assert r["phase"] == SENDING
                etags = [etag1, result[0][0]]
                await store.complete_multipart("w.pt", uid, etags)
            finally:
                os.close(fd)
            assert stats.errors.get(STALLED, 0) >= 1
            assert await store.get("w.pt") == b"".join(parts)
            assert len(proxy.expected) == 1 and "partNumber=1" in proxy.expected[0]
            assert store.requests_view()["stalls"] >= 1

    trio.run(go)
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert sum("did not answer Expect: 100-continue" in m for m in said) == 1
    assert sum("PART 2 of w.pt: stalled at http://127.0.0.1:" in m for m in said) == 1


# -- through a mount ---------------------------------------------------------------------------


def mount_s3(
    gateway: GatewayFactory,
    tmp_path: Path,
    endpoint: str,
    bucket: str,
    part_size: str = "5MiB",
    **store: float,
) -> tuple[CheckedGateway, FaultProxy, int]:
    """A mounted gateway draining to ``bucket`` through a fault proxy, with these
    ``[store]`` settings and metrics on a free port."""
    proxy = FaultProxy(int(endpoint.rsplit(":", 1)[1]))
    port = free_port()
    cfg = tmp_path / "gw.toml"
    lines = ["[store]", *(f"{k} = {v!r}" for k, v in store.items())]
    lines += [
        "[drain]",
        "settle = 0.1",
        f'part_size = "{part_size}"',
        'multipart_threshold = "5MiB"',
    ]
    lines += ["[metrics]", f'listen = "127.0.0.1:{port}"']
    cfg.write_text("\n".join(lines) + "\n")
    gw = gateway(
        "gw", "--config", str(cfg), "--endpoint-url", proxy.url, store=f"s3://{bucket}/ckpt/"
    )
    return gw, proxy, port


def in_store(endpoint: str, bucket: str, key: str) -> bytes | None:
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    try:
        return bytes(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    except s3.exceptions.NoSuchKey:
        return None


def warned_once(gw: CheckedGateway, text: str, endpoint: str) -> None:
    """The daemon's log says ``text`` once, as a warning naming the endpoint."""
    log = (gw.cache_dir / "ckptgw.log").read_text()
    said = [ln for ln in log.splitlines() if text in ln]
    assert len(said) == 1 and " WARNING " in said[0] and endpoint in said[0], said


@needs_fuse
@any_data_path
def test_through_a_mount_an_endpoint_that_ignores_expect_is_drained_and_said_once(
    gateway: GatewayFactory, tmp_path: Path, s3_endpoint: str, bucket: str
) -> None:
    """The user's view of the defect: behind an endpoint that never answers Expect:
    100-continue, files used to stay at 0 bytes sent for ever with "no errors". Now they
    end in the store; status says the endpoint does not speak it, the log says so once."""
    gw, proxy, port = mount_s3(gateway, tmp_path, s3_endpoint, bucket)
    try:
        proxy.ignore_expect = True
        big, small = os.urandom(12 << 20), os.urandom(3000)
        (gw.mountpoint / "run").mkdir()
        (gw.mountpoint / "run" / "big.pt").write_bytes(big)
        (gw.mountpoint / "run" / "small.pt").write_bytes(small)
        wait_for(
            "both files in the store",
            lambda: (
                in_store(s3_endpoint, bucket, "ckpt/run/big.pt") == big
                and in_store(s3_endpoint, bucket, "ckpt/run/small.pt") == small
            ),
        )
        st = gw.status()
        req = st["store_requests"]
        assert req["endpoint"] == proxy.url and req["expect_continue"] is False
        assert "did not answer Expect: 100-continue in 1 s" in req["no_continue"]
        assert st["errors"] == {}  # not an error: the same requests, in the form it speaks
        text = gw.cli("status", str(gw.mountpoint)).stdout
        assert f"endpoint  {proxy.url}: Expect: 100-continue off (" in text
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        assert f'ckptgw_store_expect_continue{{endpoint="{proxy.url}"'.encode() in metrics
        warned_once(gw, "did not answer Expect: 100-continue", proxy.url)
    finally:
        gw.stop()
        proxy.close()


@needs_fuse
@any_data_path
def test_through_a_mount_a_stalled_part_is_named_in_status_metrics_and_log_then_retried(
    gateway: GatewayFactory, tmp_path: Path, s3_endpoint: str, bucket: str
) -> None:
    """A part whose body the endpoint stops reading: status (text and JSON) and the metrics
    name it (which part of which file, doing what, at which endpoint) while it is stalled;
    the log says it once; at the stall deadline it is cancelled, counted as "stalled" and
    sent again, and the file ends in the store."""
    # Parts of 16 MiB: more than the socket buffers between the gateway and the proxy hold.
    gw, proxy, port = mount_s3(
        gateway, tmp_path, s3_endpoint, bucket, "16MiB", stall_warning=0.5, stall_timeout=8.0
    )
    try:
        proxy.add(Fault("stop-reading", "PUT", r"partNumber=2(&|$)", after=256 << 10))
        data = os.urandom(32 << 20)
        (gw.mountpoint / "latest.pt").write_bytes(data)

        def stalled() -> list[dict[str, object]]:
            return [r for r in gw.status()["store_requests"]["requests"] if r["stalled"]]

        wait_for("part 2 to be stalled", lambda: bool(stalled()))
        st = gw.status()
        part2 = [r for r in st["store_requests"]["requests"] if r["what"].startswith("PART 2 ")]
        [r] = [r for r in part2 if r["stalled"]]
        assert r["what"] == "PART 2 of ckpt/latest.pt" and r["phase"] == "sending"
        assert r["path"] == str(gw.mountpoint / "latest.pt")
        [upload] = st["uploads"]
        assert "PART 2 of ckpt/latest.pt (sending)" in upload["stalled"]
        schema = resources.files("gateway.daemon").joinpath("status.schema.json").read_text()
        jsonschema.validate(st, json.loads(schema))
        text = gw.cli("status", str(gw.mountpoint)).stdout
        assert f"endpoint  {proxy.url}: 1 of " in text
        assert f"STALLED   PART 2 of ckpt/latest.pt ({gw.mountpoint / 'latest.pt'}): no " in text
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        stalled_now = re.search(
            rb'ckptgw_store_requests_stalled\{endpoint="[^"]*",mountpoint="[^"]*"\} (\S+)', metrics
        )
        assert stalled_now is not None and float(stalled_now.group(1)) >= 1
        wait_for(
            "the file in the store", lambda: in_store(s3_endpoint, bucket, "ckpt/latest.pt") == data
        )
        st = gw.status()
        assert st["errors"].get("Stalled", 0) >= 1
        assert (
            "PART 2 of ckpt/latest.pt: stalled: no progress for 8 s while sending"
            in (st["last_error"])
        )
        warned_once(gw, "PART 2 of ckpt/latest.pt: stalled at", proxy.url)
    finally:
        gw.stop()
        proxy.close()


@needs_fuse
@any_data_path
def test_the_mount_check_against_a_store_that_never_answers_says_what_it_waits_for(
    gateway: GatewayFactory, tmp_path: Path, s3_endpoint: str, bucket: str
) -> None:
    """An endpoint that accepts connections and never answers: ``ckptgw mount`` used to
    print nothing for 120 s, then give up on a daemon still waiting. Now each try of the
    check ends at its deadline, mount prints what it waits for as it waits, and mounts
    with a warning (the store may come back: the drain retries)."""
    gw, proxy, _ = mount_s3(gateway, tmp_path, s3_endpoint, bucket, first_byte_timeout=2.0)
    gw.stop()  # mounted once, fine; now the endpoint goes silent
    proxy.add(Fault("silent", "HEAD", ".*", count=1000))
    try:
        r = gw.try_mount()
        assert r.returncode == 0, r.stderr
        lines = r.stderr.splitlines()
        waiting = [ln for ln in lines if ln.startswith("ckptgw: checking the store")]
        assert waiting and f"at {proxy.url}" in waiting[0]
        assert "of 3, each waits up to 2 s for an answer)" in waiting[0]
        [warning] = [ln for ln in lines if ln.startswith("ckptgw: warning:")]
        assert f"no answer from {proxy.url} in 2 s" in warning
        assert "data stays in the cache until this is fixed" in warning
        log = (gw.cache_dir / "ckptgw.log").read_text()
        assert f"checking the store s3://{bucket}/ckpt/ at {proxy.url}" in log
    finally:
        gw.stop()
        proxy.close()
