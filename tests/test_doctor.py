"""``ckptgw doctor`` through the CLI: against S3 on loopback (moto), a file:// store, bad
buckets, credentials and endpoints, mountpoints and config files; and the clock-skew rule."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ckptgw.gateway.doctor.hostcheck import FAIL, INFO, OK, WARN
from ckptgw.gateway.doctor.storeprobe import clock_check
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
def test_a_running_gateway_is_checked_as_it_runs(gateway: GatewayFactory) -> None:
    """On a running gateway's mountpoint doctor checks that mount, named in its first line,
    not the defaults of this shell (which would be another store and cache dir)."""
    gw = gateway()
    r = doctor(str(gw.mountpoint))
    assert r.returncode == 0, r.stdout + r.stderr
    first = r.stdout.splitlines()[0]
    assert first.startswith(f"info  checking the running gateway at {gw.mountpoint} (pid "), first
    assert f"store {gw.store}" in first and f"cache dir {gw.cache_dir}," in first
    line_with(r, "info", f"cache dir {gw.cache_dir} is in use by a running gateway (pid ")
    line_with(r, "ok", f"store {gw.store}: PUT, GET and DELETE of ")
    line_with(r, "ok", "the drain is healthy: 0 files (0 B) queued")
    assert "/var/lib/ckptgw" not in r.stdout and "mountpoint" not in r.stdout


@needs_fuse
def test_a_running_gateway_is_checked_with_its_own_credentials_and_endpoint(
    gateway: GatewayFactory, s3_endpoint: str, bucket: str, tmp_path: Path
) -> None:
    """The store's checks are the daemon's: this shell has neither credentials nor the
    endpoint, and doctor still checks the mount's S3 store, and leaves nothing in it."""
    import boto3

    gw = gateway("gw", "--endpoint-url", s3_endpoint, store=f"s3://{bucket}/run1/")
    bare = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    bare["CKPTGW_RUNTIME_DIR"] = gw.env["CKPTGW_RUNTIME_DIR"]
    r = subprocess.run(
        [sys.executable, "-m", "ckptgw.gateway.cli", "doctor", str(gw.mountpoint), "--json"],
        capture_output=True, text=True, timeout=120, check=False, env=bare,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    found = json.loads(r.stdout)
    assert found[0]["check"] == "gateway", found[0]
    assert f"store s3://{bucket}/run1/, endpoint {s3_endpoint}," in found[0]["message"]
    by = {c["check"]: c for c in found}
    assert by["credentials"]["status"] == OK, by["credentials"]
    assert "ckptgw-test" not in r.stdout  # the key id never shows, nor the secret
    for name in ("endpoint", "bucket", "round-trip", "multipart"):
        assert by[name]["status"] == OK, by[name]
    s3 = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]
    assert not [k for k in keys if ".ckptgw-doctor" in k], keys
    assert not s3.list_multipart_uploads(Bucket=bucket).get("Uploads")


@needs_fuse
def test_flags_that_choose_another_store_are_refused_on_a_running_gateway(
    gateway: GatewayFactory, tmp_path: Path
) -> None:
    gw = gateway()
    r = doctor("--store", f"file://{tmp_path / 'other'}", str(gw.mountpoint))
    assert r.returncode == 1 and r.stdout == ""
    err = r.stderr.strip()
    assert err.count("\n") == 0 and f"{gw.mountpoint} is a running gateway" in err, err
    assert "--store would check something else; drop it" in err, err
    r = doctor("--cache-dir", "/elsewhere", str(gw.mountpoint), "--json")  # still a list
    assert r.returncode == 1, r.stdout + r.stderr
    [refused] = json.loads(r.stdout)
    assert refused["check"] == "gateway" and refused["status"] == FAIL
    assert "--cache-dir would check something else" in refused["message"]


def _healthy() -> dict[str, Any]:
    """The fields of a status (as the daemon writes it) that doctor looks at, all well."""
    return {
        "mountpoint": "/mnt/ckpt",
        "mode": "serving",
        "mode_reason": "",
        "data_path": {"mode": "passthrough", "reason": None},
        "store_requests": None,
        "last_error": None,
        "last_error_at": None,
        "lookups": None,
        "queue": {"files": 2, "bytes": 3 << 20, "oldest_dirty_age": 4.0, "lost_wakeups": 0},
        "cache": {"enospc": 0},
    }


def test_an_older_gateway_is_named_and_its_status_still_checked() -> None:
    """A daemon from before doctor could ask it (no ``config``): one FAIL that says to
    restart it, and what its status says."""
    from ckptgw.gateway.client import Mount
    from ckptgw.gateway.doctor.live import checks
    from ckptgw.gateway.errors import UserError
    from ckptgw.gateway.registry import Entry

    class Older(Mount):
        def request(self, op: str, *, answer_within: float | None = None, **a: Any) -> Any:
            if op == "status":
                return _healthy()
            raise UserError(f"unknown operation {op!r}")

    mp = Path("/mnt/ckpt")
    found = list(checks(Older(mp, Entry(str(mp), "/c", "s3://b/", 4321, "/c/control.sock"))))
    assert [(c.check, c.status) for c in found] == [("gateway", FAIL), ("drain", OK)], found
    assert "it runs an older ckptgw than this one; restart it" in found[0].message


def test_status_problems_are_named_and_a_healthy_drain_is_one_line() -> None:
    """The deterministic tier of the live checks: a status as the daemon writes it."""
    from ckptgw.gateway.doctor.live import status_checks

    now = 1_000_000.0
    healthy = _healthy()
    [ok] = status_checks(healthy, now)
    assert (ok.check, ok.status) == ("drain", OK) and "2 files (3.0 MiB) queued" in ok.message
    sick = dict(healthy)
    sick["store_requests"] = {
        "endpoint": "http://10.0.0.9:9000",
        "expect_continue": False,
        "no_continue": "it did not answer one in 1 s",
        "deadlines": {"connect": 10, "first_byte": 30, "stall": 30, "warning": 10},
        "in_flight": 3,
        "stalled": 1,
        "requests": [
            {"what": "PUT run/a.pt", "key": "run/a.pt", "path": "/mnt/ckpt/run/a.pt",
             "phase": "sending", "age": 50, "idle": 41.0, "sent": 1 << 20, "size": 8 << 20,
             "received": 0, "stalled": True},
        ],
    }  # fmt: skip
    sick["last_error"] = "SlowDown: Please reduce your request rate"
    sick["last_error_at"] = now - 20
    sick["queue"] = {"files": 5, "bytes": 5 << 30, "oldest_dirty_age": 3600.0, "lost_wakeups": 0}
    sick["cache"] = {"enospc": 7}
    sick["mode"], sick["mode_reason"] = "emergency-drain", "preemption notice (aws)"
    got = {(c.check, c.status): c.message for c in status_checks(sick, now)}
    assert "1 of 3 requests to http://10.0.0.9:9000 are stalled" in got[("requests", WARN)]
    assert "PUT run/a.pt (/mnt/ckpt/run/a.pt): no progress for 41 s" in got[("requests", WARN)]
    assert "does not answer Expect: 100-continue" in got[("requests", INFO)]
    assert "20 s ago: SlowDown" in got[("store-errors", WARN)]
    assert "5 files (5.0 GiB) only on this node, the oldest for 60 min" in got[("drain", WARN)]
    assert "7 writes got ENOSPC" in got[("cache-space", WARN)]
    assert "emergency-drain (preemption notice (aws))" in got[("gateway", WARN)]
    assert ("drain", OK) not in got
