"""The journal's barrier (group commit) alone, on a real SQLite journal: one WAL fsync covers
every commit made before it started, a commit made while one runs gets a fsync of its own
(shared by everyone who asked meanwhile), nothing new means no fsync at all, and a failed
fsync is never retried into a false success."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from ckptgw.fsops.journal import Journal


class GatedSync:
    """Replaces the journal's WAL fsync: records what each one covers and holds it until
    the test opens the gate."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.real = journal._sync_wal
        self.covered: list[int] = []  # total_changes when each fsync started
        self.gate = threading.Event()
        self.gate.set()
        self.fail: OSError | None = None
        journal._sync_wal = self  # type: ignore[method-assign]

    def __call__(self, first: Callable[[], object] | None) -> None:
        self.covered.append(self.journal.db.total_changes)
        self.gate.wait(10)
        if self.fail is not None:
            raise self.fail
        self.real(first)


def commit(j: Journal, n: int) -> None:
    with j.transaction():
        j.set_meta(f"k{n}", str(n))


@pytest.fixture
def journal(tmp_path: Path) -> Journal:
    j = Journal(tmp_path / "journal.db")
    j.barrier_sync()
    return j


def test_a_barrier_with_nothing_new_does_no_fsync_but_runs_first(journal: Journal) -> None:
    sync = GatedSync(journal)
    ran: list[int] = []

    async def main() -> None:
        await journal.barrier()
        await journal.barrier(first=lambda: ran.append(1))
        assert not journal.unsynced()
        commit(journal, 1)
        assert journal.unsynced()
        await journal.barrier(first=lambda: ran.append(2))
        await journal.barrier()

    trio.run(main)
    assert len(sync.covered) == 1 and ran == [1, 2]


def test_lazy_commits_ask_for_no_barrier_and_ride_with_the_next(journal: Journal) -> None:
    sync = GatedSync(journal)

    async def main() -> None:
        with journal.lazily():
            commit(journal, 1)
        assert not journal.unsynced()
        await journal.barrier()
        assert sync.covered == []
        commit(journal, 2)
        with journal.lazily():  # something is pending already: it stays pending
            commit(journal, 3)
        assert journal.unsynced()
        await journal.barrier()
        assert sync.covered == [journal.db.total_changes]

    trio.run(main)


def test_commits_during_a_barrier_get_one_more_fsync_shared_by_all_who_waited(
    journal: Journal,
) -> None:
    sync = GatedSync(journal)
    done: list[str] = []

    async def barrier(name: str) -> None:
        await journal.barrier()
        done.append(name)

    async def main() -> None:
        commit(journal, 1)
        sync.gate.clear()
        async with trio.open_nursery() as n:
            n.start_soon(barrier, "a")  # its fsync covers commit 1 only
            await trio.sleep(0.05)
            commit(journal, 2)  # after a's fsync began: a's does not cover it
            n.start_soon(barrier, "b")
            n.start_soon(barrier, "c")
            await trio.sleep(0.05)
            assert done == [] and len(sync.covered) == 1
            sync.gate.set()
        assert sorted(done) == ["a", "b", "c"]

    trio.run(main)
    # Two fsyncs: a's, and one (started after commit 2) that b and c shared.
    assert len(sync.covered) == 2
    assert sync.covered[1] > sync.covered[0]
    assert not journal.unsynced()


def a_then_b(journal: Journal, sync: GatedSync, first: Callable[[], object] | None) -> list[str]:
    """Barrier a runs (held) covering commit 1; then b commits 2 and asks for a barrier,
    with ``first`` run on its behalf; the gate opens. What returned, in order, and after how
    many fsyncs."""
    order: list[str] = []

    async def a() -> None:
        await journal.barrier()
        order.append(f"a after {len(sync.covered)}")

    async def b() -> None:
        commit(journal, 2)
        await journal.barrier(first=first)
        order.append(f"b after {len(sync.covered)}")

    async def main() -> None:
        commit(journal, 1)
        sync.gate.clear()
        async with trio.open_nursery() as n:
            n.start_soon(a)
            await trio.sleep(0.05)
            n.start_soon(b)
            await trio.sleep(0.05)
            sync.gate.set()

    trio.run(main)
    return order


def test_b_does_not_return_before_the_fsync_that_covers_its_commit(journal: Journal) -> None:
    sync = GatedSync(journal)
    assert a_then_b(journal, sync, None) == ["a after 1", "b after 2"]
    assert not journal.unsynced()


def test_work_run_first_may_outlast_the_barrier_it_waits_for(journal: Journal) -> None:
    """An fsync's own cache-file sync runs while another's barrier is in flight; that
    barrier may end first (concurrent fsyncs of several writers)."""
    sync = GatedSync(journal)

    def slow_first() -> None:
        sync.gate.set()  # a's barrier ends while this still runs
        time.sleep(0.2)

    assert a_then_b(journal, sync, slow_first) == ["a after 1", "b after 2"]
    assert not journal.unsynced()


def test_a_failed_fsync_breaks_the_journal_for_good(journal: Journal) -> None:
    sync = GatedSync(journal)

    async def main() -> None:
        commit(journal, 1)
        sync.fail = OSError(5, "Input/output error")
        with pytest.raises(OSError):
            await journal.barrier()
        sync.fail = None  # the next fsync would "succeed": it must not be trusted
        with pytest.raises(OSError):
            await journal.barrier()
        commit(journal, 2)
        with pytest.raises(OSError):
            await journal.barrier()

    trio.run(main)
    assert len(sync.covered) == 1
