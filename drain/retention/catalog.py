"""The store's checkpoints, for ``status``: what a resuming node asks first ("what is there to
resume from?"), answered from memory.

Status is synchronous and must never wait on the store, so it reads the listing kept here,
with the time it was made: one at the start, then one in the background whenever status asks
and the last is older than the TTL (one at a time; after a failure, not again before the TTL
either). Nothing lists while nobody asks; the daemon sets the TTL to a minute at least, since
metrics scrapes and probes ask for status every few seconds.

What is walked: each retention run's prefix (a retention plan hands its own full listing of a
run here: :meth:`StoreCatalog.put`), or, with no run configured, the mount's whole prefix. The
walk goes one directory level at a time (delimiter listings), so that it can take the newest
checkpoints of each directory by step, not the first keys in key order (``step_000100`` sorts
before ``step_000200``: a walk cut off in key order keeps the oldest). Of each directory it
lists the files of the newest ``per_dir`` checkpoints and counts the rest (``omitted``); it
stops after ``max_keys`` keys or ``max_requests`` listings and says so (``truncated``). The
gateway's own keys (``.ckptgw-...``: the pins, directory markers) are left out.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import trio

from ckptgw.drain.checkpoints import Recognizer
from ckptgw.fsops.names import RESERVED
from ckptgw.store.interface import ObjectInfo, Store, StoreError

log = logging.getLogger(__name__)

MAX_KEYS = 10_000  # files listed per walk
MAX_REQUESTS = 200  # listings per walk: directory levels and checkpoints' files
PER_DIRECTORY = 20  # the newest checkpoints of each directory whose files are listed


@dataclass
class CheckpointFile:
    path: str  # relative to the mount's root
    key: str | None  # the object, if the store has this file
    size: int
    durable: bool
    mtime: float


@dataclass
class StoredCheckpoint:
    path: str  # relative to the mount's root
    step: int
    files: list[CheckpointFile]

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def mtime(self) -> float:
        return max(f.mtime for f in self.files)


@dataclass
class _Walk:
    checkpoints: dict[str, StoredCheckpoint]
    keys: int
    truncated: bool
    at: float
    omitted: int = 0  # checkpoints seen but older than the newest PER_DIRECTORY of their dir


@dataclass
class Walked:
    """What one walk found: the files of the checkpoints it listed, how many older ones it
    left out, and whether it stopped at a bound before seeing everything."""

    files: list[CheckpointFile]
    omitted: int = 0
    truncated: bool = False


async def walk_checkpoints(
    store: Store,
    prefix: str,
    root: str,
    recognizer: Recognizer,
    *,
    per_dir: int = PER_DIRECTORY,
    max_keys: int = MAX_KEYS,
    max_requests: int = MAX_REQUESTS,
) -> Walked:
    """The files of the newest ``per_dir`` checkpoints of every directory under ``root`` (a
    path in the mount; "" for all of it), one delimiter listing per directory level."""
    out = Walked([])
    levels = [root.strip("/")]
    requests = 0
    while levels:
        if requests >= max_requests:
            out.truncated = True
            break
        rel = levels.pop(0)
        level = await store.list_dir(prefix + (f"{rel}/" if rel else ""))
        requests += 1
        found: list[tuple[int, str, ObjectInfo | None]] = []  # (step, path, object if a file)
        for d in level.dirs:
            path = d[len(prefix) :].rstrip("/")
            name = path.rsplit("/", 1)[-1]
            if name.startswith(RESERVED.decode()):
                continue
            step = recognizer.step(name)
            if step is None:
                levels.append(path)
            else:
                found.append((step, path, None))
        for o in level.objects:
            path = o.key[len(prefix) :]
            step = recognizer.step(path.rsplit("/", 1)[-1])
            if step is not None and not path.rsplit("/", 1)[-1].startswith(RESERVED.decode()):
                found.append((step, path, o))
        found.sort(key=lambda f: f[0], reverse=True)
        out.omitted += max(0, len(found) - per_dir)
        for _, path, obj in found[:per_dir]:
            if obj is not None:
                out.files.append(CheckpointFile(path, obj.key, obj.size, True, obj.mtime))
                continue
            if len(out.files) >= max_keys or requests >= max_requests:
                out.truncated = True
                return out
            files, more = await list_files(store, prefix, path, max_keys - len(out.files))
            requests += 1 + len(files) // 1000  # a LIST page holds 1,000 keys
            out.files += files
            out.truncated |= more
    return out


async def list_files(
    store: Store, prefix: str, root: str, limit: int | None
) -> tuple[list[CheckpointFile], bool]:
    """The objects under ``root`` (a path in the mount; "" for all of it) as files, the
    gateway's own keys left out, at most ``limit`` of them; and whether there were more."""
    start = prefix + (f"{root.strip('/')}/" if root.strip("/") else "")
    out: list[CheckpointFile] = []
    objects: AsyncIterator[ObjectInfo] = store.iter_objects(start)
    try:
        async for o in objects:
            if limit is not None and len(out) >= limit:
                return out, True
            rel = o.key[len(prefix) :]
            if rel.startswith(RESERVED.decode()):
                continue  # the gateway's own, at the root: the pins
            out.append(CheckpointFile(rel, o.key, o.size, True, o.mtime))
    finally:
        aclose = getattr(objects, "aclose", None)
        if aclose is not None:  # a walk left early ends here, not at GC
            await aclose()
    return out, False


class StoreCatalog:
    def __init__(
        self,
        store: Store,
        prefix: str,
        recognizer: Recognizer,
        roots: list[str],
        *,
        ttl: float = 5.0,
        max_keys: int = MAX_KEYS,
    ) -> None:
        self.store = store
        self.prefix = prefix
        self.recognizer = recognizer
        self.roots = [r.strip("/") for r in roots] or [""]
        self.ttl = ttl
        self.max_keys = max_keys
        self.error: str | None = None  # the last walk's failure, until one succeeds
        self._walks: dict[str, _Walk] = {}
        self._tried = 0.0  # monotonic time of the last walk, failed or not
        self._asked = trio.Event()

    # -- what status reads -------------------------------------------------------------------------

    @property
    def listed_at(self) -> float | None:
        """When the oldest part of the listing was made; None before every root was listed."""
        if any(r not in self._walks for r in self.roots):
            return None
        return min(self._walks[r].at for r in self.roots)

    @property
    def truncated(self) -> bool:
        return any(w.truncated for w in self._walks.values())

    @property
    def keys(self) -> int:
        return sum(w.keys for w in self._walks.values())

    @property
    def omitted(self) -> int:
        """Checkpoints the walks saw but did not list, older than the newest of their dir."""
        return sum(w.omitted for w in self._walks.values())

    def checkpoints(self) -> dict[str, StoredCheckpoint]:
        return {p: c for w in self._walks.values() for p, c in w.checkpoints.items()}

    def ask(self) -> None:
        """Status wants the listing: walk again in the background if it is older than the TTL."""
        if time.monotonic() - self._tried >= self.ttl:
            self._asked.set()

    # -- keeping it ------------------------------------------------------------------------------

    def put(
        self, root: str, files: list[CheckpointFile], truncated: bool, omitted: int = 0
    ) -> None:
        """A listing of ``root`` (made here, or by the retention plan) replaces the last one."""
        groups: dict[str, StoredCheckpoint] = {}
        for f in files:
            path, step = self.recognizer.locate(f.path)
            if step is None:
                continue
            cp = groups.get(path)
            if cp is None:
                cp = groups[path] = StoredCheckpoint(path, step, [])
            cp.files.append(f)
        self._walks[root.strip("/")] = _Walk(groups, len(files), truncated, time.time(), omitted)

    def forget(self, path: str) -> None:
        """A checkpoint deleted by this node: gone from the listing at once."""
        for w in self._walks.values():
            w.checkpoints.pop(path, None)

    async def refresh(self) -> None:
        self._tried = time.monotonic()
        try:
            for root in self.roots:
                walked = await walk_checkpoints(
                    self.store, self.prefix, root, self.recognizer, max_keys=self.max_keys
                )
                self.put(root, walked.files, walked.truncated, walked.omitted)
        except StoreError as e:
            self.error = str(e)
            log.warning("listing the store's checkpoints failed: %s", e)
            return
        self.error = None

    async def asked(self) -> None:
        """Return once status asks for a newer listing."""
        self._asked = trio.Event()
        await self._asked.wait()
