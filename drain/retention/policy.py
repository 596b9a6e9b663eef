"""Retention: which checkpoints of a run to keep, and why. A pure function of the checkpoints
and the policy, so that its invariants can be checked for any input (a property test does).

The invariants, whatever the policy says:

1. The newest complete durable checkpoint is kept.
2. Every checkpoint newer than it (still being written, or not yet complete) is kept.
3. Pinned checkpoints, checkpoints a symlink of the run points to (``last.ckpt`` made by
   ``save_last="link"``, a ``best.ckpt``) and milestones (``keep_every``) are kept.
4. A checkpoint that is not entirely in the store is kept: retention never deletes data that
   exists only in a node's cache.
5. Incomplete checkpoints are never judged (kept), and nothing younger than ``min_age`` goes.

Everything else beyond the ``keep_last`` newest complete durable checkpoints is deleted.
Milestones that are kept are marked ``transition`` when there is a class to move them to
(``lifecycle.storage_class``): their objects get the tag ``ckptgw-class=milestone``, which the
bucket's lifecycle rules move to a cheaper class. Without one a milestone is only kept.

A checkpoint that is not complete says what it waits for (``Candidate.waiting``: its marker, or
the quiet time), so that a plan made early reads as "not yet", not as "never".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

KEEP, DELETE, TRANSITION = "keep", "delete", "transition"
MILESTONE, ROTATING = "milestone", "rotating"


@dataclass(frozen=True)
class Policy:
    keep_last: int = 3  # complete durable checkpoints kept, newest first (>= 1)
    keep_every: int = 0  # steps that are multiples of this are milestones; 0: none
    min_age: float = 0.0  # seconds: younger checkpoints are never deleted

    def __post_init__(self) -> None:
        if self.keep_last < 1:
            raise ValueError("keep_last must be at least 1")
        if self.keep_every < 0 or self.min_age < 0:
            raise ValueError("keep_every and min_age must not be negative")


@dataclass(frozen=True)
class Candidate:
    path: str
    step: int
    mtime: float  # the latest write to any of its files
    durable: bool  # every file is in the store
    complete: bool  # its completeness rule holds (a commit marker, or quiet and durable)
    pinned: bool = False
    linked_by: str = ""  # a symlink of the run that points into this checkpoint
    waiting: str = ""  # when not complete: what completeness waits for ("marker ... not ...")


@dataclass(frozen=True)
class Decision:
    path: str
    step: int
    action: str  # KEEP, DELETE or TRANSITION
    reason: str
    storage_class: str  # the tag value: MILESTONE or ROTATING


def _order(c: Candidate) -> tuple[int, float, str]:
    return c.step, c.mtime, c.path


def _incomplete(c: Candidate) -> str:
    return f"incomplete: {c.waiting}" if c.waiting else "incomplete"


def plan(
    candidates: Iterable[Candidate], policy: Policy, now: float, *, transition: bool = True
) -> list[Decision]:
    """One decision per checkpoint of one run, newest first. ``transition``: milestones that
    are kept move to a cheaper class (there is one); else they are only kept."""
    cands = sorted(candidates, key=_order, reverse=True)
    good = [c for c in cands if c.complete and c.durable]
    newest = good[0] if good else None
    latest = {c.path for c in good[: policy.keep_last]}
    out = []
    for c in cands:
        milestone = policy.keep_every > 0 and c.step % policy.keep_every == 0
        cls = MILESTONE if milestone else ROTATING
        action, reason = KEEP, ""
        if not c.durable:
            reason = "not entirely in the store yet"
        elif newest is None:
            reason = f"no complete checkpoint yet; {_incomplete(c)}"
        elif c is newest:
            reason = "newest complete checkpoint"
        elif _order(c) > _order(newest):
            reason = "newer than the newest complete checkpoint"
            if not c.complete:
                reason += f"; {_incomplete(c)}"
        elif c.pinned:
            reason = "pinned"
        elif c.linked_by:
            reason = f"a symlink points to it ({c.linked_by})"
        elif milestone:
            action = TRANSITION if transition else KEEP
            reason = f"milestone (every {policy.keep_every} steps)"
        elif c.path in latest:
            reason = f"one of the last {policy.keep_last}"
        elif not c.complete:
            reason = f"{_incomplete(c)}; not judged" if c.waiting else "incomplete: not judged"
        elif now - c.mtime < policy.min_age:
            reason = f"younger than min_age ({policy.min_age:g} s)"
        else:
            action, reason = DELETE, f"older than the last {policy.keep_last}"
        out.append(Decision(c.path, c.step, action, reason, cls))
    return out
