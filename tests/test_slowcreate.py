"""A file rewritten while its multipart upload is being created (issue 47).

The store's CreateMultipartUpload is held at a proxy for seconds (a slow or distant store);
meanwhile the trainer saves the same name again and closes it before the create returns. The
first upload is aborted when the create returns; the new version must then be uploaded at
once, not left only in the cache until something else wakes the drain.

Real mounts on both data paths, moto behind ckptgw/store/faultproxy.py.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from ckptgw.store.faultproxy import Fault, FaultProxy
from tests.conftest import GatewayFactory

MiB = 1 << 20
HOLD = 6.0  # seconds the proxy holds every CreateMultipartUpload (the issue's steps)
HELD = 4.0  # the same in the variants: long enough for the save and the wait to come first


def _save(path: Path, data: bytes, how: str) -> None:
    """One save of ``data`` at ``path``: open ``wb`` (O_TRUNC), write, flush, fsync, close;
    ``in-place`` writes over the old bytes without truncating; ``rename`` saves a temp file
    and renames it over ``path``."""
    if how == "rename":
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, path)
        return
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if how == "o_trunc" else 0)
    fd = os.open(path, flags, 0o644)
    with open(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _body(s3_endpoint: str, bucket: str, key: str) -> bytes:
    import boto3

    s3 = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    body: bytes = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    return body


def _keys(s3_endpoint: str, bucket: str) -> list[str]:
    import boto3

    s3 = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    return [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]


def test_the_issue_steps_a_rewrite_during_a_held_create_is_durable_after_flush(
    gateway: GatewayFactory, s3_endpoint: str, bucket: str
) -> None:
    """Exactly the steps of issue 47: every create held 6 s at the proxy, 64 MiB of ``a``
    saved, 1.5 s later 64 MiB of ``b`` saved over it (open ``wb``), then ``ckptgw flush
    --wait --timeout 90 MNT``: it returns 0 within 20 s and the bucket holds the ``b``."""
    proxy = FaultProxy(int(s3_endpoint.rsplit(":", 1)[1]))
    try:
        proxy.add(Fault("stall", "POST", r"[?&]uploads", count=1000, seconds=HOLD))
        gw = gateway("gw", "--endpoint-url", proxy.url, store=f"s3://{bucket}/p/")
        mnt = gw.mountpoint
        with open(mnt / "model.pt", "wb") as f:
            f.write(b"a" * (64 * MiB))
            f.flush()
            os.fsync(f.fileno())
        time.sleep(1.5)
        with open(mnt / "model.pt", "wb") as f:
            f.write(b"b" * (64 * MiB))
            f.flush()
            os.fsync(f.fileno())
        t0 = time.monotonic()
        r = gw.cli("flush", "--wait", "--timeout", "90", str(mnt), check=False)
        took = time.monotonic() - t0
        assert r.returncode == 0, r.stderr
        # Not a timing assertion of speed: the bound is the issue's, 4x what it needs here
        # (the held create, then 4 parts on loopback), and a lost file takes 90 s.
        assert took < 20, f"flush --wait took {took:.1f} s"
        assert _body(s3_endpoint, bucket, "p/model.pt") == b"b" * (64 * MiB)
        assert gw.status()["queue"]["lost_wakeups"] == 0
    finally:
        proxy.close()


@pytest.mark.parametrize("how", ["o_trunc", "in-place", "rename"])
@pytest.mark.parametrize("size", [64 * MiB, 1 * MiB], ids=["multipart", "single-put"])
def test_a_save_over_a_file_whose_upload_is_starting_is_durable_soon_after(
    gateway: GatewayFactory, s3_endpoint: str, bucket: str, how: str, size: int
) -> None:
    """The same on every way of saving over a name: the new version is durable within a few
    seconds of the held request returning (``wait`` with a bound well under the audit's and
    the permanent-retry's spacing), and the bucket holds the new bytes only. At the
    single-PUT size the PUT is what the proxy holds."""
    proxy = FaultProxy(int(s3_endpoint.rsplit(":", 1)[1]))
    try:
        held = (
            Fault("stall", "POST", r"[?&]uploads", count=1000, seconds=HELD)
            if size > 16 * MiB
            else Fault("stall", "PUT", r"/p/model\.pt$", count=1, seconds=HELD)
        )
        proxy.add(held)
        gw = gateway("gw", "--endpoint-url", proxy.url, store=f"s3://{bucket}/p/")
        mnt = gw.mountpoint
        old, new = os.urandom(size), os.urandom(size)
        _save(mnt / "model.pt", old, "o_trunc")
        deadline = time.monotonic() + 30
        while held.hits == 0:  # the drain has taken it: its request is held at the proxy
            assert time.monotonic() < deadline, "the upload never started"
            time.sleep(0.02)
        _save(mnt / "model.pt", new, how)
        t0 = time.monotonic()
        r = gw.cli("wait", str(mnt / "model.pt"), "--timeout", str(HELD + 20), check=False)
        assert r.returncode == 0, f"not durable {time.monotonic() - t0:.1f} s on: {r.stdout}"
        assert _body(s3_endpoint, bucket, "p/model.pt") == new
        assert sorted(_keys(s3_endpoint, bucket)) == ["p/model.pt"]
        assert gw.status()["queue"]["lost_wakeups"] == 0
    finally:
        proxy.close()
