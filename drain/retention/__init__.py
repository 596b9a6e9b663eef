"""Retention: which checkpoints of a run to keep, how that is applied, and the store's
checkpoints for status.

* ``policy.py``: how retention chooses. A pure function of the checkpoints and the policy,
  with numbered invariants (a property test checks them for any input).
* ``lifecycle.py``: the plan made from the store's listing and this node's journal, applied
  to the bucket and the caches; pins; the bucket's own rules.
* ``catalog.py``: the store's checkpoints as status shows them, listed in the background so
  that status never waits on the store.

What it promises: retention never deletes a checkpoint that is not entirely in the store,
the newest complete durable one, a pinned one, or one a symlink of the run points to; an
incomplete checkpoint is kept and says what it waits for. It reads objects' metadata through
:mod:`drain.reads.entries`, and imports nothing of the upload engine.
"""
