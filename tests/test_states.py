"""The per-file state machine (fsops/state.py): every transition from every state, the one
place that writes state columns, and ARCHITECTURE.md's diagram against the module."""

from __future__ import annotations

import ast
import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
import trio.testing

from ckptgw.fsops.filesystem import Filesystem, FsOptions
from ckptgw.fsops.inodes import Inode
from ckptgw.fsops.journal.rows import ROOT_INODE, InodeRow, State
from ckptgw.fsops.namespace import AttrChange, needs_no_marker
from ckptgw.fsops.signal import Signal
from ckptgw.fsops.state import TRANSITIONS, StateError, mermaid, table
from tests.test_ops import ME, Caller

ROOT = Path(__file__).resolve().parents[1]


class Events:
    def __init__(self) -> None:
        self.log: list[tuple[str, int]] = []

    def written(self, inode: int) -> None:
        self.log.append(("written", inode))

    def changed(self, inode: int) -> None:
        self.log.append(("changed", inode))

    def store_ops_added(self) -> None:
        self.log.append(("ops", 0))

    def renamed(self, inode: int) -> None:
        self.log.append(("renamed", inode))


@pytest.fixture
def fs(tmp_path: Path) -> Iterator[Filesystem]:
    f = Filesystem(tmp_path, FsOptions(store_url="file:///x", reserve_bytes=0), Events())
    yield f
    f.close()


def new_file(fs: Filesystem, state: State) -> Inode:
    """A file put in ``state`` through the transitions that lead there."""
    ino = fs.namespace.create_file(ROOT_INODE, os.urandom(4).hex().encode(), 0o644, ME)
    if state is State.DIRTY:
        return ino
    fs.states.begin_upload(ino)
    if state is State.UPLOADING:
        return ino
    assert fs.states.finish_upload(ino, ino.generation, ino.size, "k", "e", "c")
    if state is State.CLEAN:
        return ino
    fs.states.evict(ino)
    assert ino.state is State.REMOTE
    return ino


def listed(fs: Filesystem, parent: int, name: bytes, mode: int, key: str | None) -> Inode:
    """An entry another node drained, as a listing inserts it (``key`` None: a directory
    without a marker), with its parent's owner."""
    p = fs.table.get(parent)
    row = InodeRow(
        id=0,
        parent=parent,
        name=name,
        mode=mode,
        uid=p.uid,
        gid=p.gid,
        size=0,
        atime_ns=0,
        mtime_ns=0,
        ctime_ns=0,
        target=None,
        state=State.REMOTE,
        generation=1,
    )
    fs.states.insert_listed(row, key, None if key is None else "etag")
    return fs.table.get(row.id)


def new_dir(fs: Filesystem, state: State) -> Inode:
    """A directory without a marker object put in ``state`` the ways one gets there: made
    here and drained without a marker (clean), or listed from another node (remote)."""
    if state is State.REMOTE:
        return listed(fs, ROOT_INODE, os.urandom(4).hex().encode(), stat.S_IFDIR | 0o755, None)
    d = fs.namespace.mkdir(ROOT_INODE, os.urandom(4).hex().encode(), 0o755, ME)
    if state is State.DIRTY:
        return d
    fs.states.begin_upload(d)
    if state is State.UPLOADING:
        return d
    assert fs.states.marker_implied(d, d.generation)
    return d


MARKERS = ("marker_implied", "marker_needed")  # directories' transitions


def new_entry(fs: Filesystem, state: State, method: str) -> Inode:
    return new_dir(fs, state) if method in MARKERS else new_file(fs, state)


def journal_state(fs: Filesystem, ino: Inode) -> tuple[State, int]:
    row = fs.journal.get(ino.id)
    assert row is not None
    return row.state, row.generation


# Each method with what it needs to run on an inode in any state.
def call(fs: Filesystem, method: str, ino: Inode) -> None:
    s = fs.states
    if method == "mark_dirty":
        trio.run(s.mark_dirty, ino)
    elif method == "finish_upload":
        assert s.finish_upload(ino, ino.generation, ino.size, "k", "e", "c")
    elif method == "marker_implied":
        assert s.marker_implied(ino, ino.generation)
    elif method == "fetched":
        s.fetched(ino, "c")
    elif method in ("insert_local", "insert_listed"):
        pytest.skip("creates rows; covered by the namespace and listing tests")
    else:
        getattr(s, method)(ino)


@pytest.mark.parametrize("t", TRANSITIONS, ids=lambda t: f"{t.method}-{t.src}-{t.dst}")
def test_every_transition_goes_where_it_says_and_is_journaled(fs: Filesystem, t: object) -> None:
    from ckptgw.fsops.state import Transition

    assert isinstance(t, Transition)
    if t.src is None:
        pytest.skip("a row created in its state")
    ino = new_entry(fs, t.src, t.method)
    generation, changes = ino.generation, fs.states.changes.version
    call(fs, t.method, ino)
    assert fs.states.changes.version == changes + 1  # what wakes a waiting ``pending``
    assert ino.state is t.dst
    assert journal_state(fs, ino)[0] is t.dst
    bumped = t.method in ("mark_dirty", "lost", "rebind", "marker_needed")
    assert ino.generation == generation + (1 if bumped else 0)


MOVES = sorted({t.method for t in TRANSITIONS if t.src is not None} - {"abandon_upload"})


@pytest.mark.bug_expected
@pytest.mark.parametrize("method", MOVES)
@pytest.mark.parametrize("state", list(State))
def test_a_transition_from_a_state_it_does_not_start_from_is_refused_loudly(
    fs: Filesystem, method: str, state: State, caplog: pytest.LogCaptureFixture
) -> None:
    allowed = {t.src for t in TRANSITIONS if t.method == method}
    normal = ("mark_dirty", "finish_upload", "marker_implied")
    if state in allowed or (method in normal and state is State.DIRTY):
        pytest.skip("allowed, or normal: dirty again (a write), or changed during the upload")
    ino = new_entry(fs, state, method)
    before, changes = journal_state(fs, ino), fs.states.changes.version
    with caplog.at_level(logging.ERROR, logger="ckptgw.fsops.state"), pytest.raises(StateError):
        call(fs, method, ino)
    assert fs.states.changes.version == changes
    assert f"bug: {method} of inode {ino.id} in state {state.value} refused" in caplog.text
    assert (ino.state, ino.generation) == before == journal_state(fs, ino)


def test_a_wait_for_the_next_change_ends_at_the_change_and_not_before() -> None:
    changes = Signal()
    changes.fire()  # no waiter: nothing to wake

    async def main() -> None:
        await changes.wait(0)  # already past: at once
        seen, woke = changes.version, []

        async def waiter() -> None:
            await changes.wait(seen)
            woke.append(changes.version)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter)
            await trio.testing.wait_all_tasks_blocked()
            assert woke == []  # nothing changed yet: still waiting
            changes.fire()
        assert woke == [seen + 1]

    trio.run(main)


@pytest.mark.bug_expected  # the abandon of a clean file, refused
def test_finish_and_abandon_leave_a_file_that_changed_meanwhile_alone(fs: Filesystem) -> None:
    ino = new_file(fs, State.UPLOADING)
    trio.run(fs.states.mark_dirty, ino)  # a write during the upload
    generation = ino.generation
    assert not fs.states.finish_upload(ino, generation - 1, ino.size, "k", "e", "c")
    fs.states.abandon_upload(ino)
    assert (ino.state, ino.generation) == (State.DIRTY, generation)
    clean = new_file(fs, State.CLEAN)
    with pytest.raises(StateError):
        fs.states.abandon_upload(clean)


def test_a_write_during_the_upload_bumps_the_generation_and_tells_the_drain(
    fs: Filesystem,
) -> None:
    ino = new_file(fs, State.UPLOADING)
    events = fs.states.events
    assert isinstance(events, Events)
    trio.run(fs.states.mark_dirty, ino)
    assert ("changed", ino.id) in events.log
    assert not fs.states.finish_upload(ino, ino.generation - 1, ino.size, "k", "e", "c")
    assert ino.state is State.DIRTY


@pytest.mark.bug_expected
def test_finish_refuses_a_size_that_is_not_the_uploaded_one(
    fs: Filesystem, caplog: pytest.LogCaptureFixture
) -> None:
    ino = new_file(fs, State.UPLOADING)
    with caplog.at_level(logging.ERROR, logger="ckptgw.fsops.state"):
        assert not fs.states.finish_upload(ino, ino.generation, ino.size + 1, "k", "e", "c")
    assert ino.state is State.DIRTY and "bug:" in caplog.text


def test_persist_never_writes_the_state(fs: Filesystem) -> None:
    ino = new_file(fs, State.CLEAN)
    ino.state = State.DIRTY  # a stray in-memory change, as a bug would make it
    ino.size = 7
    fs.table.persist(ino)
    row = fs.journal.get(ino.id)
    assert row is not None and row.size == 7 and row.state is State.CLEAN


def _calls(path: Path, name: str) -> list[int]:
    tree = ast.parse(path.read_text())
    return [
        n.lineno
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == name
    ]


def test_state_columns_are_written_in_fsops_state_only() -> None:
    offenders = []
    for path in [p for d in ("fsops", "drain", "gateway") for p in (ROOT / d).rglob("*.py")]:
        if path == ROOT / "fsops" / "state.py" or path.parent == ROOT / "fsops" / "journal":
            continue
        for line in _calls(path, "set_state"):
            offenders.append(f"{path.relative_to(ROOT)}:{line}")
    assert offenders == []
    assert _calls(ROOT / "fsops" / "state.py", "set_state")


def test_architecture_shows_the_state_machine_of_the_code() -> None:
    doc = (ROOT / "ARCHITECTURE.md").read_text()
    assert mermaid() in doc, "regenerate with: python -m ckptgw.fsops.state"
    assert table() in doc, "regenerate with: python -m ckptgw.fsops.state"


# -- directories without a marker object (fsops.namespace.needs_no_marker) ----------------------

SELF = Caller(os.getuid(), os.getgid())  # the root's owner: what a listing gives below it


def drained_without_marker(fs: Filesystem, d: Inode) -> None:
    """As the drain leaves a directory that needs no marker: clean, stored nowhere."""
    assert needs_no_marker(fs.journal, d)
    fs.states.begin_upload(d)
    assert fs.states.marker_implied(d, d.generation)
    assert journal_state(fs, d)[0] is State.CLEAN and d.stored_key is None


def test_a_directory_needs_no_marker_only_where_a_listing_shows_it_as_it_is(
    fs: Filesystem,
) -> None:
    d = fs.namespace.mkdir(ROOT_INODE, b"d", 0o755, SELF)
    assert not needs_no_marker(fs.journal, d)  # empty: no key shows it
    fs.namespace.create_file(d.id, b"f", 0o644, SELF)
    assert needs_no_marker(fs.journal, d)
    other = fs.namespace.mkdir(ROOT_INODE, b"other", 0o700, SELF)
    fs.namespace.create_file(other.id, b"f", 0o644, SELF)
    assert not needs_no_marker(fs.journal, other)  # a listing would make it 0755
    theirs = fs.namespace.mkdir(d.id, b"theirs", 0o755, Caller(SELF.uid + 1, SELF.gid))
    fs.namespace.create_file(theirs.id, b"f", 0o644, SELF)
    assert not needs_no_marker(fs.journal, theirs)  # a listing gives it its parent's owner
    tagged = fs.namespace.mkdir(d.id, b"tagged", 0o755, SELF)
    fs.namespace.create_file(tagged.id, b"f", 0o644, SELF)
    trio.run(fs.namespace.setxattr, tagged.id, b"user.k", b"v")
    assert not needs_no_marker(fs.journal, tagged)  # a listing has no xattrs


def test_a_directory_without_a_marker_emptied_here_is_dirty_in_the_same_change(
    fs: Filesystem,
) -> None:
    d = fs.namespace.mkdir(ROOT_INODE, b"d", 0o755, SELF)
    fs.namespace.create_file(d.id, b"a", 0o644, SELF)
    fs.namespace.mkdir(d.id, b"b", 0o755, SELF)
    drained_without_marker(fs, d)
    generation = d.generation
    fs.namespace.unlink(d.id, b"a")
    assert journal_state(fs, d) == (State.CLEAN, generation)  # b still shows it
    fs.namespace.rmdir(d.id, b"b")
    assert journal_state(fs, d) == (State.DIRTY, generation + 1)  # nothing shows it now
    events = fs.states.events
    assert isinstance(events, Events) and ("written", d.id) in events.log  # the drain hears
    assert fs.journal.store_ops() == []  # no copy of a marker that is not there


def test_a_directory_with_its_marker_stays_clean_when_emptied(fs: Filesystem) -> None:
    d = fs.namespace.mkdir(ROOT_INODE, b"d", 0o755, SELF)
    fs.namespace.create_file(d.id, b"a", 0o644, SELF)
    fs.states.begin_upload(d)
    assert fs.states.finish_upload(d, d.generation, 0, "d/", "etag", None)
    fs.namespace.unlink(d.id, b"a")
    assert journal_state(fs, d)[0] is State.CLEAN  # its marker shows it


def test_attribute_changes_give_a_directory_without_a_marker_its_marker_not_a_copy(
    fs: Filesystem,
) -> None:
    d = fs.namespace.mkdir(ROOT_INODE, b"d", 0o755, SELF)
    fs.namespace.create_file(d.id, b"f", 0o644, SELF)
    drained_without_marker(fs, d)
    trio.run(fs.namespace.setattr, d.id, AttrChange(mtime_ns=12345, atime_ns=1))
    assert journal_state(fs, d)[0] is State.CLEAN  # its mtime alone is not sent
    trio.run(fs.namespace.setattr, d.id, AttrChange(mode=0o700))
    assert journal_state(fs, d)[0] is State.DIRTY
    assert fs.journal.store_ops() == []
    x = fs.namespace.mkdir(ROOT_INODE, b"x", 0o755, SELF)
    fs.namespace.create_file(x.id, b"f", 0o644, SELF)
    drained_without_marker(fs, x)
    trio.run(fs.namespace.setxattr, x.id, b"user.k", b"v")
    assert journal_state(fs, x)[0] is State.DIRTY
    assert fs.journal.store_ops() == []


def test_a_chown_of_the_parent_or_a_rename_gives_a_directory_its_marker_where_needed(
    fs: Filesystem,
) -> None:
    a = fs.namespace.mkdir(ROOT_INODE, b"a", 0o755, SELF)
    b = fs.namespace.mkdir(ROOT_INODE, b"b", 0o755, SELF)
    d = fs.namespace.mkdir(a.id, b"d", 0o755, SELF)
    fs.namespace.create_file(d.id, b"f", 0o644, SELF)
    fs.namespace.create_file(b.id, b"g", 0o644, SELF)
    for x in (d, a, b):
        drained_without_marker(fs, x)
    fs.namespace.rename(a.id, b"d", b.id, b"d", 0)  # same owner: the listing shows it as is
    assert journal_state(fs, d)[0] is State.CLEAN
    assert journal_state(fs, a)[0] is State.DIRTY  # emptied by the rename: needs its marker
    assert journal_state(fs, b)[0] is State.CLEAN
    assert fs.journal.store_ops() == []  # nothing of d's own moves (f is not stored yet)
    trio.run(fs.namespace.setattr, b.id, AttrChange(uid=SELF.uid + 1))
    assert journal_state(fs, b)[0] is State.DIRTY  # its own owner is not its parent's now
    assert journal_state(fs, d)[0] is State.DIRTY  # a listing would give d b's new owner


def test_another_nodes_directory_without_a_marker_emptied_here_gets_one(fs: Filesystem) -> None:
    r = listed(fs, ROOT_INODE, b"r", stat.S_IFDIR | 0o755, None)
    listed(fs, r.id, b"x", stat.S_IFREG | 0o644, "r/x")
    fs.namespace.unlink(r.id, b"x")
    assert journal_state(fs, r) == (State.DIRTY, 2)
    assert [(o.kind, o.src) for o in fs.journal.store_ops()] == [("delete", "r/x")]
