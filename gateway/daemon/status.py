"""What the daemon reports about itself: the status snapshot, and what is not durable yet.

Built on the trio thread from the journal, the in-memory inodes and the drain's counters. The
JSON shape is versioned (``STATUS_VERSION``) and described by ``status.schema.json``; fields
are only ever added within a version.
"""

from __future__ import annotations

import functools
import math
import os
import stat
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import trio

from ckptgw.drain.checkpoints import DRAINING, DURABLE, DirectoryTotals, FileView, Recognizer
from ckptgw.drain.reads.fetch import FetchStats
from ckptgw.drain.reads.lookupwait import LookupWait
from ckptgw.drain.reads.prefetch import Prefetcher
from ckptgw.drain.retention.lifecycle import Lifecycle as Retention
from ckptgw.drain.uploads.engine import DrainEngine
from ckptgw.drain.uploads.progress import UploadProgress
from ckptgw.fsops.filesystem import Filesystem
from ckptgw.fsops.journal.rows import ROOT_INODE, InodeRow, State
from ckptgw.fsops.storekeys import object_key
from ckptgw.gateway.daemon.checkpointrows import checkpoint_rows
from ckptgw.gateway.nfs.serve import read_state
from ckptgw.gateway.protocol import MAX_WAIT
from ckptgw.store.interface import Store

STATUS_VERSION = 1
RECHECK = 1.0  # a waiting ``pending`` asks again at least this often
SPACING = 0.02  # and never sooner than this after any ask


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
        log_path: Path | None = None,
        store: Store | None = None,
        retention: Retention | None = None,
        prefetcher: Prefetcher | None = None,
        lookups: LookupWait | None = None,
    ) -> None:
        self.mountpoint = mountpoint
        self.store_url = store_url
        # The store is on this node's own disks (--allow-local-store): its data is "durable
        # (local store)", never plain durable, in every view.
        self.store_local = store_local
        self.log_path = log_path
        self.store = store  # the bare store: its endpoint and requests in flight
        self.fs = fs
        self.engine = engine
        self.fetch_stats = fetch_stats
        self.lifecycle = Lifecycle()
        self.recognizer = recognizer or Recognizer()
        # Pins and the store's checkpoints, as last listed: status rows.
        self.retention = retention
        self.prefetcher = prefetcher  # warm-ups in status
        self.lookups = lookups  # the lookup deadline
        self.started = time.time()
        self._next_ask = -math.inf  # (trio time) a waiting ``pending`` asks again from then
        # The durable files, counted per directory (Journal.durable_totals), kept from one
        # status to the next: only the directories whose entries changed are counted again.
        # Files whose names may be checkpoints of their own are apart: (inode, directory).
        prefixes = self.recognizer.prefixes()
        self._prefixes = None if prefixes is None else [p.encode() for p in prefixes]
        self._totals: dict[int, tuple[int, int, int]] = {}
        self._apart: dict[int, set[int]] = {}

    # -- files -----------------------------------------------------------------------------------

    def files(
        self, path: str = "", *, dirs: bool = False, maybe_pending: bool = False
    ) -> list[tuple[InodeRow, FileView]]:
        """Every entry at or below ``path`` but directories (with ``dirs``: and directories,
        whose markers the store keeps too), with its durability; with ``maybe_pending``, at
        least those not durable (Journal.maybe_pending)."""
        row = self.fs.journal.resolve(path)
        if row is None:
            raise PathError(f"{self.mountpoint / path}: no such file or directory")
        prefix = path.strip("/")
        if not stat.S_ISDIR(row.mode):
            found = [(row, prefix)]
        elif maybe_pending:
            found = self._maybe_pending_under(row, prefix, dirs=dirs)
        else:
            found = [
                (r, f"{prefix}/{rel}" if prefix else rel)
                for r, rel in self.fs.journal.files_under(row.id, dirs=dirs)
            ]
        if stat.S_ISDIR(row.mode) and dirs and row.parent is not None:
            found.append((row, prefix))
        return self._views(found)

    def _path(self, inode: int) -> str:
        return "/".join(c.decode(errors="replace") for c in self.fs.journal.path_components(inode))

    def _maybe_pending_under(
        self, top: InodeRow, prefix: str, *, dirs: bool
    ) -> list[tuple[InodeRow, str]]:
        """The entries below ``top`` that may not be durable (Journal.maybe_pending), with
        their paths (``prefix``: top's as the caller named it)."""
        journal = self.fs.journal
        base = journal.path_components(top.id)
        found = []
        for r in journal.maybe_pending():
            if r.is_dir and not dirs:
                continue
            names = journal.path_components(r.id)
            if len(names) > len(base) and names[: len(base)] == base:
                rel = "/".join(c.decode(errors="replace") for c in names[len(base) :])
                found.append((r, f"{prefix}/{rel}" if prefix else rel))
        return found

    def _views(self, found: list[tuple[InodeRow, str]]) -> list[tuple[InodeRow, FileView]]:
        moving = self.fs.journal.pending_keys()  # a move to a file's key: not there yet
        key_prefix = self.fs.keys.prefix
        since = self.engine.dirty_since
        out = []
        for r, rel in found:
            r = self.fs.table.current(r)
            state = self.engine.durability(r, moving)
            stored = r.state not in (State.DIRTY, State.UPLOADING)  # a move may be pending
            # Its new version drains while the store holds the previous one under its name
            # (ARCHITECTURE.md, invariant 9): the name is not missing from the store. Known
            # to be there only with its ETag (a stale upload's key may hold nothing).
            previous = (
                not stored
                and r.stored_etag is not None
                and r.stored_key == object_key(key_prefix + rel, r.mode)
            )
            view = FileView(
                rel,
                r.size,
                state,
                r.mtime_ns / 1e9,
                state == DRAINING and stored,
                previous,
                None if stored else since.get(r.id, r.mtime_ns / 1e9),
            )
            out.append((r, view))
        return out

    def summary(self) -> tuple[list[tuple[InodeRow, FileView]], list[DirectoryTotals]]:
        """What :meth:`files` says of the whole mount (files, not directories), in two parts:
        the files that may not be durable and those whose names may be checkpoints, one by
        one; and every other file, durable, counted per directory. A status then builds rows
        for the few files in flight, however many the journal holds."""
        journal = self.fs.journal
        if self._prefixes is None:  # a pattern may match any name: every file, one by one
            return self.files(), []
        touched = journal.take_touched()
        if touched is None or touched:
            counts, apart = journal.durable_totals(
                None if touched is None else sorted(touched), self._prefixes
            )
            if touched is None:
                self._totals, self._apart = {}, {}
            for d in touched or ():
                self._totals.pop(d, None)
                self._apart.pop(d, None)
            self._totals.update(counts)
            for inode, d in apart:
                self._apart.setdefault(d, set()).add(inode)
        single = {r.id: r for r in journal.maybe_pending() if not r.is_dir}
        for r in journal.rows([i for ids in self._apart.values() for i in ids]):
            single.setdefault(r.id, r)
        counted = dict(self._totals)
        for r in single.values():  # a durable one waiting for a move: apart from its totals
            if (
                r.parent in counted
                and r.state in (State.CLEAN, State.REMOTE)
                and r.id not in self._apart.get(r.parent, ())
            ):
                n, nbytes, mtime = counted[r.parent]
                counted[r.parent] = (n - 1, nbytes - r.size, mtime)
        files = self._views([(r, self._path(r.id)) for r in single.values()])
        paths = self._directory_paths()
        by_parent: dict[int, set[bytes]] = {}
        for r in single.values():
            if r.parent is not None and r.name is not None:
                by_parent.setdefault(r.parent, set()).add(bytes(r.name))
        totals = [
            DirectoryTotals(
                paths[d],
                n,
                nbytes,
                mtime / 1e9,
                functools.partial(self._durable_files, d, paths[d], by_parent.get(d, set())),
            )
            for d, (n, nbytes, mtime) in counted.items()
            if n > 0 and d in paths
        ]
        return files, totals

    def _directory_paths(self) -> dict[int, str]:
        """Every directory's path (the root's is "")."""
        parents = {
            d: (parent, name)
            for d, parent, name in self.fs.journal.directories()
            if parent is not None
        }
        paths: dict[int, str] = {ROOT_INODE: ""}

        def path(d: int) -> str | None:
            chain = []
            while d not in paths:
                if d not in parents:
                    return None  # (an orphan's: none has entries)
                chain.append(d)
                d = parents[d][0]
            for c in reversed(chain):
                up, name = paths[parents[c][0]], parents[c][1].decode(errors="replace")
                paths[c] = f"{up}/{name}" if up else name
            return paths[chain[0]] if chain else paths[d]

        for d in parents:
            path(d)
        return paths

    def _durable_files(self, d: int, path: str, apart: set[bytes]) -> list[FileView]:
        """The files of directory ``d`` that its totals count, one by one."""
        assert self._prefixes is not None
        return [
            FileView(f"{path}/{n}" if path else n, size, DURABLE, mtime / 1e9)
            for name, size, mtime in self.fs.journal.durable_files_in(d, self._prefixes)
            if name not in apart
            for n in [name.decode(errors="replace")]
        ]

    def pending(self, paths: list[str]) -> dict[str, Any]:
        """What is not durable yet at or below ``paths`` (all of the mount if empty), and how
        far it has got, for progress bars (``wait``, ``flush --wait``, ``umount``).

        ``bytes``: the size of every entry listed, each counted once. ``bytes_sent``: the part
        of those bytes the store has already: the parts (or single PUT) its upload finished,
        and all of a file that waits only for a move to its name (``moving``, counted in
        ``moves``): a move sends no bytes. ``bytes - bytes_sent`` is what is left to send;
        ``bytes_in_flight`` is being sent now (parts under way, not yet in ``bytes_sent``)."""
        seen: dict[int, dict[str, Any]] = {}
        in_flight = 0
        for path in paths or [""]:
            for row, view in self.files(path, dirs=True, maybe_pending=True):
                if view.state != DURABLE and row.id not in seen:
                    upload = self.engine.upload_of(row.id)
                    if view.moving:
                        sent = view.size
                    else:
                        sent = min(upload.sent, view.size) if upload is not None else 0
                    in_flight += upload.in_flight if upload is not None else 0
                    seen[row.id] = {
                        "inode": row.id,  # stays across renames: a progress bar's key
                        "path": str(self.mountpoint / view.path),
                        "directory": stat.S_ISDIR(row.mode),
                        "size": view.size,
                        "sent": sent,
                        "moving": view.moving,
                        "previous_durable": view.previous,
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
            "bytes_sent": sum(int(f["sent"]) for f in files),
            "bytes_in_flight": in_flight,
            "moves": sum(bool(f["moving"]) for f in files),
            "replacing": sum(bool(f["previous_durable"]) for f in files),
            "store_local": self.store_local,  # "durable" then means: in a store on this node
        }

    async def pending_within(self, paths: list[str], wait: float) -> dict[str, Any]:
        """:meth:`pending`, answered as soon as nothing is pending or after ``wait`` seconds,
        with ``waited``: the seconds it waited. While it waits it asks again after each change
        of what is durable (``FileStates.changes``), at least every :data:`RECHECK` seconds
        (an entry removed changes nothing durable), and at its deadline (a progress bar's
        bytes move without a change). Every ask of every waiting request comes at least
        :data:`SPACING` seconds, and ten times as long as the last ask took, after the last
        one: waiting clients cost the daemon at most a tenth of its loop, however many."""
        changes = self.fs.states.changes
        start = trio.current_time()
        deadline = start + max(0.0, min(wait, MAX_WAIT))
        while True:
            # A plain ``pending`` is answered at once. Waiters woken together ask in turn:
            # each ask moves ``_next_ask`` on for the others.
            while deadline > start and trio.current_time() < min(deadline, self._next_ask):
                await trio.sleep_until(min(deadline, self._next_ask))
            seen, t0 = changes.version, time.perf_counter()
            answer = self.pending(paths)
            took = time.perf_counter() - t0
            now = trio.current_time()
            self._next_ask = now + max(SPACING, 10 * took)
            if not answer["count"] or now >= deadline:
                return answer | {"waited": round(now - start, 3)}
            with trio.move_on_at(min(deadline, now + RECHECK)):
                await changes.wait(seen)

    def flush(self, paths: list[str]) -> dict[str, Any]:
        if not paths:
            self.engine.flush()
        else:
            inodes = [
                row.id
                for p in paths
                for row, v in self.files(p, dirs=True, maybe_pending=True)
                if v.state != DURABLE
            ]
            self.engine.flush(inodes)
        return self.pending(paths)

    def store_requests(self) -> dict[str, Any] | None:
        """The store's endpoint and its requests in flight (``Store.requests_view``), each
        stalled one with the path of the file it is for, where it is one of ours."""
        view = self.store.requests_view() if self.store is not None else None
        if view is None:
            return None
        prefix = self.fs.keys.prefix
        for r in view["requests"]:
            key = str(r.get("key") or "")
            r["path"] = str(self.mountpoint / key.removeprefix(prefix)) if key else None
        return view

    def _upload(self, p: UploadProgress, prefix: str) -> dict[str, Any]:
        """One upload, under the file's current name. The upload writes the key the file had
        when it began (``sent_as``, when that differs): a rename meanwhile moves the object
        once it is complete."""
        ino = self.fs.table.peek(p.inode)  # pinned in memory while it uploads
        key = self.fs.keys.entry_key(ino) if ino is not None and ino.parent is not None else None
        rate = p.throughput
        sent_as = None if key in (None, p.key) else p.key
        return {
            "path": str(self.mountpoint / (key or p.key).removeprefix(prefix)),
            "sent_as": sent_as and str(self.mountpoint / sent_as.removeprefix(prefix)),
            "size": p.size,
            "sent": p.sent,
            "in_flight": p.in_flight,
            "phase": p.phase,
            "elapsed": round(p.elapsed, 3),
            "throughput": round(rate),
            "eta": round((p.size - p.sent) / rate, 1) if rate > 0 and p.sent else None,
        }

    def _writers(self, row: InodeRow) -> int:
        mem = self.fs.table.peek(row.id)
        return mem.writers if mem is not None else 0

    # -- the snapshot ----------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        now = time.time()
        files, totals = self.summary()
        # Each file counts once, in at most one of two sums that the text and the checkpoint
        # rows go by. dirty_bytes: files whose content the store lacks (dirty or uploading;
        # the sum of the checkpoints' local_bytes). queue.moving_bytes: files the store holds
        # under an old name (or with old metadata), waiting for a store operation (the sum of
        # the checkpoints' moving_bytes). Neither counts directories.
        dirty = [(r, v) for r, v in files if r.state in (State.DIRTY, State.UPLOADING)]
        moving = [v for _, v in files if v.moving]
        queued = [(r, v) for r, v in dirty if self._writers(r) == 0]
        since = [v.since for _, v in dirty if v.since is not None]
        replacing = [v for _, v in dirty if v.previous]
        space = self.fs.space
        retry = self.engine.stats
        prefix = self.fs.keys.prefix
        running = self.engine.running()
        uploads = [self._upload(p, prefix) for p in running]
        store_requests = self.store_requests()
        if store_requests is not None:  # an upload names its stalled requests
            stalled = [r for r in store_requests["requests"] if r["stalled"]]
            for u, p in zip(uploads, running, strict=True):
                u["stalled"] = [f"{r['what']} ({r['phase']})" for r in stalled if r["key"] == p.key]
        checkpoints, listed = checkpoint_rows(
            self.mountpoint, self.recognizer, (v for _, v in files), self.retention, now, totals
        )
        lc = self.lifecycle
        return {
            "version": STATUS_VERSION,
            "mountpoint": str(self.mountpoint),
            "store": self.store_url,
            "store_local": self.store_local,
            "log": None if self.log_path is None else str(self.log_path),
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
                "moves": len(moving),
                "moving_bytes": sum(v.size for v in moving),
                "replacing": len(replacing),
                "replacing_bytes": sum(v.size for v in replacing),
                # dirty, quiet files the scheduler had lost and its audit queued (bugs): 0
                "lost_wakeups": self.engine.scheduler.lost_wakeups,
            },
            "uploads": uploads,
            "drained": {"bytes": self.engine.drained.bytes, "files": self.engine.drained.files},
            "written_bytes": self.fs.files.written_bytes,
            "fsyncs": self.fs.files.fsyncs,
            "syncs": {
                "files": self.fs.cache.syncs.files,
                "entries": self.fs.cache.syncs.entries,
                "journal": self.fs.journal.barriers,
                "inline": self.fs.files.inline_syncs,
            },
            "requests": self.fs.requests.view(),
            "data_path": {
                "mode": self.fs.path.mode,
                "reason": self.fs.path.reason if not self.fs.path.active else None,
                "passthrough_opens": self.fs.path.stats.passthrough_opens,
                "daemon_opens": self.fs.path.stats.daemon_opens,
                "daemon_bytes": self.fs.files.daemon_bytes,
            },
            "fetched": {
                "bytes": self.fetch_stats.bytes,
                "files": self.fetch_stats.files,
                "requests": self.fetch_stats.requests,
            },
            "warmups": [] if self.prefetcher is None else self.prefetcher.views(),
            "retries": retry.retries,
            "errors": dict(retry.errors),
            "last_error": retry.last_error or None,
            "last_error_at": retry.last_error_at or None,
            "checkpoints": checkpoints,
            "nfs": read_state(self.fs.cache.root),
            "part_workers": None if self.store is None else self.store.part_workers_view(),
            "store_requests": store_requests,
            # lookups the store kept waiting past store.lookup_wait (answered from the journal)
            "lookups": None if self.lookups is None else asdict(self.lookups.view()),
            **listed,  # store_listing and pins
        }
