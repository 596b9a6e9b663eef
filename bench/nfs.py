"""The NFS section of `make bench`: files written through NFS-Ganesha on loopback (``ckptgw
serve nfs``, a libnfs client per writer in a private network namespace) against the same
writes into the FUSE mount and into a directory on the cache disk, the sides alternated run by
run. NFS is NFSv3; where `make test` built libnfs 5 into the venv, NFSv4.0 is a fourth side,
and a fifth is the floor: NFSv4.0 to NFS-Ganesha exporting a plain directory on the same disk
with the same configuration, so NFS's own cost is told apart from ckptgw's.

Each writer writes one file in 1 MiB writes, fsyncs it (an NFS COMMIT), closes it and renames
it into place; the local sides do the same through ``bench.copier``, a process started before
the clock, as the NFS clients are mounted before it. Every writer of a round starts at once;
the round's time runs until the last one returned. Between rounds the mount's and the NFS
side's files are left to drain to the bucket, then deleted, so no drain runs during a round.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from bench.common import Bench
from tests.nfsclient import (
    LineClient,
    NetNs,
    NfsClient,
    build_client,
    nfs4_unavailable,
    plain_ganesha,
    serve_nfs,
)

SIDES = ("disk", "mount", "nfs")  # "nfs": NFSv3; "nfs4" (NFSv4.0) where libnfs 5 is built
# and "floor4": NFSv4.0 to NFS-Ganesha exporting a plain directory on the cache disk, with the
# configuration serve nfs writes, on its own port in the same namespace: NFS's own cost.
FLOOR_PORT = 20490
EXPORT_DIR = "users"  # made in the mount, owned by the NFS clients' uid
CLIENT_UID = 1000


def random_file(path: Path, size: int) -> None:
    with path.open("wb") as f:
        left = size
        while left:
            n = min(left, 64 << 20)
            f.write(os.urandom(n))
            left -= n


def all_at_once(jobs: Sequence[Callable[[], object]]) -> float:
    """Run every job in its own thread at once; seconds until the last one returned."""
    errors: list[BaseException] = []

    def run(job: Callable[[], object]) -> None:
        try:
            job()
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run, args=(job,)) for job in jobs]
    os.sync()  # start with no write-back left over from the last round
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return seconds


def nfs_rounds(b: Bench, size: int, writers: int) -> dict[str, list[float]]:
    """``b.runs`` rounds (after one warm-up) of ``writers`` files of ``size`` bytes on each
    side; the seconds of each counted round, by side."""
    exe = build_client(b.work)
    src = b.work / "source.bin"
    random_file(src, size)
    src.read_bytes()  # in the page cache for every side alike
    sides = SIDES + (("nfs4", "floor4") if nfs4_unavailable() is None else ())
    s: dict[str, list[float]] = {side: [] for side in sides}
    # The namespace first: its rpcbind's private mount namespace must not hold the mount.
    floor = b.disk / "nfs_floor"
    with NetNs() as ns, b.node("--allow-other") as gw, floor_export(ns, floor, b.work) as url4:
        users = gw.mountpoint / EXPORT_DIR
        users.mkdir()
        os.chown(users, CLIENT_UID, CLIENT_UID)
        r = serve_nfs(ns, gw.mountpoint, gw.env, "--clients", "127.0.0.1/32")
        if r.returncode != 0:
            raise RuntimeError(f"serve nfs failed: {r.stderr.strip()}")
        url = f"nfs://127.0.0.1/checkpoints?uid={CLIENT_UID}&gid={CLIENT_UID}"
        copier = [sys.executable, "-m", "bench.copier"]
        # NFSv4 clients hold a lease that libnfs renews only while it is called: an NFSv4
        # side's clients are mounted just before its round (outside the clock), and closed after.
        v4_urls = {"nfs4": f"{url}&version=4&nfsport=2049", "floor4": url4}
        clients: dict[str, list[LineClient]] = {side: [] for side in sides}
        try:
            for _ in range(writers):
                clients["disk"].append(LineClient(copier))
                clients["mount"].append(LineClient(copier))
                clients["nfs"].append(NfsClient(exe, ns, url))
            for i in range(b.runs + 1):  # the first round warms every side up, not counted
                times = {}
                k = i % len(sides)
                for side in sides[k:] + sides[:k]:  # each side goes first in turn
                    root = floor if side == "floor4" else gw.mountpoint
                    if side in v4_urls:
                        clients[side] = [NfsClient(exe, ns, v4_urls[side]) for _ in range(writers)]
                    times[side] = one_round(b, side, clients[side], src, root, i)
                    if side in v4_urls:
                        for c in clients[side]:
                            c.close()
                        clients[side] = []
                say_round(i, writers, times)
                if i:
                    for side, t in times.items():
                        s[side].append(t)
        finally:
            for group in clients.values():
                for c in group:
                    c.close()
            serve_nfs(ns, gw.mountpoint, gw.env, "--stop")
    src.unlink()
    return s


@contextmanager
def floor_export(ns: NetNs, root: Path, work: Path) -> Iterator[str]:
    """The floor's export of ``root`` (a plain directory on the cache disk) and the URL an
    NFSv4 client mounts it with; nothing where NFSv4 cannot be measured."""
    if nfs4_unavailable() is not None:
        yield ""
        return
    (root / EXPORT_DIR).mkdir(parents=True)
    os.chown(root / EXPORT_DIR, CLIENT_UID, CLIENT_UID)
    try:
        with plain_ganesha(ns, root, work / "floor-ganesha", port=FLOOR_PORT, pseudo="/floor"):
            query = f"uid={CLIENT_UID}&gid={CLIENT_UID}&version=4&nfsport={FLOOR_PORT}"
            yield f"nfs://127.0.0.1/floor?{query}"
    finally:
        shutil.rmtree(root, ignore_errors=True)


def one_round(
    b: Bench, side: str, writers: list[LineClient], src: Path, mnt: Path, i: int
) -> float:
    if side == "disk":
        where = b.disk / f"nfs_round_{i}"
        where.mkdir()
        paths = [str(where / f"w{k}") for k in range(len(writers))]
    elif side == "mount":
        (mnt / EXPORT_DIR / f"mount_{i}").mkdir()
        paths = [str(mnt / EXPORT_DIR / f"mount_{i}" / f"w{k}") for k in range(len(writers))]
    else:
        writers[0].cmd("mkdir", f"/{EXPORT_DIR}/{side}_{i}")
        paths = [f"/{EXPORT_DIR}/{side}_{i}/w{k}" for k in range(len(writers))]
    seconds = all_at_once(
        [
            lambda c=c, p=p: c.cmd("put", src, f"{p}.tmp", p)  # type: ignore[misc]
            for c, p in zip(writers, paths, strict=True)
        ]
    )
    size = src.stat().st_size
    if side in ("disk", "floor4"):  # nothing drains: delete what the round wrote
        where = (
            Path(os.path.dirname(paths[0])) if side == "disk" else mnt / EXPORT_DIR / f"{side}_{i}"
        )
        shutil.rmtree(where)
        return seconds
    sub = f"{side}_{i}"
    b.wait_in_bucket({f"gw/{EXPORT_DIR}/{sub}/w{k}": size for k in range(len(writers))})
    for k in range(len(writers)):
        (mnt / EXPORT_DIR / sub / f"w{k}").unlink()
    (mnt / EXPORT_DIR / sub).rmdir()  # the gateway deletes the objects
    return seconds


def say_round(i: int, writers: int, times: dict[str, float]) -> None:
    print(
        f"  run {i}{' (warm-up)' if not i else ''}: {writers} writer(s): disk "
        f"{times['disk']:6.2f} s, mount {times['mount']:6.2f} s, NFSv3 {times['nfs']:6.2f} s"
        + (f", NFSv4 {times['nfs4']:6.2f} s" if "nfs4" in times else "")
        + (f", NFSv4 to a plain directory {times['floor4']:6.2f} s" if "floor4" in times else ""),
        flush=True,
    )
