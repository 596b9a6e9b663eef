"""``ckptgw status`` of drained files counted per directory
(gateway.daemon.status.Reporter.summary): its checkpoint rows say what a walk of the mount says,
at the first status and after changes (only the directories changed are counted again), and the
recognizer's name prefixes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ckptgw.drain.checkpoints import DirectoryTotals, EntryCount, FileView, Recognizer
from tests.conftest import GatewayFactory


def walked(mnt: Path) -> dict[str, tuple[int, int, int]]:
    """(files, directories, bytes) per checkpoint, from a walk of the mount."""
    found: dict[str, list[tuple[str, int]]] = {}
    rec = Recognizer()
    for d, _, names in os.walk(mnt):
        for n in names:
            p = Path(d, n)
            rel = str(p.relative_to(mnt))
            found.setdefault(rec.locate(rel)[0], []).append((rel, p.stat().st_size))
    out = {}
    for c, files in found.items():
        count = EntryCount.of(c, (f for f, _ in files))
        out[str(mnt / c) if c else str(mnt)] = (
            count.files,
            count.directories,
            sum(s for _, s in files),
        )
    return out


def shown(status: dict[str, Any]) -> dict[str, tuple[int, int, int]]:
    assert all(r["state"] == "durable" for r in status["checkpoints"]), status["checkpoints"]
    return {r["path"]: (r["files"], r["directories"], r["bytes"]) for r in status["checkpoints"]}


def drained(gw: Any) -> dict[str, Any]:
    left = gw.control().request("pending", paths=[], wait=30)
    assert not left["count"], left
    status: dict[str, Any] = gw.status()
    return status


def test_status_counts_what_the_mount_holds(gateway: GatewayFactory) -> None:
    gw = gateway()
    mnt = gw.mountpoint
    (mnt / "run/step_1/sub").mkdir(parents=True)
    for rel, size in [
        ("run/step_1/a", 10),
        ("run/step_1/b", 20),
        ("run/step_1/sub/c", 5),
        ("run/ckpt_7.pt", 7),  # a checkpoint of its own, among other files
        ("run/notes.txt", 3),
        ("top.txt", 4),
    ]:
        (mnt / rel).write_bytes(b"x" * size)
    first = shown(drained(gw))
    assert first == walked(mnt)
    assert first[str(mnt / "run/ckpt_7.pt")] == (1, 0, 7)

    # Changes after the first status: only the directories they touch are counted again.
    (mnt / "run/step_1/d").write_bytes(b"y" * 8)
    (mnt / "run/step_1/a").unlink()
    os.rename(mnt / "run/notes.txt", mnt / "run/step_1/notes.txt")
    (mnt / "run/ckpt_7.pt").write_bytes(b"z" * 70)
    (mnt / "run/step_2").mkdir()
    (mnt / "run/step_2/e").write_bytes(b"e" * 2)
    second = shown(drained(gw))
    assert second == walked(mnt)
    assert second != first
    assert second[str(mnt / "run/step_1")] == (4, 2, 20 + 5 + 8 + 3)

    # Emptied: the directory's row goes.
    (mnt / "run/step_2/e").unlink()
    (mnt / "top.txt").unlink()
    third = shown(drained(gw))
    assert third == walked(mnt)
    assert str(mnt) not in third


def test_a_checkpoint_with_counted_files_lists_them_when_asked() -> None:
    files = [FileView("run/step_1/x", 3, "local", 5.0, since=5.0)]
    totals = [
        DirectoryTotals(
            "run/step_1/sub", 2, 11, 9.0, lambda: [FileView("run/step_1/sub/y", 11, "durable", 9)]
        )
    ]
    (c,) = Recognizer().group(files, totals)
    assert (c.path, c.step, c.bytes, c.mtime, c.state) == ("run/step_1", 1, 14, 9.0, "draining")
    assert c.count == EntryCount(3, 2)
    assert [f.path for f in c.every()] == ["run/step_1/x", "run/step_1/sub/y"]


def test_name_prefixes_cover_every_name_a_pattern_matches() -> None:
    assert Recognizer().prefixes() == [
        "global_step",
        "step",
        "iter_",
        "checkpoint",
        "epoch",
        "ckpt",
    ]
    assert Recognizer([r"steps?(\d+)"]).prefixes() == ["step"]  # "s" is optional
    assert Recognizer([r"(\d+)"]).prefixes() is None  # any name may match
    assert Recognizer([r"a(\d+)|b(\d+)"]).prefixes() is None
