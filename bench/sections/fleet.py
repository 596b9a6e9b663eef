"""Many gateways, one bucket, behind a rate-limited store (:mod:`bench.fleet`)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from bench import fleet as fleets
from bench.common import (
    Bench,
    Row,
    say,
)


def fleet(b: Bench, plan: fleets.Plan) -> None:
    n = plan.gateways
    say(
        f"\n## fleet: {n} gateways x {plan.files} files of {plan.size >> 10} KiB, one step "
        f"at once, behind {plan.write_rate:g} writes/s and {plan.read_rate:g} reads/s "
        f"[{b.path}]"
    )
    s = fleets.fleet_rounds(b, plan)
    b.samples[f"fleet {n} {b.path}"] = {"plan": asdict(plan), "samples": s}
    x = f"{n} gateways"

    def rows(metric: str, refused_metric: str, r: dict[str, Any], bound: str) -> list[Row]:
        refused = r["refused_writes"] + r["refused_reads"]
        total = r["writes"] + r["reads"] + refused
        return [
            Row(metric, x, bound, r["bound"], r["seconds"], "s"),
            Row(refused_metric, x, "requests", total, refused, "requests"),
        ]

    first, *later = s["saves"]
    b.add(*rows("fleet durable (first save)", "fleet refused (first save)", first, "bound"))
    for r in later[-1:]:
        b.add(*rows("fleet durable (learned)", "fleet refused (learned)", r, "bound"))
    b.add(*rows("fleet restore", "fleet restore refused", s["restore"], "read bound"))
    rounds = [*s["saves"], s["restore"]]
    b.add(
        Row(
            "fleet lost",
            x,
            "objects",
            sum(r["objects"] for r in rounds),
            sum(r["lost"] for r in rounds),
            "objects",
        )
    )
    if s["unpaced"] is not None:
        b.add(*rows("unpaced fleet durable", "unpaced fleet refused", s["unpaced"], "bound"))
