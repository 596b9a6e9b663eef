"""Directory markers at fleet scale, through real mounts on one S3 bucket (moto, behind a proxy
that logs every request): a directory that a fresh node's listing shows as it is without its
marker object (it holds entries, mode 0755, its parent's owner, no xattrs) is never PUT, by any
node; every other directory keeps its marker, and one that loses its last entry, here or after
a kill -9, gets it. A fresh node sees the same tree either way."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from ckptgw.gateway.client import wait_durable
from ckptgw.store.faultproxy import FaultProxy
from tests.conftest import CheckedGateway, GatewayFactory, any_data_path, needs_fuse
from tests.test_drain import wait_for
from tests.test_readthrough import write_toml

pytestmark = [pytest.mark.mount, needs_fuse, any_data_path]

PREFIX = "ckpt/"


@pytest.fixture(autouse=True)
def umask_022() -> Iterator[None]:
    """mkdir gives 0755 whatever the test runner's umask (the caller's umask applies)."""
    old = os.umask(0o022)
    yield
    os.umask(old)


class Fleet:
    """Gateways on one bucket, each with its own mount and cache dir, all through one proxy
    that logs every request. Nothing drains by itself (a long settle): only flush does, so a
    directory is never drained before the files written into it just after its mkdir."""

    def __init__(self, gateway: GatewayFactory, tmp_path: Path, endpoint: str, bucket: str) -> None:
        self.gateway, self.tmp_path, self.bucket = gateway, tmp_path, bucket
        self.proxy = FaultProxy(int(endpoint.rsplit(":", 1)[1]))
        self.s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")

    def node(self, name: str) -> CheckedGateway:
        cfg = write_toml(
            self.tmp_path / f"{name}.toml",
            {"store": {"listing_ttl": 0.2}, "drain": {"settle": 600.0}},
        )
        return self.gateway(
            name,
            "--config",
            str(cfg),
            "--endpoint-url",
            self.proxy.url,
            store=f"s3://{self.bucket}/{PREFIX}",
        )

    def puts(self, key: str) -> int:
        """PUT requests of ``key`` that reached the store."""
        path = f"/{self.bucket}/{PREFIX}{key}"
        return sum(1 for m, p, how in self.proxy.log if m == "PUT" and p.split("?")[0] == path)

    def objects(self) -> dict[str, bytes]:
        out = {}
        for o in self.s3.list_objects_v2(Bucket=self.bucket, Prefix=PREFIX).get("Contents", []):
            try:
                body = self.s3.get_object(Bucket=self.bucket, Key=o["Key"])["Body"].read()
            except self.s3.exceptions.NoSuchKey:
                continue  # deleted between the listing and the read
            out[o["Key"].removeprefix(PREFIX)] = body
        return out

    def holds(self, expected: dict[str, bytes]) -> None:
        """Wait until the store holds exactly ``expected`` (a delete is carried out a little
        after the flush that waits for what is to be stored: it gathers with others)."""
        try:
            wait_for(
                "the store to hold exactly the expected objects", lambda: self.objects() == expected
            )
        except AssertionError:
            assert self.objects() == expected

    def metadata(self, key: str) -> dict[str, str]:
        return dict(self.s3.head_object(Bucket=self.bucket, Key=PREFIX + key)["Metadata"])


@pytest.fixture
def fleet(
    gateway: GatewayFactory, tmp_path: Path, s3_endpoint: str, bucket: str
) -> Iterator[Fleet]:
    f = Fleet(gateway, tmp_path, s3_endpoint, bucket)
    yield f
    f.proxy.close()


def flush(gw: CheckedGateway) -> None:
    assert gw.cli("flush", "--wait", "--timeout", "60").returncode == 0


def pending(gw: CheckedGateway, path: str) -> dict[str, Any]:
    answer: dict[str, Any] = gw.control().request("pending", paths=[path])
    return answer


def checkpoint_state(gw: CheckedGateway, name: str) -> str:
    found = [c for c in gw.status()["checkpoints"] if c["path"].endswith("/" + name)]
    assert len(found) == 1, found
    return str(found[0]["state"])


def test_two_gateways_saving_into_the_same_new_directory_put_no_marker_for_it(
    fleet: Fleet,
) -> None:
    a, b = fleet.node("a"), fleet.node("b")
    for gw in (a, b):  # each node makes step_1 itself: neither has drained anything yet
        (gw.mountpoint / "step_1").mkdir()
    files = {}
    for rank, gw in enumerate((a, b)):
        for i in range(4):
            data = os.urandom(1000 + 10 * rank + i)
            (gw.mountpoint / f"step_1/shard_{rank}_{i}.pt").write_bytes(data)
            files[f"step_1/shard_{rank}_{i}.pt"] = data
    for gw in (a, b):
        flush(gw)
    assert fleet.objects() == files  # the files, and no marker
    assert fleet.puts("step_1/") == 0
    assert sum(fleet.puts(k) for k in files) == len(files)  # the proxy saw the PUTs it counts
    for gw in (a, b):  # durable everywhere it is counted: the directory too
        assert checkpoint_state(gw, "step_1") == "durable"
        left = pending(gw, "step_1")
        assert (left["count"], left["directories"]) == (0, 0)
        wait_durable(gw.mountpoint / "step_1", timeout=10)
    c = fleet.node("c")  # a fresh node: the directory as a listing shows it
    st = (c.mountpoint / "step_1").stat()
    assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o755
    root = c.mountpoint.stat()
    assert (st.st_uid, st.st_gid) == (root.st_uid, root.st_gid)
    assert sorted(os.listdir(c.mountpoint / "step_1")) == sorted(k[7:] for k in files)
    for key, data in files.items():
        assert (c.mountpoint / key).read_bytes() == data


def test_only_directories_a_listing_would_show_otherwise_get_their_marker(fleet: Fleet) -> None:
    a = fleet.node("a")
    m = a.mountpoint
    (m / "a/b/c").mkdir(parents=True)
    (m / "a/b/c/file").write_bytes(b"deep")
    (m / "empty").mkdir()
    (m / "private").mkdir()
    (m / "private/key.pt").write_bytes(b"secret")
    (m / "private").chmod(0o700)
    (m / "tagged").mkdir()
    (m / "tagged/x").write_bytes(b"x")
    os.setxattr(m / "tagged", "user.step", b"7")
    flush(a)
    assert set(fleet.objects()) == {
        "a/b/c/file",
        "empty/",  # nothing else shows an empty directory
        "private/",  # a listing would make it 0755
        "private/key.pt",
        "tagged/",  # a listing has no xattrs
        "tagged/x",
    }
    assert [fleet.puts(k) for k in ("a/", "a/b/", "a/b/c/")] == [0, 0, 0]
    assert fleet.puts("empty/") == 1
    assert fleet.metadata("private/")["mode"] == "700"
    assert pending(a, "")["count"] == 0  # every directory is durable, marker or not
    c = fleet.node("c")
    n = c.mountpoint
    assert (n / "a/b/c/file").read_bytes() == b"deep"
    assert stat.S_IMODE((n / "a/b").stat().st_mode) == 0o755
    assert (n / "empty").is_dir() and os.listdir(n / "empty") == []
    assert stat.S_IMODE((n / "private").stat().st_mode) == 0o700
    assert os.getxattr(n / "tagged", "user.step") == b"7"
    # Made private once in the store without a marker: it gets one, not a copy of nothing.
    (m / "a/b").chmod(0o700)
    flush(a)
    assert fleet.metadata("a/b/")["mode"] == "700"
    assert fleet.puts("a/b/") == 1  # one PUT of the marker (a copy would be a PUT there too)
    d = fleet.node("d")
    assert stat.S_IMODE((d.mountpoint / "a/b").stat().st_mode) == 0o700


def test_a_directory_without_a_marker_that_loses_its_last_entry_gets_its_marker(
    fleet: Fleet,
) -> None:
    a = fleet.node("a")
    (a.mountpoint / "d").mkdir()
    (a.mountpoint / "d/x").write_bytes(b"x")
    (a.mountpoint / "r").mkdir()
    (a.mountpoint / "r/y").write_bytes(b"y")
    flush(a)
    assert set(fleet.objects()) == {"d/x", "r/y"}
    (a.mountpoint / "d/x").unlink()
    flush(a)
    fleet.holds({"d/": b"", "r/y": b"y"})
    assert fleet.metadata("d/")["mode"] == "755"
    # Another node's directory without a marker, emptied on a node that only listed it.
    b = fleet.node("b")
    assert os.listdir(b.mountpoint / "r") == ["y"]
    (b.mountpoint / "r/y").rename(b.mountpoint / "y")  # renamed away
    flush(b)
    fleet.holds({"d/": b"", "r/": b"", "y": b"y"})
    assert fleet.puts("r/") == 1
    assert fleet.metadata("r/")["mode"] == "755"
    assert "r" in os.listdir(b.mountpoint)  # the next listings of B keep it
    c = fleet.node("c")
    for name in ("d", "r"):
        assert (c.mountpoint / name).is_dir() and os.listdir(c.mountpoint / name) == []


def test_rename_and_rmdir_of_a_directory_without_a_marker(fleet: Fleet) -> None:
    a = fleet.node("a")
    m = a.mountpoint
    (m / "tmp_step_2/sub").mkdir(parents=True)
    (m / "tmp_step_2/model.pt").write_bytes(b"model")
    (m / "tmp_step_2/sub/opt.pt").write_bytes(b"opt")
    flush(a)
    assert set(fleet.objects()) == {"tmp_step_2/model.pt", "tmp_step_2/sub/opt.pt"}
    (m / "tmp_step_2").rename(m / "step_2")
    flush(a)
    fleet.holds({"step_2/model.pt": b"model", "step_2/sub/opt.pt": b"opt"})
    assert checkpoint_state(a, "step_2") == "durable"
    c = fleet.node("c")
    assert (c.mountpoint / "step_2/sub/opt.pt").read_bytes() == b"opt"
    assert not (c.mountpoint / "tmp_step_2").exists()
    # Removed entry by entry: whatever markers the emptied directories got go with them.
    (m / "step_2/model.pt").unlink()
    (m / "step_2/sub/opt.pt").unlink()
    (m / "step_2/sub").rmdir()
    (m / "step_2").rmdir()
    flush(a)
    fleet.holds({})
    assert pending(a, "")["count"] == 0


def test_a_directory_emptied_just_before_a_kill_9_gets_its_marker_after_the_remount(
    fleet: Fleet,
) -> None:
    a = fleet.node("a")
    (a.mountpoint / "d").mkdir()
    (a.mountpoint / "d/x").write_bytes(b"x")
    flush(a)
    assert set(fleet.objects()) == {"d/x"}
    (a.mountpoint / "d/x").unlink()  # journaled; nothing drains (a long settle)
    left = pending(a, "d")
    assert (left["count"], left["directories"]) == (1, 1)  # d waits for its marker
    a.kill()
    a.stop()
    a.start()
    flush(a)
    fleet.holds({"d/": b""})
    c = fleet.node("c")
    assert (c.mountpoint / "d").is_dir() and os.listdir(c.mountpoint / "d") == []
