"""Sharded checkpoints: many small files, each created, written, fsynced and closed. What each
file costs is counted (FUSE requests, fsyncs of cache files and directories, journal
barriers) through real mounts; DCP saves and loads with 2 and 4 ranks go through the mount
and a fresh node; kill -9 of the daemon under concurrent writers of small files loses
nothing that an fsync acknowledged (group commit acknowledges nothing early)."""

from __future__ import annotations

import multiprocessing
import os
import random
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import xxhash

from ckptgw.fsops.cache import ENTRY_DURABLE_WITH_FILE, fs_type
from ckptgw.fsops.passthrough import DAEMON, NOFLUSH
from tests.conftest import CheckedGateway, GatewayFactory, any_data_path, needs_fuse
from tests.test_drain import wait_for
from tests.test_operate import SLOW, S3Setup, s3_gateway
from tests.test_readthrough import write_toml

pytestmark = [pytest.mark.mount, needs_fuse]

QUIET = "[drain]\nsettle = 3600\n"  # no upload competes with what is counted


def quiet_gateway(gateway: GatewayFactory, tmp_path: Path, name: str = "gw") -> CheckedGateway:
    cfg = tmp_path / f"{name}.toml"
    cfg.write_text(QUIET)
    return gateway(name, "--config", str(cfg))


def counters(gw: CheckedGateway) -> dict[str, Any]:
    st = gw.status()
    req = {op: v["count"] for op, v in st["requests"].items()}
    return {"requests": req, "syncs": st["syncs"], "fsyncs": st["fsyncs"]}


def delta(before: dict[str, Any], after: dict[str, Any], part: str) -> dict[str, int]:
    b, a = before[part], after[part]
    return {k: a[k] - b.get(k, 0) for k in a if a[k] != b.get(k, 0)}


def test_what_one_small_file_costs(gateway: GatewayFactory, tmp_path: Path, data_path: str) -> None:
    gw = quiet_gateway(gateway, tmp_path)
    d = gw.mountpoint / "step_1"
    d.mkdir()
    n = 40
    data = os.urandom(300_000)
    before = counters(gw)
    started = time.monotonic()
    for i in range(n):
        fd = os.open(d / f"__{i}_0.distcp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, data)
        os.fsync(fd)
        os.close(fd)
    took = time.monotonic() - started
    after = counters(gw)
    req = delta(before, after, "requests")
    syncs = delta(before, after, "syncs")
    # Per file: one create, fsync and release; at most one lookup (the name is new), one
    # getattr (of the directory, whose attributes the create made stale) and one getxattr
    # (the kernel's check for file capabilities at the first write); on the daemon's path
    # the write itself, the times its write-back cache kept (setattr), and a flush at close
    # (on the kernel's path a close sends none: fsops.passthrough.Passthrough.flush_skipped).
    for op in ("create", "fsync", "release"):
        assert req.get(op) == n, (op, req)
    flushes = n if data_path == DAEMON or not NOFLUSH else 0
    assert req.get("flush", 0) == flushes, req
    # (The kernel also looks the directory up again each time its entry expires: once a
    # second, mount.attr_timeout, which a loaded machine's loop may outlast.)
    assert req.get("lookup", 0) <= n + int(took) + 1, (took, req)
    for op in ("getattr", "getxattr"):
        assert req.get(op, 0) <= n, (op, req)
    writes = n if data_path == DAEMON else 0
    assert req.get("write", 0) == writes, req
    assert req.get("setattr", 0) <= writes, req
    seen = " ".join(f"{k}={v}" for k, v in sorted(req.items()))
    # FORGET is the kernel letting inodes go from its cache, when it likes (memory pressure
    # on a loaded machine), not a cost of the save: left out of the budget.
    asked = sum(v for k, v in req.items() if k != "forget")
    assert asked <= 6 * n + flushes + 2 * writes + int(took) + 1, seen
    # Each fsync: one fsync of its cache file, one journal barrier (the create is journaled),
    # and the directory entry only where the cache filesystem needs it. The first at least
    # on the event loop's own thread (one writer, small files); the others too unless one
    # took long on a loaded machine (files.INLINE_SYNC_SLOW).
    inline = syncs.pop("inline", 0)
    assert 1 <= inline <= n, inline
    assert "watching the FUSE request queue" in (gw.cache_dir / "ckptgw.log").read_text()
    entries = 0 if fs_type(gw.cache_dir) in ENTRY_DURABLE_WITH_FILE else n
    assert syncs == {"files": n, "journal": n, **({"entries": n} if entries else {})}, syncs

    # fsync again, nothing changed: the cache file only, no journal barrier, no entry; and
    # on the kernel's path, a read-only open's close sends no flush either.
    before = counters(gw)
    for i in range(n):
        fd = os.open(d / f"__{i}_0.distcp", os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    after = counters(gw)
    again = delta(before, after, "syncs")
    assert again.pop("inline", 0) <= n and again == {"files": n}, again
    req = delta(before, after, "requests")
    assert req.get("flush", 0) == (n if data_path == DAEMON or not NOFLUSH else 0), req
    for i in range(n):
        assert (d / f"__{i}_0.distcp").read_bytes() == data


@any_data_path
def test_a_missing_name_is_asked_once_and_a_create_replaces_the_answer(
    gateway: GatewayFactory, tmp_path: Path
) -> None:
    gw = quiet_gateway(gateway, tmp_path)
    d = gw.mountpoint / "run"
    d.mkdir()
    missing = d / ".metadata"
    before = counters(gw)
    for _ in range(5):
        assert not missing.exists()
    looked = delta(before, counters(gw), "requests").get("lookup", 0)
    assert looked == 1, f"{looked} lookups for one missing name asked 5 times"
    missing.write_bytes(b"meta")  # through the mount: the kernel replaces its negative entry
    assert missing.exists() and missing.read_bytes() == b"meta"
    os.rename(missing, d / "renamed")
    assert not missing.exists() and (d / "renamed").read_bytes() == b"meta"
    os.symlink("renamed", missing)
    assert missing.read_bytes() == b"meta"


@any_data_path
def test_ls_l_of_a_checkpoint_asks_for_no_extended_attribute_per_file(
    gateway: GatewayFactory, tmp_path: Path
) -> None:
    """`ls -l` asks each file for its SELinux label and its ACL; the mount has neither
    (ENOTSUP, which coreutils remembers per filesystem), so it asks once, not twice a file."""
    ls = shutil.which("ls")
    if ls is None:
        pytest.skip("no ls")
    gw = quiet_gateway(gateway, tmp_path)
    d = gw.mountpoint / "step_9"
    d.mkdir()
    n = 300
    for i in range(n):
        (d / f"__{i}_0.distcp").write_bytes(b"x" * i)
    os.setxattr(d / "__1_0.distcp", "user.step", b"9")  # the "user." namespace still works
    before = counters(gw)
    out = subprocess.run([ls, "-l", str(d)], capture_output=True, text=True, check=True)
    req = delta(before, counters(gw), "requests")
    lines = [ln for ln in out.stdout.splitlines() if ln.endswith(".distcp")]
    assert len(lines) == n and all(ln.startswith("-rw-") for ln in lines), out.stdout[:300]
    assert req.get("getxattr", 0) <= 4, req
    assert os.getxattr(d / "__1_0.distcp", "user.step") == b"9"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _state(rank: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + rank)
    return {f"layer{i}": torch.randn(1000 + 97 * i, generator=g) for i in range(12)}


def _dcp_rank(rank: int, world: int, port: int, ckpt: str, mode: str) -> None:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        mine = {f"rank{rank}": _state(rank)}
        if mode == "save":  # one file per tensor: the many-file layout
            writer = dcp.FileSystemWriter(ckpt, single_file_per_rank=False)
            dcp.save(mine, storage_writer=writer)
        else:
            target = {f"rank{rank}": {k: torch.zeros_like(v) for k, v in _state(rank).items()}}
            dcp.load(target, storage_reader=dcp.FileSystemReader(ckpt))
            for k, v in mine[f"rank{rank}"].items():
                assert torch.equal(target[f"rank{rank}"][k], v), k
        dist.barrier()
    finally:
        dist.destroy_process_group()


@any_data_path
@pytest.mark.parametrize("world", [2, 4])
def test_dcp_save_and_load_through_the_mount_and_on_a_fresh_node(
    gateway: GatewayFactory, world: int
) -> None:
    import torch.multiprocessing as mp

    a = gateway("a")
    ckpt = a.mountpoint / "dcp" / "step_100"
    mp.spawn(_dcp_rank, args=(world, _free_port(), str(ckpt), "save"), nprocs=world, join=True)
    files = sorted(os.listdir(ckpt))
    assert ".metadata" in files
    assert len([f for f in files if f.endswith(".distcp")]) == 12 * world
    a.cli("wait", str(ckpt), "--timeout", "120")
    mp.spawn(_dcp_rank, args=(world, _free_port(), str(ckpt), "load"), nprocs=world, join=True)
    b = gateway("b")  # a fresh node on the same store: empty cache
    fresh = b.mountpoint / "dcp" / "step_100"
    mp.spawn(_dcp_rank, args=(world, _free_port(), str(fresh), "load"), nprocs=world, join=True)
    assert sorted(os.listdir(fresh)) == files


def _small_writer(root: str, log_path: str, seed: int) -> None:
    """Small files, each fsynced before it is noted done (with its digest): the log is the
    list of what the mount acknowledged."""
    rng = random.Random(seed)
    base = Path(root)
    with open(log_path, "a") as log:
        try:
            base.mkdir(parents=True, exist_ok=True)
            for i in range(100_000):
                data = rng.randbytes(rng.choice([0, 1, 512, 4096, 65_536, 200_000]))
                path = base / f"__{i}.distcp"
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                try:
                    os.write(fd, data)
                    os.fsync(fd)
                finally:
                    os.close(fd)
                log.write(f"{path} {xxhash.xxh3_128_hexdigest(data)}\n")
                log.flush()
        except OSError:
            return  # the daemon was killed under us


@any_data_path
def test_kill9_under_many_small_fsyncs_loses_nothing_acknowledged(
    gateway: GatewayFactory, tmp_path: Path
) -> None:
    gw = gateway()
    ctx = multiprocessing.get_context("spawn")
    checked = 0
    for rnd in range(2):
        writers = []
        for r in range(4):  # concurrent fsyncs: they share journal barriers
            log = tmp_path / f"log_{rnd}_{r}.txt"
            log.touch()
            root = gw.mountpoint / f"round_{rnd}" / f"rank_{r}"
            p = ctx.Process(target=_small_writer, args=(str(root), str(log), rnd * 10 + r))
            p.start()
            writers.append(p)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # until each writer has acknowledged some files
            if all(len((tmp_path / f"log_{rnd}_{r}.txt").read_text()) > 2000 for r in range(4)):
                break
            time.sleep(0.1)
        time.sleep(random.Random(rnd).uniform(0.1, 0.6))
        gw.kill()
        for p in writers:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
                p.join()
        gw.start()
        for k in range(rnd + 1):
            for r in range(4):
                for line in (tmp_path / f"log_{k}_{r}.txt").read_text().splitlines():
                    path, digest = line.split()
                    got = xxhash.xxh3_128_hexdigest(Path(path).read_bytes())
                    assert got == digest, f"{path} differs after crash {rnd}"
                    checked += 1
    assert checked > 100, "the writers acknowledged too little to test anything"


@pytest.fixture
def s3(s3_endpoint: str, bucket: str) -> Iterator[S3Setup]:
    setup = S3Setup(s3_endpoint, bucket)
    yield setup
    setup.proxy.close()


@any_data_path
def test_rm_rf_of_a_durable_checkpoint_deletes_its_objects_in_one_request(
    gateway: GatewayFactory, s3: S3Setup, s3_env: dict[str, str], tmp_path: Path
) -> None:
    gw = s3_gateway(gateway, s3, write_toml(tmp_path / "c.toml", {"drain": SLOW}))
    d = gw.mountpoint / "run" / "step_5"
    d.mkdir(parents=True)
    for i in range(60):
        (d / f"__{i}_0.distcp").write_bytes(os.urandom(100 + i))
    gw.cli("wait", str(d), "--timeout", "120")
    assert len([k for k in s3.keys if k.startswith("run/step_5/")]) == 60  # no marker: implied
    seen = len(s3.proxy.log)
    shutil.rmtree(d)
    wait_for("the objects to go", lambda: not any(k.startswith("run/step_5") for k in s3.keys))
    requests = [(m, p) for m, p, _ in s3.proxy.log[seen:]]
    assert not [p for m, p in requests if m == "DELETE"], requests  # no DELETE per object
    batches = [p for m, p in requests if m == "POST" and "delete" in p]
    assert len(batches) == 1, requests
    assert gw.status()["queue"]["store_ops"] == 0
