"""Many files at once: a DCP save of one file per tensor, many small files, several writer
processes saving their shards; the mount against the disk, and until durable against boto3."""

from __future__ import annotations

import functools
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bench.common import (
    _DIR_COMMANDS,
    DIR_OPS,
    ROOT,
    Bench,
    Row,
    dir_times,
    mib,
    say,
    timed,
)
from bench.workloads import dcp_save, write_small
from ckptgw.gateway.harness import Gateway


def save_rounds(
    b: Bench, name: str, save: Callable[[Path], float], dir_ops: bool = False
) -> tuple[dict[str, Any], int]:
    """Runs of a save that writes many files into a directory (``save`` returns its
    seconds): to the disk, then boto3 uploads those files; to the mount, then until all of
    them are in the bucket. The sides go first in turn. With ``dir_ops``, ``ls -l``,
    ``du -s`` and ``rm -rf`` of the saved directory are timed on both sides too (on the
    mount once it is durable). The samples (without the warm-up) and the number of
    files."""
    keys = ("disk", "mount", "durable", "boto3") + (DIR_OPS if dir_ops else ())
    s: dict[str, list[float]] = {k: [] for k in keys}
    n = 0
    with b.node() as gw:
        for i in range(b.runs + 1):  # the first round warms both up and is not counted
            got: dict[str, float] = {}
            sides = (
                functools.partial(_disk_side, b, name, i, save, dir_ops),
                functools.partial(_mount_side, b, gw, name, i, save, dir_ops),
            )
            for side in sides if i % 2 else sides[::-1]:
                got.update(side())
            n = int(got.pop("files"))
            say(
                f"  run {i}{' (warm-up)' if not i else ''}: {n} files, save disk "
                f"{got['disk']:6.2f} s, mount {got['mount']:6.2f} s; durable after "
                f"{got['durable']:6.2f} s, boto3 upload {got['boto3']:6.2f} s"
                + "".join(f"; {k} {got[k]:.2f} s" for k in keys[4:])
            )
            if i:
                for k in keys:
                    s[k].append(got[k])
    b.delete(f"gw/{name}/")
    return s, n


def _disk_side(
    b: Bench, name: str, i: int, save: Callable[[Path], float], dir_ops: bool
) -> dict[str, float]:
    d = b.disk / f"{name}_{i}"
    got = {"disk": save(d)}
    files = {f"boto3/{name}_{i}/{p.name}": p for p in d.iterdir()}
    got["files"] = len(files)
    got["boto3"] = b.boto3("upload", files)["seconds"]
    got.update(dir_times(d, "disk") if dir_ops else {})
    shutil.rmtree(d, ignore_errors=True)
    b.delete("boto3/")
    return got


def _mount_side(
    b: Bench, gw: Gateway, name: str, i: int, save: Callable[[Path], float], dir_ops: bool
) -> dict[str, float]:
    m = gw.mountpoint / name / f"step_{i}"
    got = {"mount": save(m)}
    want = {f"gw/{name}/step_{i}/{p.name}": p.stat().st_size for p in m.iterdir()}
    t0 = time.perf_counter()
    b.wait_durable(gw, want)
    got["durable"] = time.perf_counter() - t0
    got.update(dir_times(m, "mount") if dir_ops else {})
    shutil.rmtree(m, ignore_errors=True)
    # The deletes of those objects are done before the next round (as the boto3 side's
    # are): they would otherwise compete with its uploads, or with boto3's.
    b.wait_store_ops(gw)
    return got


def add_files_rows(b: Bench, what: str, x: str, s: dict[str, list[float]]) -> None:
    med = {k: statistics.median(v) for k, v in s.items()}
    b.add(
        Row(f"save stall ({what})", x, "disk", med["disk"], med["mount"], "s"),
        Row(f"time to durable ({what})", x, "boto3 upload", med["boto3"], med["durable"], "s"),
    )
    if what == "writers":
        return
    starts = [d + b for d, b in zip(s["disk"], s["boto3"], strict=True)]
    ends = [m + d for m, d in zip(s["mount"], s["durable"], strict=True)]
    b.add(
        Row(
            f"durable from start ({what})",
            x,
            "disk save + boto3",
            statistics.median(starts),
            statistics.median(ends),
            "s",
        )
    )
    for op in _DIR_COMMANDS:
        if f"{op} disk" in s:
            b.add(Row(f"{op} ({what})", x, "disk", med[f"{op} disk"], med[f"{op} mount"], "s"))


def many_files(b: Bench, total: int, tensors: int, dir_ops: bool = False) -> None:
    say(f"\n## DCP save, {tensors} tensors ({mib(total)}): one file per tensor")
    sd = {f"t{i}": torch.randn(total // 4 // tensors) for i in range(tensors)}
    s, n = save_rounds(
        b,
        f"dcp{tensors}",
        lambda target: timed(functools.partial(dcp_save, sd, target)),
        dir_ops=dir_ops,
    )
    b.samples[f"dcp {tensors} {b.path}"] = {"files": n, "bytes": total, "samples": s}
    add_files_rows(b, "DCP", f"{n} files", s)


def small_files(b: Bench, count: int, size: int) -> None:
    say(f"\n## {count} files of {size >> 10} KiB, each written and fsynced")
    s, n = save_rounds(
        b, "small", lambda target: timed(functools.partial(write_small, target, count, size))
    )
    b.samples[f"small {b.path}"] = {"files": n, "bytes": count * size, "samples": s}
    add_files_rows(b, "small files", f"{n}x{size >> 10}KiB", s)


def writers(b: Bench, n: int, shard: int) -> None:
    say(f"\n## {n} writer process(es), {mib(shard)} each, saving at once")
    ranks = [
        subprocess.Popen(
            [sys.executable, "-m", "bench.rank", "--rank", str(r), "--bytes", str(shard)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
            cwd=ROOT,
        )
        for r in range(n)
    ]

    def save_all(target: Path) -> float:
        """All ranks save into ``target`` at once; seconds until the last one returned."""
        target.mkdir(parents=True)
        os.sync()
        t0 = time.monotonic()
        for p in ranks:
            assert p.stdin is not None
            p.stdin.write(f"{target}\n")
        ends = [float(p.stdout.readline()) for p in ranks if p.stdout is not None]
        return max(ends) - t0

    try:
        for p in ranks:
            assert p.stdout is not None
            if p.stdout.readline().strip() != "ready":
                raise RuntimeError("a rank failed to start")
        s, _ = save_rounds(b, "w", save_all)
    finally:
        for p in ranks:
            if p.stdin is not None:
                p.stdin.close()
        for p in ranks:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    b.samples[f"writers {n} {b.path}"] = {"shard_bytes": shard, "samples": s}
    add_files_rows(b, "writers", str(n), s)
