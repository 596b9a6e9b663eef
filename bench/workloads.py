"""Save stall: torch.save of a ~1 GiB state dict + fsync + rename, through the mount vs the disk.

The limit is the same save into a directory on the cache disk, measured in the same run,
alternating with the mount so that both see the same machine. Also sequential write MB/s
(4 MiB writes + fsync). Prints ratios against the disk and writes JSON next to this file.

    python -m bench.save_stall [--size-mib 1024] [--runs 5] [--workdir DIR]

Target (issue 2): the mount's save stall at most 1.25x the disk's.
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from bench.results import save
from gateway.harness import Gateway, exit_on_sigterm

TARGET = 1.25


def state_dict(total_bytes: int) -> dict[str, object]:
    """Weights plus Adam's two moments, in layers of a transformer-ish shape (float32)."""
    n_params = total_bytes // 4 // 3
    layers = 48
    per_layer = n_params // layers
    torch.manual_seed(0)
    model = {f"layers.{i}.weight": torch.randn(per_layer) for i in range(layers)}
    optim = {
        f"state.{i}": {
            "step": torch.tensor(100.0),
            "exp_avg": torch.randn(per_layer),
            "exp_avg_sq": torch.rand(per_layer),
        }
        for i in range(layers)
    }
    return {"model": model, "optimizer": {"state": optim}, "step": 100}


def save_atomic(obj: object, path: Path) -> None:
    """The checkpoint pattern trainers use: temp file, fsync, rename, fsync the directory."""
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def sequential_write(path: Path, total: int, block: int = 4 << 20) -> None:
    buf = os.urandom(block)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for _ in range(total // block):
            os.write(fd, buf)
        os.fsync(fd)
    finally:
        os.close(fd)


def timed(fn: Callable[[], None]) -> float:
    os.sync()  # start each run with no write-back left over from the last one
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure(disk_dir: Path, mnt_dir: Path, runs: int, size: int) -> dict[str, object]:
    sd = state_dict(size)
    probe = disk_dir / "probe.pt"
    torch.save(sd, probe)
    nbytes = probe.stat().st_size
    probe.unlink()
    results: dict[str, list[float]] = {
        "save_disk": [],
        "save_mount": [],
        "seq_disk": [],
        "seq_mount": [],
    }
    for i in range(runs + 1):  # the first round warms up both and is not counted
        for where, d in (("disk", disk_dir), ("mount", mnt_dir)):
            t = timed(functools.partial(save_atomic, sd, d / "ckpt.pt"))
            (d / "ckpt.pt").unlink()
            s = timed(functools.partial(sequential_write, d / "seq.bin", size))
            (d / "seq.bin").unlink()
            if i:
                results[f"save_{where}"].append(t)
                results[f"seq_{where}"].append(s)
            print(
                f"  run {i}{' (warm-up)' if not i else ''} {where:5}: save {t:6.2f} s, "
                f"sequential {size / s / 1e6:6.0f} MB/s",
                flush=True,
            )
    med = {k: statistics.median(v) for k, v in results.items()}
    return {
        "checkpoint_bytes": nbytes,
        "runs": runs,
        "samples": results,
        "median_s": med,
        "save_ratio": med["save_mount"] / med["save_disk"],
        "seq_mb_s": {"disk": size / med["seq_disk"] / 1e6, "mount": size / med["seq_mount"] / 1e6},
    }


def main() -> None:
    exit_on_sigterm()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--workdir", default=None, help="a directory on the cache disk")
    ap.add_argument("--mount-arg", action="append", default=[], help="extra ckptgw mount flag")
    args = ap.parse_args()
    size = args.size_mib << 20

    work = Path(tempfile.mkdtemp(prefix="ckptgw-bench-", dir=args.workdir))
    try:
        disk_dir, store = work / "disk", work / "store"
        disk_dir.mkdir()
        gw = Gateway(
            work / "mnt",
            work / "cache",
            f"file://{store}",
            *args.mount_arg,
            env={"CKPTGW_RUNTIME_DIR": str(work / "run")},
        )
        with gw:
            print(
                f"save stall, {args.size_mib} MiB state dict, {args.runs} runs "
                f"(+1 warm-up), disk dir {disk_dir}"
            )
            res = measure(disk_dir, gw.mountpoint, args.runs, size)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    med = res["median_s"]
    assert isinstance(med, dict)
    ratio = float(res["save_ratio"])  # type: ignore[arg-type]
    seq = res["seq_mb_s"]
    assert isinstance(seq, dict)
    print()
    print(f"{'metric':34} {'disk':>10} {'mount':>10} {'ratio':>7} {'target':>8}")
    print(
        f"{'save+fsync+rename stall (median s)':34} {med['save_disk']:10.2f} "
        f"{med['save_mount']:10.2f} {ratio:7.2f} {'<= ' + str(TARGET):>8}"
        f"  {'MET' if ratio <= TARGET else 'MISSED'}"
    )
    print(
        f"{'sequential write+fsync (MB/s)':34} {seq['disk']:10.0f} {seq['mount']:10.0f} "
        f"{seq['disk'] / seq['mount']:7.2f}"
    )
    res["machine"] = {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }
    print(f"\nwrote {save('save_stall', res)}")


if __name__ == "__main__":
    main()
