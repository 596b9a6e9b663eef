"""Where benchmarks write their figures: ``bench/results/<name>.json`` (not committed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DEFAULT = Path(__file__).parent / "results"


def save(name: str, data: dict[str, Any], out: Path = DEFAULT) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    path.write_text(json.dumps(data, indent=2))
    return path
