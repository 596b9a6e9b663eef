"""What the sections of `make bench` (:mod:`bench.suite`, :mod:`bench.sections`) share: the
settings both sides run with, a row of the table and its target, and :class:`Bench`, one
section's moto server, bucket, disk and gateway nodes, with the waits and the boto3 side every
section uses."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3

from bench import baseline, journalscale
from ckptgw.fsops.passthrough import DAEMON
from ckptgw.gateway.harness import Gateway

ROOT = Path(__file__).resolve().parent.parent  # the checkout: its commit is measured
PART = 16 << 20  # upload part size and parts in flight, for the gateway and boto3 alike
PARTS = 8
# Reading: the gateway runs with its defaults (ranges sized to each object, 8 GETs in
# flight); boto3 tuned as the baseline, and with its own defaults.
GETS = 8
BOTO3_TUNED = (64 << 20, GETS)
BOTO3_DEFAULTS = (8 << 20, 10)  # s3transfer's TransferConfig defaults
BUCKET = "bench"
CREDS = {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}
# Targets from the issues; the same target holds at every size and writer count. A metric
# not listed takes its name's part before " (".
TARGETS = {
    "save stall": 1.10,
    "save stall (writers)": 1.15,
    "save CPU s/GiB": 1.00,  # against the absolute limit SAVE_CPU_LIMIT
    "cold read (cached)": 1.05,
    "time to durable": 1.00,  # after the save's return, vs boto3's upload (issue 17)
    "drain CPU s/GiB": 1.00,
    "cold restore": 1.00,
    "cold restore (DCP)": 1.20,
    "save stall (DCP)": 1.30,
    "save stall (small files)": 1.30,
    "durable from start": 1.00,
    "overwrite window": 0.0,  # the time the key is missing, over the time to durable
    "time to durable (Expect ignored)": 1.20,
    # bench.fleet (issue 41): against the rate bound; refused: a share of all requests
    "fleet durable": 1.15,
    "fleet refused": 0.10,
    "fleet lost": 0.0,
    "fleet restore": 1.15,
    "fleet restore refused": 0.10,
    **journalscale.TARGETS,  # one node's journal at 1M entries against 10k (issue 41)
}
SAVE_CPU_LIMIT = 0.05  # daemon CPU seconds per GiB saved through the mount


@dataclass
class Row:
    metric: str
    x: str  # the size or the number of writers
    baseline: str
    base: float
    gateway: float
    unit: str
    path: str = ""  # the mount's data path: "passthrough" or "daemon"

    @property
    def ratio(self) -> float:
        return self.gateway / self.base if self.base else float("inf")

    @property
    def target(self) -> float | None:
        return TARGETS.get(self.metric, TARGETS.get(self.metric.split(" (")[0]))


# ``ls -l``, ``du -s`` and ``rm -rf`` of a saved directory: sample keys "<op> disk|mount".
DIR_OPS = ("ls -l disk", "ls -l mount", "du disk", "du mount", "rm -rf disk", "rm -rf mount")
_DIR_COMMANDS = {"ls -l": ["ls", "-l"], "du": ["du", "-s"], "rm -rf": ["rm", "-rf"]}


def dir_times(path: Path, side: str) -> dict[str, float]:
    """Seconds of ``ls -l``, ``du -s`` and then ``rm -rf`` of ``path``, each a process."""
    out = {}
    for op, argv in _DIR_COMMANDS.items():
        t0 = time.perf_counter()
        subprocess.run([*argv, str(path)], check=True, stdout=subprocess.DEVNULL)
        out[f"{op} {side}"] = time.perf_counter() - t0
    return out


def say(msg: str) -> None:
    print(msg, flush=True)


def mib(n: int) -> str:
    return f"{n >> 30} GiB" if n >= 1 << 30 and n % (1 << 30) == 0 else f"{n >> 20} MiB"


def drop_caches() -> bool:
    """Empty the page cache (root only); False where it cannot."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        return False
    return True


def timed(fn: Callable[[], object]) -> float:
    os.sync()  # start with no write-back left over from the last run
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


class Bench:
    def __init__(
        self,
        work: Path,
        endpoint: str,
        runs: int,
        path: str,
        rows: list[Row],
        samples: dict[str, Any],
        part_workers: int | None = None,
    ) -> None:
        self.work = work
        work.mkdir()
        self.endpoint = endpoint
        self.runs = runs
        self.s3 = boto3.client("s3", endpoint_url=endpoint)
        self.s3.create_bucket(Bucket=BUCKET)
        self.rows = rows
        self.samples = samples
        self.path = path  # the data path of the nodes started here
        self.disk = work / "disk"
        self.disk.mkdir()
        self.config = work / "gw.toml"
        self.config.write_text(
            f'[drain]\npart_size = "{PART >> 20}MiB"\nmultipart_threshold = "{PART >> 20}MiB"\n'
            f"max_parts = {PARTS}\n"
            + (f"part_workers = {part_workers}\n" if part_workers is not None else "")
        )
        # Part worker processes (ckptgw.store.partpool): the gateway's default unless given; a
        # given count is named in each row's "at" column.
        self.workers = (
            ""
            if part_workers is None
            else f", {part_workers} part worker{'' if part_workers == 1 else 's'}"
        )
        self._nodes = 0

    # -- helpers ------------------------------------------------------------------------------

    @contextmanager
    def node(self, *args: str) -> Iterator[Gateway]:
        """A gateway on a fresh node: its own, empty cache dir; always unmounted after. ``args``
        go to its mount."""
        self._nodes += 1
        root = self.work / f"node{self._nodes}"
        gw = Gateway(
            root / "mnt",
            root / "cache",
            f"s3://{BUCKET}/gw/",
            "--endpoint-url",
            self.endpoint,
            "--config",
            str(self.config),
            *(["--no-passthrough"] if self.path == DAEMON else []),
            *args,
            env={"CKPTGW_RUNTIME_DIR": str(self.work / "run")},
        )
        try:
            gw.start()
            mode = gw.status()["data_path"]
            if mode["mode"] != self.path:
                raise RuntimeError(f"the mount runs on the {mode['mode']} path: {mode['reason']}")
            yield gw
        finally:
            gw.stop()
            shutil.rmtree(root, ignore_errors=True)

    def keys(self, prefix: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
            out.update({o["Key"]: o["Size"] for o in page.get("Contents", [])})
        return out

    def wait_in_bucket(self, want: dict[str, int], timeout: float = 3600) -> None:
        """Until every key is in the bucket with its size. An object appears only complete.
        Lists only the keys' common directory."""
        prefix = os.path.commonpath(list(want)) if len(want) > 1 else os.path.dirname(*want)
        deadline = time.monotonic() + timeout
        while True:
            have = self.keys(f"{prefix}/")
            if all(have.get(k) == n for k, n in want.items()):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"not in the bucket after {timeout} s: {sorted(want)[:3]}")
            time.sleep(0.1)  # polling loads the (single-process) server too

    def wait_durable(self, gw: Gateway, want: dict[str, int]) -> None:
        """Until the gateway has every key of ``want`` in the bucket: its own word first (a
        ``pending`` request on its control socket, no flush, which the daemon answers once
        nothing is pending, asking itself again only when an entry's state changes), then one
        listing of the bucket that checks it (which waits on if the gateway was wrong).
        Polling the bucket instead loaded the moto server that the drain under test shares
        (a listing of a 2,000-key directory ten times a second), which the boto3 side, timed
        in its own process, does not pay; polling ``pending`` every 20 ms cost the daemon
        0.5 of its 2.0 CPU s for a 1 GiB drain, which the drain CPU row counted."""
        mount = gw.control()
        path = os.path.commonpath([k.removeprefix("gw/") for k in want])
        if len(want) == 1:
            path = os.path.dirname(path)
        while mount.request("pending", paths=[path], wait=30)["count"]:
            pass
        self.wait_in_bucket(want, timeout=120)

    def wait_store_ops(self, gw: Gateway) -> None:
        """Until the gateway has done its pending store operations (the deletes of what was
        just removed from the mount), so that they do not overlap what is timed next."""
        control = gw.control()
        while control.request("status")["queue"]["store_ops"]:
            time.sleep(0.1)

    def delete(self, prefix: str) -> None:
        keys = list(self.keys(prefix))
        for i in range(0, len(keys), 1000):
            self.s3.delete_objects(
                Bucket=BUCKET, Delete={"Objects": [{"Key": k} for k in keys[i : i + 1000]]}
            )

    def boto3(
        self, op: str, pairs: dict[str, Path], how: tuple[int, int] = BOTO3_TUNED
    ) -> dict[str, Any]:
        """boto3 moving ``pairs`` (key: file); uploads in the gateway's parts, downloads in
        ``how`` (chunk size, threads)."""
        chunk, conc = (PART, PARTS) if op == "upload" else how
        return baseline.run(
            op, self.endpoint, BUCKET, chunk, conc, {k: str(p) for k, p in pairs.items()}
        )

    def add(self, *rows: Row) -> None:
        for r in rows:
            r.path = self.path
            self.rows.append(r)
            verdict = ""
            if r.target is not None:
                verdict = "met" if r.ratio <= r.target else f"MISSED (target {r.target:.2f}x)"
            say(
                f"  = {r.metric:28} {r.x:>7} [{r.path}]: {r.baseline} {r.base:8.2f} {r.unit}, "
                f"gateway {r.gateway:8.2f} {r.unit}, {r.ratio:5.2f}x {verdict}"
            )
