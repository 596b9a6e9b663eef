"""One checkpoint per size: the save stall, the daemon's save CPU, the cold read of the cached
file, the time to durable and the drain's CPU and memory, each against its limit."""

from __future__ import annotations

import functools
import statistics
import time
from pathlib import Path

import torch

from bench.common import (
    SAVE_CPU_LIMIT,
    Bench,
    Row,
    drop_caches,
    mib,
    say,
    timed,
)
from bench.procs import cpu_seconds, tree_cpu_seconds, tree_peak_rss
from bench.workloads import save_atomic, state_dict


def sizes(b: Bench, size: int) -> None:
    label = mib(size) + b.workers
    say(
        f"\n## {label} checkpoint [{b.path}]: save stall, save CPU, cold read, "
        "time to durable, drain CPU, memory"
    )
    sd = state_dict(size)
    keys = ("disk", "mount", "save_cpu", "boto3", "durable", "cpu", "boto3_cpu")
    s: dict[str, list[float]] = {k: [] for k in (*keys, "read_disk", "read_mount")}
    nbytes, boto3_rss = 0, 0.0
    with b.node() as gw:
        assert gw.pid is not None
        for i in range(b.runs + 1):  # the first round warms both up and is not counted
            got: dict[str, float] = {}

            # Each side cleans up after itself (file, object) before the other begins: with
            # the first side's 1 GiB still in moto's memory, the second upload of a round,
            # boto3's or ours, took 12.6-14.3 s against 7.7-9.2 s for the first.
            def disk_side(i: int = i, got: dict[str, float] = got) -> None:
                d = b.disk / "ckpt.pt"
                got["disk"] = timed(functools.partial(save_atomic, sd, d))
                got["bytes"] = d.stat().st_size
                up = b.boto3("upload", {f"boto3/size/{i}.pt": d})
                got.update(boto3=up["seconds"], boto3_cpu=up["cpu_seconds"])
                got["boto3_rss"] = up["peak_rss_bytes"]
                if i and (read := cold_read(b, d)) is not None:
                    got["read_disk"] = read
                d.unlink()
                b.delete("boto3/")

            def mount_side(i: int = i, got: dict[str, float] = got) -> None:
                assert gw.pid is not None
                m = gw.mountpoint / f"size/step_{i}/ckpt.pt"
                m.parent.mkdir(parents=True)
                c0 = cpu_seconds(gw.pid)
                got["mount"] = timed(functools.partial(save_atomic, sd, m))
                got["save_cpu"] = cpu_seconds(gw.pid) - c0
                t0, c0 = time.perf_counter(), tree_cpu_seconds(gw.pid)  # with its workers
                b.wait_durable(gw, {f"gw/size/step_{i}/ckpt.pt": m.stat().st_size})
                got["durable"] = time.perf_counter() - t0
                got["cpu"] = tree_cpu_seconds(gw.pid) - c0
                if i and (read := cold_read(b, m)) is not None:  # clean in the cache now
                    got["read_mount"] = read
                m.unlink()
                b.wait_store_ops(gw)  # its object deleted

            for side in (disk_side, mount_side) if i % 2 else (mount_side, disk_side):
                side()
            nbytes, boto3_rss = int(got["bytes"]), max(boto3_rss, got["boto3_rss"])
            reads = "read_disk" in got and "read_mount" in got
            say(
                f"  run {i}{' (warm-up)' if not i else ''}: save disk {got['disk']:6.2f} s, "
                f"mount {got['mount']:6.2f} s ({got['save_cpu']:5.2f} CPU s); durable after "
                f"{got['durable']:6.2f} s ({got['cpu']:5.2f} CPU s), boto3 upload "
                f"{got['boto3']:6.2f} s ({got['boto3_cpu']:5.2f} CPU s)"
                + (
                    f"; cold read disk {got['read_disk']:6.2f} s, mount {got['read_mount']:6.2f} s"
                    if reads
                    else ""
                )
            )
            if i:
                for k in (*keys, *(("read_disk", "read_mount") if reads else ())):
                    s[k].append(got[k])
        rss = tree_peak_rss(gw.pid)
    sd.clear()  # its memory back before the next section
    gib = nbytes / (1 << 30)
    med = {k: statistics.median(v) for k, v in s.items() if v}
    b.samples[f"size {label} {b.path}"] = {
        "bytes": nbytes,
        "samples": s,
        "daemon_peak_rss": rss,
        "boto3_peak_rss": boto3_rss,
    }
    b.add(
        Row("save stall", label, "disk", med["disk"], med["mount"], "s"),
        Row("save CPU s/GiB", label, "limit", SAVE_CPU_LIMIT, med["save_cpu"] / gib, "s"),
        Row("time to durable", label, "boto3 upload", med["boto3"], med["durable"], "s"),
        Row(
            "drain CPU s/GiB",
            label,
            "boto3 upload",
            med["boto3_cpu"] / gib,
            med["cpu"] / gib,
            "s",
        ),
        Row(
            "peak memory (MiB)",
            label,
            "boto3 process",
            boto3_rss / 2**20,
            rss / 2**20,
            "MiB",
        ),
    )
    if "read_mount" in med:
        b.add(Row("cold read (cached)", label, "disk", med["read_disk"], med["read_mount"], "s"))
    b.delete("gw/size/")


def cold_read(b: Bench, path: Path) -> float | None:
    """Seconds of ``torch.load`` of a checkpoint (on the disk, or clean in the mount's
    cache) with an empty page cache; None where caches cannot be dropped."""
    if not drop_caches():
        return None
    t0 = time.perf_counter()
    del_me = torch.load(path, weights_only=True)
    seconds = time.perf_counter() - t0
    del del_me
    return seconds
