"""The documentation: what is generated equals its generator's output, the front page and the
design stay short, and every relative link points to a file that exists."""

from __future__ import annotations

import json
import re
from pathlib import Path

from bench import report
from ckptgw.gateway.cli import completion
from ckptgw.gateway.cli.commandref import reference
from ckptgw.gateway.cli.main import _parser

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_docs_commands_md_is_the_generated_reference() -> None:
    doc = (ROOT / "docs/commands.md").read_text()
    assert doc == reference(), (
        "regenerate with: python -m ckptgw.gateway.cli.commandref > docs/commands.md"
    )


def test_the_reference_has_every_command_and_option() -> None:
    doc = reference()
    words = completion._words(_parser())  # what completion offers after each command path
    leaves = [p for p, w in words.items() if p and not re.search(r"(^| )[a-z]", w)]
    assert len(leaves) >= 15, leaves
    for path in leaves:
        chunk = doc.split(f"## `ckptgw {path}`\n", 1)[1].split("\n## ", 1)[0]
        for option in words[path].split():
            if option != "--help":
                assert f"`{option}" in chunk, f"{option} of ckptgw {path} is not in the reference"


def test_docs_benchmarks_md_is_written_from_the_published_results() -> None:
    doc = (ROOT / "docs/benchmarks.md").read_text()
    assert doc == report.render(), "write it again with: python -m bench.report"
    readme = (ROOT / "README.md").read_text()
    assert readme == report.with_headline(readme), "write it again with: python -m bench.report"
    assert list((ROOT / "docs/results").glob("*.json")), "no published results"


def _run(date: str, rows: list[tuple[str, str, str, float, float]]) -> dict[str, object]:
    return {
        "machine": {"date": date, "cpu": "Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz", "cpus": 2},  # noqa: E501
        "command": "python -m bench.suite --only save",
        "commit": "abc1234",
        "rows": [
            {"metric": m, "x": x, "path": p, "baseline": "disk", "base": base, "gateway": gw,
             "unit": "s", "ratio": gw / base, "target": 1.1 if m == "save stall" else None}
            for m, x, p, base, gw in rows
        ],
    }  # fmt: skip


def test_a_run_replaces_its_rows_and_keeps_the_others(tmp_path: Path) -> None:
    first = _run("2026-11-01", [("save stall", "1 GiB", "daemon", 1.0, 1.05),
                                ("ls -l (DCP)", "9 files", "daemon", 0.1, 0.2)])  # fmt: skip
    path = report.publish(first, results=tmp_path)
    assert path.name == "2-core-intel-xeon-platinum-8481c.json"
    second = _run("2026-11-27", [("save stall", "1 GiB", "daemon", 1.0, 1.5)])
    report.publish(second, results=tmp_path)
    rows = json.loads(path.read_text())["rows"]
    got = {(r["metric"], r["date"]): r["gateway"] for r in rows}
    assert got == {("ls -l (DCP)", "2026-11-01"): 0.2, ("save stall", "2026-11-27"): 1.5}
    page = report.render(tmp_path)
    assert "Measured 2026-11-01 to 2026-11-27 (commits abc1234)." in page
    assert (
        "| save stall | 1 GiB | daemon | disk | 1.00 s | 1.50 s | 1.50x | ≤ 1.10x **missed** |"
        in page
    )
    assert "**Missed on this machine (1):** save stall at 1 GiB [daemon] 1.50x" in page
    assert "| ls -l (DCP) | 9 files | daemon | disk | 0.100 s | 0.200 s | 2.00x | - |" in page
    table = report.headline(tmp_path)
    assert table.startswith("On 2-core-intel-xeon-platinum-8481c: 2 cores (Intel(R) Xeon(R)")
    assert (
        "| `torch.save` + fsync + rename | 1 GiB | daemon | disk 1.00 s | 1.50 s | 1.50x |" in table
    )


def test_the_front_page_and_the_design_stay_short() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250, "README.md is the front page: move reference to docs/"
    assert len((ROOT / "ARCHITECTURE.md").read_text()) <= 40_000


def test_every_relative_link_points_to_a_file_that_exists() -> None:
    broken = []
    for page in PAGES:
        text = re.sub(r"```.*?```|`[^`\n]*`", "", page.read_text(), flags=re.DOTALL)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            if not (page.parent / target.split("#", 1)[0]).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, broken
