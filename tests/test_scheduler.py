"""The drain scheduler alone: a fake clock (trio's MockClock) and a fake worker that records
what it was asked and finishes uploads when the test says so. No filesystem, no store."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import pytest
import trio
import trio.testing

from ckptgw.drain.uploads.scheduler import (
    AUDIT_SPACING_DIRTY,
    SMALL_FILE,
    Hold,
    Ready,
    ScheduleConfig,
    Scheduler,
)
from ckptgw.store.interface import StoreError

SETTLE = 0.2


@dataclass
class FakeFile:
    key: str
    mtime_ns: int = 0
    size: int = 64 << 20  # above SMALL_FILE unless a test says otherwise
    hold: Hold | None = None  # what look() answers instead of Ready
    dirty: bool = True


@dataclass
class FakeWorker:
    files: dict[int, FakeFile] = field(default_factory=dict)
    busy: set[str] = field(default_factory=set)
    started: list[tuple[float, int]] = field(default_factory=list)  # (time, inode)
    begun: list[int] = field(default_factory=list)
    # What each upload of an inode does, in turn: "ok", "changed", a StoreError, or "wait"
    # (block until released through `release`).
    script: dict[int, list[object]] = field(default_factory=dict)
    gates: dict[int, trio.Event] = field(default_factory=dict)
    cancelled: list[int] = field(default_factory=list)
    looks: int = 0
    keys: int = 0  # keys asked for (a path walk in the journal, for the real worker)

    def look(self, inode: int) -> Ready | Hold:
        self.looks += 1
        f = self.files.get(inode)
        if f is None or not f.dirty:
            return Hold.GONE
        return f.hold if f.hold is not None else Ready(f.mtime_ns, f.size)

    def key(self, inode: int) -> str:
        self.keys += 1
        return self.files[inode].key

    def dirty(self) -> list[int]:
        return [i for i, f in self.files.items() if f.dirty]

    def busy_keys(self) -> set[str]:
        return set(self.busy)

    def begin(self, inode: int, key: str) -> None:
        self.begun.append(inode)

    async def upload(self, inode: int, key: str) -> bool:
        self.started.append((trio.current_time(), inode))
        steps = self.script.get(inode) or ["ok"]
        step = steps.pop(0) if len(steps) > 1 else steps[0]
        if step == "wait":
            gate = self.gates[inode] = trio.Event()
            try:
                await gate.wait()
            except trio.Cancelled:
                self.cancelled.append(inode)
                return False  # a real worker cleans up, then reports "changed"
            return self._clean(inode)
        if isinstance(step, StoreError):
            raise step
        if step == "changed":
            return False
        return self._clean(inode)

    def _clean(self, inode: int) -> bool:
        self.files[inode].dirty = False
        return True

    def release(self, inode: int) -> None:
        self.gates.pop(inode).set()


def run(test: Callable[[Scheduler, FakeWorker], Awaitable[None]], **cfg: object) -> None:
    """Run ``test`` with a scheduler on a fake clock that jumps when everything waits."""

    async def main() -> None:
        scheduler = Scheduler(ScheduleConfig(**{"settle": SETTLE, **cfg}))  # type: ignore[arg-type]
        worker = FakeWorker()
        async with trio.open_nursery() as nursery:
            await nursery.start(scheduler.run, worker)
            await test(scheduler, worker)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def starts(worker: FakeWorker, inode: int) -> list[float]:
    return [t for t, i in worker.started if i == inode]


def test_a_quiet_file_starts_after_the_settle_delay() -> None:
    async def test(s: Scheduler, w: FakeWorker) -> None:
        w.files[1] = FakeFile("a")
        t0 = trio.current_time()
        s.written(1)
        await trio.sleep(SETTLE / 2)
        s.written(1)  # an fsync's end restarts the delay
        await trio.sleep(10)
        assert starts(w, 1) == [pytest.approx(t0 + SETTLE / 2 + SETTLE)]
        assert w.begun == [1]
        assert 1 not in s.dirty_since  # clean: forgotten

    run(test)


def test_a_file_being_written_is_held_until_reported_again() -> None:
    async def test(s: Scheduler, w: FakeWorker) -> None:
        w.files[1] = FakeFile("a", hold=Hold.WRITING)
        s.written(1)
        await trio.sleep(10)
        assert starts(w, 1) == []
        assert s.waiting() == 0  # dropped: the last release reports it again
        w.files[1].hold = None
        s.written(1)
        await trio.sleep(10)
        assert len(starts(w, 1)) == 1

    run(test)


def test_a_file_being_fsynced_waits_without_being_dropped() -> None:
    async def test(s: Scheduler, w: FakeWorker) -> None:
        w.files[1] = FakeFile("a", hold=Hold.SYNCING)
        s.written(1)
        await trio.sleep(10)
        assert starts(w, 1) == [] and s.waiting() == 1
        w.files[1].hold = None
        s.written(1)
        await trio.sleep(10)
        assert len(starts(w, 1)) == 1

    run(test)


def test_a_write_during_the_upload_cancels_it_and_it_goes_again() -> None:
    async def test(s: Scheduler, w: FakeWorker) -> None:
        w.files[1] = FakeFile("a")
        w.script[1] = ["wait", "ok"]
        s.written(1)
        await trio.sleep(1)
        assert s.uploading() == {1: "a"}
        s.changed(1)  # the filesystem: its content is about to change
        await trio.testing.wait_all_tasks_blocked()
        assert w.cancelled == [1]
        t_cancel = trio.current_time()
        await trio.sleep(10)
        assert len(starts(w, 1)) == 2
        assert starts(w, 1)[1] == pytest.approx(t_cancel + SETTLE)
        assert not w.files[1].dirty

    run(test)


def test_a_change_reported_by_the_worker_reschedules_after_the_settle_delay() -> None:
    async def test(s: Scheduler, w: FakeWorker) -> None:
        w.files[1] = FakeFile("a")
        w.script[1] = ["changed", "ok"]
        s.written(1)
        await trio.sleep(10)
        first, second = starts(w, 1)
        assert second == pytest.approx(first + SETTLE)

    run(test)


def test_a_rename_mid_upload_does_not_cancel_it() -> None:
    async def test(s: Scheduler, w: FakeWorker) -> None:
        w.files[1] = FakeFile("old")
        w.script[1] = ["wait"]
        s.written(1)
        await trio.sleep(1)
        w.files[1].key = "new"  # renamed: the worker moves the object after completing
        await trio.sleep(1)
        w.release(1)
        await trio.sleep(10)
        assert w.cancelled == [] and len(starts(w, 1)) == 1 and not w.files[1].dirty

    run(test)


def test_a_quiet_file_renamed_starts_at_once_without_the_rest_of_its_settle_delay() -> None:
    async def test(s: Scheduler, w: FakeWorker) -> None:
        w.files[1] = FakeFile("tmp")
        s.written(1)  # the save's fsync, then its close
        await trio.sleep(SETTLE / 4)
        t_rename = trio.current_time()
        w.files[1].key = "final"
        s.renamed(1)
        await trio.sleep(10)
        assert starts(w, 1) == [pytest.approx(t_rename)]
        s.renamed(1)  # clean now: nothing to start
        s.renamed(2)  # never reported quiet (still being written): nothing either
        await trio.sleep(10)
        assert len(starts(w, 1)) == 1 and starts(w, 2) == []

    run(test)


def test_a_renamed_file_yields_to_a_burst_of_other_files_but_not_to_its_own_save() -> None:
    """With ``yield_to_saves``: a file saved and renamed on its own goes at once (its own
    fsync and close are not a burst); renamed while other files keep being finished (a
    sharded save that ends with a renamed metadata file), it waits for the burst to end."""

    async def test(s: Scheduler, w: FakeWorker) -> None:
        w.files[1] = FakeFile("one.pt")
        s.written(1)
        s.written(1)
        t_rename = trio.current_time()
        s.renamed(1)
        await trio.sleep(10)
        assert starts(w, 1) == [pytest.approx(t_rename)]

        for i in (2, 3, 4):
            w.files[i] = FakeFile(f"shard{i}")
            s.written(i)
            t_shard = trio.current_time()
            await trio.sleep(SETTLE / 4)
        w.files[5] = FakeFile(".metadata")
        s.written(5)
        s.renamed(5)
        await trio.sleep(10)
        assert starts(w, 5) == [pytest.approx(t_shard + SETTLE)]  # the others' burst ended

    run(test, yield_to_saves=30.0)


def test_shards_each_renamed_into_place_are_still_a_burst() -> None:
    """Each shard saved as temp + fsync + close + rename, one after another: from the second
    on, each waits for the burst to end (the previous shard's report is another file's)."""

    async def test(s: Scheduler, w: FakeWorker) -> None:
        for i in range(1, 6):
            w.files[i] = FakeFile(f"shard{i}")
            s.written(i)
            s.written(i)
            s.renamed(i)
            t_last = trio.current_time()
            await trio.sleep(SETTLE / 4)
        await trio.sleep(10)
        assert starts(w, 1) == [pytest.approx(0.0, abs=0.01)]  # alone when it was renamed
        for i in range(2, 6):
            assert starts(w, i) == [pytest.approx(t_last - SETTLE / 4 + SETTLE)], i
        assert s.yielded > 0

    run(test, yield_to_saves=30.0)


def test_a_file_renamed_while_still_open_goes_once_it_is_quiet() -> None:
    """The RENAME may come before the RELEASE of the close before it (FUSE sends RELEASE in
    the background): the file goes as soon as it is reported quiet, not a settle later; a
    change after the rename (unlink, or dirty again) takes that back."""

    async def test(s: Scheduler, w: FakeWorker) -> None:
        w.files[1] = FakeFile("final.pt")
        w.files[2] = FakeFile("other.pt")
        s.renamed(1)
        s.renamed(2)
        s.changed(2)
        await trio.sleep(1)
        t_quiet = trio.current_time()
        s.written(1)
        s.written(2)
        await trio.sleep(10)
        assert starts(w, 1) == [pytest.approx(t_quiet)]
        assert starts(w, 2) == [pytest.approx(t_quiet + SETTLE)]

    run(test)


def test_a_rename_does_not_cut_a_retry_delay_short_nor_restart_an_upload() -> None:
    async def test(s: Scheduler, w: FakeWorker) -> None:
        w.files[1] = FakeFile("a")
        w.script[1] = [StoreError("503", temporary=True), "ok"]
        w.files[2] = FakeFile("b")
        w.script[2] = ["wait"]
        s.written(1)
        s.written(2)
        await trio.sleep(1)
        assert len(starts(w, 1)) == 1 and s.uploading() == {2: "b"}
        s.renamed(1)  # failed: waits for its retry
        s.written(2)  # reported quiet during its upload (due again after it)...
        s.renamed(2)  # ...and renamed: the upload goes on, not a second one beside it
        await trio.sleep(1)
        assert len(starts(w, 1)) == 1 and len(starts(w, 2)) == 1
        w.release(2)
        await trio.sleep(600)
        assert len(starts(w, 1)) == 2 and len(starts(w, 2)) == 1

    run(test)


def test_one_upload_per_key_and_none_for_a_key_a_store_operation_holds() -> None:
    async def test(s: Scheduler, w: FakeWorker) -> None:
        w.files[1] = FakeFile("k")
        w.files[2] = FakeFile("k")  # e.g. replaced by a rename while 1 uploads
        w.files[3] = FakeFile("busy")
        w.busy.add("busy")
        w.script[1] = ["wait"]
        for i in (1, 2, 3):
            s.written(i)
        await trio.sleep(5)
        assert [i for _, i in w.started] == [1]
        w.release(1)
        await trio.sleep(5)
        assert [i for _, i in w.started] == [1, 2]
        w.busy.clear()
        s.wake()  # the store operation is done
        await trio.sleep(5)
        assert [i for _, i in w.started] == [1, 2, 3]

    run(test)


def test_at_most_max_files_at_once() -> None:
    async def test(s: Scheduler, w: FakeWorker) -> None:
        for i in range(1, 7):
            w.files[i] = FakeFile(f"k{i}")
            w.script[i] = ["wait"]
            s.written(i)
        await trio.sleep(5)
        assert len(s.uploading()) == 2
        w.release(next(iter(s.uploading())))
        await trio.sleep(1)
        assert len(s.uploading()) == 2 and len(w.started) == 3

    run(test, max_files=2)


def test_small_files_have_a_lane_of_their_own() -> None:
    """A burst of small files (a sharded save) goes many at once, beside the big files."""

    async def test(s: Scheduler, w: FakeWorker) -> None:
        for i in range(1, 4):
            w.files[i] = FakeFile(f"big{i}")
            w.script[i] = ["wait"]
            s.written(i)
        for i in range(10, 30):
            w.files[i] = FakeFile(f"small{i}", size=SMALL_FILE if i % 2 else 1)
            w.script[i] = ["wait"]
            s.written(i)
        await trio.sleep(1)
        running = set(s.uploading())
        assert len(running & {1, 2, 3}) == 2  # max_files
        assert len(running - {1, 2, 3}) == 5  # max_small_files
        small = next(i for i in running if i >= 10)
        w.release(small)
        await trio.sleep(0.1)
        assert len(set(s.uploading()) - {1, 2, 3}) == 5 and len(w.started) == 8

    run(test, max_files=2, max_small_files=5)


def test_a_full_lane_does_not_make_every_due_file_looked_at_again() -> None:
    """Hundreds of small files due, their lane full: each end of an upload looks at a
    bounded number of them, not at all of them (which made a 2,000-file drain quadratic),
    and asks for the key of the one it starts only."""

    async def test(s: Scheduler, w: FakeWorker) -> None:
        for i in range(1, 301):
            w.files[i] = FakeFile(f"k{i}", size=1)
            w.script[i] = ["wait"]
            s.written(i)
        await trio.sleep(1)
        assert len(s.uploading()) == 4
        before, keys = w.looks, w.keys
        for _ in range(20):
            w.release(min(s.uploading()))
            await trio.sleep(0.01)
        assert len(w.started) == 24
        assert w.looks - before <= 20 * 35, w.looks - before  # not 20 x 296
        # The looks are cheap; only a file that starts has its key worked out (a path walk
        # in the journal, which was 6% of the daemon's CPU in a drain of 513 files).
        assert w.keys - keys == 20, w.keys - keys

    run(test, max_files=2, max_small_files=4)


def test_due_files_wait_for_a_save_in_progress_but_not_forever() -> None:
    """Files finished one after another less than ``settle`` apart: nothing starts until
    the burst ends, or until the first file has waited ``yield_to_saves``."""

    async def test(s: Scheduler, w: FakeWorker) -> None:
        t0 = trio.current_time()
        for i in range(1, 21):  # a save finishing a file every 0.1 s for 2 s
            w.files[i] = FakeFile(f"k{i}", size=1)
            s.written(i)
            await trio.sleep(0.1)
        await trio.sleep(SETTLE + 0.05)
        assert w.started and min(t for t, _ in w.started) >= t0 + 2.0  # after the burst
        assert len(w.started) == 20 and s.yielded > 0

        w.started.clear()
        t1 = trio.current_time()
        for i in range(100, 160):  # a burst longer than yield_to_saves (6 s)
            w.files[i] = FakeFile(f"k{i}", size=1)
            s.written(i)
            await trio.sleep(0.1)
        first = min(t for t, _ in w.started)
        assert t1 + SETTLE + 3.0 <= first <= t1 + SETTLE + 3.0 + 0.1  # the oldest waited 3 s

    run(test, yield_to_saves=3.0)


def test_without_yield_files_go_while_the_save_runs() -> None:
    async def test(s: Scheduler, w: FakeWorker) -> None:
        t0 = trio.current_time()
        for i in range(1, 21):
            w.files[i] = FakeFile(f"k{i}", size=1)
            s.written(i)
            await trio.sleep(0.1)
        assert min(t for t, _ in w.started) <= t0 + SETTLE + 0.01
        assert s.yielded == 0

    run(test)


def test_temporary_failures_back_off_and_permanent_ones_wait_and_log_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    temporary = StoreError("503 SlowDown", temporary=True)
    permanent = StoreError("403 AccessDenied", temporary=False)

    async def test(s: Scheduler, w: FakeWorker) -> None:
        w.files[1] = FakeFile("t")
        w.script[1] = [temporary, temporary, "ok"]
        w.files[2] = FakeFile("p")
        w.script[2] = [permanent, permanent, permanent, "ok"]
        s.written(1)
        s.written(2)
        await trio.sleep(1000)
        t = starts(w, 1)
        assert len(t) == 3
        assert t[1] - t[0] == pytest.approx(4.0) and t[2] - t[1] == pytest.approx(8.0)
        p = starts(w, 2)
        assert len(p) == 4
        assert [b - a for a, b in itertools.pairwise(p)] == [pytest.approx(60.0)] * 3
        assert not w.files[1].dirty and not w.files[2].dirty
        assert s.errors == {}  # cleared once clean

    with caplog.at_level(logging.WARNING, logger="ckptgw.drain.uploads.scheduler"):
        run(test)
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "403 AccessDenied" in errors[0].getMessage()


def test_a_flush_retries_a_failed_file_at_once_without_logging_it_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    permanent = StoreError("NoSuchBucket", temporary=False)

    async def test(s: Scheduler, w: FakeWorker) -> None:
        w.files[1] = FakeFile("p")
        w.script[1] = [permanent, permanent, "ok"]
        s.written(1)
        await trio.sleep(1)
        assert len(starts(w, 1)) == 1 and "NoSuchBucket" in s.errors[1]
        t_flush = trio.current_time()
        s.flush([1])
        await trio.sleep(0.01)
        assert starts(w, 1)[1] == pytest.approx(t_flush)  # not 60 s later
        await trio.sleep(100)
        assert len(starts(w, 1)) == 3

    with caplog.at_level(logging.WARNING, logger="ckptgw.drain.uploads.scheduler"):
        run(test)
    assert len([r for r in caplog.records if r.levelno == logging.ERROR]) == 1


def test_a_flush_goes_before_files_that_were_due_earlier() -> None:
    async def test(s: Scheduler, w: FakeWorker) -> None:
        for i in (1, 2, 3):
            w.files[i] = FakeFile(f"k{i}")
            s.written(i)
            await trio.sleep(0.01)
        await trio.sleep(0)
        s.flush([3])
        await trio.sleep(10)
        assert [i for _, i in w.started][:1] == [3]

    run(test, max_files=1)


def test_a_flush_of_everything_asks_the_worker_what_is_dirty() -> None:
    async def test(s: Scheduler, w: FakeWorker) -> None:
        w.files[7] = FakeFile("left-from-before")  # never reported since this start
        s.flush()
        await trio.sleep(0.01)
        assert [i for _, i in w.started] == [7]

    run(test)


def test_a_flush_of_named_files_queues_those_the_scheduler_holds_nothing_for() -> None:
    """``flush PATH`` / ``wait PATH`` name files from the journal: one whose report never
    reached the scheduler goes now as well."""

    async def test(s: Scheduler, w: FakeWorker) -> None:
        w.files[7] = FakeFile("never-reported")
        s.flush([7])
        await trio.sleep(0.01)
        assert [i for _, i in w.started] == [7]

    run(test)


def test_a_flush_while_a_rewrite_waits_for_its_upload_to_end_starts_it_right_after() -> None:
    """Issue 47: the file is rewritten during its upload (cancelled; the clean-up is slow,
    as an abort after a held create is) and reported quiet again; a flush then must leave
    its next round queued, first, so it starts as soon as the upload ends."""

    async def test(s: Scheduler, w: FakeWorker) -> None:
        w.files[1] = FakeFile("latest.pt")
        w.script[1] = ["wait", "ok"]
        s.written(1)
        await trio.sleep(SETTLE + 0.01)
        assert s.uploading() == {1: "latest.pt"}
        s.changed(1)  # rewritten: the upload is cancelled, and its clean-up takes a while
        s.written(1)  # the rewrite's writer closed
        s.flush([1])
        await trio.sleep(5)
        assert len(starts(w, 1)) == 2 and not w.files[1].dirty

    run(test)


@pytest.mark.parametrize("size", [1, 64 << 20])
def test_the_emergency_drain_goes_newest_first_at_full_concurrency(
    caplog: pytest.LogCaptureFixture, size: int
) -> None:
    """Small files too: in an emergency there is one lane, so the order holds."""

    async def test(s: Scheduler, w: FakeWorker) -> None:
        for i in range(1, 7):
            w.files[i] = FakeFile(f"k{i}", mtime_ns=i * 1000, size=size)
            w.script[i] = ["wait"]
        s.start_emergency("SIGTERM")
        await trio.sleep(0.01)
        assert sorted(s.uploading()) == [3, 4, 5, 6]  # the four newest, no settle delay
        assert w.begun == [6, 5, 4, 3]  # taken in this order
        w.files[9] = FakeFile("k9", mtime_ns=1)
        s.written(9)  # written during the emergency: no settle delay either
        for i in list(s.uploading()):
            w.release(i)
        await trio.sleep(0.01)
        assert {2, 1, 9} <= set(s.uploading()) | {i for _, i in w.started}

    with caplog.at_level(logging.WARNING, logger="ckptgw.drain.uploads.scheduler"):
        run(test, max_files=1, emergency_files=4)
    assert "emergency drain (SIGTERM)" in caplog.text


def test_a_file_written_during_the_emergency_starts_at_once_whatever_the_settle() -> None:
    async def test(s: Scheduler, w: FakeWorker) -> None:
        s.start_emergency("preemption")
        await trio.sleep(1)
        t0 = trio.current_time()
        w.files[1] = FakeFile("last.pt", size=5)
        s.written(1)
        await trio.sleep(0.02)
        assert starts(w, 1) and starts(w, 1)[0] - t0 < 0.02

    run(test, settle=600.0)


def test_key_free_waits_for_the_upload_of_that_key() -> None:
    async def test(s: Scheduler, w: FakeWorker) -> None:
        w.files[1] = FakeFile("k")
        w.script[1] = ["wait"]
        s.written(1)
        await trio.sleep(1)
        freed_at: list[float] = []

        async def waiter() -> None:
            await s.key_free("k")
            freed_at.append(trio.current_time())

        async with trio.open_nursery() as n:
            n.start_soon(waiter)
            await trio.sleep(5)
            assert freed_at == []
            t = trio.current_time()
            w.release(1)
        assert freed_at == [pytest.approx(t)]

    run(test)


def test_an_unexpected_error_is_logged_and_the_file_retried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Boom(FakeWorker):
        calls = 0

        async def upload(self, inode: int, key: str) -> bool:
            self.calls += 1
            if self.calls == 1:
                raise RuntimeError("a bug")
            return await super().upload(inode, key)

    async def main() -> None:
        s = Scheduler(ScheduleConfig(settle=SETTLE))
        w = Boom()
        w.files[1] = FakeFile("k")
        async with trio.open_nursery() as nursery:
            await nursery.start(s.run, w)
            s.written(1)
            await trio.sleep(100)
            assert w.calls == 2 and not w.files[1].dirty
            nursery.cancel_scope.cancel()

    with caplog.at_level(logging.ERROR, logger="ckptgw.drain.uploads.scheduler"):
        trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert "failed unexpectedly" in caplog.text


# -- the audit: no lost wake-up -------------------------------------------------------------------


@pytest.mark.bug_expected
def test_a_dirty_quiet_file_that_was_never_reported_is_found_and_queued(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A file whose report was lost (a bug elsewhere) is found by the audit at idle moments:
    once as a suspect, then, still unqueued a second later, logged as a bug and started."""

    async def test(s: Scheduler, w: FakeWorker) -> None:
        w.files[1] = FakeFile("lost")  # dirty and quiet, but nobody called written()
        w.files[2] = FakeFile("open", hold=Hold.WRITING)  # its release will report it
        await trio.sleep(120)
        assert [i for _, i in w.started] == [1]
        # Found at the idle loop's next wake-up (at most a minute), then confirmed a second
        # later: not left for ever.
        assert starts(w, 1)[0] <= 62.0
        assert s.lost_wakeups == 1 and not w.files[1].dirty

    with caplog.at_level(logging.ERROR, logger="ckptgw.drain.uploads.scheduler"):
        run(test)
    assert "bug: lost is dirty and quiet but was not queued" in caplog.text


@pytest.mark.bug_expected
def test_a_lost_report_after_a_quiet_hour_is_found_within_seconds() -> None:
    """Audits that find nothing space out (up to a minute while nothing is dirty); a file
    that changes then, and whose quiet report is lost, is still found within seconds: a
    change brings the next audit within AUDIT_SPACING_DIRTY, and a second one confirms it
    AUDIT_SPACING later."""

    async def test(s: Scheduler, w: FakeWorker) -> None:
        await trio.sleep(3600)
        w.files[1] = FakeFile("lost")
        t = trio.current_time()
        s.changed(1)  # its content changed (mark_dirty); the release's report never comes
        await trio.sleep(60)
        assert starts(w, 1) and starts(w, 1)[0] - t <= AUDIT_SPACING_DIRTY + 1.5
        assert s.lost_wakeups == 1

    run(test)


def test_a_file_reported_between_two_audits_is_no_lost_wakeup() -> None:
    """The first audit may see a file a moment before its report comes (an open that made
    it is still under way): only one unqueued at two audits in a row counts."""

    async def test(s: Scheduler, w: FakeWorker) -> None:
        await trio.sleep(2.5)  # past the start's own audit
        w.files[1] = FakeFile("late")
        while not s._suspects:  # the next audit sees it unqueued (within seconds)
            await trio.sleep(0.1)
        assert s._suspects == {1} and trio.current_time() < 2.5 + AUDIT_SPACING_DIRTY
        s.written(1)
        await trio.sleep(5)
        assert starts(w, 1) and s.lost_wakeups == 0

    run(test)
