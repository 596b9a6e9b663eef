"""The drain through a real mount: every file reaches the store under its own path, byte for
byte, and renames, unlinks and writes before, during and after the upload leave the store
with the current data under the current names only. Against the file store and against a
real S3 HTTP API (moto) behind a fault-injecting proxy."""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import boto3
import jsonschema
import pytest
import xxhash

from ckptgw.gateway.client import mount_of
from ckptgw.gateway.mountpoint import mounted_fstype
from ckptgw.store.faultproxy import Fault, FaultProxy
from tests.conftest import CheckedGateway, GatewayFactory, any_data_path, needs_fuse

pytestmark = [pytest.mark.mount, needs_fuse]


def wait_for(what: str, predicate: Callable[[], bool], timeout: float = 60) -> None:
    """Poll until ``predicate`` holds (a bounded wait, not a timing assertion)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def file_store_objects(root: Path) -> dict[str, bytes]:
    """Objects of a file store: every file below its root but the store's own staging, and
    directory markers under their keys ("a/b/")."""
    out = {}
    # os.walk, not rglob: the store removes emptied directories while we walk (a move of a
    # directory's objects), and os.walk skips a directory that vanished instead of raising.
    for dirpath, _, names in os.walk(root):
        for name in names:
            p = Path(dirpath) / name
            rel = p.relative_to(root).as_posix()
            if name == ".ckptgw-dir":  # a directory's marker object, "a/b/"
                rel = rel.removesuffix(name)
            elif rel.startswith(".ckptgw-") or name.startswith(".ckptgw-"):
                continue
            try:
                out[rel] = p.read_bytes()
            except FileNotFoundError:
                continue  # deleted between the listing and the read
    return out


@dataclass
class Bucket:
    """A read-only view of what the store holds, for assertions."""

    objects: Callable[[], dict[str, bytes]]
    metadata: Callable[[str], dict[str, str]]


@dataclass
class DrainSetup:
    gw: CheckedGateway
    store: Bucket
    proxy: FaultProxy | None


def write_config(path: Path, **drain: object) -> Path:
    lines = ["[drain]"] + [
        f"{k} = {v!r}" if not isinstance(v, str) else f'{k} = "{v}"' for k, v in drain.items()
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(params=["file", "s3"])
def drain(
    request: pytest.FixtureRequest, gateway: GatewayFactory, tmp_path: Path
) -> Iterator[Callable[..., DrainSetup]]:
    proxies: list[FaultProxy] = []

    def make(**drain_cfg: object) -> DrainSetup:
        drain_cfg = {"settle": 0.2, "part_size": "5MiB", "multipart_threshold": "5MiB"} | drain_cfg
        cfg = write_config(tmp_path / "drain.toml", **drain_cfg)
        if request.param == "file":
            root = tmp_path / "store"
            gw = gateway("gw", "--config", str(cfg), store=f"file://{root}")

            def objects() -> dict[str, bytes]:
                return file_store_objects(root)

            def metadata(key: str) -> dict[str, str]:
                import json

                return dict(json.loads(os.getxattr(root / key, "user.ckptgw")))

            return DrainSetup(gw, Bucket(objects, metadata), None)
        endpoint = request.getfixturevalue("s3_endpoint")
        bucket = request.getfixturevalue("bucket")
        proxy = FaultProxy(int(endpoint.rsplit(":", 1)[1]))
        proxies.append(proxy)
        gw = gateway(
            "gw", "--config", str(cfg), "--endpoint-url", proxy.url, store=f"s3://{bucket}/ckpt/"
        )
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")

        def s3_objects() -> dict[str, bytes]:
            out = {}
            for o in s3.list_objects_v2(Bucket=bucket, Prefix="ckpt/").get("Contents", []):
                try:
                    body = s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()
                except s3.exceptions.NoSuchKey:
                    continue  # deleted between the listing and the read: the drain is moving
                out[o["Key"].removeprefix("ckpt/")] = body
            return out

        def s3_metadata(key: str) -> dict[str, str]:
            return dict(s3.head_object(Bucket=bucket, Key=f"ckpt/{key}")["Metadata"])

        return DrainSetup(gw, Bucket(s3_objects, s3_metadata), proxy)

    yield make
    for p in proxies:
        p.close()


def settle_on(store: Bucket, files: dict[str, bytes], timeout: float = 60) -> None:
    """Wait until the store holds exactly these objects. A directory that holds an entry and
    looks as a listing would show it has no marker (tests/test_dirmarkers.py): ``files``
    names the markers expected."""
    expected = dict(files)

    def done() -> bool:
        return store.objects() == expected

    try:
        wait_for("the store to hold exactly the expected objects", done, timeout)
    except AssertionError:
        got = store.objects()
        raise AssertionError(
            f"store has {sorted(got)} (sizes {[len(v) for v in got.values()]}), "
            f"expected {sorted(expected)}"
        ) from None


def test_files_reach_the_store_byte_for_byte(drain: Callable[..., DrainSetup]) -> None:
    d = drain()
    mnt = d.gw.mountpoint
    small, big = os.urandom(1000), os.urandom(13 << 20) + b"tail"
    (mnt / "run1" / "step_1").mkdir(parents=True)
    (mnt / "run1" / "step_1" / "small.pt").write_bytes(small)
    (mnt / "run1" / "step_1" / "big.pt").write_bytes(big)
    (mnt / "empty").write_bytes(b"")
    settle_on(d.store, {"run1/step_1/small.pt": small, "run1/step_1/big.pt": big, "empty": b""})
    assert d.store.metadata("run1/step_1/small.pt")["xxh3-128"] == xxhash.xxh3_128_hexdigest(small)
    meta = d.store.metadata("run1/step_1/big.pt")  # a multipart upload: the store's CRC32
    assert meta["part-size"] == str(5 << 20) and "xxh3-128" not in meta
    assert meta["size"] == str(len(big))


def test_a_save_renamed_into_place_goes_at_once_under_its_final_key_only(
    drain: Callable[..., DrainSetup],
) -> None:
    """The rename ends a save (temp file, fsync, rename): the file goes without waiting out
    its settle delay (here 10 minutes, so nothing else could have sent it), and no request
    names the temp file. A file written and closed but not renamed waits it out."""
    d = drain(settle=600.0, yield_to_saves=0)  # with a 600 s settle, later.pt is a long burst
    mnt = d.gw.mountpoint
    data = os.urandom(6 << 20)
    (mnt / "later.pt").write_bytes(b"not renamed")
    with open(mnt / "ckpt.pt.tmp", "wb") as f:
        f.write(data)
        os.fsync(f.fileno())
    os.rename(mnt / "ckpt.pt.tmp", mnt / "ckpt.pt")
    settle_on(d.store, {"ckpt.pt": data})
    if d.proxy is not None:  # no request ever named the temp file
        assert not [p for _, p, _ in d.proxy.log if "tmp" in p]
    mount, _ = mount_of(mnt)
    left = mount.request("pending", paths=["later.pt"], wait=0.2)
    assert [f["path"] for f in left["files"]] == [str(mnt / "later.pt")]


def test_rename_and_unlink_of_drained_data(drain: Callable[..., DrainSetup]) -> None:
    d = drain()
    mnt = d.gw.mountpoint
    (mnt / "old").mkdir()
    files = {f"old/rank_{i}.distcp": os.urandom(2000 + i) for i in range(30)}
    for k, v in files.items():
        (mnt / k).write_bytes(v)
    (mnt / "gone.pt").write_bytes(b"bye")
    (mnt / "a.pt").write_bytes(b"A")
    settle_on(d.store, files | {"gone.pt": b"bye", "a.pt": b"A"})
    os.rename(mnt / "old", mnt / "new")  # a directory of drained files: copy + delete each
    os.unlink(mnt / "gone.pt")
    os.rename(mnt / "a.pt", mnt / "b.pt")
    renamed = {k.replace("old/", "new/"): v for k, v in files.items()}
    settle_on(d.store, renamed | {"b.pt": b"A"})


def test_changes_during_the_upload_end_with_current_data_only(
    drain: Callable[..., DrainSetup],
) -> None:
    d = drain(max_parts=1)
    mnt = d.gw.mountpoint
    if d.proxy is not None:  # hold each upload mid-way so the changes land during it
        d.proxy.add(Fault("stall", "PUT", r"partNumber=2", count=3, seconds=1.5))
    v1, v2 = os.urandom(12 << 20), os.urandom(11 << 20)
    (mnt / "written.pt").write_bytes(v1)
    (mnt / "renamed.pt").write_bytes(v1)
    (mnt / "unlinked.pt").write_bytes(v1)
    (mnt / "truncated.pt").write_bytes(v1)
    time.sleep(0.6)  # let the uploads start (settle 0.2 s); the outcome must not depend on it
    (mnt / "written.pt").write_bytes(v2)
    os.rename(mnt / "renamed.pt", mnt / "final.pt")
    os.unlink(mnt / "unlinked.pt")
    os.truncate(mnt / "truncated.pt", 4096)
    settle_on(d.store, {"written.pt": v2, "final.pt": v1, "truncated.pt": v1[:4096]})


def part_workers_of(daemon: int) -> list[int]:
    """The daemon's part worker processes (ckptgw.store.partpool)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        state, ppid = stat.rsplit(") ", 1)[1].split()[:2]
        if int(ppid) == daemon and state != "Z" and b"ckptgw.store.partworker" in cmdline:
            found.append(int(entry))
    return found


@pytest.mark.parametrize("drain", ["s3"], indirect=True)  # holds a part at the S3 proxy
def test_a_part_worker_killed_mid_upload_loses_nothing(drain: Callable[..., DrainSetup]) -> None:
    d = drain(part_workers=1, max_parts=2)
    assert d.proxy is not None and d.gw.pid is not None
    daemon = d.gw.pid
    [worker] = part_workers_of(daemon)
    hold = d.proxy.add(Fault("hold", "PUT", r"partNumber=3(&|$)", drop=True))
    data = os.urandom(20 << 20)  # 4 parts of 5 MiB
    (d.gw.mountpoint / "big.pt").write_bytes(data)
    proxy = d.proxy
    wait_for("part 3 to be held", lambda: any(o == "hold" for _, _, o in proxy.log))
    os.kill(worker, signal.SIGKILL)
    wait_for("another part worker", lambda: part_workers_of(daemon) not in ([], [worker]))
    hold.release()
    settle_on(d.store, {"big.pt": data})
    assert d.store.metadata("big.pt")["part-size"] == str(5 << 20)
    log = (d.gw.cache_dir / "ckptgw.log").read_text()
    assert f"part worker {worker} ended (killed by signal 9)" in log
    [replacement] = part_workers_of(daemon)
    status = d.gw.status()
    schema = resources.files("gateway.daemon").joinpath("status.schema.json").read_text()
    jsonschema.validate(status, json.loads(schema))
    pool = status["part_workers"]  # each of the 4 parts answered once, in the end
    assert pool == {"configured": 1, "running": 1, "replaced": 1, "parts": 4, "in_use": True}
    text = d.gw.cli("status", str(d.gw.mountpoint)).stdout
    assert "part workers 1 of 1 running, 1 replaced, 4 parts sent" in text
    d.gw.kill()  # a crashed daemon takes its workers with it
    wait_for("the part worker to exit", lambda: not Path(f"/proc/{replacement}").exists())


@pytest.mark.parametrize("drain", ["s3"], indirect=True)  # counts requests at the S3 proxy
def test_resume_after_sigkill_does_not_resend_finished_parts(
    drain: Callable[..., DrainSetup],
) -> None:
    d = drain(max_parts=1, settle=0.1)
    assert d.proxy is not None
    data = os.urandom(30 << 20)  # 6 parts of 5 MiB
    d.proxy.add(Fault("stall", "PUT", r"partNumber=4", count=1, seconds=30))
    (d.gw.mountpoint / "big.pt").write_bytes(data)
    proxy = d.proxy

    def parts() -> list[str]:
        return [p for m, p, _ in proxy.log if m == "PUT" and "partNumber" in p]

    wait_for("parts 1-3 to be sent and part 4 to stall", lambda: len(parts()) >= 4)
    d.gw.kill()
    acked = {
        p.split("partNumber=")[1].split("&")[0]
        for m, p, outcome in proxy.log
        if m == "PUT" and "partNumber" in p and outcome == "ok"
    }
    assert len(acked) >= 3, acked
    d.proxy.log.clear()
    d.gw.start()
    settle_on(d.store, {"big.pt": data})
    resent = {p.split("partNumber=")[1].split("&")[0] for p in parts()}
    assert resent.isdisjoint(acked), f"parts sent again after resume: {resent & acked}"
    assert "resuming upload" in (d.gw.cache_dir / "ckptgw.log").read_text()


@pytest.mark.parametrize("drain", ["s3"], indirect=True)  # faults injected at the S3 proxy
def test_faults_lose_nothing(drain: Callable[..., DrainSetup]) -> None:
    d = drain()
    assert d.proxy is not None
    d.proxy.add(Fault("slowdown", "PUT", ".*", count=3))
    d.proxy.add(Fault("reset", "PUT", r"partNumber", count=2))
    files = {f"f{i}.pt": os.urandom((7 << 20) if i % 2 else 3000) for i in range(6)}
    for k, v in files.items():
        (d.gw.mountpoint / k).write_bytes(v)
    settle_on(d.store, files)
    kinds = [o for _, _, o in d.proxy.log]
    assert kinds.count("slowdown") == 3 and kinds.count("reset") == 2


@pytest.mark.parametrize("drain", ["s3"], indirect=True)
@any_data_path
def test_a_part_that_keeps_failing_delays_only_its_file(drain: Callable[..., DrainSetup]) -> None:
    """A part that fails through every retry fails its upload, not the gateway: the file is
    tried again later and arrives; the others are not held up."""
    d = drain()
    assert d.proxy is not None
    attempts = 8  # RetryPolicy.attempts: one more failure than the retries absorb
    # a reset, not a 503 SlowDown: a refusal as too many is retried in the pace's turns
    # (tests/test_pacing.py), up to RetryPolicy.refusals
    d.proxy.add(Fault("reset", "PUT", r"partNumber=2(&|$)", count=attempts))
    big, small = os.urandom(12 << 20), os.urandom(1000)
    (d.gw.mountpoint / "big.pt").write_bytes(big)
    (d.gw.mountpoint / "small.pt").write_bytes(small)
    settle_on(d.store, {"big.pt": big, "small.pt": small})
    assert [o for _, _, o in d.proxy.log].count("reset") == attempts
    log = (d.gw.cache_dir / "ckptgw.log").read_text()
    assert "big.pt failed (" in log and "retrying in" in log


def test_missing_bucket_fails_the_mount_with_what_to_fix(
    gateway: GatewayFactory, s3_endpoint: str, bucket: str
) -> None:
    """A misspelled bucket would strand every checkpoint written to the mount: the mount is
    refused with one line naming the bucket, and nothing is mounted. The cache dir that the
    refused mount made holds nothing, so the right bucket is then taken with no more steps."""
    wrong = f"bukcet-{uuid.uuid4().hex[:12]}"  # made by no other test
    gw = gateway("gw", "--endpoint-url", s3_endpoint, store=f"s3://{wrong}/run/", start=False)
    gw.expect_errors = True  # the refusal is logged as an error
    r = gw.try_mount()
    assert r.returncode != 0
    assert r.stderr.startswith("ckptgw: ") and r.stderr.count("\n") == 1, r.stderr
    assert f"bucket {wrong!r} does not exist" in r.stderr and "check the bucket name" in r.stderr
    assert mounted_fstype(gw.mountpoint.resolve()) is None
    gw.store = f"s3://{bucket}/run/"
    gw.start()
    (gw.mountpoint / "a.pt").write_bytes(b"x")
    gw.stop(drain=True)
    s3 = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    assert s3.get_object(Bucket=bucket, Key="run/a.pt")["Body"].read() == b"x"


def test_bucket_gone_after_mount_keeps_the_data_until_it_is_back(
    gateway: GatewayFactory, s3_endpoint: str, s3_env: object, tmp_path: Path
) -> None:
    """A permanent error after the mount (the bucket deleted) keeps the data in the cache and
    the drain retrying: once the cause is fixed the data drains, with no remount."""
    cfg = write_config(tmp_path / "d.toml", settle=0.1, permanent_retry=0.5)
    bucket = f"late-bucket-{uuid.uuid4().hex[:12]}"  # made by no other test
    s3 = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    s3.create_bucket(Bucket=bucket)
    gw = gateway("gw", "--config", str(cfg), "--endpoint-url", s3_endpoint, store=f"s3://{bucket}/")
    s3.delete_bucket(Bucket=bucket)
    gw.expect_errors = True  # the failed uploads are logged as errors, by design
    (gw.mountpoint / "kept.pt").write_bytes(b"written while the bucket was missing")
    wait_for(
        "the drain to fail on the missing bucket",
        lambda: "bucket does not exist" in (gw.cache_dir / "ckptgw.log").read_text(),
    )
    s3.create_bucket(Bucket=bucket)  # the cause is fixed: no remount needed
    wait_for(
        "the upload after the bucket exists",
        lambda: s3.list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 1,
    )
    body = s3.get_object(Bucket=bucket, Key="kept.pt")["Body"].read()
    assert body == b"written while the bucket was missing"


def test_wrong_credentials_fail_the_mount_and_are_never_shown(
    gateway: GatewayFactory,
    s3_env: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tests.s3server import moto_server

    secret = "not-the-right-secret-4711"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    with moto_server({"INITIAL_NO_AUTH_ACTION_COUNT": "0"}) as endpoint:
        gw = gateway("gw", "--endpoint-url", endpoint, store="s3://some-bucket/", start=False)
        gw.expect_errors = True  # the refusal is logged as an error
        r = gw.try_mount()
        assert r.returncode != 0 and r.stderr.count("\n") == 1, r.stderr
        assert "check the credentials" in r.stderr and "not mounted" in r.stderr
        assert mounted_fstype(gw.mountpoint.resolve()) is None
    log = (gw.cache_dir / "ckptgw.log").read_text()
    assert secret not in log and secret not in r.stderr


def test_unreachable_default_endpoint_says_to_set_endpoint_url(
    gateway: GatewayFactory, s3_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without --endpoint-url the store is AWS S3; where that cannot be reached (here: no
    network) the user most likely meant an S3-compatible store."""
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    gw = gateway("gw", store="s3://some-bucket/", start=False)
    gw.env.pop("AWS_ENDPOINT_URL", None)
    gw.expect_errors = True  # the refusal is logged as an error
    r = gw.try_mount()
    assert r.returncode != 0 and r.stderr.count("\n") == 1, r.stderr
    assert "set --endpoint-url" in r.stderr
