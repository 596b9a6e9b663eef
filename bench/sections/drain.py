"""Files draining at once: from the last write's return until all are in the bucket, against
boto3 uploading the same files at once."""

from __future__ import annotations

import os
import shutil
import statistics
import threading
import time
from pathlib import Path

from bench.common import (
    Bench,
    Row,
    mib,
    say,
)
from bench.procs import children, cpu_seconds, tree_cpu_seconds, tree_peak_rss


def drain_files(b: Bench, n: int, size: int) -> None:
    """``n`` files of ``size`` written at once (a thread each, fsynced), then drained at
    once: from the last write's return until all are in the bucket, against boto3
    uploading the same files at once (one transfer manager: the same part size and parts
    in flight). CPU: the daemon with its part workers, and the daemon alone."""
    x = (f"{n}x{mib(size)}" if n > 1 else mib(size)) + b.workers
    say(f"\n## {x} [{b.path}]: {n} file(s) draining at once")
    block = os.urandom(64 << 20)

    def write_all(target: Path) -> list[Path]:
        target.mkdir(parents=True)
        files = [target / f"f{k}.bin" for k in range(n)]

        def write(path: Path) -> None:
            with path.open("wb") as f:
                f.write(os.urandom(16))  # no two files alike
                for off in range(16, size, len(block)):
                    f.write(block[: min(len(block), size - off)])
                f.flush()
                os.fsync(f.fileno())

        os.sync()
        threads = [threading.Thread(target=write, args=(p,)) for p in files]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return files

    keys = ("boto3", "durable", "boto3_cpu", "cpu", "daemon_cpu")
    s: dict[str, list[float]] = {k: [] for k in keys}
    with b.node() as gw:
        assert gw.pid is not None
        pid = gw.pid
        workers = len(children(pid))
        for i in range(b.runs + 1):  # the first round warms both up and is not counted
            got: dict[str, float] = {}

            def disk_side(i: int = i, got: dict[str, float] = got) -> None:
                files = write_all(b.disk / f"drain_{i}")
                up = b.boto3("upload", {f"boto3/drain_{i}/{p.name}": p for p in files})
                got.update(boto3=up["seconds"], boto3_cpu=up["cpu_seconds"])
                shutil.rmtree(b.disk / f"drain_{i}")
                b.delete("boto3/")

            def mount_side(i: int = i, got: dict[str, float] = got) -> None:
                files = write_all(gw.mountpoint / "drain" / f"step_{i}")
                want = {f"gw/drain/step_{i}/{p.name}": size for p in files}
                t0, c0, d0 = time.perf_counter(), tree_cpu_seconds(pid), cpu_seconds(pid)
                b.wait_durable(gw, want)
                got.update(
                    durable=time.perf_counter() - t0,
                    cpu=tree_cpu_seconds(pid) - c0,
                    daemon_cpu=cpu_seconds(pid) - d0,
                )
                shutil.rmtree(gw.mountpoint / "drain" / f"step_{i}")
                b.wait_store_ops(gw)

            for side in (disk_side, mount_side) if i % 2 else (mount_side, disk_side):
                side()
            gib = n * size / (1 << 30)
            say(
                f"  run {i}{' (warm-up)' if not i else ''}: durable after "
                f"{got['durable']:6.2f} s ({n * size / got['durable'] / 2**20:5.0f} MiB/s; "
                f"CPU {got['cpu'] / gib:5.2f} s/GiB, the daemon's own "
                f"{got['daemon_cpu'] / gib:5.2f}), boto3 upload {got['boto3']:6.2f} s "
                f"({n * size / got['boto3'] / 2**20:5.0f} MiB/s; "
                f"CPU {got['boto3_cpu'] / gib:5.2f} s/GiB)"
            )
            if i:
                for k in keys:
                    s[k].append(got[k])
        rss = tree_peak_rss(pid)
    gib = n * size / (1 << 30)
    b.samples[f"drain {x} {b.path}"] = {
        "files": n,
        "file_bytes": size,
        "part_workers": workers,
        "samples": s,
        "daemon_and_workers_peak_rss": rss,
    }
    med = {k: statistics.median(v) for k, v in s.items()}
    b.add(
        Row("time to durable (at once)", x, "boto3 upload", med["boto3"], med["durable"], "s"),
        Row(
            "drain CPU s/GiB (at once)",
            x,
            "boto3 upload",
            med["boto3_cpu"] / gib,
            med["cpu"] / gib,
            "s",
        ),
        Row(
            "daemon's own CPU s/GiB",
            x,
            "boto3 upload",
            med["boto3_cpu"] / gib,
            med["daemon_cpu"] / gib,
            "s",
        ),
    )
    b.delete("gw/drain/")
