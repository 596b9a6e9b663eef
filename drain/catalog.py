"""The store's checkpoints, for ``status``: what a resuming node asks first ("what is there to
resume from?"), answered from memory.

Status is synchronous and must never wait on the store, so it reads the listing kept here,
with the time it was made: one at the start, then one in the background whenever status asks
and the last is older than the TTL (one at a time; after a failure, not again before the TTL
either). Nothing lists while nobody asks; the daemon sets the TTL to a minute at least, since
metrics scrapes and probes ask for status every few seconds.

What is walked: each retention run's prefix, the same listing the retention plan makes (a plan
hands its own here: :meth:`StoreCatalog.put`), or, with no run configured, the mount's whole
prefix. A walk stops after ``max_keys`` keys and says so (``truncated``); the recognizer groups
what it saw into checkpoints. The gateway's own keys (``.ckptgw-...`` at the root: the pins) are
left out.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import trio

from ckptgw.drain.checkpoints import Recognizer
from ckptgw.drain.store import ObjectInfo, Store, StoreError
from ckptgw.fsops.names import RESERVED

log = logging.getLogger(__name__)

MAX_KEYS = 10_000  # per walk: ten S3 pages


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

    def checkpoints(self) -> dict[str, StoredCheckpoint]:
        return {p: c for w in self._walks.values() for p, c in w.checkpoints.items()}

    def ask(self) -> None:
        """Status wants the listing: walk again in the background if it is older than the TTL."""
        if time.monotonic() - self._tried >= self.ttl:
            self._asked.set()

    # -- keeping it ------------------------------------------------------------------------------

    def put(self, root: str, files: list[CheckpointFile], truncated: bool) -> None:
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
        self._walks[root.strip("/")] = _Walk(groups, len(files), truncated, time.time())

    def forget(self, path: str) -> None:
        """A checkpoint deleted by this node: gone from the listing at once."""
        for w in self._walks.values():
            w.checkpoints.pop(path, None)

    async def refresh(self) -> None:
        self._tried = time.monotonic()
        try:
            for root in self.roots:
                files, truncated = await list_files(self.store, self.prefix, root, self.max_keys)
                self.put(root, files, truncated)
        except StoreError as e:
            self.error = str(e)
            log.warning("listing the store's checkpoints failed: %s", e)
            return
        self.error = None

    async def asked(self) -> None:
        """Return once status asks for a newer listing."""
        self._asked = trio.Event()
        await self._asked.wait()
