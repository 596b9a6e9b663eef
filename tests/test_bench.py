"""`make bench`, shrunk to seconds: every section runs against moto on loopback and writes its
JSON and plots. (No timing is asserted: only that each figure was measured and is sane.)"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bench import floor
from ckptgw.fsops import passthrough
from ckptgw.fsops.passthrough import DAEMON, PASSTHROUGH
from tests.nfsclient import nfs4_unavailable, nfs_unavailable

pytestmark = [pytest.mark.mount, pytest.mark.torch]

ROOT = Path(__file__).resolve().parent.parent
ONE_PATH = PASSTHROUGH if passthrough.unavailable(True) is None else DAEMON


def leave_nothing_behind(proc: subprocess.Popen[str], tmp_path: Path) -> None:
    """The suite cut short (the test's timeout): SIGTERM lets it unmount and stop its moto
    server; whatever is still there after that (daemons run in sessions of their own) is
    killed and lazily unmounted."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    subprocess.run(["pkill", "-9", "-f", str(tmp_path)], check=False)
    for line in Path("/proc/self/mounts").read_text().splitlines():
        where = line.split()[1]
        if where.startswith(str(tmp_path)):
            subprocess.run(["fusermount3", "-u", "-z", where], check=False)


def test_bench_suite_measures_every_comparison(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bench.suite",
            "--sizes",
            "16",
            "--restore-sizes",
            "16",
            "--writers",
            "1,2",
            "--shard-mib",
            "8",
            "--dcp-mib",
            "8",
            "--dcp-tensors",
            "16",
            "--dcp-files",
            "8,16",
            "--small-files",
            "40",
            "--small-kib",
            "4",
            "--nfs-mib",
            "8",
            "--nfs-writers",
            "2",
            "--drain-files",
            "2",
            "--drain-mib",
            "16",
            "--part-workers",
            "1",
            "--overwrite-sizes",
            "16",
            "--expect-mib",
            "16",
            "--only",  # fleet and journal: test_bench_fleet_and_journal_sections
            "save,restore,files,floor,writers,drain,nfs,overwrite,expect",
            "--runs",
            "1",
            "--paths",
            ONE_PATH,
            "--workdir",
            str(tmp_path),
            "--out",
            str(tmp_path / "out"),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=600)
    finally:
        leave_nothing_behind(proc, tmp_path)
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]
    doc = json.loads((tmp_path / "out/suite.json").read_text())
    paths = doc["settings"]["paths"]
    assert paths == [ONE_PATH]  # every path runs the same bench code: the suite's time on one
    worker = ", 1 part worker"  # the save and drain sections run with one
    each = {
        ("save stall", "16 MiB" + worker),
        ("save CPU s/GiB", "16 MiB" + worker),
        ("time to durable", "16 MiB" + worker),
        ("drain CPU s/GiB", "16 MiB" + worker),
        ("peak memory (MiB)", "16 MiB" + worker),
        ("time to durable (at once)", "2x16 MiB" + worker),
        ("drain CPU s/GiB (at once)", "2x16 MiB" + worker),
        ("daemon's own CPU s/GiB", "2x16 MiB" + worker),
        ("cold restore", "16 MiB"),
        ("cold restore (boto3 defaults)", "16 MiB"),
        ("cold restore (DCP)", "17 files"),
        ("cold restore (DCP) (boto3 defaults)", "17 files"),
        ("save stall (DCP)", "9 files"),
        ("time to durable (DCP)", "9 files"),
        ("durable from start (DCP)", "9 files"),
        ("save stall (DCP)", "17 files"),
        ("time to durable (DCP)", "17 files"),
        ("durable from start (DCP)", "17 files"),
        ("ls -l (DCP)", "17 files"),
        ("du (DCP)", "17 files"),
        ("rm -rf (DCP)", "17 files"),
        ("save stall (small files)", "40x4KiB"),
        ("time to durable (small files)", "40x4KiB"),
        ("durable from start (small files)", "40x4KiB"),
        ("save stall (writers)", "1"),
        ("time to durable (writers)", "1"),
        ("save stall (writers)", "2"),
        ("time to durable (writers)", "2"),
        ("overwrite window", "16 MiB"),
        ("time to durable (Expect ignored)", "16 MiB"),
    }
    # The FUSE floor: the same DCP save through daemons that only pass through.
    for side in (floor.PYFUSE3, "ckptgw") + ((floor.LIBFUSE,) if floor.passthrough_hp() else ()):
        each.add(("DCP save (FUSE floor)", f"9 files, {side}"))
    if os.geteuid() == 0:  # it drops the page cache
        each.add(("cold read (cached)", "16 MiB" + worker))
    if nfs_unavailable() is None:
        for metric in ("write + fsync (mount)", "write + fsync (NFS)", "write + fsync (NFS/mount)"):
            each.add((metric, "2x8 MiB"))
        if nfs4_unavailable() is None:  # libnfs 5 in the venv: NFSv4 too
            for metric in (
                "write + fsync (NFSv4)",
                "write + fsync (NFSv4/mount)",
                "write + fsync (NFSv4 floor)",
                "write + fsync (NFSv4/floor)",
            ):
                each.add((metric, "2x8 MiB"))
    else:
        assert "no NFS section here" in stdout
    got = {(row["metric"], row["x"], row["path"]) for row in doc["rows"]}
    assert got == {(m, x, p) for p in paths for m, x in each}
    for row in doc["rows"]:
        if row["metric"] == "overwrite window":  # seconds the key was missing: 0 is the aim
            assert row["base"] > 0 and row["gateway"] >= 0, row
            continue
        assert row["base"] > 0 and row["gateway"] > 0, row
        assert math.isclose(row["ratio"], row["gateway"] / row["base"])
    assert doc["machine"]["cpus"] >= 1 and doc["settings"]["runs"] == 1
    for png in ("suite_size.png", "suite_writers.png"):
        assert (tmp_path / "out" / png).read_bytes()[:4] == b"\x89PNG"
    assert "gateway / limit measured in this run" in stdout
    assert str(tmp_path) not in Path("/proc/self/mounts").read_text()
    assert not list(tmp_path.glob("ckptgw-bench-*")), "the work dir was not removed"


def test_bench_fleet_and_journal_sections(tmp_path: Path) -> None:
    """The fleet (real gateways behind the rate-limiting proxy) and one node's journal at
    scale, shrunk: 2 gateways saving 4 files at 20 writes a second, 500 and 2,000 entries."""
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "bench.suite", "--only", "fleet,journal",
            "--fleet", "2:4:20", "--fleet-kib", "16", "--journal-sizes", "500,2000",
            "--runs", "1", "--paths", ONE_PATH, "--workdir", str(tmp_path),
            "--out", str(tmp_path / "out"),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=280)
    finally:
        leave_nothing_behind(proc, tmp_path)
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]
    doc = json.loads((tmp_path / "out/suite.json").read_text())
    rows = {(r["metric"], r["x"]): r for r in doc["rows"]}
    fleet = {
        "fleet durable (first save)", "fleet refused (first save)", "fleet durable (learned)",
        "fleet refused (learned)", "fleet restore", "fleet restore refused", "fleet lost",
        "unpaced fleet durable", "unpaced fleet refused",
    }  # fmt: skip
    journal = {
        "journal: create", "journal: status", "journal: status --json", "journal: pending",
        "journal: mount", "journal: remount after kill -9", "journal: ls -l 10k files",
        "journal: RSS", "journal: peak RSS", "journal: status (limit)",
    }  # fmt: skip
    want = {(m, "2 gateways") for m in fleet}
    want |= {(m, f"2k {kind}") for m in journal for kind in ("clean", "remote")}
    assert set(rows) == want
    assert rows[("fleet lost", "2 gateways")]["gateway"] == 0  # every object byte-exact
    assert rows[("fleet lost", "2 gateways")]["base"] == 2 * (2 * 4 + 1) + 2 * 4 + 2
    for metric in ("fleet durable (first save)", "fleet restore", "unpaced fleet durable"):
        r = rows[(metric, "2 gateways")]
        assert r["base"] > 0 and r["gateway"] > 0, r  # a bound, and a time
    for (metric, _), r in rows.items():
        if metric.startswith("journal:"):
            assert r["base"] > 0 and r["gateway"] > 0, r
    assert doc["settings"]["fleet"] == "2:4:20"
    assert str(tmp_path) not in Path("/proc/self/mounts").read_text()
