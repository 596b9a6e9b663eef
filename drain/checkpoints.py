"""Checkpoints: which files belong together, and whether the set would survive losing the node.

A checkpoint is the deepest path component that looks like one of the common trainers' names
(``step_N``, ``global_stepN``, ``iter_0000100``, ``checkpoint-N``, ``epoch_N``, ``ckpt_N.pt``):
a directory with everything below it, or a single file. Files under no such name are grouped
by their directory, so a status view stays one line per directory however many files there are.

Per file: ``local`` (only in this node's cache), ``draining`` (an upload or a move of it is
under way) or ``durable`` (the store has this content under this path). Per checkpoint:
``durable`` when every file is, ``local-only`` when none is and nothing is being sent, else
``draining``.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

DEFAULT_PATTERNS = (
    r"global_step(\d+)",
    r"step[_-]?(\d+)",
    r"iter_(\d+)",
    r"checkpoint[_-](\d+)",
    r"epoch[_-]?(\d+)",
    r"ckpt[_-]?(\d+)",
)
_SUFFIX = r"(?:\.[A-Za-z0-9]+)*"  # ckpt_5.pt, step_10.safetensors

LOCAL, DRAINING, DURABLE = "local", "draining", "durable"
LOCAL_ONLY = "local-only"


@dataclass(frozen=True)
class FileView:
    path: str  # relative to the mount's root
    size: int
    state: str  # LOCAL, DRAINING or DURABLE
    mtime: float
    # DRAINING for a store operation only: the store has this content already, under the
    # file's old name (a move to its name is pending) or with old metadata (an update is).
    moving: bool = False
    # Not durable, but the store holds this name's previous version (the file it replaced,
    # or its own older content), which stays there until the new version replaces it.
    previous: bool = False
    # Not durable: since when (seconds since the epoch) its content has been only on this
    # node (the first report of the change not yet in the store). None when durable.
    since: float | None = None


def is_marker(path: str) -> bool:
    """A directory's marker object (``run/step_1/``): the store keeps one per directory."""
    return path.endswith("/")


@dataclass(frozen=True)
class EntryCount:
    """How a checkpoint's entries are counted wherever they are (status, the retention plan,
    pins): its files, every entry but directories (regular files, symlinks, special files: an
    object each), and apart from them its directories: its own and each one below it, whether
    a listing named the marker or only a file inside it. The mount's root is no directory of
    its own here (its files are no checkpoint). ``wait`` and ``flush`` count what is not
    durable yet the same way: files, and directories apart."""

    files: int
    directories: int

    @classmethod
    def of(
        cls, root: str, paths: Iterable[str], counted: Iterable[tuple[str, int]] = ()
    ) -> EntryCount:
        """``paths``: the entries one by one; ``counted``: (directory, files in it) more."""
        files = 0
        dirs: set[str] = set()
        below = f"{root}/" if root else ""

        def add(d: str) -> None:  # a directory and those between it and the root
            while d and (d == root or d.startswith(below)) and d not in dirs:
                dirs.add(d)
                d = posixpath.dirname(d)

        for p in paths:
            if is_marker(p):
                add(p.rstrip("/"))
            else:
                files += 1
                add(posixpath.dirname(p))
        for d, n in counted:
            files += n
            add(d)
        return cls(files, len(dirs))


@dataclass(frozen=True)
class DirectoryTotals:
    """Durable files of one directory, counted, not listed: a status of a node that holds a
    long run's checkpoints reads a million drained files as totals per directory (the journal
    sums them). None of them is named like a checkpoint of its own (those are listed)."""

    path: str  # the directory, relative to the mount's root ("" for the root)
    files: int
    bytes: int
    mtime: float  # the latest
    # Lists them (a merge with the store's listing, a retention verdict): read when asked.
    load: Callable[[], list[FileView]] = field(compare=False, repr=False, default=list)


@dataclass
class CheckpointView:
    path: str  # relative to the mount's root; "" for files directly in it
    step: int | None  # None: not a checkpoint, the files of one directory
    files: list[FileView] = field(default_factory=list)
    # Durable files counted per directory, not in ``files`` (:meth:`every` lists them too).
    totals: list[DirectoryTotals] = field(default_factory=list)

    def every(self) -> list[FileView]:
        """Every file, those counted in ``totals`` read from where they are."""
        return self.files + [f for t in self.totals for f in t.load()]

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.files) + sum(t.bytes for t in self.totals)

    @property
    def count(self) -> EntryCount:
        return EntryCount.of(
            self.path, (f.path for f in self.files), ((t.path, t.files) for t in self.totals)
        )

    @property
    def local_bytes(self) -> int:
        """Bytes of files whose content the store lacks (dirty or uploading): only on this
        node. Not "bytes in the cache": a checkpoint the store holds has none, however much of
        it is cached. Each file counts once; a file waiting only for a move counts in
        :attr:`moving_bytes` instead, so over all checkpoints this is status's dirty_bytes."""
        return sum(f.size for f in self.files if f.state != DURABLE and not f.moving)

    @property
    def local_since(self) -> float | None:
        """Since when the oldest content of it the store lacks has been only on this node
        (the exposure window's start); None when the store has all of it."""
        return min(
            (f.since for f in self.files if f.since is not None and not f.moving), default=None
        )

    @property
    def replacing(self) -> int:
        """Files whose new version is not durable yet while the store still holds their
        previous one under the same name."""
        return sum(f.previous for f in self.files)

    @property
    def moves(self) -> int:
        """Files whose content is in the store, waiting for a store operation (a move to
        their name, an update of their metadata) to be durable."""
        return sum(f.moving for f in self.files)

    @property
    def moving_bytes(self) -> int:
        """The bytes of :attr:`moves`: stored already, not sent again."""
        return sum(f.size for f in self.files if f.moving)

    @property
    def mtime(self) -> float:
        return max(
            max((f.mtime for f in self.files), default=0.0),
            max((t.mtime for t in self.totals), default=0.0),
        )

    @property
    def state(self) -> str:
        states = {f.state for f in self.files} | ({DURABLE} if self.totals else set())
        if states <= {DURABLE}:
            return DURABLE
        if states == {LOCAL}:
            return LOCAL_ONLY
        return DRAINING


class Recognizer:
    def __init__(self, patterns: Sequence[str] = DEFAULT_PATTERNS) -> None:
        self._patterns = [re.compile(p + _SUFFIX) for p in patterns]

    def step(self, component: str) -> int | None:
        for p in self._patterns:
            m = p.fullmatch(component)
            if m:
                return int(m.group(1))
        return None

    def prefixes(self) -> list[str] | None:
        """What every name a pattern matches begins with, one string per pattern (a name
        that begins with none of them is no checkpoint of its own); None where a pattern
        does not begin with a literal (then any name may be one)."""
        out = []
        for p in self._patterns:
            literal = re.match(r"[A-Za-z0-9_-]*", p.pattern)
            text = literal.group() if literal else ""
            if p.pattern[len(text) : len(text) + 1] in ("?", "*", "{"):
                text = text[:-1]  # the last one is optional
            if not text or "|" in p.pattern:  # (an alternative may begin otherwise)
                return None
            out.append(text)
        return out

    def locate_directory(self, directory: str) -> tuple[str, int | None]:
        """:meth:`locate` of a file in ``directory`` whose own name is no checkpoint's."""
        parts = directory.split("/") if directory else []
        for depth in range(len(parts), 0, -1):
            step = self.step(parts[depth - 1])
            if step is not None:
                return "/".join(parts[:depth]), step
        return directory, None

    def locate(self, path: str) -> tuple[str, int | None]:
        """(checkpoint path, step) for a file, or (its directory, None) outside checkpoints."""
        parts = path.split("/")
        for depth in range(len(parts), 0, -1):
            step = self.step(parts[depth - 1])
            if step is not None:
                return "/".join(parts[:depth]), step
        return "/".join(parts[:-1]), None

    def group(
        self, files: Iterable[FileView], totals: Iterable[DirectoryTotals] = ()
    ) -> list[CheckpointView]:
        """Checkpoints, newest first (by their latest write, then by step)."""
        out: dict[str, CheckpointView] = {}

        def view(path: str, step: int | None) -> CheckpointView:
            if path not in out:
                out[path] = CheckpointView(path, step)
            return out[path]

        for f in files:
            view(*self.locate(f.path)).files.append(f)
        for t in totals:
            view(*self.locate_directory(t.path)).totals.append(t)
        return sorted(out.values(), key=lambda c: (c.mtime, c.step or 0), reverse=True)
