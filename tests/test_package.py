"""The project installs as one distribution, ``ckptgw``, whose only top-level import name is
``ckptgw``: a wheel built from the checkout carries every module under ``ckptgw/`` and a
working ``ckptgw`` script, and runs from anywhere without the checkout on the path."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from ckptgw import __version__

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel built from a copy of what a source distribution needs (the build writes its
    build/ beside the sources: not into the checkout)."""
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("wheel")
    for folder in ("gateway", "fsops", "drain"):
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(
        ROOT / "ckptgw/store", src / "ckptgw/store", ignore=shutil.ignore_patterns("__pycache__")
    )
    for name in ("pyproject.toml", "README.md", "ckptgw/__init__.py", "ckptgw/__main__.py"):
        shutil.copy(ROOT / name, src / name)
    # No build isolation and no dependencies: the venv's setuptools builds it, offline.
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps",
         "-w", str(out), str(src)],
        check=True,
        capture_output=True,
        timeout=300,
    )  # fmt: skip
    (found,) = out.glob("ckptgw-*.whl")
    return found


def test_wheel_has_one_top_level_name(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        dist = next(n.split("/")[0] for n in names if ".dist-info/" in n)
        tops = {n.split("/")[0] for n in names} - {dist}
        entry_points = z.read(f"{dist}/entry_points.txt").decode()
    assert tops == {"ckptgw"}, tops
    for module in (
        "gateway/cli/main.py",
        "gateway/daemon/status.schema.json",
        "gateway/cli/__main__.py",
        "fsops/state.py",
        "fsops/journal/rows.py",
        "drain/uploads/engine.py",
        "store/interface.py",
        "store/partworker.py",
        "__main__.py",
    ):
        assert f"ckptgw/{module}" in names, module
    # every module of the checkout is in the wheel, and nothing else
    here = {
        f"ckptgw/{p.relative_to(ROOT)}"
        for folder in ("gateway", "fsops", "drain")
        for p in (ROOT / folder).rglob("*.py")
    } | {str(p.relative_to(ROOT)) for p in (ROOT / "ckptgw/store").glob("*.py")}
    assert here <= set(names), here - set(names)
    assert "ckptgw = ckptgw.gateway.cli.main:main" in entry_points


def test_installed_wheel_runs_outside_the_checkout(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    where = subprocess.run(
        [
            sys.executable,
            "-c",
            "import ckptgw.gateway.cli.main, ckptgw.drain.uploads.engine, ckptgw.store.s3; "
            "print(ckptgw.gateway.cli.main.__file__); print(ckptgw.drain.uploads.engine.__file__); "
            "print(ckptgw.store.s3.__file__)",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout.split()
    assert all(Path(w).is_relative_to(target) for w in where), where
    script = target / "bin" / "ckptgw"
    r = subprocess.run(
        [sys.executable, str(script), "--version"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"ckptgw {__version__}"
