"""The suite's figures as PNG: how each comparison grows with checkpoint size and with the
number of writers, absolute seconds on both sides and the ratio against its target."""

from __future__ import annotations

from pathlib import Path
from typing import Any

SIZE_METRICS = ["save stall", "time to durable", "cold restore", "drain CPU s/GiB"]
WRITER_METRICS = ["save stall (writers)", "time to durable (writers)"]


def _series(rows: list[dict[str, Any]], metric: str) -> tuple[list[str], list[float], list[float]]:
    picked = [r for r in rows if r["metric"] == metric and r.get("path") == rows[0].get("path")]
    return [r["x"] for r in picked], [r["base"] for r in picked], [r["gateway"] for r in picked]


def _figure(
    doc: dict[str, Any], metrics: list[str], xlabel: str, title: str, out: Path
) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = doc["rows"]
    metrics = [m for m in metrics if any(r["metric"] == m for r in rows)]
    if not metrics:
        return None
    fig, axes = plt.subplots(1, len(metrics) + 1, figsize=(4.2 * (len(metrics) + 1), 4))
    ratio_ax = axes[-1]
    for ax, metric in zip(axes, metrics, strict=False):
        xs, base, gw = _series(rows, metric)
        baseline = next(r["baseline"] for r in rows if r["metric"] == metric)
        ax.plot(xs, base, "o-", color="0.4", label=baseline)
        ax.plot(xs, gw, "o-", color="tab:blue", label="gateway")
        ax.set_title(metric)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("s/GiB" if "CPU" in metric else "seconds")
        ax.legend(fontsize=8)
        line = ratio_ax.plot(
            xs, [g / b for g, b in zip(gw, base, strict=True)], "o-", label=metric
        )[0]
        target = next(r["target"] for r in rows if r["metric"] == metric)
        if target is not None:
            ratio_ax.axhline(target, color=line.get_color(), ls=":", lw=1)
    ratio_ax.axhline(1.0, color="0.6", lw=0.8)
    ratio_ax.set_title("gateway / limit (dotted: target)")
    ratio_ax.set_xlabel(xlabel)
    ratio_ax.legend(fontsize=7)
    m = doc["machine"]
    fig.suptitle(f"{title} — {m['cpus']} CPUs, {m['memory_gib']} GiB, {m['date']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def plot_sizes(doc: dict[str, Any], out_dir: Path) -> Path | None:
    return _figure(
        doc,
        SIZE_METRICS,
        "checkpoint size",
        "ckptgw vs the limit, by size",
        out_dir / "suite_size.png",
    )


def plot_writers(doc: dict[str, Any], out_dir: Path) -> Path | None:
    return _figure(
        doc,
        WRITER_METRICS,
        "writer processes",
        "ckptgw vs the limit, by writers",
        out_dir / "suite_writers.png",
    )
