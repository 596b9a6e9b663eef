"""The scheduler against a model of the files it drains, over generated interleavings.

A model worker keeps, per file, what the engine and the filesystem keep (named, state,
generation, writers, fsyncs running) and reports to the scheduler exactly what the
filesystem reports (``written`` at a writer's last release, an fsync's end or a truncate;
``changed`` when content changes or the name goes; ``renamed``). Its uploads wait until the
sequence says how they end: complete, fail (temporary or permanent), or, once cancelled by a
change, finish their shielded clean-up (the abort of a held CreateMultipartUpload) when the
sequence says so. The sequences are seeded random walks, each step drawn from those that
apply at that moment (the same walks every run); the clock is trio's MockClock, moved by the
sequence.

Checked after every step: a file that is dirty and quiet (named, no writer, no fsync) is
uploading or has a current entry in the scheduler's queue. At the end, with every writer gone
and the store answering, every named file is clean, and the audit found no lost wake-up (the
invariant, not the audit, is what keeps files moving).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import trio
import trio.testing

from ckptgw.drain.uploads.scheduler import Hold, Ready, ScheduleConfig, Scheduler
from ckptgw.store.interface import StoreError

FILES = 3  # named files at once
INODES = 8  # files made in one walk (inode numbers are not reused)
STEPS = [0.05, 0.25, 3.0, 70.0]  # clock moves: inside a settle delay, past it, retries


@dataclass
class File:
    key: str
    named: bool = True
    state: str = "dirty"  # dirty | uploading | clean (the journal's state)
    generation: int = 1
    writers: int = 1  # a create opens it
    syncing: int = 0


@dataclass
class Upload:
    generation: int
    answer: trio.Event = field(default_factory=trio.Event)
    outcome: str = "ok"  # ok | temporary | permanent
    cancelled: bool = False
    cleaned: trio.Event = field(default_factory=trio.Event)  # the abort after a cancel


class ModelWorker:
    """The engine's side of the contract (:class:`drain.uploads.scheduler.Worker`), over the
    model."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.s = scheduler
        self.files: dict[int, File] = {}
        self.busy: set[str] = set()
        self.uploads: dict[int, Upload] = {}
        self.closing = False  # the walk is over: a cancelled upload cleans up at once
        self._keys = itertools.count()

    # -- Worker ---------------------------------------------------------------------------

    def look(self, inode: int) -> Ready | Hold:
        f = self.files.get(inode)
        if f is None or not f.named or f.state != "dirty":
            return Hold.GONE
        if f.writers:
            return Hold.WRITING
        if f.syncing:
            return Hold.SYNCING
        return Ready(f.generation, 64 << 20)

    def key(self, inode: int) -> str:
        return self.files[inode].key

    def dirty(self) -> list[int]:
        return [i for i, f in self.files.items() if f.named and f.state != "clean"]

    def busy_keys(self) -> set[str]:
        return set(self.busy)

    def begin(self, inode: int, key: str) -> None:
        f = self.files[inode]
        assert f.state == "dirty" and f.writers == 0 and inode not in self.uploads
        f.state = "uploading"
        self.uploads[inode] = Upload(f.generation)

    async def upload(self, inode: int, key: str) -> bool:
        f, up = self.files[inode], self.uploads[inode]
        try:
            try:
                await up.answer.wait()
            except trio.Cancelled:
                up.cancelled = True
                if not self.closing:
                    with trio.CancelScope(shield=True):
                        await up.cleaned.wait()  # the engine's clean-up after a stale upload
                raise
            if up.outcome != "ok":
                raise StoreError("refused", temporary=up.outcome == "temporary")
            if f.named and f.state == "uploading" and f.generation == up.generation:
                f.state = "clean"
                return True
            return False
        finally:
            if f.state == "uploading":  # abandon_upload: dirty again, same generation
                f.state = "dirty"
            del self.uploads[inode]

    # -- what the filesystem does ---------------------------------------------------------

    def mark_dirty(self, f: File, inode: int) -> None:
        if f.state != "dirty":
            f.state, f.generation = "dirty", f.generation + 1
            self.s.changed(inode)

    def quiet(self, f: File, inode: int) -> None:
        if f.named and f.state == "dirty":
            self.s.written(inode)

    def new_key(self) -> str:
        return f"k{next(self._keys)}"


def _act(w: ModelWorker, s: Scheduler, action: str, i: int, j: int) -> Callable[[], None] | None:
    """The step ``action`` on file ``i`` (``j``: a second file, for a rename over it), as a
    call, or None where it does not apply in this state."""
    f = w.files.get(i)
    named = f is not None and f.named
    up = w.uploads.get(i)

    def create() -> None:
        w.files[i] = File(w.new_key())

    def create_saved() -> None:  # created, written and closed: a whole save in one step
        create()
        w.files[i].writers = 0
        w.quiet(w.files[i], i)

    def save() -> None:  # opened with O_TRUNC, written, closed: a whole save in one step
        open_write(True)()
        release()

    def open_write(trunc: bool) -> Callable[[], None]:
        def go() -> None:
            assert f is not None
            f.writers += 1
            if trunc:  # O_TRUNC, or any open for writing on the kernel's path
                w.mark_dirty(f, i)

        return go

    def write() -> None:
        assert f is not None
        w.mark_dirty(f, i)

    def release() -> None:
        assert f is not None
        f.writers -= 1
        if f.writers == 0:
            w.quiet(f, i)

    def fsync_begin() -> None:
        assert f is not None
        f.syncing += 1

    def fsync_end() -> None:
        assert f is not None
        f.syncing -= 1
        if f.writers == 0:
            w.quiet(f, i)

    def truncate() -> None:
        assert f is not None
        w.mark_dirty(f, i)
        if f.writers == 0:
            w.quiet(f, i)

    def rename() -> None:  # to a new name, or over file j (which goes)
        assert f is not None
        g = w.files.get(j)
        if j != i and g is not None and g.named:
            g.named = False
            s.changed(j)
            f.key = g.key
        else:
            f.key = w.new_key()
        if f.state == "dirty":
            s.renamed(i)

    def unlink() -> None:
        assert f is not None
        f.named = False
        s.changed(i)

    def answer(outcome: str) -> Callable[[], None]:
        def go() -> None:
            assert up is not None
            up.outcome = outcome
            up.answer.set()

        return go

    def cleaned() -> None:
        assert up is not None
        up.cleaned.set()

    def busy() -> None:
        assert f is not None
        if f.key in w.busy:
            w.busy.discard(f.key)
            s.wake()  # the store operation on it is done
        else:
            w.busy.add(f.key)

    table: dict[str, tuple[bool, Callable[[], None]]] = {
        "create": (f is None and i == len(w.files) + 1, create),
        "create_saved": (f is None and i == len(w.files) + 1, create_saved),
        "save": (named, save),
        "open": (named, open_write(False)),
        "open_trunc": (named, open_write(True)),
        "write": (named and f is not None and f.writers > 0, write),
        "release": (f is not None and f.writers > 0, release),
        "fsync": (named, fsync_begin),
        "fsync_end": (f is not None and f.syncing > 0, fsync_end),
        "truncate": (named, truncate),
        "rename": (named, rename),
        "unlink": (named, unlink),
        "ok": (up is not None and not up.answer.is_set(), answer("ok")),
        "temporary": (up is not None and not up.answer.is_set(), answer("temporary")),
        "permanent": (up is not None and not up.answer.is_set(), answer("permanent")),
        "abort_returns": (up is not None and up.cancelled, cleaned),
        "busy": (f is not None, busy),
        "flush": (True, lambda: s.flush([i])),
        "flush_all": (True, lambda: s.flush()),
        "emergency": (True, lambda: s.start_emergency("test")),
    }
    applies, call = table[action]
    return call if applies else None


ACTIONS = [
    "save",
    "open",
    "open_trunc",
    "write",
    "release",
    "fsync",
    "fsync_end",
    "truncate",
    "rename",
    "unlink",
    "ok",
    "temporary",
    "permanent",
    "abort_returns",
    "busy",
    "flush",
    "flush_all",
    "emergency",
]
Step = tuple[str, int, int, float]  # (action, file, second file, seconds for "tick")


def _choices(w: ModelWorker, s: Scheduler) -> list[Step]:
    """Every step that applies now: each action on each file it applies to (a create makes
    the next inode, while fewer than FILES are named), and the ticks."""
    out: list[Step] = [("tick", 0, 0, dt) for dt in STEPS]
    made = list(w.files)
    if sum(f.named for f in w.files.values()) < FILES and len(made) < INODES:
        out += [("create", len(made) + 1, 0, 0.0), ("create_saved", len(made) + 1, 0, 0.0)]
    for action in ACTIONS:
        for i in made:
            for j in made if action == "rename" else (i,):
                if _act(w, s, action, i, j) is not None:
                    out.append((action, i, j, 0.0))
    return out


def _unqueued_quiet(w: ModelWorker, s: Scheduler) -> list[int]:
    quiet = [
        i
        for i, f in w.files.items()
        if f.named and f.state == "dirty" and f.writers == 0 and f.syncing == 0
    ]
    queued = {
        e[3] for e in s._queue if s._due.get(e[3]) == e[1] and (e[3] not in s._urgent) == e[0]
    }
    return [i for i in quiet if i not in s._running and i not in queued]


async def _settle(clock: trio.testing.MockClock, seconds: float = 0.0) -> None:
    """Move the clock by ``seconds`` in a few jumps, letting every task run after each."""
    await trio.testing.wait_all_tasks_blocked()
    jumps = 1 if seconds < 1 else 10
    for _ in range(jumps if seconds else 0):
        clock.jump(seconds / jumps)
        await trio.testing.wait_all_tasks_blocked()


def check(choose: Callable[[list[Step]], Step | None]) -> None:
    """Run the steps ``choose`` picks, one at a time, from those that apply (None: done)."""
    clock = trio.testing.MockClock()

    async def main() -> None:
        s = Scheduler(ScheduleConfig(settle=0.2, max_files=2, max_small_files=0))
        w = ModelWorker(s)
        async with trio.open_nursery() as nursery:
            await nursery.start(s.run, w)
            try:
                done: list[Step] = []
                while (step := choose(_choices(w, s))) is not None:
                    action, i, j, dt = step
                    if action == "tick":
                        await _settle(clock, dt)
                    else:
                        call = _act(w, s, action, i, j)
                        assert call is not None, step
                        call()
                        await _settle(clock)
                    done.append(step)
                    lost = _unqueued_quiet(w, s)
                    assert not lost, f"dirty and quiet but not queued: {lost} after {done}"
                # The end: every writer and fsync gone, the store answers, time passes.
                for i, f in w.files.items():
                    while f.syncing:
                        _act(w, s, "fsync_end", i, i)()  # type: ignore[misc]
                    while f.writers:
                        _act(w, s, "release", i, i)()  # type: ignore[misc]
                w.busy.clear()
                s.wake()
                for _ in range(60):
                    for up in list(w.uploads.values()):
                        up.outcome = "ok"
                        up.answer.set()
                        up.cleaned.set()
                    await _settle(clock, 30.0)
                    assert not _unqueued_quiet(w, s), done
                stuck = {i: f.state for i, f in w.files.items() if f.named and f.state != "clean"}
                assert not stuck, f"not drained at the end: {stuck} after {done}"
                assert s.lost_wakeups == 0
            finally:  # also when a check failed: nothing may wait for a step not taken
                w.closing = True
                for up in w.uploads.values():
                    up.cleaned.set()
                nursery.cancel_scope.cancel()

    trio.run(main, clock=clock)


def replay(steps: list[Step]) -> Callable[[list[Step]], Step | None]:
    it = iter(steps)

    def choose(choices: list[Step]) -> Step | None:
        step = next(it, None)
        assert step is None or step in choices, f"{step} does not apply now"
        return step

    return choose


WALKS = 400
WALK_STEPS = 60
KINDS = {  # a walk draws a kind of step first, then a step of that kind
    "filesystem": {"create", "create_saved", "save", "open", "open_trunc", "write", "release"}
    | {"fsync", "fsync_end", "truncate", "rename", "unlink"},
    "store": {"ok", "temporary", "permanent", "abort_returns"},
    "operator": {"flush", "flush_all", "emergency", "busy"},  # busy: a store operation
    "clock": {"tick"},
}


def walk(seed: int) -> Callable[[list[Step]], Step | None]:
    """A random walk of WALK_STEPS steps: each a kind drawn evenly from those with a step
    that applies now, then one of its steps. Every fourth walk has an emergency drain on its
    way (it lasts to the end: in the others it would swamp what comes after it)."""
    rng = random.Random(seed)
    left = WALK_STEPS
    emergency = seed % 4 == 0

    def choose(choices: list[Step]) -> Step | None:
        nonlocal left
        left -= 1
        if left < 0:
            return None
        kinds = [
            [c for c in choices if c[0] in names and (emergency or c[0] != "emergency")]
            for names in KINDS.values()
        ]
        return rng.choice(rng.choice([k for k in kinds if k]))

    return choose


@pytest.mark.parametrize("first", range(0, WALKS, WALKS // 4))
def test_no_interleaving_leaves_a_dirty_quiet_file_unqueued(first: int) -> None:
    """Seeded random walks over the steps that apply at each moment: every run walks the
    same ones, and a failure names its seed and its steps."""
    for seed in range(first, first + WALKS // 4):
        try:
            check(walk(seed))
        except AssertionError as e:
            raise AssertionError(f"walk {seed}: {e}") from None


def test_the_issue_47_interleaving() -> None:
    """The sequence of issue 47, written out: the drain takes the file, the create is held;
    the file is rewritten and closed; a flush comes while the upload is being cancelled; the
    abort returns."""
    check(
        replay(
            [
                ("create", 1, 0, 0.0),
                ("release", 1, 1, 0.0),
                ("tick", 0, 0, 0.25),  # settled: the upload starts
                ("open_trunc", 1, 1, 0.0),  # cancels it; its create is still held
                ("fsync", 1, 1, 0.0),
                ("fsync_end", 1, 1, 0.0),
                ("release", 1, 1, 0.0),  # reported quiet while the upload still runs
                ("tick", 0, 0, 0.25),
                ("flush", 1, 1, 0.0),  # ckptgw flush --wait
                ("abort_returns", 1, 1, 0.0),
                ("tick", 0, 0, 0.05),
            ]
        )
    )
