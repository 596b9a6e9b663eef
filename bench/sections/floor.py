"""The FUSE floor: the DCP save through FUSE daemons that only pass a directory through
(:mod:`bench.floor`) beside ckptgw."""

from __future__ import annotations

import functools
import shutil
import statistics
from pathlib import Path

import torch

from bench import floor as daemons
from bench.common import (
    Bench,
    Row,
    mib,
    say,
    timed,
)
from bench.workloads import dcp_save
from ckptgw.fsops.passthrough import PASSTHROUGH


def floor(b: Bench, total: int, tensors: int, hp: Path | None) -> None:
    """The DCP save of :func:`bench.sections.files.many_files` on the disk, through FUSE
    daemons that only pass a directory through (:mod:`bench.floor`), and through ckptgw: what
    any FUSE daemon costs a sharded save on this machine, beside what ckptgw costs. The sides
    go first in turn (each equally often when the runs are a multiple of the sides); each
    removes what it saved before the next begins."""
    say(f"\n## the FUSE floor: DCP save, {tensors} tensors ({mib(total)}), one file per tensor")
    sd = {f"t{i}": torch.randn(total // 4 // tensors) for i in range(tensors)}
    cmds = daemons.daemons(hp, passthrough=b.path == PASSTHROUGH)
    names = ["disk", *cmds, "ckptgw"]
    s: dict[str, list[float]] = {k: [] for k in names}
    n = 0

    def save(d: Path) -> float:
        nonlocal n
        t = timed(functools.partial(dcp_save, sd, d))
        n = sum(1 for p in d.iterdir() if p.is_file())
        shutil.rmtree(d)
        return t

    with b.node() as gw:
        for i in range(b.runs + 1):  # the first round warms all up and is not counted
            got: dict[str, float] = {}
            for side in names[i % len(names) :] + names[: i % len(names)]:
                if side == "disk":
                    got[side] = save(b.disk / f"floor_{i}")
                elif side == "ckptgw":
                    got[side] = save(gw.mountpoint / f"floor_{i}")
                    b.wait_store_ops(gw)
                else:
                    where = b.work / f"floor_{i}_{len(got)}"
                    with daemons.mounted(cmds[side], where / "src", where / "mnt") as m:
                        got[side] = save(m / "d")
                    shutil.rmtree(where)
            say(
                f"  run {i}{' (warm-up)' if not i else ''}: {n} files, "
                + ", ".join(f"{k} {v:.2f} s" for k, v in got.items())
            )
            if i:
                for k, v in got.items():
                    s[k].append(v)
    b.samples[f"floor {tensors} {b.path}"] = {"files": n, "bytes": total, "samples": s}
    disk = statistics.median(s["disk"])
    for side in names[1:]:
        x = f"{n} files, {side}"
        b.add(Row("DCP save (FUSE floor)", x, "disk", disk, statistics.median(s[side]), "s"))
