"""Any node resumes from the store: listings merged into the namespace, reads through the
cache, checksums verified; and the cache as a bounded tier (eviction, back-pressure).

Two gateways with separate cache dirs on one store stand in for two nodes."""

from __future__ import annotations

import collections
import errno
import json
import os
import stat
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from ckptgw.store.faultproxy import Fault, FaultProxy
from tests.conftest import CheckedGateway, GatewayFactory, any_data_path, errno_of, needs_fuse
from tests.test_drain import file_store_objects, wait_for

pytestmark = [pytest.mark.mount, needs_fuse]


def write_toml(path: Path, sections: dict[str, dict[str, object]]) -> Path:
    lines = []
    for section, body in sections.items():
        lines.append(f"[{section}]")
        for k, v in body.items():
            lines.append(f"{k} = {json.dumps(v) if isinstance(v, str | bool) else repr(v)}")
    path.write_text("\n".join(lines) + "\n")
    return path


class Nodes:
    """Gateways ("nodes") on one store: ``node("a")`` mounts one with its own cache dir."""

    def __init__(
        self, kind: str, gateway: GatewayFactory, tmp_path: Path, request: pytest.FixtureRequest
    ):
        self.kind, self.gateway, self.tmp_path = kind, gateway, tmp_path
        self.proxy: FaultProxy | None = None
        self.made: list[CheckedGateway] = []
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

    def node(self, name: str, *, listing_ttl: float = 0.2, **cache: object) -> CheckedGateway:
        """``cache`` settings override the test's (``fetch_chunk=None``: the default, ranges
        that adapt to each object)."""
        settings = {k: v for k, v in {"fetch_chunk": "1MiB", **cache}.items() if v is not None}
        cfg = write_toml(
            self.tmp_path / f"{name}.toml",
            {
                "store": {"listing_ttl": listing_ttl},
                "drain": {"settle": 0.1, "part_size": "5MiB", "multipart_threshold": "5MiB"},
                "cache": settings,
            },
        )
        extra = ["--config", str(cfg)]
        if self.endpoint:
            extra += ["--endpoint-url", self.endpoint]
        gw = self.gateway(name, *extra, store=self.url)
        self.made.append(gw)
        return gw

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
    if n.proxy is not None:  # the gateways behind it stop first (an unmount still drains)
        for gw in n.made:
            gw.stop()
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


def test_a_warmup_says_which_files_it_could_not_read(nodes: Nodes) -> None:
    good = os.urandom(1 << 20)
    nodes.put("run/step_4/good.pt", good)
    nodes.put("run/step_4/tampered.pt", os.urandom(3 << 20), {"xxh3-128": "0" * 32})
    b = nodes.node("b", prefetch=False)
    b.expect_errors = True  # the checksum mismatch is logged as an error
    r = b.cli("warmup", str(b.mountpoint / "run/step_4"), "--wait", "--json", check=False)
    assert r.returncode == 4, (r.stdout, r.stderr)  # not all of it is in the cache
    job = json.loads(r.stdout)
    assert job["error"] == "" and (job["fetched_files"], job["failed_files"]) == (1, 1), job
    assert job["failed"] == [{"path": "run/step_4/tampered.pt", "error": os.strerror(errno.EIO)}]
    assert (b.mountpoint / "run/step_4/good.pt").read_bytes() == good
    assert errno_of((b.mountpoint / "run/step_4/tampered.pt").read_bytes) == errno.EIO


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


# -- prefetch and warm-up -------------------------------------------------------------------------


def _by_key(log: list[tuple[str, str, str]], method: str, prefix: str) -> collections.Counter[str]:
    """Requests of ``method`` per object key under ``prefix`` (listings left out)."""
    out: collections.Counter[str] = collections.Counter()
    for m, path, _ in log:
        target = urllib.parse.urlsplit(path).path  # the absolute form too
        key = urllib.parse.unquote(target).split("/", 2)[-1]  # /bucket/key
        if m == method and "list-type=" not in path and key.startswith(prefix):
            out[key.removeprefix("ckpt/")] += 1
    return out


@any_data_path  # reads of remote files go through the daemon on either path
@pytest.mark.parametrize("nodes", ["s3"], indirect=True)
def test_a_fresh_node_prefetches_a_dcp_checkpoint_and_warmup_leaves_nothing_to_request(
    nodes: Nodes,
) -> None:
    import torch.multiprocessing as mp

    from tests.test_torch import _dcp_rank, _free_port

    a = nodes.node("a")
    ckpt = "run/step_9"
    mp.spawn(_dcp_rank, args=(2, _free_port(), str(a.mountpoint / ckpt), "save"), nprocs=2)
    extra = os.urandom(20 << 20)  # not read by the loader: only a prefetch fetches it
    (a.mountpoint / ckpt / "extra.bin").write_bytes(extra)
    (a.mountpoint / ckpt / "extra.bin").chmod(0o600)
    nodes.drained({f"{ckpt}/extra.bin": extra})
    assert a.cli("flush", "--wait", "--timeout", "60").returncode == 0

    def shards() -> dict[str, int]:
        return {
            k: len(v)
            for k, v in nodes.objects().items()
            if k.startswith(f"{ckpt}/") and not k.endswith("/")
        }

    wait_for("the DCP files in the store", lambda: len(shards()) == 4)
    stored = shards()
    assert len(stored) == 4 and stored[f"{ckpt}/extra.bin"] == len(extra), stored
    a.stop()
    proxy = nodes.count_requests()

    # Node B: the loader opens the checkpoint's files; the first open prefetches all of them.
    # A listing is reused for 5 s (the default). It HEADs the small .metadata (an object that
    # small could be a symlink); every other file is described by its first GET's response
    # (no HEAD, though the loader looks each up), and there is one GET per range (8 MiB
    # ranges up to 8 in flight: adapted to the size). extra.bin (20 MiB) was a multipart
    # upload: its checksum is the store's CRC32, which no ranged GET reports, so one HEAD
    # at the end of its fetch asks for it.
    b = nodes.node("b", fetch_chunk=None, listing_ttl=5.0)
    mp.spawn(_dcp_rank, args=(2, _free_port(), str(b.mountpoint / ckpt), "load"), nprocs=2)
    wait_for("the prefetch to end", lambda: b.status()["warmups"][0]["phase"] == "done")
    job = b.status()["warmups"][0]
    assert (job["origin"], job["path"], job["error"]) == ("open", ckpt, ""), job
    assert job["fetched_files"] + job["cached_files"] == 4 and job["fetched_files"] >= 1, job
    assert job["skipped_files"] == job["failed_files"] == 0, job
    gets, heads = _by_key(proxy.log, "GET", "ckpt/"), _by_key(proxy.log, "HEAD", "ckpt/")
    assert gets == {k: max(1, -(-n // (8 << 20))) for k, n in stored.items()}, gets
    assert gets[f"{ckpt}/extra.bin"] == 3
    files_heads = {k: n for k, n in heads.items() if not k.endswith("/")}  # not dirs' markers
    assert files_heads == {f"{ckpt}/.metadata": 1, f"{ckpt}/extra.bin": 1}, heads
    assert stored[f"{ckpt}/.metadata"] <= 4096 < min(stored[f"{ckpt}/__0_0.distcp"], len(extra))
    # Described all the same, by the GET: the mode node A gave it, and no more HEADs.
    assert stat.S_IMODE((b.mountpoint / ckpt / "extra.bin").stat().st_mode) == 0o600
    assert _by_key(proxy.log, "HEAD", "ckpt/") == heads
    assert (b.mountpoint / ckpt / "extra.bin").read_bytes() == extra
    assert _by_key(proxy.log, "GET", "ckpt/") == gets  # read from the cache
    b.stop()

    # Node C: ckptgw warmup --wait, then the load and every read make no request at all.
    c = nodes.node("c", fetch_chunk=None, listing_ttl=120.0)
    r = c.cli("warmup", str(c.mountpoint / ckpt), "--wait", "--json", check=False)
    assert r.returncode == 0, r.stderr
    job = json.loads(r.stdout)
    assert (job["phase"], job["origin"], job["files"], job["fetched_files"]) == (
        "done",
        "warmup",
        4,
        4,
    ), job
    assert job["fetched_bytes"] == sum(stored.values())
    before = len(proxy.log)
    mp.spawn(_dcp_rank, args=(2, _free_port(), str(c.mountpoint / ckpt), "load"), nprocs=2)
    assert (c.mountpoint / ckpt / "extra.bin").read_bytes() == extra
    assert proxy.log[before:] == []
    r = c.cli("warmup", str(c.mountpoint / "run/step_404"), "--wait", check=False)
    assert r.returncode == 1, r.stderr
    assert f"{c.mountpoint}/run/step_404: no such file or directory" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@any_data_path
@pytest.mark.parametrize("nodes", ["s3"], indirect=True)
def test_a_warmup_larger_than_the_cache_evicts_nothing_dirty_and_says_what_did_not_fit(
    nodes: Nodes,
) -> None:
    a = nodes.node("a")
    shards = {f"run/step_3/shard{i}.bin": os.urandom((i + 3) << 20) for i in range(4)}
    (a.mountpoint / "run/step_3").mkdir(parents=True)
    for rel, data in shards.items():
        (a.mountpoint / rel).write_bytes(data)
    nodes.drained(shards)
    a.stop()
    proxy = nodes.count_requests()
    hold = proxy.add(Fault("hold", "PUT", r"dirty\.bin"))

    # Node B: 16 MiB of cache, 6 MiB of it dirty (its upload held): 10 MiB of room for 3+4+5+6.
    b = nodes.node("b", fetch_chunk=None, size="16MiB", prefetch=False)
    dirty = os.urandom(6 << 20)
    (b.mountpoint / "scratch").mkdir()
    (b.mountpoint / "scratch/dirty.bin").write_bytes(dirty)
    wait_for("the dirty file's upload to start", lambda: hold.hits == 1)
    r = b.cli("warmup", str(b.mountpoint / "run/step_3"), "--wait", check=False)
    assert r.returncode == 4, (r.stdout, r.stderr)  # not all of it is in the cache
    # Largest first, as long as it fits: 6 MiB, then 4 MiB; 5 and 3 MiB did not fit.
    assert "2 files (8.0 MiB) did not fit" in r.stdout, r.stdout
    did_not_fit = sorted(
        line.split()[-1] for line in r.stdout.splitlines() if "did not fit " in line
    )
    assert did_not_fit == [str(b.mountpoint / f"run/step_3/shard{i}.bin") for i in (0, 2)]
    assert "2 files did not fit in the cache" in r.stderr
    st = b.status()
    assert st["dirty_bytes"] == len(dirty) and st["cache"]["used"] <= 16 << 20
    assert st["warmups"][0]["skipped_files"] == 2 and st["warmups"][0]["fetched_files"] == 2
    hold.release()
    assert (b.mountpoint / "scratch/dirty.bin").read_bytes() == dirty
    for rel, data in shards.items():  # what did not fit is read through
        assert (b.mountpoint / rel).read_bytes() == data, rel
    nodes.drained({"scratch/dirty.bin": dirty})


# -- a slow store (drain/reads/lookupwait.py; deterministic tiers: tests/test_slowstore.py) -------


def _log(gw: CheckedGateway) -> str:
    return (gw.cache_dir / "ckptgw.log").read_text(errors="replace")


@any_data_path  # names and listings: the same on either data path
@pytest.mark.parametrize("nodes", ["s3"], indirect=True)
def test_a_save_is_not_held_by_stalled_listings_and_all_of_it_becomes_durable(
    nodes: Nodes,
) -> None:
    """Every LIST held (for up to 120 s) while the trainer saves a checkpoint of 50 shards
    into a new directory of a directory listed before: each directory's first lookup waits
    store.lookup_wait (2 s) at most, the rest answer from the journal. The save ends long
    before the hold would (bound: 30 s, where the defect is 120 s), every file drains, and
    the log says what waits for which store, once."""
    proxy = nodes.count_requests()
    nodes.put("run/step_0/model.pt", b"an older checkpoint")
    a = nodes.node("a")
    assert os.listdir(a.mountpoint / "run") == ["step_0"]  # run/ is listed: the journal knows it
    held = proxy.add(Fault("hold", "GET", r"list-type=2", count=10**6, seconds=120))
    shards = {f"run/step_1/shard_{i:02}.distcp": os.urandom(8 << 10) for i in range(50)}
    started = time.monotonic()
    (a.mountpoint / "run/step_1").mkdir()
    for rel, data in shards.items():
        (a.mountpoint / rel).write_bytes(data)
    (a.mountpoint / "run/latest").write_bytes(b"step_1")
    took = time.monotonic() - started
    assert took < 30, f"the save took {took:.0f} s behind the held listings"
    assert held.hits >= 2 and not held.released.is_set()  # run/ and run/step_1/ were held
    lookups = a.status()["lookups"]  # the stall shows in status while it lasts
    assert lookups["stalled_since"] is not None and lookups["from_journal"] > 0
    assert "LIST ckpt/run/" in lookups["stalled_on"] and lookups["episodes"] == 1
    assert "lookups   the store is slow" in a.cli("status", str(a.mountpoint)).stdout
    nodes.drained({**shards, "run/latest": b"step_1"})  # the uploads are not held
    warnings = [line for line in _log(a).splitlines() if " WARNING " in line]
    stalls = [line for line in warnings if "has not completed LIST ckpt/run/" in line]
    assert len(stalls) == 1, warnings  # once per episode
    assert f"s3://{nodes.bucket}/ckpt/ at {proxy.url}" in stalls[0]  # the store and endpoint
    assert "ckptgw-test-secret" not in _log(a)
    held.release()
    wait_for("the held listings to end", lambda: "answers again" in _log(a))
    # What the held listings brought is merged: the names are all still there, once each.
    assert sorted(os.listdir(a.mountpoint / "run")) == ["latest", "step_0", "step_1"]
    assert sorted(os.listdir(a.mountpoint / "run/step_1")) == sorted(
        p.rsplit("/", 1)[1] for p in shards
    )


@any_data_path
@pytest.mark.parametrize("nodes", ["s3"], indirect=True)
def test_a_fresh_node_never_says_a_durable_file_is_missing_when_its_listing_is_slow_or_fails(
    nodes: Nodes,
) -> None:
    """A fresh node restoring: a directory it never listed has nothing in the journal to
    answer from. Its first LIST held past store.lookup_wait: the lookup waits for it and
    finds the file. Its first LIST failing (503 SlowDown for every attempt, retried and
    logged as retries are): EIO for the file and for reading the directory, never ENOENT or
    an empty directory; once the store answers, the file is there."""
    a = nodes.node("a")
    files = {"run/step_1/model.pt": os.urandom(1 << 20), "run/step_2/model.pt": b"weights"}
    for rel, data in files.items():
        (a.mountpoint / rel).parent.mkdir(parents=True, exist_ok=True)
        (a.mountpoint / rel).write_bytes(data)
    nodes.drained(files)
    a.stop()
    proxy = nodes.count_requests()
    # A directory's listing (the status's catalog lists checkpoints without a delimiter).
    listing = r"list-type=2&prefix=ckpt%2Frun%2F{}%2F&delimiter=%2F"
    slow = proxy.add(Fault("hold", "GET", listing.format("step_1"), seconds=5))
    failing = proxy.add(Fault("slowdown", "GET", listing.format("step_2"), count=6))  # 2 x 3 tries

    b = nodes.node("b")
    assert (b.mountpoint / "run/step_1/model.pt").read_bytes() == files["run/step_1/model.pt"]
    assert slow.hits == 1  # it was held, and waited for

    step_2 = b.mountpoint / "run/step_2"
    assert errno_of(os.stat, step_2 / "model.pt") == errno.EIO
    assert errno_of(os.listdir, step_2) == errno.EIO
    assert failing.hits == 6
    time.sleep(0.3)  # listing_ttl (0.2 s): due again, and the store answers now
    assert (step_2 / "model.pt").read_bytes() == b"weights"
    assert os.listdir(step_2) == ["model.pt"]
    log = _log(b)
    assert "list ckpt/run/step_2/: " in log and "retry 2 in" in log  # counted retries
    assert "cannot list the store" in log


@any_data_path
@pytest.mark.parametrize("nodes", ["s3"], indirect=True)
def test_a_node_that_restarts_while_the_store_cannot_be_listed_keeps_saving(
    nodes: Nodes,
) -> None:
    """The gateway restarts (a preemption) while every LIST fails: the directories it knew
    before are answered from its journal, as old as their last listing, so a save into them
    and a new checkpoint directory work (and drain once the store answers). Only what the
    node knows nothing of is an error (the test above)."""
    proxy = nodes.count_requests()
    a = nodes.node("a")
    (a.mountpoint / "run/step_1").mkdir(parents=True)
    (a.mountpoint / "run/step_1/model.pt").write_bytes(b"one")
    nodes.drained({"run/step_1/model.pt": b"one"})
    a.stop()
    failing = proxy.add(Fault("slowdown", "GET", r"list-type=2", count=10**6))
    a.start()
    (a.mountpoint / "run/step_2").mkdir()
    (a.mountpoint / "run/step_2/model.pt").write_bytes(b"two")
    (a.mountpoint / "run/latest").write_bytes(b"step_2")
    assert failing.hits > 0  # the store was asked, and could not answer
    failing.count = 0  # it answers again
    nodes.drained(
        {"run/step_1/model.pt": b"one", "run/step_2/model.pt": b"two", "run/latest": b"step_2"}
    )
