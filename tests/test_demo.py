"""`make demo`, shortened: the preempted run resumes on a fresh node and its loss curve matches
the reference step for step; the plot is written; nothing stays mounted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.mount, pytest.mark.torch]

ROOT = Path(__file__).resolve().parent.parent


def test_demo_resumes_on_a_fresh_node_bit_for_bit(tmp_path: Path) -> None:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.demo",
            "--steps",
            "24",
            "--every",
            "5",
            "--kill-at",
            "17",
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = r.stdout
    assert "trainer SIGKILLed after step 17" in out
    assert "resumed from checkpoint step 15" in out
    assert "all 24 steps identical to the reference (bit for bit)" in out
    assert "the 2 recomputed steps equal node A's" in out
    assert "checkpoints visible on node B: step_000005, step_000010, step_000015" in out
    # the retention plan ends it: the newest kept, milestones (every 25) none, older deleted
    assert "run1/step_000020  keep" in out and "run1/step_000005  delete" in out
    png = tmp_path / "demo_loss.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    mounts = Path("/proc/self/mounts").read_text()
    assert "ckptgw-demo-" not in mounts
