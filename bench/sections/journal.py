"""One node's journal at scale (:mod:`bench.journalscale`), as rows of the suite."""

from __future__ import annotations

from bench import journalscale
from bench.common import Bench, Row, say


def journal(b: Bench, sizes: tuple[int, ...]) -> None:
    """For each kind of cache dir, each figure at the largest size against the smallest
    (``base``), and status's seconds at the largest against
    :data:`bench.journalscale.STATUS_LIMIT`; their targets are
    :data:`bench.journalscale.TARGETS`, by metric."""
    say(f"\n## one node's journal: {' and '.join(f'{n:,}' for n in sizes)} entries")
    figures = journalscale.run(sizes, journalscale.KINDS, b.runs, b.work)
    b.add(*journalscale.rows_of(figures, Row))
