"""Cold restore on a fresh node (empty cache): ``torch.load`` of a checkpoint, or a DCP load,
through the gateway against boto3 downloading the same objects."""

from __future__ import annotations

import functools
import shutil
import statistics
from collections.abc import Callable
from pathlib import Path

import torch

from bench.common import (
    BOTO3_DEFAULTS,
    BOTO3_TUNED,
    BUCKET,
    GETS,
    Bench,
    Row,
    mib,
    say,
    timed,
)
from bench.workloads import dcp_load, dcp_save, save_atomic, state_dict
from ckptgw.fsops.contentsum import Hasher, parts_checksum
from ckptgw.fsops.objectmeta import CHECKSUM, PART_SIZE


def saved_once(b: Bench, name: str, save: Callable[[Path], object]) -> dict[str, int]:
    """Save a checkpoint through a node (``save`` into ``gw/restore/NAME``), wait until it
    is in the bucket and check it is what was saved; its keys and sizes."""
    with b.node() as gw:
        target = gw.mountpoint / "restore" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        save(target)
        files = [target] if target.is_file() else sorted(p for p in target.iterdir())
        want = {f"gw/{p.relative_to(gw.mountpoint)}": p.stat().st_size for p in files}
        b.wait_in_bucket(want)
        for p in files:
            key = f"gw/{p.relative_to(gw.mountpoint)}"
            head = b.s3.head_object(Bucket=BUCKET, Key=key, ChecksumMode="ENABLED")
            meta = head["Metadata"]
            if CHECKSUM in meta:
                hasher, checksum = Hasher(), meta[CHECKSUM]
            else:  # a multipart upload: the store's CRC32 of its parts
                part_size = int(meta[PART_SIZE])
                hasher = Hasher(part_size)
                checksum = parts_checksum(part_size, head["ChecksumCRC32"])
            with open(p, "rb") as f:
                while piece := f.read(8 << 20):
                    hasher.update(piece)
            assert hasher.matches(checksum), f"{p} is not what was saved"
    return want


def restore_rounds(
    b: Bench,
    what: str,
    want: dict[str, int],
    load: Callable[[Path], object],
    how: tuple[int, int],
    defaults: bool = True,
) -> dict[str, list[float]]:
    """Runs of: ``load`` of the saved checkpoint through a fresh node (empty cache), boto3
    downloading the same objects tuned (``how``) and (``defaults``) with its defaults,
    each side first in turn."""
    s: dict[str, list[float]] = {"cold": [], "boto3": []}
    local = b.disk / "download"

    def gateway() -> float:
        with b.node() as gw:  # a fresh node: empty cache
            return timed(functools.partial(load, gw.mountpoint / "restore" / what))

    def download(how: tuple[int, int]) -> float:
        local.mkdir(exist_ok=True)
        pairs = {k: local / k.replace("/", "_") for k in want}
        down = b.boto3("download", pairs, how)
        assert {p.stat().st_size for p in pairs.values()} <= set(want.values())
        shutil.rmtree(local)
        return float(down["seconds"])

    sides: list[tuple[str, Callable[[], float]]] = [
        ("cold", gateway),
        ("boto3", functools.partial(download, how)),
    ]
    if defaults:
        sides.append(("boto3_defaults", functools.partial(download, BOTO3_DEFAULTS)))
        s["boto3_defaults"] = []
    for i in range(b.runs):
        got = {}
        turn = i % len(sides)
        for name, fn in sides[turn:] + sides[:turn]:
            got[name] = fn()
            s[name].append(got[name])
        say(
            f"  run {i}: ckptgw {got['cold']:6.2f} s; boto3 download {got['boto3']:6.2f} s "
            f"({how[0] >> 20} MiB x {how[1]})"
            + (f", {got['boto3_defaults']:6.2f} s (its defaults)" if defaults else "")
        )
    return s


def restore(b: Bench, size: int, defaults: bool) -> None:
    label = mib(size)
    say(f"\n## {label} checkpoint [{b.path}]: cold restore on a fresh node")
    sd = state_dict(size)
    want = saved_once(b, "step_1/ckpt.pt", functools.partial(save_atomic, sd))
    del sd
    s = restore_rounds(
        b,
        "step_1/ckpt.pt",
        want,
        lambda p: torch.load(p, weights_only=True),
        BOTO3_TUNED,
        defaults,
    )
    b.samples[f"restore {label} {b.path}"] = s
    add_restore_rows(b, "cold restore", label, s, BOTO3_TUNED)
    b.delete("gw/restore/")


def restore_files(b: Bench, total: int, tensors: int) -> None:
    say(f"\n## DCP checkpoint, {tensors} tensors ({mib(total)}): cold restore on a fresh node")
    sd = {f"t{i}": torch.randn(total // 4 // tensors) for i in range(tensors)}
    want = saved_once(b, "dcp/step_1", functools.partial(dcp_save, sd))
    target = {k: torch.empty_like(v) for k, v in sd.items()}
    del sd

    def load(path: Path) -> None:
        dcp_load(target, path)

    s = restore_rounds(b, "dcp/step_1", want, load, (8 << 20, GETS))
    b.samples[f"restore dcp {b.path}"] = {"files": len(want), "samples": s}
    add_restore_rows(b, "cold restore (DCP)", f"{len(want)} files", s, (8 << 20, GETS))
    b.delete("gw/restore/")


def add_restore_rows(
    b: Bench, metric: str, x: str, s: dict[str, list[float]], how: tuple[int, int]
) -> None:
    med = {k: statistics.median(v) for k, v in s.items()}
    tuned = f"boto3 download ({how[0] >> 20} MiB x {how[1]})"
    defaults = f"boto3 download, its defaults ({BOTO3_DEFAULTS[0] >> 20} MiB x 10)"
    b.add(Row(metric, x, tuned, med["boto3"], med["cold"], "s"))
    if "boto3_defaults" in med:
        b.add(
            Row(
                f"{metric} (boto3 defaults)",
                x,
                defaults,
                med["boto3_defaults"],
                med["cold"],
                "s",
            )
        )
