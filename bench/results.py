"""Where benchmarks write their figures: ``bench/results/<name>.json`` (not committed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def save(name: str, data: dict[str, Any]) -> Path:
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    path = out / f"{name}.json"
    path.write_text(json.dumps(data, indent=2))
    return path
