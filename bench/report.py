"""docs/benchmarks.md and README's headline table, written from the published results in
docs/results/ (one file per machine).

``python -m bench.suite --publish`` merges its rows into ``docs/results/<machine>.json`` (a row
replaces the one with the same metric, size and data path; the others stay, each with its own
date and commit) and then writes docs/benchmarks.md with :func:`write`. The page is never
edited by hand; ``python -m bench.report`` writes it again from the results alone, and a test
keeps the two equal."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"
PAGE = ROOT / "docs" / "benchmarks.md"
README = ROOT / "README.md"
# One-off experiments that a design choice rests on (ARCHITECTURE.md links them), kept by hand
# beside the code they measured, copied into the page as they are.
CHOICES = Path(__file__).resolve().parent / "choices.md"
# README's headline table sits between these lines, written from the results like the page.
HEADLINE_BEGIN = (
    "<!-- headline: written by `python -m bench.report` from docs/results/; do not edit by hand -->"
)
HEADLINE_END = "<!-- /headline -->"
# The headline rows: (what it measures, in words; the metric; the size or count).
HEADLINE = (
    ("`torch.save` + fsync + rename", "save stall", "1 GiB"),
    ("time to durable after the save returns", "time to durable", "1 GiB"),
    ("cold restore on a fresh node (`torch.load`)", "cold restore", "1 GiB"),
    ("DCP save, one file per tensor", "save stall (DCP)", "513 files"),
    ("the same DCP save through a FUSE daemon that only passes calls on", "DCP save (FUSE floor)",
     "513 files, pyfuse3 pass-through"),
    ("time to durable, DCP", "time to durable (DCP)", "513 files"),
    ("`latest.pt` saved over: time its key is missing", "overwrite window", "256 MiB"),
    ("time to durable behind a proxy ignoring `Expect`", "time to durable (Expect ignored)",
     "256 MiB"),
    ("8 writers over NFSv3 against the same on the FUSE mount", "write + fsync (NFS/mount)",
     "8x256 MiB"),
    ("8 writers over NFSv4 against the same on the FUSE mount", "write + fsync (NFSv4/mount)",
     "8x256 MiB"),
    ("8 writers over NFSv4 against Ganesha exporting a plain directory",
     "write + fsync (NFSv4/floor)", "8x256 MiB"),
    ("16 gateways saving one step behind a write limit, after the first save",
     "fleet durable (learned)", "16 gateways"),
    ("the share of those gateways' requests the store refused", "fleet refused (learned)",
     "16 gateways"),
)  # fmt: skip

# The row's identity within a machine's results: a later run's row with the same one replaces it.
KEY = ("metric", "x", "path")
# What a machine's file keeps of a row (the run's samples stay in bench/results/suite.json).
ROW_FIELDS = ("metric", "x", "path", "baseline", "base", "gateway", "unit", "ratio", "target")

METHOD = """\
Every figure is a ratio against a limit measured **in the same run, on the same machine**,
with the sides alternated run by run and the median of the runs reported (one exception: the
save's CPU, against a fixed budget). The limit is what the machine can do without ckptgw:

- **save stall**: `torch.save` + `fsync` + `rename` through the mount, against the same save
  into a directory on the cache disk. The DCP rows save a `torch.distributed.checkpoint` of
  many files the same way; the writers rows run 1 to 8 processes saving their shards at once.
- **time to durable**: from the save's return until every object is complete in the bucket
  (ckptgw says so, then the bucket is checked), against boto3's transfer manager uploading the
  same bytes to the same server with the same part size and parts in flight. *durable from
  start* counts from the save's start.
- **save CPU s/GiB**: the daemon's CPU seconds per GiB saved through the mount, against a
  fixed budget of 0.05 s/GiB (on the kernel's data path the daemon should hardly work).
- **cold read (cached)**: `torch.load` of the file just saved, with the page cache dropped,
  through the mount against the same from the disk.
- **drain CPU s/GiB** and **peak memory**: the daemon's, against boto3's for the same upload;
  *daemon's own CPU* leaves out the part workers' processes.
- **ls -l**, **du**, **rm -rf** of the DCP checkpoint's directory, through the mount against
  the disk (no target: what a user waits for).
- **cold restore**: `torch.load` (or a DCP load) through a fresh gateway with an empty cache,
  against boto3 downloading the same objects (tuned: 64 MiB parts, 8 threads; and with its own
  defaults).
- **DCP save (FUSE floor)**: the same DCP save through a FUSE filesystem that only passes
  calls through (`bench/floorfs.py`, pyfuse3; and libfuse's `passthrough_hp` where built),
  against the disk: what any FUSE daemon costs on this machine.
- **overwrite window**: `latest.pt` saved again under its name while a thread HEADs its key
  every 20 ms; the time the key was missing (target 0).
- **time to durable (Expect ignored)**: behind a proxy that ignores `Expect: 100-continue`,
  against the same proxy answering it.
- **write + fsync (NFS)**: files written through `ckptgw serve nfs` (NFS-Ganesha on loopback,
  libnfs as the client) over NFSv3, and *(NFSv4)* over NFSv4.0, against the disk and against
  the FUSE mount; *NFSv4 floor* is the same NFSv4 writes to NFS-Ganesha exporting a plain
  directory on the same disk with the same configuration, and *NFSv4/floor* ckptgw's export
  against it: what the gateway costs beyond NFS's own.
- **fleet** (`bench/fleet.py`): N gateways, each a real mount with its own cache dir, behind
  a proxy that takes a fixed number of writes and reads a second (token buckets of one
  second's worth; 503 SlowDown when empty, as S3 answers a burst). Every gateway saves its
  files into one step directory at once. *fleet durable* is the time until every object is in
  the bucket, against the **bound**: the write requests the store accepted divided by its
  write rate; *(first save)* on gateways that know nothing yet, *(learned)* the next save on
  the same gateways. *fleet refused* is the share of all requests refused. *fleet restore*:
  N fresh gateways read each rank's files and the shared `.metadata` at once, against the
  read requests accepted over the read rate. *fleet lost*: objects missing or not byte-exact
  (target 0). *unpaced* rows are the same save with `store.adaptive_rate = false` (no target).
- **journal** (`bench/journalscale.py`): one gateway on a cache dir whose journal holds 1M
  drained entries (in directories of 1,000), against the same with 10k: mount, remount after
  `kill -9`, `status`, `pending`, a create, `ls -l` of a 10,000-file directory, the daemon's
  RSS; *clean*: every file cached, *remote*: none. *status (limit)* is against one second.

The store is moto's S3 server on loopback, so *time to durable* and *cold restore* compare
ckptgw's client with boto3's on the same server, not with a real S3 region. *data path* is the
mount's: `passthrough` (the kernel writes the cache file itself) or `daemon` (every byte
through the FUSE daemon). A ratio above its target is marked **missed**; nothing is tuned to
pass."""

REPRODUCE = """\
```
make bench                                   # every section, both data paths (hours on 2 cores)
make bench BENCH_ARGS="--only save,drain --sizes 1024 --runs 5"
.venv/bin/python -m bench.suite --help       # the sections and their sizes
.venv/bin/python -m bench.suite ... --publish  # merge the rows into docs/results/ and
                                             # write this page again
```
`--publish` names the machine after its CPU (`--machine NAME` to choose). The raw results,
samples included, are in `bench/results/suite.json` (not committed)."""


def machine_name(info: dict[str, Any]) -> str:
    """A file name for a machine: its CPU count and model (``2-core-intel-xeon-...``)."""
    model = re.sub(r"\(r\)|\(tm\)|cpu|@.*$", "", str(info.get("cpu", "")).lower())
    slug = re.sub(r"[^a-z0-9]+", "-", model).strip("-")
    return f"{info.get('cpus', '?')}-core-{slug}" if slug else f"{info.get('cpus', '?')}-core"


def merge(old: dict[str, Any] | None, run: dict[str, Any]) -> dict[str, Any]:
    """A machine's results after a run: its rows replace those with the same key."""
    stamp = {"date": run["machine"]["date"], "commit": run.get("commit", "")}
    rows = [
        {k: r.get(k) for k in ROW_FIELDS} | stamp | {"command": run.get("command", "")}
        for r in run["rows"]
    ]
    fresh = {tuple(r[k] for k in KEY): r for r in rows}
    out = []
    for r in (old or {}).get("rows", []):  # a replaced row keeps its place in the table
        out.append(fresh.pop(tuple(r[k] for k in KEY), r))
    return {"machine": run["machine"], "rows": out + list(fresh.values())}


def publish(run: dict[str, Any], name: str | None = None, results: Path = RESULTS) -> Path:
    """Merge a suite run into its machine's file; returns the file."""
    results.mkdir(parents=True, exist_ok=True)
    path = results / f"{name or machine_name(run['machine'])}.json"
    old = json.loads(path.read_text()) if path.exists() else None
    path.write_text(json.dumps(merge(old, run), indent=1) + "\n")
    return path


def _num(v: float) -> str:
    return f"{v:.3f}" if abs(v) < 1 else f"{v:.2f}"


def _ratio(r: dict[str, Any]) -> str:
    """The ratio, with a third decimal where two would hide that it passed its target."""
    text = f"{r['ratio']:.2f}x"
    target = r.get("target")
    if target is not None and r["ratio"] > target and f"{target:.2f}x" == text:
        text = f"{r['ratio']:.3f}x"
    return text


def _verdict(r: dict[str, Any]) -> str:
    target = r.get("target")
    if target is None:
        return "-"
    met = r["ratio"] <= target
    return f"≤ {target:.2f}x " + ("met" if met else "**missed**")


def machine_section(name: str, doc: dict[str, Any]) -> list[str]:
    m = doc["machine"]
    rows = doc["rows"]
    dates = sorted({r["date"] for r in rows})
    when = dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}"
    commits = sorted({r["commit"] for r in rows if r.get("commit")})
    out = [
        f"## {name}",
        "",
        f"{m.get('cpus')} cores ({m.get('cpu')}), {m.get('memory_gib')} GiB, disk {m.get('disk')}, "
        f"Linux {m.get('kernel')}, Python {m.get('python')}, torch {m.get('torch')}, "
        f"moto {m.get('moto')}, boto3 {m.get('boto3')}. Measured {when}"
        + (f" (commits {', '.join(commits)})." if commits else "."),
        "",
        "| metric | at | data path | limit (what) | limit | ckptgw | ratio | target |",
        "|---|---|---|---|--:|--:|--:|---|",
    ]
    for r in rows:
        unit = r["unit"]
        out.append(
            f"| {r['metric']} | {r['x']} | {r['path']} | {r['baseline']} | "
            f"{_num(r['base'])} {unit} | {_num(r['gateway'])} {unit} | "
            f"{_ratio(r)} | {_verdict(r)} |"
        )
    missed = [r for r in rows if r.get("target") is not None and r["ratio"] > r["target"]]
    out.append("")
    if missed:
        out.append(
            f"**Missed on this machine ({len(missed)}):** "
            + "; ".join(
                f"{r['metric']} at {r['x']} [{r['path']}] {_ratio(r)} (target {r['target']:.2f}x)"
                for r in missed
            )
            + "."
        )
    else:
        out.append("Every row with a target met it on this machine.")
    out.append("")
    cmds = sorted({r["command"] for r in rows if r.get("command")})
    if cmds:
        out += ["The runs:", "", "```", *cmds, "```", ""]
    return out


def render(results: Path = RESULTS) -> str:
    out = [
        "<!-- Written by `python -m bench.report` from docs/results/*.json (which "
        "`python -m bench.suite --publish` merges each run into); do not edit by hand. -->",
        "",
        "# Benchmarks",
        "",
        "## Method",
        "",
        METHOD,
        "",
        "## How to reproduce",
        "",
        REPRODUCE,
        "",
    ]
    files = sorted(results.glob("*.json")) if results.is_dir() else []
    if not files:
        out += ["No published results yet.", ""]
    for path in files:
        out += machine_section(path.stem, json.loads(path.read_text()))
    if CHOICES.exists():
        out += ["## Measurements behind design choices", "", CHOICES.read_text().strip(), ""]
    return "\n".join(out).rstrip("\n") + "\n"


def headline(results: Path = RESULTS) -> str:
    """README's table: the headline rows of the machine that has the most of them."""
    best: tuple[int, str, dict[str, Any]] | None = None
    for path in sorted(results.glob("*.json")) if results.is_dir() else []:
        doc = json.loads(path.read_text())
        have = {(r["metric"], r["x"]) for r in doc["rows"]}
        n = sum((metric, x) in have for _, metric, x in HEADLINE)
        if best is None or n > best[0]:
            best = (n, path.stem, doc)
    if best is None or best[0] == 0:
        return "No published results yet."
    _, name, doc = best
    m = doc["machine"]
    dates = sorted({r["date"] for r in doc["rows"]})
    out = [
        f"On {name}: {m.get('cpus')} cores ({m.get('cpu')}), {m.get('memory_gib')} GiB, "
        f"{m.get('disk')}, moto {m.get('moto')} on loopback; {dates[-1]}.",
        "",
        "| what | size | data path | limit (same run) | ckptgw | ratio | target |",
        "|---|---|---|---|--:|--:|---|",
    ]
    for what, metric, x in HEADLINE:
        found = [r for r in doc["rows"] if (r["metric"], r["x"]) == (metric, x)]
        for r in sorted(found, key=lambda r: r["path"] != "passthrough"):  # the kernel's first
            unit = r["unit"]
            out.append(
                f"| {what} | {x} | {r['path']} | {r['baseline']} {_num(r['base'])} {unit} | "
                f"{_num(r['gateway'])} {unit} | {_ratio(r)} | {_verdict(r)} |"
            )
    return "\n".join(out)


def with_headline(readme: str, results: Path = RESULTS) -> str:
    """README's text with its headline table written again from the results."""
    begin = readme.index(HEADLINE_BEGIN) + len(HEADLINE_BEGIN)
    end = readme.index(HEADLINE_END, begin)
    return f"{readme[:begin]}\n{headline(results)}\n{readme[end:]}"


def write(results: Path = RESULTS, page: Path = PAGE, readme: Path = README) -> Path:
    page.write_text(render(results))
    readme.write_text(with_headline(readme.read_text(), results))
    return page


if __name__ == "__main__":
    print(f"wrote {write()}")
