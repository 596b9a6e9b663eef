"""Group commit: the barrier that makes every commit so far durable by one fsync of the WAL
(see the package's durability model)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import trio

from ckptgw.fsops.journal.connection import Connection


class _FirstFailed(OSError):
    """What a barrier ran first failed, not the journal's own fsync."""


class Barrier(Connection):
    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self._durable = -1  # total_changes that the last WAL fsync covered
        self._syncing: trio.Event | None = None  # the WAL fsync running now
        self._broken: OSError | None = None  # a WAL fsync failed
        self.barriers = 0  # WAL fsyncs done

    @contextlib.contextmanager
    def lazily(self) -> Iterator[None]:
        """Commits whose loss in a crash is harmless (an open's atime): they ask for no
        barrier of their own, and the next barrier makes them durable with the rest."""
        synced = self._durable >= self.db.total_changes
        yield
        if synced and not self.db.in_transaction:
            self._durable = self.db.total_changes

    def unsynced(self) -> bool:
        """Whether a commit was made since the last barrier began."""
        return self.db.total_changes > self._durable

    async def barrier(self, first: Callable[[], object] | None = None) -> None:
        """Return once every commit so far is on stable storage; with ``first``, call it on
        the same worker thread just before (an fsync of a cache file: one trip for both).

        Group commit: one fsync of the WAL covers every commit made before it started, so
        a barrier asked for while one runs waits for it (and, if its own commits came
        later, for the next, which covers everything asked meanwhile); a barrier with no
        commit since the last one does nothing but ``first``. Commits are counted by the
        rows they changed (``total_changes``). A failed fsync of the WAL leaves the journal
        broken: every barrier after it fails too, as the kernel may have dropped the pages
        it could not write (retrying would report them durable)."""
        want = self.db.total_changes
        while True:
            if self._broken is not None:
                raise self._broken
            if self._durable >= want:
                if first is not None:
                    await trio.to_thread.run_sync(first)
                return
            if self._syncing is not None:
                running = self._syncing
                if first is not None:  # its own work now, while the other sync runs
                    await trio.to_thread.run_sync(first)
                    first = None
                await running.wait()  # (set already if it ended meanwhile)
                continue
            covers = self._covers()
            self._syncing = done = trio.Event()
            try:
                await trio.to_thread.run_sync(self._sync_wal, first)
            except OSError as e:
                if not isinstance(e, _FirstFailed):
                    self._broken = e
                raise
            finally:
                self._syncing = None
                done.set()
            self._wal_synced(covers)
            return

    def _sync_wal(self, first: Callable[[], object] | None) -> None:
        if first is not None:
            try:
                first()
            except OSError as e:
                raise _FirstFailed(e.errno, e.strerror) from e
        os.fsync(self._wal_fd)

    def barrier_sync(self, first: Callable[[], object] | None = None) -> None:
        """What :meth:`barrier` promises, on the calling thread: ``first`` (its error is its
        own), then the WAL's fsync unless nothing was committed since the last one. For a
        caller that must not wait for a worker thread (startup, shutdown, a small file's
        fsync with nothing else to do: see :meth:`fsops.files.OpenFiles.barrier`); not while
        a barrier runs on a worker thread (:meth:`idle`)."""
        self.check()
        if first is not None:
            first()
        if self._durable >= self.db.total_changes:
            return
        covers = self._covers()
        try:
            os.fsync(self._wal_fd)
        except OSError as e:
            self._broken = e
            raise
        self._wal_synced(covers)

    def _covers(self) -> int:
        """What a WAL fsync starting now covers: every commit so far (``total_changes``), or
        -1 inside an open transaction (its commit comes later; the caller's are in)."""
        return -1 if self.db.in_transaction else self.db.total_changes

    def _wal_synced(self, covers: int) -> None:
        self.barriers += 1
        self._durable = max(self._durable, covers)

    def check(self) -> None:
        """Raise the error of a failed WAL fsync, if one failed: the journal is broken."""
        if self._broken is not None:
            raise self._broken

    def idle(self) -> bool:
        """Whether no barrier is running on a worker thread now."""
        return self._syncing is None
