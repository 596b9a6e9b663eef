"""The checkpoint rows of ``status``: this node's and the store's, merged, all from memory.

A resuming node asks first what the store holds; a fresh cache knows nothing of it. So the rows
are this node's checkpoints (from the journal, as before) and the store's (from the last listing
that :class:`~drain.retention.catalog.StoreCatalog` made in the background), each row saying
where it is (``where``: ``local``, only on this node; ``store``, only in the store listing, this
node has not seen it; ``both``), whether it is complete (when a retention run
covers it: the same rule the plan uses, with what it waits for), and whether it is pinned. Of
the checkpoints only in the store, the newest ``STORE_ROWS`` of each directory are rows; the
others are counted (``store_listing.omitted``). Nothing here calls the store: it reads the
listing and the pins as last seen, with their times, and asks for a newer listing when the last
is older than the TTL.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ckptgw.drain.checkpoints import (
    DURABLE,
    CheckpointView,
    DirectoryTotals,
    EntryCount,
    FileView,
    Recognizer,
    is_marker,
)
from ckptgw.drain.retention.catalog import PER_DIRECTORY, CheckpointFile
from ckptgw.drain.retention.lifecycle import Lifecycle

# checkpoints only in the store shown per directory (a run), newest first: those the walk lists
STORE_ROWS = PER_DIRECTORY


def _row(
    mountpoint: Path,
    c: CheckpointView,
    where: str,
    judged: tuple[bool, str] | None,
    pinned: bool,
    now: float,
    count: EntryCount,
) -> dict[str, Any]:
    since = c.local_since
    return {
        "path": str(mountpoint / c.path) if c.path else str(mountpoint),
        "step": c.step,
        "state": c.state,
        "files": count.files,
        "directories": count.directories,
        "bytes": c.bytes,
        "local_bytes": c.local_bytes,
        "local_age": None if since is None else round(max(0.0, now - since), 3),
        "replacing": c.replacing,
        "moves": c.moves,
        "moving_bytes": c.moving_bytes,
        "mtime": round(c.mtime, 3),
        "where": where,
        "complete": None if judged is None else judged[0],
        "waiting": None if judged is None or judged[0] else judged[1],
        "pinned": pinned,
    }


def _files(files: list[CheckpointFile]) -> list[CheckpointFile]:
    """The files whose state the row shows: directory markers only where there is nothing
    else (this node's rows have no directories either). What the row counts is
    :class:`EntryCount`'s, markers included."""
    return [f for f in files if not is_marker(f.path)] or files


def _order(rows: list[dict[str, Any]]) -> None:
    """Newest first: the directories (runs) by their latest write, each one's checkpoints by
    step (a store's times say when a file was drained, not when it was written)."""

    def group(r: dict[str, Any]) -> str:
        return posixpath.dirname(r["path"]) if r["step"] is not None else str(r["path"])

    latest: dict[str, float] = {}
    for r in rows:
        latest[group(r)] = max(latest.get(group(r), 0.0), r["mtime"])
    rows.sort(
        key=lambda r: (
            latest[group(r)],
            group(r),
            -1 if r["step"] is None else r["step"],
            r["mtime"],
        ),
        reverse=True,
    )


def checkpoint_rows(
    mountpoint: Path,
    recognizer: Recognizer,
    files: Iterable[FileView],
    retention: Lifecycle | None,
    now: float,
    totals: Iterable[DirectoryTotals] = (),
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The rows, newest first, and the ``store_listing`` and ``pins`` status fields. ``files``
    one by one and ``totals``, durable files counted per directory: those are listed only for
    a checkpoint that the store's listing holds too or that a retention run covers."""
    local = recognizer.group(files, totals)
    stored = retention.catalog.checkpoints() if retention is not None else {}
    pinned = retention.pinned if retention is not None else {}
    rows = []
    for c in local:
        s = stored.get(c.path) if c.step is not None else None
        view = c
        count = c.count
        covered = retention is not None and c.step is not None and retention.run_of(c.path)
        files = c.every() if s is not None or covered else c.files
        if s is not None and retention is not None:  # the store may hold files not seen here
            every = list(retention.merge(s.files, files).values())
            count = EntryCount.of(c.path, (f.path for f in every))
            merged = _files(every)
            known = {f.path: f for f in files}
            view = CheckpointView(
                c.path,
                c.step,
                [known.get(f.path) or FileView(f.path, f.size, DURABLE, f.mtime) for f in merged],
            )
        judged = None
        if covered and retention is not None:
            judged = retention.judge(c.path, files, now, stored)
        # In the store too: listed there, or every file drained (the listing may be older).
        where = "both" if s is not None or c.state == DURABLE else "local"
        rows.append(_row(mountpoint, view, where, judged, c.path in pinned, now, count))
    seen = {c.path for c in local}
    shown: dict[str, int] = {}
    omitted = 0
    for s in sorted(stored.values(), key=lambda s: (s.step, s.mtime), reverse=True):
        if s.path in seen:
            continue
        parent = posixpath.dirname(s.path)
        shown[parent] = shown.get(parent, 0) + 1
        if shown[parent] > STORE_ROWS:
            omitted += 1
            continue
        view = CheckpointView(
            s.path, s.step, [FileView(f.path, f.size, DURABLE, f.mtime) for f in _files(s.files)]
        )
        judged = retention.judge(s.path, [], now, stored) if retention is not None else None
        count = EntryCount.of(s.path, (f.path for f in s.files))
        rows.append(_row(mountpoint, view, "store", judged, s.path in pinned, now, count))
    _order(rows)
    extra: dict[str, Any] = {"store_listing": None, "pins": None}
    if retention is not None:
        cat = retention.catalog
        cat.ask()
        extra["store_listing"] = {
            "listed_at": cat.listed_at,
            "roots": cat.roots,
            "keys": cat.keys,
            "truncated": cat.truncated,
            "checkpoints": len(stored),
            "omitted": omitted + cat.omitted,
            "per_directory": STORE_ROWS,
            "error": cat.error,
        }
        extra["pins"] = {
            "listed_at": retention.pins_listed_at,
            "items": [
                {"path": str(mountpoint / p), "pinned_at": at or None}
                for p, at in sorted(pinned.items())
            ],
        }
    return rows, extra
