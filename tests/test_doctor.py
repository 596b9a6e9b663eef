"""``ckptgw doctor`` through the CLI: against S3 on loopback (moto), a file:// store, bad
buckets, credentials and endpoints, mountpoints and config files; and the clock-skew rule."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ckptgw.gateway.hostcheck import FAIL, INFO, OK, WARN
from ckptgw.gateway.storeprobe import clock_check
from tests.conftest import GatewayFactory, needs_fuse

# Lines whose status depends on the machine, not on what the test set up.
_MACHINE = ("passthrough", "O_DIRECT", "is on this node")


def doctor(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ckptgw.gateway.cli", "doctor", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def lines(r: subprocess.CompletedProcess[str], label: str) -> list[str]:
    return [line for line in r.stdout.splitlines() if line.split(" ", 1)[0] == label]


def line_with(r: subprocess.CompletedProcess[str], label: str, needle: str) -> str:
    """The one line with ``label`` (ok, warn, info, FAIL) that says ``needle``."""
    found = [x for x in lines(r, label) if needle in x]
    assert len(found) == 1, f"no one {label} line with {needle!r} in:\n{r.stdout}"
    return found[0]


def file_store(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    store = f"file://{tmp_path / 'store'}"
    return doctor("--store", store, "--cache-dir", str(tmp_path / "cache"), *extra)


@needs_fuse
def test_all_ok_against_s3_and_nothing_left_in_the_bucket(
    s3_endpoint: str, bucket: str, tmp_path: Path
) -> None:
    import boto3

    (tmp_path / "mnt").mkdir()
    store = f"s3://{bucket}/run1/"
    r = doctor(
        "--store", store, "--endpoint-url", s3_endpoint, "--cache-dir", str(tmp_path / "c"),
        str(tmp_path / "mnt"),
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    # moto listens on loopback: as MinIO on the node would, so the place is a warning
    assert "is on this node: if that server keeps its data here" in line_with(
        r, "warn", f"store endpoint {s3_endpoint}"
    )
    for line in r.stdout.splitlines():
        assert line.startswith("ok ") or any(m in line for m in _MACHINE), line
    for needle in (
        "/dev/fuse and fusermount3",
        "AWS credentials found (env)",
        f"store endpoint {s3_endpoint} answers",
        f"bucket {bucket} exists",
        f"store {store}: PUT, GET and DELETE of run1/.ckptgw-doctor/",
        f"store {store}: multipart upload (create, abort)",
        f"bucket {bucket}: lifecycle rules readable",
        "clock agrees with the store's",
        f"mountpoint {tmp_path / 'mnt'} is an empty directory, not mounted",
        "cache dir not in use",
    ):
        assert any(needle in line for line in lines(r, "ok")), (needle, r.stdout)
    s3 = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    assert s3.list_objects_v2(Bucket=bucket).get("KeyCount") == 0
    assert not s3.list_multipart_uploads(Bucket=bucket).get("Uploads")
    assert not (tmp_path / "c").exists()  # a cache dir is made by the mount, not by doctor


def test_a_misspelled_bucket_is_named(s3_endpoint: str, s3_env: dict[str, str]) -> None:
    r = doctor("--store", "s3://bukcet-misspelled/run/", "--endpoint-url", s3_endpoint)
    assert r.returncode == 1
    fail = line_with(r, "FAIL", "store s3://bukcet-misspelled/run/")
    assert "bucket 'bukcet-misspelled' does not exist" in fail and "check the bucket name" in fail
    assert f"store endpoint {s3_endpoint} answers" in r.stdout  # the endpoint is not blamed


def test_wrong_credentials_fail_without_showing_them(
    s3_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.s3server import moto_server

    key_id, secret = "AKIADOCTORTEST4711", "not-the-right-secret-4711"
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    with moto_server({"INITIAL_NO_AUTH_ACTION_COUNT": "0"}) as endpoint:
        r = doctor("--store", "s3://some-bucket/", "--endpoint-url", endpoint)
    assert r.returncode == 1
    fail = line_with(r, "FAIL", "store s3://some-bucket/")
    assert "check the credentials" in fail
    assert "AWS credentials found (env)" in r.stdout  # where they came from, never what
    for shown in (r.stdout, r.stderr):
        assert secret not in shown and key_id not in shown


def test_an_endpoint_that_refuses_connections(s3_env: dict[str, str]) -> None:
    from tests.s3server import free_port

    endpoint = f"http://127.0.0.1:{free_port()}"
    r = doctor("--store", "s3://bkt/p/", "--endpoint-url", endpoint, "--json")
    assert r.returncode == 1
    found = {c["check"]: c for c in json.loads(r.stdout)}
    assert found["endpoint"]["status"] == FAIL
    assert f"{endpoint} does not answer" in found["endpoint"]["message"]
    assert "bucket" not in found and "round-trip" not in found  # nothing more to learn


def test_a_local_file_store_is_refused_unless_allowed_then_a_warning(tmp_path: Path) -> None:
    r = file_store(tmp_path)
    assert r.returncode == 1
    fail = line_with(r, "FAIL", "is lost with this node")
    assert "--allow-local-store" in fail
    assert not (tmp_path / "store").exists()  # refused: not made either

    r = file_store(tmp_path, "--allow-local-store", "--json")
    found = json.loads(r.stdout)
    assert all(set(c) == {"check", "status", "message"} for c in found)
    by_check = {c["check"]: c for c in found}
    assert by_check["store-place"]["status"] == WARN
    assert "not safe from losing this node" in by_check["store-place"]["message"]
    for check in ("store-dir", "round-trip", "multipart"):
        assert by_check[check]["status"] == OK, by_check[check]
    assert "clock" not in by_check  # a directory has no clock to compare
    assert sorted(os.listdir(tmp_path / "store")) == [".ckptgw-tmp", ".ckptgw-uploads"]
    if by_check["fuse"]["status"] == OK:
        assert r.returncode == 0  # a warning does not fail the run


def test_mountpoint_problems(tmp_path: Path) -> None:
    mp = tmp_path / "mnt"
    mp.mkdir()
    (mp / "left-over.pt").write_bytes(b"x")
    r = file_store(tmp_path, "--allow-local-store", str(mp))
    assert r.returncode == 1
    line_with(r, "FAIL", f"mountpoint {mp} is not empty (1 entries: left-over.pt)")

    r = file_store(tmp_path, "--allow-local-store", str(tmp_path / "none"))
    assert r.returncode == 1
    line_with(r, "FAIL", f"mountpoint {tmp_path / 'none'} does not exist: mkdir -p")

    r = file_store(tmp_path, "--allow-local-store", "--json")  # no mountpoint: not checked
    assert "mountpoint" not in {c["check"] for c in json.loads(r.stdout)}


def test_a_bad_config_file_is_one_failed_line_and_the_rest_still_runs(tmp_path: Path) -> None:
    cfg = tmp_path / "ckptgw.toml"
    cfg.write_text("[cache]\nreserv = '1GiB'\n")
    r = file_store(tmp_path, "--allow-local-store", "--config", str(cfg))
    assert r.returncode == 1
    fail = line_with(r, "FAIL", "unknown key cache.reserv")
    assert "the checks below use the flags" in fail
    assert "PUT, GET and DELETE" in r.stdout

    cfg.write_text("[cache]\nreserve = '1GiB'\n")
    r = file_store(tmp_path, "--allow-local-store", "--config", str(cfg))
    assert f"ok    config file {cfg} loads" in r.stdout
    assert "cache.reserve 1.0 GiB" in r.stdout


def test_clock_skew_classification() -> None:
    server = 1_800_000_000.0  # the store's Date, seconds since the epoch
    assert clock_check(server, server + 0.4).status == OK
    assert clock_check(server, server - 59).status == OK
    ahead = clock_check(server, server + 61)
    assert ahead.status == WARN and "61 s ahead of the store's" in ahead.message
    behind = clock_check(server, server - 14 * 60)
    assert behind.status == WARN and "840 s behind" in behind.message
    refused = clock_check(server, server + 15 * 60 + 1)
    assert refused.status == FAIL and "S3 refuses" in refused.message
    assert clock_check(server, server - 3600).status == FAIL
    assert clock_check(None, server).status == INFO  # no Date header: nothing to compare


@needs_fuse
def test_a_running_gateway_is_information_not_a_failure(gateway: GatewayFactory) -> None:
    gw = gateway()
    r = doctor(
        "--store", gw.store, "--allow-local-store", "--cache-dir", str(gw.cache_dir),
        str(gw.mountpoint),
    )  # fmt: skip
    line_with(r, "info", f"cache dir {gw.cache_dir} is in use by a running gateway (pid ")
    line_with(r, "info", f"mountpoint {gw.mountpoint}: a gateway is mounted there")
    assert r.returncode == 0, r.stdout
