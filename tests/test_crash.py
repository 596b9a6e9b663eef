"""kill -9 of the daemon at random points of a write/fsync/rename loop; after a new mount of the
same cache dir every acknowledged file and rename is there, byte for byte (xxhash).

The writer logs each operation to a journal outside the mount: ``begin`` before it starts and
``done`` once the call that acknowledges it (fsync of the file, fsync of the directory) has
returned. The expected state is the replay of the done operations; paths touched by an
operation that began but never finished may be in either state."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import time
from pathlib import Path

import pytest
import xxhash

from tests.conftest import GatewayFactory, needs_fuse

pytestmark = [pytest.mark.mount, needs_fuse]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def writer(root: str, log_path: str, seed: int) -> None:
    rng = random.Random(seed)
    base = Path(root)
    with open(log_path, "a") as log:

        def note(**rec: object) -> None:
            log.write(json.dumps(rec) + "\n")
            log.flush()
            os.fsync(log.fileno())

        try:
            base.mkdir(exist_ok=True)
            _fsync_dir(base.parent)
            for step in range(10_000):
                data = rng.randbytes(rng.choice([0, 1, 4096, 70_000, 1 << 20, 3 << 20]))
                digest = xxhash.xxh3_128_hexdigest(data)
                d = base / f"step_{step}"
                final = d / "model.pt"
                note(op="begin", paths=[str(final), str(base / "latest.pt")])
                d.mkdir()
                tmp = d / "model.pt.tmp"
                with open(tmp, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.rename(tmp, final)
                _fsync_dir(d)
                _fsync_dir(base)
                note(op="done", kind="put", path=str(final), digest=digest)
                # Replace latest.pt through temp + fsync + rename, as trainers do.
                tmp = base / "latest.pt.tmp"
                with open(tmp, "wb") as f:
                    f.write(data)
                    os.fsync(f.fileno())
                os.rename(tmp, base / "latest.pt")
                _fsync_dir(base)
                note(op="done", kind="put", path=str(base / "latest.pt"), digest=digest)
                if step % 3 == 2:  # retire an old step
                    old = base / f"step_{step - 2}"
                    note(op="begin", paths=[str(old / "model.pt")])
                    os.unlink(old / "model.pt")
                    os.rmdir(old)
                    _fsync_dir(base)
                    note(op="done", kind="rm", path=str(old / "model.pt"))
        except OSError:
            return  # the daemon was killed under us


def expected_state(log_path: Path) -> tuple[dict[str, str], set[str]]:
    state: dict[str, str] = {}
    pending: set[str] = set()
    for line in log_path.read_text().splitlines():
        rec = json.loads(line)
        if rec["op"] == "begin":
            pending = set(rec["paths"])
        elif rec["kind"] == "put":
            state[rec["path"]] = rec["digest"]
        else:
            state.pop(rec["path"], None)
        if rec["op"] == "done" and rec.get("path") in pending and rec["kind"] == "rm":
            pending = set()
    return state, pending


@pytest.mark.parametrize("seed", [11, 23])
def test_kill9_loses_nothing_acknowledged(
    gateway: GatewayFactory, tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    gw = gateway()
    ctx = multiprocessing.get_context("spawn")
    total_checked = 0
    for rnd in range(4):
        log = tmp_path / f"log_{rnd}.jsonl"
        log.touch()
        root = gw.mountpoint / f"round_{rnd}"
        proc = ctx.Process(target=writer, args=(str(root), str(log), seed * 100 + rnd))
        proc.start()
        time.sleep(rng.uniform(0.3, 2.5))
        gw.kill()
        proc.join(timeout=60)
        if proc.is_alive():
            proc.kill()
            proc.join()
        gw.start()  # same cache dir; mount must clear the stale mountpoint itself
        for k in range(rnd + 1):  # every earlier round survives every later crash too
            state, pending = expected_state(tmp_path / f"log_{k}.jsonl")
            for path, digest in state.items():
                if path in pending:
                    continue
                rel = Path(path).relative_to(gw.mountpoint)
                got = xxhash.xxh3_128_hexdigest((gw.mountpoint / rel).read_bytes())
                assert got == digest, f"round {k}: {rel} differs after crash {rnd}"
                total_checked += 1
    assert total_checked > 8, "the writer acknowledged too little to test anything"
    assert "recovered after an unclean shutdown" in (gw.cache_dir / "ckptgw.log").read_text()
