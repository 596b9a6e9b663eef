"""``ckptgw cache rebind``: a cache dir's data sent to another store, end to end through the CLI
(a real mount, moto on loopback). The data path does not matter here: the daemon's is used."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import boto3
import pytest

from ckptgw.fsops.passthrough import DAEMON
from tests.conftest import GatewayFactory, needs_fuse
from tests.test_drain import wait_for

pytestmark = [
    pytest.mark.mount,
    needs_fuse,
    pytest.mark.parametrize("data_path", [DAEMON], indirect=True),
]


def objects(s3: object, bucket: str) -> dict[str, bytes]:
    listed = s3.list_objects_v2(Bucket=bucket).get("Contents", [])  # type: ignore[attr-defined]
    return {
        o["Key"]: s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()  # type: ignore[attr-defined]
        for o in listed
    }


def test_stranded_data_goes_to_the_right_bucket(
    gateway: GatewayFactory, s3_endpoint: str, bucket: str
) -> None:
    """A mount whose bucket went away (as a misspelled one would) holds checkpoints that can
    never drain; rebinding its cache dir sends them, renames included, to the right bucket."""
    s3 = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    wrong = f"wrong-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=wrong)
    gw = gateway("gw", "--endpoint-url", s3_endpoint, store=f"s3://{wrong}/run/")
    s3.delete_bucket(Bucket=wrong)
    gw.expect_errors = True  # the uploads to the missing bucket fail, by design
    data = os.urandom(3 << 20)
    (gw.mountpoint / "step_10").mkdir()
    (gw.mountpoint / "step_10" / "model.pt.tmp").write_bytes(data)
    os.rename(gw.mountpoint / "step_10" / "model.pt.tmp", gw.mountpoint / "step_10" / "model.pt")
    cache = str(gw.cache_dir)
    right = f"s3://{bucket}/run/"

    busy = gw.cli("cache", "rebind", cache, "--store", right, "--endpoint-url", s3_endpoint,
                  check=False)  # fmt: skip
    assert busy.returncode != 0 and "unmount it first" in busy.stderr, busy.stderr
    gw.stop()  # umount --force: the data stays in the cache

    nope = f"s3://no-such-{uuid.uuid4().hex[:8]}/run/"
    r = gw.cli("cache", "rebind", cache, "--store", nope, "--endpoint-url", s3_endpoint,
               check=False)  # fmt: skip
    assert r.returncode != 0 and "nothing rebound" in r.stderr and r.stderr.count("\n") == 1
    refused = gw.try_mount(right)
    assert refused.returncode != 0 and f"belongs to store s3://{wrong}/run/" in refused.stderr

    r = gw.cli("cache", "rebind", cache, "--store", right, "--endpoint-url", s3_endpoint)
    assert f"bound to {right} (was s3://{wrong}/run/)" in r.stdout
    assert "2 entries (3.0 MiB) go to" in r.stdout, r.stdout  # step_10/ and its model.pt
    again = gw.cli("cache", "rebind", cache, "--store", right, "--endpoint-url", s3_endpoint)
    assert "already bound" in again.stdout

    gw.store = right
    gw.start()
    gw.cli("wait", str(gw.mountpoint / "step_10"), "--timeout", "60")
    stored = objects(s3, bucket)
    assert stored["run/step_10/model.pt"] == data
    assert "run/step_10/model.pt.tmp" not in stored


def test_drained_files_are_uploaded_again_and_remote_ones_forgotten(
    gateway: GatewayFactory, s3_endpoint: str, bucket: str
) -> None:
    """Files already in the old store go to the new one too (the cache has them); entries only
    the old store has are no longer listed, and stay where they are."""
    s3 = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    new = f"new-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=new)
    s3.put_object(Bucket=bucket, Key="other-tool.bin", Body=b"written by another tool")
    gw = gateway("gw", "--endpoint-url", s3_endpoint, store=f"s3://{bucket}/")
    assert (gw.mountpoint / "other-tool.bin").exists()  # listed: remote here
    data = os.urandom(1 << 20)
    (gw.mountpoint / "a.pt").write_bytes(data)
    gw.cli("wait", str(gw.mountpoint / "a.pt"), "--timeout", "60")
    gw.stop()

    r = gw.cli("cache", "rebind", str(gw.cache_dir), "--store", f"s3://{new}/",
               "--endpoint-url", s3_endpoint)  # fmt: skip
    assert "1 entry only" in r.stdout, r.stdout  # other-tool.bin
    gw.store = f"s3://{new}/"
    gw.start()
    assert not (gw.mountpoint / "other-tool.bin").exists()
    assert (gw.mountpoint / "a.pt").read_bytes() == data
    gw.cli("wait", str(gw.mountpoint / "a.pt"), "--timeout", "60")
    wait_for("a.pt in the new bucket", lambda: "a.pt" in objects(s3, new))
    assert objects(s3, new) == {"a.pt": data}
    assert objects(s3, bucket)["other-tool.bin"] == b"written by another tool"


def test_rebind_refuses_what_is_not_a_cache_dir(gateway: GatewayFactory, tmp_path: Path) -> None:
    gw = gateway("gw", start=False)
    r = gw.cli("cache", "rebind", str(tmp_path / "nothing"), "--store", "s3://some-bucket/",
               check=False)  # fmt: skip
    assert r.returncode != 0 and "not a ckptgw cache dir" in r.stderr
