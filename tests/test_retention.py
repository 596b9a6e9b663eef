"""Retention planning: the invariants hold for any checkpoints, completions, pins and policies
(a property test), and the plan for a typical run reads as expected."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptgw.drain.retention.policy import (
    DELETE,
    KEEP,
    MILESTONE,
    TRANSITION,
    Candidate,
    Policy,
    plan,
)

NOW = 1_000_000.0


@st.composite
def runs(draw: st.DrawFn) -> list[Candidate]:
    steps = draw(st.lists(st.integers(0, 400), max_size=25))
    out = []
    for i, step in enumerate(steps):
        durable = draw(st.booleans())
        out.append(
            Candidate(
                path=f"run/c{i}_{step}",
                step=step,
                mtime=NOW - draw(st.floats(0, 10_000)),
                durable=durable,
                complete=draw(st.booleans()),
                pinned=draw(st.booleans()) and draw(st.booleans()),
                linked_by="last.ckpt" if draw(st.integers(0, 5)) == 0 else "",
            )
        )
    return out


policies = st.builds(
    Policy,
    keep_last=st.integers(1, 6),
    keep_every=st.sampled_from([0, 0, 10, 50, 100]),
    min_age=st.sampled_from([0.0, 60.0, 5000.0]),
)


def key(c: Candidate) -> tuple[int, float, str]:
    return c.step, c.mtime, c.path


@settings(max_examples=400, deadline=None)
@given(runs(), policies)
def test_the_plan_never_breaks_the_invariants(cands: list[Candidate], policy: Policy) -> None:
    decisions = plan(cands, policy, NOW)
    assert sorted(d.path for d in decisions) == sorted(c.path for c in cands)
    deleted = {d.path for d in decisions if d.action == DELETE}
    by_path = {c.path: c for c in cands}
    good = sorted((c for c in cands if c.complete and c.durable), key=key, reverse=True)
    if not good:
        assert not deleted  # without a complete durable checkpoint nothing goes
        return
    newest = good[0]
    assert newest.path not in deleted
    for c in good[: policy.keep_last]:
        assert c.path not in deleted
    for path in deleted:
        c = by_path[path]
        assert key(c) < key(newest)  # never the newest, never a newer one being written
        assert c.durable and c.complete  # never data only in a cache, never an unjudged one
        assert not c.pinned and not c.linked_by
        assert not (policy.keep_every and c.step % policy.keep_every == 0)  # milestones stay
        assert NOW - c.mtime >= policy.min_age
    for d in decisions:
        if d.action == TRANSITION:
            assert d.storage_class == MILESTONE


def test_a_typical_run() -> None:
    def c(step: int, **kw: object) -> Candidate:
        args: dict[str, object] = {"mtime": NOW - 10_000 + step, "durable": True, "complete": True}
        return Candidate(path=f"run/step_{step}", step=step, **(args | kw))  # type: ignore[arg-type]

    cands = [
        c(100),
        c(200),
        c(300, pinned=True),
        c(350, linked_by="best.ckpt"),
        c(400),
        c(500),
        c(600, complete=False),  # a crash mid-save, older than the newest complete one
        c(700),
        c(800),
        c(900, complete=False, durable=False),  # being written now
    ]
    got = {
        d.step: (d.action, d.reason) for d in plan(cands, Policy(keep_last=2, keep_every=500), NOW)
    }
    assert got == {
        900: (KEEP, "not entirely in the store yet"),
        800: (KEEP, "newest complete checkpoint"),
        700: (KEEP, "one of the last 2"),
        600: (KEEP, "incomplete: not judged"),
        500: (TRANSITION, "milestone (every 500 steps)"),
        350: (KEEP, "a symlink points to it (best.ckpt)"),
        400: (DELETE, "older than the last 2"),
        300: (KEEP, "pinned"),
        200: (DELETE, "older than the last 2"),
        100: (DELETE, "older than the last 2"),
    }


def test_bad_policies_are_refused() -> None:
    with pytest.raises(ValueError, match="keep_last"):
        Policy(keep_last=0)
    with pytest.raises(ValueError, match="negative"):
        Policy(keep_every=-1)
