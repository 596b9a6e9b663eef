"""Lifecycle: retention applied to the bucket and the caches, pins, and the bucket's own rules.

The plan for a run (a path in the mount with a retention policy) comes from two views:

* the store: every object under the run (what any node drained), listed in full;
* this node's journal: files not yet durable, which the store does not have (or has an older
  version of). They make their checkpoint "not durable", so retention never touches it.

Checkpoints are grouped by :class:`~drain.checkpoints.Recognizer`; pins are empty objects under
``<prefix>.ckptgw-pins/<path>``, so every node sees the same pins. Only a checkpoint that exists
is pinned: one with files only in this node's cache, or at least one object in the store.
Status reads the pins from a copy kept here (updated by pin, unpin, every listing of them and
the background listing of :class:`~drain.retention.catalog.StoreCatalog`), never from the store.

A directory's marker object belongs to the checkpoint it is in (and goes with it), but a
checkpoint of markers only (a ``step_N/`` made before its files) is never complete. A symlink
of the run outside the checkpoints (``last.ckpt``, ``best.ckpt``) whose relative target is in
a checkpoint keeps that checkpoint: deleting it would leave the link dangling, on every node.
Applying a plan deletes each doomed checkpoint's objects in batches, then drops it from this
node's namespace and cache (other nodes drop it at their next listing), and tags milestones
``ckptgw-class=milestone`` for the bucket's transition rule (only when
``lifecycle.storage_class`` names a class to move them to: without one a milestone is only
kept).

A checkpoint is complete when its marker (``retention.marker``) is in the store, or, without a
marker, when it has been quiet for ``retention.quiet`` seconds; until then the plan and status
say which of the two it waits for.
"""

from __future__ import annotations

import fnmatch
import logging
import posixpath
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from ckptgw.drain.checkpoints import DURABLE, EntryCount, FileView, Recognizer
from ckptgw.drain.reads.entries import read_meta
from ckptgw.drain.retention.catalog import CheckpointFile as _File
from ckptgw.drain.retention.catalog import StoreCatalog, StoredCheckpoint, list_files
from ckptgw.drain.retention.policy import DELETE, TRANSITION, Candidate, Decision, Policy, plan
from ckptgw.fsops.filesystem import Filesystem
from ckptgw.fsops.journal import State
from ckptgw.fsops.names import RESERVED
from ckptgw.fsops.objectmeta import SMALL_OBJECT
from ckptgw.store.interface import Store, StoreError

log = logging.getLogger(__name__)

PINS = RESERVED.decode() + "pins/"
CLASS_TAG = "ckptgw-class"
RULE_PREFIX = "ckptgw-"


@dataclass(frozen=True)
class RunPolicy:
    run: str  # a directory in the mount, relative to its root ("jobs/llama")
    policy: Policy = field(default_factory=Policy)
    marker: str = ""  # a checkpoint is complete once a file matching this glob is durable
    quiet: float = 300.0  # without a marker: complete once durable and quiet this long


@dataclass(frozen=True)
class BucketRules:
    abort_days: int = 7  # AbortIncompleteMultipartUpload after this many days
    storage_class: str = ""  # milestones move here (e.g. "GLACIER_IR"); empty: no transition
    transition_days: int = 30


@dataclass
class CheckpointPlan:
    run: str
    decision: Decision
    files: list[_File]

    def view(self) -> dict[str, Any]:
        d = self.decision
        count = EntryCount.of(d.path, (f.path for f in self.files))
        return {
            "run": self.run,
            "path": d.path,
            "step": d.step,
            "action": d.action,
            "reason": d.reason,
            "class": d.storage_class,
            "files": count.files,  # as status counts them
            "directories": count.directories,
            "bytes": sum(f.size for f in self.files),
        }


def _where(local: bool, stored: bool) -> str | None:
    """Where a checkpoint is, as status's rows say it (see :meth:`Lifecycle.where`)."""
    if local and stored:
        return "both"
    return "local" if local else "store" if stored else None


class Lifecycle:
    def __init__(
        self,
        fs: Filesystem,
        store: Store,
        runs: list[RunPolicy],
        rules: BucketRules,
        local_files: Callable[[str], list[FileView]],
        recognizer: Recognizer | None = None,
        *,
        listing_ttl: float = 5.0,
    ) -> None:
        self.fs = fs
        self.store = store
        self.prefix = fs.keys.prefix
        self.runs = runs
        self.rules = rules
        self.local_files = local_files  # durability of this node's files under a path
        self.recognizer = recognizer or Recognizer()
        self.catalog = StoreCatalog(
            store, self.prefix, self.recognizer, [r.run for r in runs], ttl=listing_ttl
        )
        # The pins as last seen (path -> when pinned), for status: it never asks the store.
        self.pinned: dict[str, float] = {}
        self.pins_listed_at: float | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep the pins and the store's checkpoints listed for status: once at the start,
        then whenever status asks for a listing older than the TTL."""
        task_status.started()
        while True:
            try:
                await self.pins()
            except StoreError as e:
                log.warning("listing the pins failed: %s", e)
            await self.catalog.refresh()
            await self.catalog.asked()

    # -- pins --------------------------------------------------------------------------------------

    def _pin_key(self, path: str) -> str:
        return f"{self.prefix}{PINS}{path.strip('/')}"

    async def pins(self) -> set[str]:
        start = f"{self.prefix}{PINS}"
        found = {o.key[len(start) :]: o.mtime async for o in self.store.iter_objects(start)}
        self.pinned, self.pins_listed_at = found, time.time()
        return set(found)

    async def pin(self, path: str) -> str:
        """Pin a checkpoint that exists; returns where it is (see :meth:`where`)."""
        path = path.strip("/")
        where = await self.where(path)
        if where is None:
            raise LookupError(
                f"{path}: no such checkpoint, neither in this node's cache nor in the store "
                "(nothing pinned; ckptgw status lists the checkpoints)"
            )
        await self.store.put(self._pin_key(path), b"", {"pinned-at": str(time.time())})
        self.pinned[path] = time.time()
        return where

    async def unpin(self, path: str) -> bool:
        """Remove a pin; returns whether there was one."""
        path = path.strip("/")
        key = self._pin_key(path)
        was = await self.store.head(key) is not None
        if was:
            await self.store.delete(key)
        self.pinned.pop(path, None)
        return was

    async def where(self, path: str) -> str | None:
        """Where a checkpoint is, as status's rows say it: "local" (files on this node, no
        object yet), "store" (objects, nothing on this node), "both", or None (nowhere: never
        written, or deleted)."""
        path = path.strip("/")
        local = bool(self.local_files(path))
        stored = await self.store.head(self.prefix + path) is not None
        if not stored:
            files, _ = await list_files(self.store, self.prefix, path, 1)
            stored = bool(files)
        return _where(local, stored)

    async def pin_views(self) -> list[dict[str, Any]]:
        """Every pin, listed from the store now, where its checkpoint is (None: gone) and its
        entries, counted as status and the plan count them (the store's and this node's)."""
        await self.pins()
        out = []
        for path, at in sorted(self.pinned.items()):
            local = self.local_files(path)
            stored, _ = await list_files(self.store, self.prefix, path, None)
            if not stored and (one := await self.store.head(self.prefix + path)) is not None:
                stored = [_File(path, one.key, one.size, True, one.mtime)]  # a one-file checkpoint
            count = EntryCount.of(path, self.merge(stored, local))
            out.append(
                {
                    "path": path,
                    "pinned_at": at or None,
                    "where": _where(bool(local), bool(stored)),  # from the listing made here
                    "files": count.files,
                    "directories": count.directories,
                }
            )
        return out

    # -- planning ----------------------------------------------------------------------------------

    async def _files(self, run: RunPolicy) -> dict[str, _File]:
        stored, _ = await list_files(self.store, self.prefix, run.run, None)
        self.catalog.put(run.run, stored, False)
        return self.merge(stored, self.local_files(run.run))

    def merge(self, stored: list[_File], local: list[FileView]) -> dict[str, _File]:
        """The store's files, with this node's that are not durable in their place."""
        out = {f.path: f for f in stored}
        for v in local:
            known = out.get(v.path)
            if v.state != DURABLE:
                out[v.path] = _File(v.path, known.key if known else None, v.size, False, v.mtime)
            elif known is None:  # durable, but the listing has not caught up yet
                out[v.path] = _File(v.path, self.prefix + v.path, v.size, True, v.mtime)
        return out

    async def _links(self, files: dict[str, _File]) -> dict[str, str]:
        """Checkpoints that symlinks outside the checkpoints point to: path -> the link."""
        out: dict[str, str] = {}
        for f in files.values():
            if f.size > SMALL_OBJECT or f.path.endswith("/"):
                continue
            if self.recognizer.locate(f.path)[1] is not None:
                continue  # inside a checkpoint: goes with it
            target = await self._target(f)
            if target is None or target.startswith(b"/"):
                continue
            resolved = posixpath.normpath(
                posixpath.join(posixpath.dirname(f.path), target.decode(errors="replace"))
            )
            path, step = self.recognizer.locate(resolved)
            if step is not None:
                out.setdefault(path, f.path)
        return out

    async def _target(self, f: _File) -> bytes | None:
        """A symlink's target, from this node's journal or else from the store."""
        row = self.fs.journal.resolve(f.path)
        if row is not None:  # a listing here described it already (small objects are)
            return row.target if stat.S_ISLNK(row.mode) else None
        if f.key is None:
            return None
        try:
            info = await self.store.head(f.key)
            if info is None or read_meta(info).kind != stat.S_IFLNK:
                return None
            return await self.store.get(f.key, etag=info.etag)
        except StoreError as e:
            log.warning("retention: cannot read %s (%s); its target is not kept for it", f.key, e)
            return None

    def _complete(
        self, run: RunPolicy, path: str, files: list[_File], now: float
    ) -> tuple[bool, str]:
        """Whether a checkpoint is complete, and if not, what that waits for."""
        if not all(f.durable for f in files):
            return False, "files not in the store yet"
        if all(f.path.endswith("/") for f in files):
            return False, "only its directory is in the store, none of its files"
        if len(files) == 1 and files[0].path == path:
            return True, ""  # a single-file checkpoint: complete once it is in the store
        if run.marker:
            if any(fnmatch.fnmatch(posixpath.basename(f.path), run.marker) for f in files):
                return True, ""
            return False, f"marker {run.marker} not in the store yet"
        left = run.quiet - (now - max(f.mtime for f in files))
        if left <= 0:
            return True, ""
        return False, (
            f"quiet for {max(1, round(left))} s more, "
            "or add a marker (retention.marker, e.g. .metadata)"
        )

    def run_of(self, path: str) -> RunPolicy | None:
        """The retention run a checkpoint is in, if any."""
        return next((r for r in self.runs if path.startswith(r.run + "/")), None)

    def judge(
        self,
        path: str,
        local: list[FileView],
        now: float,
        listed: dict[str, StoredCheckpoint] | None = None,
    ) -> tuple[bool, str] | None:
        """For status, from memory: whether a checkpoint is complete (and what it waits for),
        from the last listing of the store (``listed``: the catalog's checkpoints, when the
        caller has them already) and this node's files; None outside every run."""
        run = self.run_of(path)
        if run is None:
            return None
        stored = (self.catalog.checkpoints() if listed is None else listed).get(path)
        files = list(self.merge(stored.files if stored else [], local).values())
        return self._complete(run, path, files, now) if files else None

    async def plan(self, run_filter: str | None = None) -> list[CheckpointPlan]:
        runs = [r for r in self.runs if run_filter is None or r.run == run_filter.strip("/")]
        if run_filter is not None and not runs:
            known = ", ".join(r.run for r in self.runs) or "none configured"
            raise LookupError(f"no retention policy for run {run_filter!r} (runs: {known})")
        pins = await self.pins()
        now = time.time()
        out: list[CheckpointPlan] = []
        for run in runs:
            groups: dict[str, list[_File]] = {}
            steps: dict[str, int] = {}
            files = await self._files(run)
            links = await self._links(files)
            for f in files.values():
                path, step = self.recognizer.locate(f.path)
                if step is not None:
                    groups.setdefault(path, []).append(f)
                    steps[path] = step
            cands = []
            for path, members in groups.items():
                complete, waiting = self._complete(run, path, members, now)
                cands.append(
                    Candidate(
                        path=path,
                        step=steps[path],
                        mtime=max(f.mtime for f in members),
                        durable=all(f.durable for f in members),
                        complete=complete,
                        pinned=path in pins,
                        linked_by=links.get(path, ""),
                        waiting=waiting,
                    )
                )
            decisions = plan(cands, run.policy, now, transition=bool(self.rules.storage_class))
            out += [CheckpointPlan(run.run, d, groups[d.path]) for d in decisions]
        return out

    # -- applying ----------------------------------------------------------------------------------

    async def apply(self, run_filter: str | None = None) -> dict[str, Any]:
        """Carry out the plan: returns what it did (and the plan it followed)."""
        plans = await self.plan(run_filter)
        deleted = tagged = dropped = 0
        for p in plans:
            keys = [f.key for f in p.files if f.key is not None]
            if p.decision.action == DELETE:
                if any(not f.durable for f in p.files):
                    raise AssertionError(f"plan would delete {p.decision.path}, not durable")
                await self._delete(p.decision.path, keys)
                self.catalog.forget(p.decision.path)
                dropped += self._forget_local(p.decision.path, set(keys))
                deleted += 1
                log.info("retention: deleted %s (%s)", p.decision.path, p.decision.reason)
            elif p.decision.action == TRANSITION:
                for key in keys:
                    await self._tag(key, p.decision.storage_class)
                tagged += 1
        return {
            "plan": [p.view() for p in plans],
            "deleted": deleted,
            "deleted_bytes": sum(p.view()["bytes"] for p in plans if p.decision.action == DELETE),
            "tagged": tagged,
            "dropped_local_files": dropped,
        }

    async def _delete(self, path: str, keys: list[str]) -> None:
        # A file of it rewritten since the plan (dirty, its key now its previous version,
        # which its upload replaces): that key is not deleted (ARCHITECTURE.md, invariant 9).
        # The plan was made several awaits ago.
        keys = [k for k in keys if not self.fs.keys.replaced(k)]
        await self.store.delete_many(keys)
        for key in keys:  # a listing begun before the delete must not bring the names back
            self.fs.keys.note_removed(key)

    async def _tag(self, key: str, storage_class: str) -> None:
        await self.store.put_tags(key, {CLASS_TAG: storage_class})

    def _forget_local(self, path: str, keys: set[str]) -> int:
        """Drop a deleted checkpoint from this node: its names, and its cache files (at once, or
        when the kernel forgets an inode it still knows). Returns the files dropped."""
        journal, table = self.fs.journal, self.fs.table
        top = journal.resolve(path)
        if top is None:
            return 0
        is_dir = stat.S_ISDIR(top.mode)
        rows = [r for r, _ in journal.files_under(top.id)] if is_dir else [top]
        freed: list[int] = []
        dropped = 0
        with journal.transaction():
            for row in rows:
                current = table.current(row)
                ours = current.state in (State.CLEAN, State.REMOTE) and current.stored_key in keys
                if not ours:
                    continue
                dropped += 1
                if table.unlink(table.adopt(current)) and current.state is State.CLEAN:
                    freed.append(row.id)
            if is_dir:  # then the directories it emptied, children first
                for d in [*reversed([i for i, _ in journal.subtree(top.id)]), top.id]:
                    entry = journal.get(d)  # files unlinked above are gone or orphans by now
                    if entry and stat.S_ISDIR(entry.mode) and not journal.has_children(d):
                        ino = table.adopt(entry)
                        if ino.stored_key not in keys:
                            self.fs.keys.unlinked(ino)  # a marker stored since, or on its way
                        table.unlink(ino)
        for i in freed:
            table.cache.remove(i)
        return dropped

    # -- bucket rules ------------------------------------------------------------------------------

    def our_rules(self) -> list[dict[str, Any]]:
        scope: dict[str, Any] = {"Prefix": self.prefix}
        rules: list[dict[str, Any]] = [
            {
                "ID": f"{RULE_PREFIX}abort-incomplete-uploads",
                "Status": "Enabled",
                "Filter": scope,
                "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": self.rules.abort_days},
            }
        ]
        if self.rules.storage_class:
            tag = {"Key": CLASS_TAG, "Value": "milestone"}
            filt = {"And": {"Prefix": self.prefix, "Tags": [tag]}} if self.prefix else {"Tag": tag}
            rules.append(
                {
                    "ID": f"{RULE_PREFIX}milestones",
                    "Status": "Enabled",
                    "Filter": filt,
                    "Transitions": [
                        {
                            "Days": self.rules.transition_days,
                            "StorageClass": self.rules.storage_class,
                        }
                    ],
                }
            )
        return rules

    async def bucket_rules(self, apply: bool) -> dict[str, Any]:
        """The bucket's rules with ours merged in (others' rules kept); applied if asked."""
        current = await self.store.get_lifecycle()
        others = [r for r in current if not str(r.get("ID", "")).startswith(RULE_PREFIX)]
        merged = others + self.our_rules()
        if apply:
            await self.store.put_lifecycle(merged)
        return {"current": current, "proposed": merged, "applied": apply}
