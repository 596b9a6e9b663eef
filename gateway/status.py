"""What the daemon reports about itself: the status snapshot, and what is not durable yet.

Built on the trio thread from the journal, the in-memory inodes and the drain's counters. The
JSON shape is versioned (``STATUS_VERSION``) and described by ``status.schema.json``; fields
are only ever added within a version.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptgw.drain.checkpoints import DURABLE, FileView, Recognizer
from ckptgw.drain.engine import DrainEngine
from ckptgw.drain.fetch import FetchStats
from ckptgw.fsops.filesystem import Filesystem
from ckptgw.fsops.journal import InodeRow, State

STATUS_VERSION = 1


class PathError(Exception):
    """A path the caller named is not in this mount."""


@dataclass
class Lifecycle:
    """How the daemon is doing as a whole; set by the daemon, shown in status."""

    mode: str = "serving"  # "serving", "emergency-drain" or "stopping"
    reason: str = ""  # why the mode is not "serving"
    deadline: float | None = None  # wall time the daemon stops at, whatever is left
    preemption: Callable[[], dict[str, Any]] = dict  # the watcher's view


class Reporter:
    def __init__(
        self,
        mountpoint: Path,
        store_url: str,
        fs: Filesystem,
        engine: DrainEngine,
        fetch_stats: FetchStats,
        recognizer: Recognizer | None = None,
        *,
        store_local: bool = False,
    ) -> None:
        self.mountpoint = mountpoint
        self.store_url = store_url
        # The store is on this node's own disks (--allow-local-store): its data is "durable
        # (local store)", never plain durable, in every view.
        self.store_local = store_local
        self.fs = fs
        self.engine = engine
        self.fetch_stats = fetch_stats
        self.lifecycle = Lifecycle()
        self.recognizer = recognizer or Recognizer()
        self.started = time.time()

    # -- files -----------------------------------------------------------------------------------

    def files(self, path: str = "", *, dirs: bool = False) -> list[tuple[InodeRow, FileView]]:
        """Every entry at or below ``path`` but directories (with ``dirs``: and directories,
        whose markers the store keeps too), with its durability."""
        row = self.fs.journal.resolve(path)
        if row is None:
            raise PathError(f"{self.mountpoint / path}: no such file or directory")
        prefix = path.strip("/")
        if not stat.S_ISDIR(row.mode):
            found = [(row, prefix)]
        else:
            found = [
                (r, f"{prefix}/{rel}" if prefix else rel)
                for r, rel in self.fs.journal.files_under(row.id, dirs=dirs)
            ]
            if dirs and row.parent is not None:
                found.append((row, prefix))
        moving = self.fs.journal.pending_keys()  # a move to a file's key: not there yet
        out = []
        for r, rel in found:
            r = self.fs.table.current(r)
            state = self.engine.durability(r, moving)
            out.append((r, FileView(rel, r.size, state, r.mtime_ns / 1e9)))
        return out

    def pending(self, paths: list[str]) -> dict[str, Any]:
        """What is not durable yet at or below ``paths`` (all of the mount if empty)."""
        seen: dict[int, dict[str, Any]] = {}
        for path in paths or [""]:
            for row, view in self.files(path, dirs=True):
                if view.state != DURABLE:
                    seen[row.id] = {
                        "path": str(self.mountpoint / view.path),
                        "directory": stat.S_ISDIR(row.mode),
                        "size": view.size,
                        "state": view.state,
                        "open_for_writing": self._writers(row) > 0,
                        "error": self.engine.errors.get(row.id),
                    }
        files = sorted(seen.values(), key=lambda f: str(f["path"]))
        return {
            "files": files,  # every kind of entry: directories have markers in the store
            "count": len(files),
            "directories": sum(bool(f["directory"]) for f in files),
            "bytes": sum(int(f["size"]) for f in files),
        }

    def flush(self, paths: list[str]) -> dict[str, Any]:
        if not paths:
            self.engine.flush()
        else:
            inodes = [
                row.id for p in paths for row, v in self.files(p, dirs=True) if v.state != DURABLE
            ]
            self.engine.flush(inodes)
        return self.pending(paths)

    def _writers(self, row: InodeRow) -> int:
        mem = self.fs.table.peek(row.id)
        return mem.writers if mem is not None else 0

    # -- the snapshot ----------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        now = time.time()
        files = self.files()
        dirty = [(r, v) for r, v in files if r.state in (State.DIRTY, State.UPLOADING)]
        queued = [(r, v) for r, v in dirty if self._writers(r) == 0]
        since = [self.engine.dirty_since.get(r.id, r.mtime_ns / 1e9) for r, _ in dirty]
        space = self.fs.space
        retry = self.engine.stats
        prefix = self.fs.keys.prefix
        uploads = [
            {
                "path": str(self.mountpoint / p.key.removeprefix(prefix)),
                "size": p.size,
                "sent": p.sent,
                "elapsed": round(p.elapsed, 3),
                "throughput": round(p.throughput),
            }
            for p in self.engine.running()
        ]
        checkpoints = [
            {
                "path": str(self.mountpoint / c.path) if c.path else str(self.mountpoint),
                "step": c.step,
                "state": c.state,
                "files": len(c.files),
                "bytes": c.bytes,
                "local_bytes": c.local_bytes,
                "mtime": round(c.mtime, 3),
            }
            for c in self.recognizer.group(v for _, v in files)
        ]
        lc = self.lifecycle
        return {
            "version": STATUS_VERSION,
            "mountpoint": str(self.mountpoint),
            "store": self.store_url,
            "store_local": self.store_local,
            "pid": os.getpid(),
            "uptime": round(now - self.started, 3),
            "mode": lc.mode,
            "mode_reason": lc.reason,
            "deadline": lc.deadline,
            "preemption": lc.preemption(),
            "cache": {
                "dir": str(self.fs.cache.root),
                "used": space.cache.used,
                "limit": space.limit,
                "free": space.free_bytes(),
                "evictions": space.stats.evictions,
                "evicted_bytes": space.stats.evicted_bytes,
                "write_waits": space.stats.waits,
                "enospc": space.stats.enospc,
            },
            "dirty_bytes": sum(r.size for r, _ in dirty),
            "queue": {
                "files": len(queued),
                "bytes": sum(r.size for r, _ in queued),
                "oldest_dirty_age": round(now - min(since), 3) if since else None,
                "open_for_writing": len(dirty) - len(queued),
                "store_ops": self.fs.journal.count_store_ops(),
            },
            "uploads": uploads,
            "drained": {"bytes": self.engine.drained.bytes, "files": self.engine.drained.files},
            "written_bytes": self.fs.files.written_bytes,
            "data_path": {
                "mode": self.fs.path.mode,
                "reason": self.fs.path.reason if not self.fs.path.active else None,
                "passthrough_opens": self.fs.path.stats.passthrough_opens,
                "daemon_opens": self.fs.path.stats.daemon_opens,
                "daemon_bytes": self.fs.files.daemon_bytes,
            },
            "fetched": {"bytes": self.fetch_stats.bytes, "files": self.fetch_stats.files},
            "retries": retry.retries,
            "errors": dict(retry.errors),
            "last_error": retry.last_error or None,
            "last_error_at": retry.last_error_at or None,
            "checkpoints": checkpoints,
        }
