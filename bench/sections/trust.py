"""Trust (:mod:`bench.trust`): the overwrite window, and the time to durable behind a proxy
that ignores ``Expect: 100-continue``."""

from __future__ import annotations

import statistics

from bench import trust
from bench.common import (
    Bench,
    Row,
    mib,
    say,
)


def overwrite(b: Bench, size: int) -> None:
    say(f"\n## overwrite window, {mib(size)} [{b.path}]: latest.pt saved again by name")
    s = trust.overwrite_rounds(b, size)
    b.samples[f"overwrite {mib(size)} {b.path}"] = {"bytes": size, "samples": s}
    med = {k: statistics.median(v) for k, v in s.items()}
    label = mib(size)
    b.add(Row("overwrite window", label, "time to durable", med["durable"], med["missing"], "s"))


def expect(b: Bench, size: int) -> None:
    say(f"\n## {mib(size)} behind a proxy that ignores Expect: 100-continue [{b.path}]")
    s = trust.expect_rounds(b, size)
    b.samples[f"expect {mib(size)} {b.path}"] = {"bytes": size, "samples": s}
    med = {k: statistics.median(v) for k, v in s.items() if k != "first_ignores"}
    b.add(
        Row(
            "time to durable (Expect ignored)",
            mib(size),
            "Expect answered",
            med["answers"],
            med["ignores"],
            "s",
        )
    )
