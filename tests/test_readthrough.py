"""Any node resumes from the store: listings merged into the namespace, reads through the
cache, checksums verified; and the cache as a bounded tier (eviction, back-pressure).

Two gateways with separate cache dirs on one store stand in for two nodes."""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from tests.conftest import CheckedGateway, GatewayFactory, any_data_path, errno_of, needs_fuse
from tests.faultproxy import FaultProxy
from tests.test_drain import file_store_objects, wait_for

pytestmark = [pytest.mark.mount, needs_fuse]


def write_toml(path: Path, sections: dict[str, dict[str, object]]) -> Path:
    lines = []
    for section, body in sections.items():
        lines.append(f"[{section}]")
        for k, v in body.items():
            lines.append(f"{k} = {json.dumps(v)}" if isinstance(v, str) else f"{k} = {v!r}")
    path.write_text("\n".join(lines) + "\n")
    return path


class Nodes:
    """Gateways ("nodes") on one store: ``node("a")`` mounts one with its own cache dir."""

    def __init__(
        self, kind: str, gateway: GatewayFactory, tmp_path: Path, request: pytest.FixtureRequest
    ):
        self.kind, self.gateway, self.tmp_path = kind, gateway, tmp_path
        self.proxy: FaultProxy | None = None
        if kind == "file":
            self.root = tmp_path / "store"
            self.url = f"file://{self.root}"
            self.endpoint: str | None = None
        else:
            endpoint = request.getfixturevalue("s3_endpoint")
            self.bucket = request.getfixturevalue("bucket")
            self.s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
            self.url, self.endpoint = f"s3://{self.bucket}/ckpt/", endpoint

    def count_requests(self) -> FaultProxy:
        """Route the nodes made from now on through a proxy that logs every request. (Not by
        default: the proxy's threads live in the test process, and torch.save opens files
        holding the GIL, so a lookup that lists the store would wait for its own client.)"""
        assert self.endpoint is not None
        self.proxy = FaultProxy(int(self.endpoint.rsplit(":", 1)[1]))
        self.endpoint = self.proxy.url
        return self.proxy

    def node(self, name: str, **cache: object) -> CheckedGateway:
        cfg = write_toml(
            self.tmp_path / f"{name}.toml",
            {
                "store": {"listing_ttl": 0.2},
                "drain": {"settle": 0.1, "part_size": "5MiB", "multipart_threshold": "5MiB"},
                "cache": {"fetch_chunk": "1MiB", **cache},
            },
        )
        extra = ["--config", str(cfg)]
        if self.endpoint:
            extra += ["--endpoint-url", self.endpoint]
        return self.gateway(name, *extra, store=self.url)

    # -- the store, seen directly ----------------------------------------------------------------

    def objects(self) -> dict[str, bytes]:
        if self.kind == "file":
            return file_store_objects(self.root)
        out = {}
        for o in self.s3.list_objects_v2(Bucket=self.bucket, Prefix="ckpt/").get("Contents", []):
            try:
                body = self.s3.get_object(Bucket=self.bucket, Key=o["Key"])["Body"].read()
            except self.s3.exceptions.NoSuchKey:
                continue  # deleted between the listing and the read
            out[o["Key"].removeprefix("ckpt/")] = body
        return out

    def put(self, key: str, data: bytes, metadata: dict[str, str] | None = None) -> None:
        """An object written by another tool (or tampered with)."""
        if self.kind == "file":
            import json

            p = self.root / key
            p.parent.mkdir(parents=True, exist_ok=True)
            tmp = p.with_name(p.name + ".other-tool")
            tmp.write_bytes(data)
            if metadata:
                os.setxattr(tmp, "user.ckptgw", json.dumps(metadata).encode())
            os.rename(tmp, p)
        else:
            self.s3.put_object(
                Bucket=self.bucket, Key=f"ckpt/{key}", Body=data, Metadata=metadata or {}
            )

    def delete(self, key: str) -> None:
        if self.kind == "file":
            (self.root / key).unlink()
        else:
            self.s3.delete_object(Bucket=self.bucket, Key=f"ckpt/{key}")

    def drained(self, expected: dict[str, bytes], timeout: float = 60) -> None:
        wait_for(
            f"{sorted(expected)} in the store",
            lambda: all(self.objects().get(k) == v for k, v in expected.items()),
            timeout,
        )


@pytest.fixture(params=["file", "s3"])
def nodes(
    request: pytest.FixtureRequest, gateway: GatewayFactory, tmp_path: Path
) -> Iterator[Nodes]:
    n = Nodes(request.param, gateway, tmp_path, request)
    yield n
    if n.proxy is not None:
        n.proxy.close()


def test_a_fresh_node_reads_what_another_drained(nodes: Nodes) -> None:
    a = nodes.node("a")
    files = {
        "run/step_1/model.pt": os.urandom(9 << 20),  # multipart upload, several fetch chunks
        "run/step_1/small.json": b'{"step": 1}',
        "run/step_1/empty": b"",
        "run/latest": b"step_1",
    }
    for rel, data in files.items():
        p = a.mountpoint / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(p, os.O_WRONLY | os.O_CREAT, 0o640)
        os.write(fd, data)
        os.close(fd)
    nodes.drained(files)

    b = nodes.node("b")
    mnt = b.mountpoint
    assert sorted(os.listdir(mnt)) == ["run"]
    assert sorted(os.listdir(mnt / "run")) == ["latest", "step_1"]
    assert sorted(os.listdir(mnt / "run/step_1")) == ["empty", "model.pt", "small.json"]
    assert (mnt / "run/step_1/model.pt").stat().st_size == 9 << 20
    for rel, data in files.items():
        assert (mnt / rel).read_bytes() == data, rel
    # The mode the drain recorded comes back with the content.
    assert (mnt / "run/latest").stat().st_mode & 0o777 == 0o640
    assert errno_of(os.stat, mnt / "run/missing") == errno.ENOENT
    # Read again: now from B's cache.
    assert (mnt / "run/step_1/model.pt").read_bytes() == files["run/step_1/model.pt"]


def test_nodes_see_each_others_files_last_writer_wins(nodes: Nodes) -> None:
    a, b = nodes.node("a"), nodes.node("b")
    (a.mountpoint / "shared").mkdir()
    (a.mountpoint / "shared/one.pt").write_bytes(b"from a")
    nodes.drained({"shared/one.pt": b"from a"})
    wait_for("B to see A's file", lambda: (b.mountpoint / "shared/one.pt").exists(), 10)
    assert (b.mountpoint / "shared/one.pt").read_bytes() == b"from a"

    (b.mountpoint / "shared/two.pt").write_bytes(b"from b")
    (b.mountpoint / "shared/one.pt").write_bytes(b"rewritten by b")
    nodes.drained({"shared/two.pt": b"from b", "shared/one.pt": b"rewritten by b"})

    def a_sees_b() -> bool:
        try:
            return (a.mountpoint / "shared/one.pt").read_bytes() == b"rewritten by b" and (
                a.mountpoint / "shared/two.pt"
            ).read_bytes() == b"from b"
        except FileNotFoundError:
            return False

    wait_for("A to see B's files (last writer wins)", a_sees_b, 10)

    os.unlink(b.mountpoint / "shared/two.pt")
    wait_for("the delete to reach the store", lambda: "shared/two.pt" not in nodes.objects())
    wait_for(
        "A to see the delete",
        lambda: (
            not (a.mountpoint / "shared/two.pt").exists()
            and "two.pt" not in os.listdir(a.mountpoint / "shared")
        ),
        10,
    )
    # A's own files are never taken for someone else's: nothing else changed on A.
    assert (a.mountpoint / "shared/one.pt").read_bytes() == b"rewritten by b"


@any_data_path  # the fresh node reads through the daemon either way; saves: tests/test_torch.py
def test_torch_and_dcp_checkpoints_restore_on_a_fresh_node(nodes: Nodes) -> None:
    torch = pytest.importorskip("torch")
    import torch.multiprocessing as mp

    from bench.workloads import save_atomic
    from tests.test_torch import _dcp_rank, _free_port, training_state

    a = nodes.node("a")
    state = training_state(3)
    (a.mountpoint / "run/step_7").mkdir(parents=True)
    save_atomic(state, a.mountpoint / "run/step_7/ckpt.pt")
    dcp_dir = str(a.mountpoint / "run/dcp_7")
    mp.spawn(_dcp_rank, args=(2, _free_port(), dcp_dir, "save"), nprocs=2, join=True)
    wait_for(
        "both checkpoints in the store",
        lambda: (
            {"run/step_7/ckpt.pt", "run/dcp_7/.metadata"} <= set(nodes.objects())
            and sum(k.startswith("run/dcp_7/") for k in nodes.objects()) >= 3
        ),
    )
    a.stop()  # node A is gone

    b = nodes.node("b")
    loaded = torch.load(b.mountpoint / "run/step_7/ckpt.pt", weights_only=True)
    assert loaded["step"] == state["step"]
    assert torch.equal(loaded["rng"], state["rng"])
    for k, v in state["model"].items():  # type: ignore[attr-defined]
        assert torch.equal(loaded["model"][k], v), k
    dcp_b = str(b.mountpoint / "run/dcp_7")
    mp.spawn(_dcp_rank, args=(2, _free_port(), dcp_b, "load"), nprocs=2, join=True)


def test_bad_checksum_is_eio_missing_object_is_enoent(nodes: Nodes) -> None:
    nodes.put("d/tampered.pt", os.urandom(3 << 20), {"xxh3-128": "0" * 32, "size": "3145728"})
    other = os.urandom(2 << 20)
    nodes.put("d/other-tool.bin", other)  # no checksum metadata: reads fine
    nodes.put("d/deleted.pt", b"soon gone")
    b = nodes.node("b")
    b.expect_errors = True  # the checksum mismatch is logged as an error
    d = b.mountpoint / "d"
    assert sorted(os.listdir(d)) == ["deleted.pt", "other-tool.bin", "tampered.pt"]
    assert errno_of((d / "tampered.pt").read_bytes) == errno.EIO
    assert errno_of((d / "tampered.pt").read_bytes) == errno.EIO  # and again, not silently
    assert (d / "other-tool.bin").read_bytes() == other
    nodes.delete("d/deleted.pt")
    assert errno_of((d / "deleted.pt").read_bytes) == errno.ENOENT
    log = (b.cache_dir / "ckptgw.log").read_text()
    assert "checksum mismatch in" in log and "tampered.pt" in log
    problems = b.log_problems()
    assert problems and all("checksum mismatch" in p for p in problems), problems


@pytest.mark.parametrize("nodes", ["s3"], indirect=True)
def test_a_burst_of_creates_costs_one_listing(nodes: Nodes) -> None:
    proxy = nodes.count_requests()
    a = nodes.node("a")
    (a.mountpoint / "burst").mkdir()
    before = len(proxy.log)
    for i in range(50):
        (a.mountpoint / f"burst/f{i}.tmp").write_bytes(b"x")
    lists = [p for m, p, _ in proxy.log[before:] if m == "GET" and "list-type=2" in p]
    # The listing is reused for listing_ttl (0.2 s): a few LISTs at most, not one per name.
    assert 1 <= len(lists) <= 10, lists


def test_cache_limit_evicts_clean_files_and_writes_wait_for_the_drain(nodes: Nodes) -> None:
    limit = 20 << 20
    a = nodes.node("a", size="20MiB", write_wait=60.0)
    files = {f"big/part{i}.bin": os.urandom(6 << 20) for i in range(8)}  # 48 MiB > the limit
    for rel, data in files.items():
        p = a.mountpoint / rel
        p.parent.mkdir(exist_ok=True)
        p.write_bytes(data)  # waits, when it must, for earlier files to drain
    nodes.drained(files)
    used = sum(p.stat().st_size for p in (a.cache_dir / "data").rglob("*") if p.is_file())
    assert used <= limit
    st = os.statvfs(a.mountpoint)
    assert st.f_blocks * st.f_frsize <= limit  # statfs shows the configured size
    for rel, data in files.items():  # evicted files come back through the store
        assert (a.mountpoint / rel).read_bytes() == data, rel


@pytest.mark.parametrize("nodes", ["file"], indirect=True)
def test_a_file_larger_than_the_cache_gets_enospc_after_the_wait(nodes: Nodes) -> None:
    a = nodes.node("a", size="8MiB", write_wait=1.0)
    kept = os.urandom(1 << 20)
    (a.mountpoint / "kept.bin").write_bytes(kept)
    # The error comes from a write, and again from close() where the kernel writes through
    # (no write-back cache: passthrough mode), as a local filesystem may report it.
    with pytest.raises(OSError) as e, open(a.mountpoint / "huge.bin", "wb") as f:
        for _ in range(16):
            f.write(os.urandom(1 << 20))
            f.flush()
        os.fsync(f.fileno())
    assert e.value.errno == errno.ENOSPC
    log = (a.cache_dir / "ckptgw.log").read_text()
    assert "writes wait for the drain" in log and "ENOSPC after waiting" in log
    assert (a.mountpoint / "kept.bin").read_bytes() == kept
    nodes.drained({"kept.bin": kept})
