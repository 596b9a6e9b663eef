"""`make bench`: the gateway against the limit, every figure measured in the same run.

Everything runs on each data path of the mount (``--paths``, fsops.passthrough): the
kernel's (passthrough, where this machine can) and the daemon's, one after the other; each
section (a size, the DCP save, a writer count) on a moto server of its own.

For each checkpoint size (256 MiB to 4 GiB by default):
- save stall: ``torch.save`` + fsync + rename through the mount, against the same save into a
  directory on the cache disk; and the daemon's CPU seconds per GiB saved (target 0.05);
- cold read of the cached clean file (``torch.load`` after dropping the page cache), against
  the same from the disk (root only: it drops caches);
- time to durable: from the save's return until the object is complete in the bucket (the
  gateway's word, then checked in the bucket: :meth:`bench.common.Bench.wait_durable`), against
  boto3 uploading the same bytes (its transfer manager, same part size and parts in flight);
- drain CPU seconds per GiB (the daemon's, during the drain) against boto3's, and the peak
  resident memory of each;
Then a DCP save of many files (mount against disk, and until all are in the bucket against
boto3 uploading them), 1 to 8 writer processes saving their shards at once, like the ranks
of one node, and files written through the NFS gateway mode (bench.nfs: NFS-Ganesha on
loopback against the FUSE mount and the disk; root, with Ganesha and libnfs installed).

Trust (:mod:`bench.trust`): the overwrite window (``latest.pt`` saved again under its name:
the time its key is missing from the bucket, target 0) and the time to durable behind a
proxy that ignores ``Expect: 100-continue`` against one that answers it (target 1.2x).

Cold restore (``--restore-sizes``, and the DCP checkpoint): ``torch.load`` (or a DCP load)
through a fresh gateway with an empty cache and ckptgw's default fetch settings, against
boto3 downloading the same objects, tuned (64 MiB parts, 8 threads; the DCP files: 8 MiB,
8 threads, the gateway's GETs in flight) and with its own defaults (8 MiB, 10 threads); the
sides go first in turn, run by run.

The store is moto's S3 server on loopback; the disk is the one under ``--workdir``. Writes
``bench/results/suite.json``, ``suite_size.png`` and ``suite_writers.png`` and prints the table.

    python -m bench.suite [--sizes 256,1024,4096] [--writers 1,2,4,8] [--runs 3]
                          [--restore-sizes 1024,4096]
                          [--only save,...,expect,fleet,journal]
                          [--fleet 8:32:50,16:64:100]
                          [--nfs-mib 1024] [--nfs-writers 1,8] [--paths passthrough,daemon]
"""

from __future__ import annotations

import argparse
import datetime
import functools
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from bench import fleet as fleets
from bench import floor as daemons
from bench.common import (
    BOTO3_DEFAULTS,
    BOTO3_TUNED,
    CREDS,
    PART,
    PARTS,
    ROOT,
    Bench,
    Row,
    say,
)
from bench.results import save
from bench.sections import drain, files, fleet, floor, journal, nfs, restore, trust
from bench.sections import save as sizes
from ckptgw.fsops import passthrough
from ckptgw.fsops.passthrough import DAEMON, PASSTHROUGH
from ckptgw.gateway.harness import exit_on_sigterm
from ckptgw.gateway.storeplace import place_of
from tests.nfsclient import nfs_unavailable
from tests.s3server import moto_server

#: One section run: the part worker count its Bench is made with, and what it runs.
Section = tuple[int | None, Callable[[Bench], None]]
#: A section's runs for one data path: from the arguments and the part worker counts
#: (``--part-workers``; the sections that do not compare them run with the first).
Planner = Callable[[argparse.Namespace, list[int | None]], list[Section]]


def machine(workdir: Path) -> dict[str, Any]:
    cpu = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        ),
        platform.processor(),
    )
    mem = int(Path("/proc/meminfo").read_text().split()[1]) * 1024
    fstype = place_of(workdir).fstype  # from mountinfo: statfs says "ext2/ext3" for ext4
    return {
        "date": datetime.date.today().isoformat(),
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "memory_gib": round(mem / 2**30),
        "disk": f"{workdir} ({fstype})",
        "kernel": platform.release(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "moto": metadata.version("moto"),
        "boto3": metadata.version("boto3"),
    }


def commit() -> str:
    """The commit checked out, with ``+`` when the tree has changes not committed."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
        ).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], check=False, cwd=ROOT).returncode
    except (OSError, subprocess.CalledProcessError):
        return ""
    return head + ("+" if dirty else "")


def table(rows: list[Row]) -> str:
    out = [
        f"{'metric':28} {'at':>9} {'data path':>11}  {'baseline':>14} {'limit':>9} "
        f"{'gateway':>9} {'ratio':>7}  target"
    ]
    for r in rows:
        verdict = "-"
        if r.target is not None:
            verdict = f"<= {r.target:.2f}x " + ("met" if r.ratio <= r.target else "MISSED")
        out.append(
            f"{r.metric:28} {r.x:>9} {r.path:>11}  {r.baseline:>14} {r.base:8.2f}{r.unit[0]} "
            f"{r.gateway:8.2f}{r.unit[0]} {r.ratio:6.2f}x  {verdict}"
        )
    return "\n".join(out)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="256,1024,4096", help="checkpoint sizes in MiB")
    ap.add_argument("--writers", default="1,2,4,8", help="writer process counts")
    ap.add_argument("--shard-mib", type=int, default=256, help="each writer's shard")
    ap.add_argument("--dcp-mib", type=int, default=256)
    ap.add_argument("--dcp-tensors", type=int, default=512, help="the DCP load's checkpoint")
    ap.add_argument(
        "--dcp-files",
        default="512,2000",
        help="DCP saves of these many tensors (one file each); the largest also times "
        "ls -l, du and rm -rf of the checkpoint",
    )
    ap.add_argument("--small-files", type=int, default=10_000, help="0: no small-files section")
    ap.add_argument("--small-kib", type=int, default=64)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument(
        "--restore-sizes",
        default="1024,4096",
        help="cold restore of these sizes in MiB (moto reads a whole object for every ranged "
        "GET, so its cost grows with the square of the size)",
    )
    ap.add_argument(
        "--restore-defaults-max-mib",
        type=int,
        default=1024,
        help="compare with boto3's own defaults (8 MiB parts) only up to this size: on moto "
        "they take about 85 s per GiB, and 20 times that at 4 GiB",
    )
    ap.add_argument("--nfs-mib", type=int, default=1024, help="each NFS writer's file")
    ap.add_argument("--nfs-writers", default="1,8", help="NFS writer counts")
    ap.add_argument("--drain-files", default="1,4,8", help="files draining at once")
    ap.add_argument("--drain-mib", type=int, default=256, help="each draining file's size")
    ap.add_argument(
        "--part-workers",
        default="",
        help="drain.part_workers for the save and drain sections, one round each (e.g. 0,4); "
        "default: the gateway's own",
    )
    ap.add_argument(
        "--overwrite-sizes", default="256,1024", help="the overwrite window at these sizes (MiB)"
    )
    ap.add_argument("--expect-mib", type=int, default=1024, help="the Expect section's file")
    ap.add_argument(
        "--only",
        default="save,restore,files,floor,writers,drain,nfs,overwrite,expect,fleet,journal",
    )
    ap.add_argument(
        "--fleet",
        default="8:32:50,16:64:100",
        help="fleets as GATEWAYS:FILES:WRITES_PER_S, each gateway saving FILES files of "
        "--fleet-kib at once behind a store taking WRITES_PER_S (reads: 1.57x)",
    )
    ap.add_argument("--fleet-kib", type=int, default=128, help="the fleet's file size (KiB)")
    ap.add_argument("--fleet-saves", type=int, default=2, help="saves per fleet (the first cold)")
    ap.add_argument(
        "--journal-sizes",
        default="10000,1000000",
        help="journal entries of the journal section's cache dirs (the largest against the "
        "smallest)",
    )
    ap.add_argument(
        "--floor-hp",
        default="",
        help="libfuse's passthrough_hp for the floor section (default: the one make floor-tools "
        "built into the venv, if any)",
    )
    ap.add_argument(
        "--paths",
        default=f"{PASSTHROUGH},{DAEMON}",
        help="the mount's data paths to measure (passthrough is skipped where unavailable)",
    )
    ap.add_argument("--workdir", default="/var/tmp", help="a directory on the cache disk")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    ap.add_argument(
        "--publish",
        action="store_true",
        help="merge the rows into docs/results/MACHINE.json and write docs/benchmarks.md",
    )
    ap.add_argument("--machine", help="with --publish: the machine's name (default: its CPU)")
    return ap


def _sizes(args: argparse.Namespace, workers: list[int | None]) -> list[Section]:
    return [
        (w, functools.partial(sizes.sizes, size=size))
        for w in workers
        for size in (int(x) << 20 for x in args.sizes.split(","))
    ]


def _drain(args: argparse.Namespace, workers: list[int | None]) -> list[Section]:
    return [
        (w, functools.partial(drain.drain_files, n=n, size=args.drain_mib << 20))
        for w in workers
        for n in (int(x) for x in args.drain_files.split(","))
    ]


def _restore(args: argparse.Namespace, workers: list[int | None]) -> list[Section]:
    out: list[Section] = []
    for size in (int(x) << 20 for x in args.restore_sizes.split(",")):
        defaults = size <= args.restore_defaults_max_mib << 20
        out.append((workers[0], functools.partial(restore.restore, size=size, defaults=defaults)))
    out.append(
        (
            workers[0],
            functools.partial(
                restore.restore_files, total=args.dcp_mib << 20, tensors=args.dcp_tensors
            ),
        )
    )
    return out


def _files(args: argparse.Namespace, workers: list[int | None]) -> list[Section]:
    counts = [int(x) for x in args.dcp_files.split(",")]
    out: list[Section] = [
        (
            workers[0],
            functools.partial(
                files.many_files,
                total=args.dcp_mib << 20,
                tensors=tensors,
                dir_ops=tensors == max(counts),
            ),
        )
        for tensors in counts
    ]
    if args.small_files:
        out.append(
            (
                workers[0],
                functools.partial(
                    files.small_files, count=args.small_files, size=args.small_kib << 10
                ),
            )
        )
    return out


def _floor(args: argparse.Namespace, workers: list[int | None]) -> list[Section]:
    hp = Path(args.floor_hp) if args.floor_hp else daemons.passthrough_hp()
    if hp is None:
        say("no libfuse passthrough_hp here (make floor-tools builds it)")
    tensors = min(int(x) for x in args.dcp_files.split(","))
    run = functools.partial(floor.floor, total=args.dcp_mib << 20, tensors=tensors, hp=hp)
    return [(workers[0], run)]


def _writers(args: argparse.Namespace, workers: list[int | None]) -> list[Section]:
    return [
        (workers[0], functools.partial(files.writers, n=n, shard=args.shard_mib << 20))
        for n in (int(x) for x in args.writers.split(","))
    ]


def _overwrite(args: argparse.Namespace, workers: list[int | None]) -> list[Section]:
    return [
        (workers[0], functools.partial(trust.overwrite, size=size))
        for size in (int(x) << 20 for x in args.overwrite_sizes.split(","))
    ]


def _expect(args: argparse.Namespace, workers: list[int | None]) -> list[Section]:
    return [(workers[0], functools.partial(trust.expect, size=args.expect_mib << 20))]


def _journal(args: argparse.Namespace, workers: list[int | None]) -> list[Section]:
    sizes = tuple(int(x) for x in args.journal_sizes.split(","))
    return [(workers[0], functools.partial(journal.journal, sizes=sizes))]


def _fleet(args: argparse.Namespace, workers: list[int | None]) -> list[Section]:
    out: list[Section] = []
    for spec in args.fleet.split(","):
        n, count, rate = spec.split(":")
        plan = fleets.Plan(int(n), int(count), args.fleet_kib << 10, float(rate), args.fleet_saves)
        out.append((workers[0], functools.partial(fleet.fleet, plan=plan)))
    return out


def _nfs(args: argparse.Namespace, workers: list[int | None]) -> list[Section]:
    return [
        (workers[0], functools.partial(nfs.nfs_writes, size=args.nfs_mib << 20, n=n))
        for n in (int(x) for x in args.nfs_writers.split(","))
    ]


#: The sections in the order they run on each data path (``--only`` picks among them), and
#: whether they run on every path (False: on the first only, since the drain's or the
#: journal's figures do not depend on it).
SECTIONS: tuple[tuple[str, Planner, bool], ...] = (
    ("save", _sizes, True),
    ("drain", _drain, True),
    ("restore", _restore, True),
    ("files", _files, True),
    ("floor", _floor, True),
    ("writers", _writers, True),
    ("overwrite", _overwrite, True),
    ("expect", _expect, True),
    ("journal", _journal, False),
    ("fleet", _fleet, False),
    ("nfs", _nfs, True),
)


def main() -> None:
    exit_on_sigterm()
    args = parser().parse_args()
    only = set(args.only.split(","))
    paths = args.paths.split(",")
    if PASSTHROUGH in paths and (why := passthrough.unavailable(True)) is not None:
        say(f"no passthrough here ({why}): measuring the daemon path only")
        paths.remove(PASSTHROUGH)
    if "nfs" in only and (why := nfs_unavailable()) is not None:
        say(f"no NFS section here: {why}")
        only.discard("nfs")
    os.environ.update(CREDS)
    work = Path(tempfile.mkdtemp(prefix="ckptgw-bench-", dir=args.workdir))
    info = machine(Path(args.workdir))
    measured = commit()  # the code the run starts with
    say("machine: " + ", ".join(f"{k} {v}" for k, v in info.items()))
    t_start = time.monotonic()
    rows: list[Row] = []  # reported even if a later section fails
    samples: dict[str, Any] = {}
    workers: list[int | None] = [None]  # the gateway's default
    if args.part_workers:
        workers = [int(x) for x in args.part_workers.split(",")]
    sections = [
        (path, w, run)
        for path in paths
        for name, planned, every_path in SECTIONS
        if name in only and (every_path or path == paths[0])
        for w, run in planned(args, workers)
    ]
    try:
        for i, (path, w, section) in enumerate(sections):
            # A moto server per section: it keeps every object in memory, and one server for
            # every size on both paths ran out of it (24 GiB).
            with moto_server() as endpoint:
                section(Bench(work / f"section{i}", endpoint, args.runs, path, rows, samples, w))
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if rows:
            report(rows, samples, info, args, time.monotonic() - t_start, measured)


def report(
    rows: list[Row],
    samples: dict[str, Any],
    info: dict[str, Any],
    args: argparse.Namespace,
    seconds: float,
    measured: str,
) -> None:
    say("\n" + table(rows))
    say(f"\n(all ratios: gateway / limit measured in this run; {seconds:.0f} s)")
    doc = {
        "machine": info,
        "command": "python -m bench.suite "
        + " ".join(a for a in sys.argv[1:] if a not in ("--publish",)),
        "commit": measured,
        "seconds": round(seconds),
        "settings": {
            "part": PART,
            "parts": PARTS,
            "fetch": "ckptgw's defaults",
            "boto3_download_tuned": list(BOTO3_TUNED),
            "boto3_download_defaults": list(BOTO3_DEFAULTS),
            "runs": args.runs,
            "paths": sorted({r.path for r in rows}),
            "part_workers": args.part_workers or "the gateway's default",
            "fleet": args.fleet,
            "journal_sizes": args.journal_sizes,
        },
        "rows": [asdict(r) | {"ratio": r.ratio, "target": r.target} for r in rows],
        "samples": samples,
    }
    say(f"wrote {save('suite', doc, args.out)}")
    if args.publish:
        from bench import report as page

        say(f"wrote {page.publish(doc, args.machine)} and {page.write()}")
    from bench.plots import plot_sizes, plot_writers

    for path in (plot_sizes(doc, args.out), plot_writers(doc, args.out)):
        if path is not None:
            say(f"wrote {path}")


if __name__ == "__main__":
    main()
