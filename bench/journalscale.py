"""One node's journal at scale: a cache dir whose journal holds 10,000 and 1,000,000 entries.

A long run keeps thousands of checkpoints of hundreds of files on a node, every one drained.
This builds such cache dirs and measures a real ``ckptgw mount`` daemon on each: the same
figures at 10k and at 1M entries, and their ratio. Targets (issue 41): a create and
``status`` no slower at 1M than at 10k, ``status`` within a second, and the daemon's memory
bounded by what is open and in flight, not by the journal's size.

The journal (built through :class:`fsops.journal.Journal`, in one transaction) holds N
entries: empty files in directories of 1,000 (``run/step_1`` ...), and one directory of
10,000 files (``run/step_0``) that ``ls -l`` lists. Every entry is drained, in one of two
kinds of cache dir:

- ``clean``: each file has its (empty) cache file and its stored key, as after a drain;
- ``remote``: each file has its stored key and no cache file, as listed from the store
  (or evicted).

The store is a file:// directory that holds no object of those entries: nothing measured
here reads one. Figures, each on a mount of its own cache dir:

- mount: ``ckptgw mount`` until it returns (the mount is ready);
- remount after kill -9: the daemon is killed, then ``ckptgw mount`` again (recovery from an
  unclean shutdown) until it returns;
- status, status --json: ``ckptgw status`` commands, start to exit (median), and apart the
  first after the mount (``status (first)``, with --json), which counts every file;
- pending: a ``pending`` request of the whole mount on the control socket (median);
- create: the mean of 1,000 creates (open O_CREAT, close; not fsynced) of empty files in a
  fresh directory, the median of the runs;
- ls -l: ``ls -l`` of the 10,000-file directory, the first after the mount;
- RSS: the daemon's VmRSS and VmHWM (/proc) after the mount, after the requests, and after
  the remount.

    python -m bench.journalscale [--sizes 10000,1000000] [--kinds clean,remote] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from bench.results import save
from ckptgw.fsops.cache import CacheFiles
from ckptgw.fsops.journal import ROOT_INODE, InodeRow, Journal, State
from ckptgw.gateway.harness import Gateway, exit_on_sigterm

PER_DIRECTORY = 1000  # files per checkpoint directory
LISTED = 10_000  # files of the directory ``ls -l`` lists
CREATES = 1000
SIZES = (10_000, 1_000_000)
KINDS = ("clean", "remote")
# Targets of the ratios (1M / 10k) and the limit of status's seconds; the metric names of
# :func:`rows_of` (bench.common.Row looks a row's target up by its metric).
TARGETS = {
    "journal: create": 1.2,
    "journal: status": 1.2,
    "journal: status --json": 1.2,
    "journal: pending": 1.2,
    "journal: status (limit)": 1.0,
    "journal: RSS": 1.2,
    "journal: peak RSS": 1.2,
}
STATUS_LIMIT = 1.0  # seconds
R = TypeVar("R")


def say(msg: str) -> None:
    print(msg, flush=True)


# -- building ----------------------------------------------------------------------------------


def _model(root: Path, store: str, env: dict[str, str]) -> InodeRow:
    """A drained empty file's journal row (its etag and checksum, as the store gave them)."""
    gw = Gateway(root / "mnt", root / "cache", store, env=env)
    with gw:
        (gw.mountpoint / "model").write_bytes(b"")
        left = gw.control().request("pending", paths=[], wait=60)
        if left["count"]:
            raise RuntimeError(f"the model file did not drain: {left}")
    j = Journal(root / "cache" / "journal.db")
    try:
        model = j.resolve("model")
        if model is None or model.state is not State.CLEAN:
            raise RuntimeError(f"no drained model file: {model}")
        return model
    finally:
        j.close()


def build(root: Path, n: int, kind: str, store: str, env: dict[str, str]) -> float:
    """A cache dir at ``root/cache`` whose journal holds ``n`` drained entries (see the
    module's docstring); returns the seconds it took."""
    t0 = time.perf_counter()
    model = _model(root, store, env)
    cache_dir = root / "cache"
    j = Journal(cache_dir / "journal.db")
    cache = CacheFiles(cache_dir, 0, 0, direct_io=False) if kind == "clean" else None
    state = State.CLEAN if kind == "clean" else State.REMOTE
    now = time.time_ns()

    def entry(parent: int, name: str, mode: int, key: str) -> InodeRow:
        return InodeRow(
            0, parent, name.encode(), mode, model.uid, model.gid, 0, now, now, now, None,
            state if mode == model.mode else State.CLEAN, 1, key, model.stored_etag,
            model.checksum if mode == model.mode else None,
        )  # fmt: skip

    try:
        with j.transaction():
            run = j.insert(entry(ROOT_INODE, "run", 0o40755, "run/"))
            step, made = 0, 0
            while made < n:
                count = min(LISTED if step == 0 else PER_DIRECTORY, n - made)
                d = f"run/step_{step}"
                parent = j.insert(entry(run, f"step_{step}", 0o40755, f"{d}/"))
                for i in range(count):
                    ino = j.insert(entry(parent, f"f{i}", model.mode, f"{d}/f{i}"))
                    if cache is not None:
                        cache.create(ino)
                made += count
                step += 1
    finally:
        if cache is not None:
            cache.close()
        j.close()
    return time.perf_counter() - t0


# -- measuring ---------------------------------------------------------------------------------


def memory(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process, in bytes."""
    got = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                got[key] = int(value.split()[0]) * 1024
    return got["VmRSS"], got["VmHWM"]


def seconds(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


@dataclass
class Figures:
    """One cache dir's figures (seconds, bytes)."""

    n: int
    kind: str
    build: float = 0.0
    values: dict[str, float] = field(default_factory=dict)


def measure(root: Path, n: int, kind: str, runs: int, store: str, env: dict[str, str]) -> Figures:
    fig = Figures(n, kind)
    fig.build = build(root, n, kind, store, env)
    say(f"  built {n} {kind} entries in {fig.build:.1f} s")
    v = fig.values
    gw = Gateway(root / "mnt", root / "cache", store, env=env)
    try:
        v["mount"] = seconds(gw.start)
        assert gw.pid is not None
        v["rss mount"], v["hwm mount"] = memory(gw.pid)
        listed = gw.mountpoint / "run" / "step_0"
        v["ls -l"] = seconds(
            lambda: subprocess.run(["ls", "-l", str(listed)], check=True, stdout=subprocess.DEVNULL)
        )
        mp = str(gw.mountpoint)
        v["status (first)"] = seconds(lambda: gw.cli("status", mp, "--json"))
        v["status"] = statistics.median(seconds(lambda: gw.cli("status", mp)) for _ in range(runs))
        v["status --json"] = statistics.median(
            seconds(lambda: gw.cli("status", mp, "--json")) for _ in range(runs)
        )
        mount = gw.control()
        v["pending"] = statistics.median(
            seconds(lambda: mount.request("pending", paths=[], answer_within=600))
            for _ in range(runs)
        )
        means = []
        for r in range(runs):  # a create is a few FUSE round trips: the median of the runs
            fresh = gw.mountpoint / f"fresh{r}"
            fresh.mkdir()
            t0 = time.perf_counter()
            for i in range(CREATES):
                os.close(os.open(fresh / f"c{i}", os.O_CREAT | os.O_WRONLY, 0o644))
            means.append((time.perf_counter() - t0) / CREATES)
        v["create"] = statistics.median(means)
        v["rss requests"], v["hwm requests"] = memory(gw.pid)
        gw.kill()
        v["remount after kill -9"] = seconds(gw.start)
        v["rss remount"], v["hwm remount"] = memory(gw.pid)
    finally:
        gw.stop()
    return fig


# -- the report --------------------------------------------------------------------------------

# (figure, unit, scale, target of the ratio 1M/10k)
SHOWN = (
    ("mount", "s", 1.0, None),
    ("remount after kill -9", "s", 1.0, None),
    ("status (first)", "s", 1.0, None),
    ("status", "s", 1.0, TARGETS["journal: status"]),
    ("status --json", "s", 1.0, TARGETS["journal: status --json"]),
    ("pending", "s", 1.0, TARGETS["journal: pending"]),
    ("create", "ms", 1e3, TARGETS["journal: create"]),
    ("ls -l", "s", 1.0, None),
    ("rss mount", "MiB", 1 / (1 << 20), TARGETS["journal: RSS"]),
    ("hwm mount", "MiB", 1 / (1 << 20), TARGETS["journal: peak RSS"]),
    ("rss requests", "MiB", 1 / (1 << 20), TARGETS["journal: RSS"]),
    ("hwm requests", "MiB", 1 / (1 << 20), TARGETS["journal: peak RSS"]),
    ("rss remount", "MiB", 1 / (1 << 20), TARGETS["journal: RSS"]),
    ("hwm remount", "MiB", 1 / (1 << 20), TARGETS["journal: peak RSS"]),
)


def table(figures: list[Figures]) -> str:
    small, large = min(f.n for f in figures), max(f.n for f in figures)
    out = []
    for kind in sorted({f.kind for f in figures}):
        a = next(f for f in figures if f.kind == kind and f.n == small)
        b = next(f for f in figures if f.kind == kind and f.n == large)
        out.append(
            f"{kind} cache dir, {small:,} vs {large:,} entries "
            f"(built in {a.build:.1f} s and {b.build:.1f} s)"
        )
        out.append(f"  {'figure':24} {small:>12,} {large:>12,} {'ratio':>8}  target")
        for name, unit, scale, target in SHOWN:
            x, y = a.values[name] * scale, b.values[name] * scale
            ratio = y / x if x else float("inf")
            verdict = "-"
            if target is not None:
                verdict = f"<= {target:.1f}x " + ("met" if ratio <= target else "MISSED")
            if name.startswith("status"):
                met = "met" if b.values[name] <= STATUS_LIMIT else "MISSED"
                verdict += f"; < {STATUS_LIMIT:.0f} s {met}"
            out.append(f"  {name:24} {x:9.2f} {unit:3}{y:9.2f} {unit:3}{ratio:7.2f}x  {verdict}")
    return "\n".join(out)


def run(
    sizes: tuple[int, ...] = SIZES,
    kinds: tuple[str, ...] = KINDS,
    runs: int = 3,
    workdir: Path = Path("/var/tmp"),
) -> list[Figures]:
    """Build and measure each cache dir, one at a time (each removed after)."""
    work = Path(tempfile.mkdtemp(prefix="ckptgw-journal-", dir=workdir))
    env = {"CKPTGW_RUNTIME_DIR": str(work / "run")}
    out = []
    try:
        for kind in kinds:
            for n in sizes:
                say(f"{kind}, {n:,} entries")
                root = work / f"{kind}-{n}"
                store = f"file://{root / 'store'}"
                fig = measure(root, n, kind, runs, store, env)
                say("  " + ", ".join(f"{k} {val:.4g}" for k, val in fig.values.items()))
                out.append(fig)
                shutil.rmtree(root, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def rows_of(figures: list[Figures], row: Callable[..., R]) -> list[R]:
    """The figures as rows made by ``row(metric, x, baseline, base, gateway, unit)``
    (:class:`bench.common.Row`)."""
    small, large = min(f.n for f in figures), max(f.n for f in figures)
    out = []
    names = {
        "create": ("journal: create", "ms", 1e3),
        "status": ("journal: status", "s", 1.0),
        "status --json": ("journal: status --json", "s", 1.0),
        "pending": ("journal: pending", "s", 1.0),
        "mount": ("journal: mount", "s", 1.0),
        "remount after kill -9": ("journal: remount after kill -9", "s", 1.0),
        "ls -l": ("journal: ls -l 10k files", "s", 1.0),
        "rss requests": ("journal: RSS", "MiB", 1 / (1 << 20)),
        "hwm remount": ("journal: peak RSS", "MiB", 1 / (1 << 20)),
    }
    for kind in sorted({f.kind for f in figures}):
        a = next(f for f in figures if f.kind == kind and f.n == small)
        b = next(f for f in figures if f.kind == kind and f.n == large)
        x = f"{large // 1000}k {kind}" if large < 1_000_000 else f"{large // 1_000_000}M {kind}"
        base = f"{small // 1000}k entries"
        for name, (metric, unit, scale) in names.items():
            out.append(row(metric, x, base, a.values[name] * scale, b.values[name] * scale, unit))
        out.append(
            row("journal: status (limit)", x, "limit", STATUS_LIMIT, b.values["status"], "s")
        )
    return out


def main() -> None:
    exit_on_sigterm()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)), help="entries in the journal")
    ap.add_argument("--kinds", default=",".join(KINDS), help="clean, remote or both")
    ap.add_argument("--runs", type=int, default=3, help="status and pending: median of these")
    ap.add_argument("--workdir", default="/var/tmp", help="a directory on the cache disk")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = ap.parse_args()
    sizes = tuple(int(s) for s in args.sizes.split(","))
    kinds = tuple(args.kinds.split(","))
    figures = run(sizes, kinds, args.runs, Path(args.workdir))
    say("\n" + table(figures))
    doc: dict[str, Any] = {
        "command": "python -m bench.journalscale " + " ".join(sys.argv[1:]),
        "figures": [
            {"entries": f.n, "kind": f.kind, "build": round(f.build, 3), **f.values}
            for f in figures
        ],
    }
    say(f"wrote {save('journalscale', doc, args.out)}")


if __name__ == "__main__":
    main()
