"""What the benchmarks write: a transformer-shaped training state, saved the way trainers save
it (``torch.save`` + fsync + rename, or a DCP save of many files)."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import torch


def state_dict(total_bytes: int, layers: int = 48, seed: int = 0) -> dict[str, object]:
    """Weights plus Adam's two moments, in ``layers`` layers (float32), ``total_bytes`` in all."""
    per_layer = max(1, total_bytes // 4 // 3 // layers)
    torch.manual_seed(seed)
    model = {f"layers.{i}.weight": torch.randn(per_layer) for i in range(layers)}
    optim = {
        f"state.{i}": {
            "step": torch.tensor(100.0),
            "exp_avg": torch.randn(per_layer),
            "exp_avg_sq": torch.rand(per_layer),
        }
        for i in range(layers)
    }
    return {"model": model, "optimizer": {"state": optim}, "step": 100}


def fsync_path(path: Path, flags: int = os.O_RDONLY) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_atomic(obj: object, path: Path) -> None:
    """The checkpoint pattern trainers use: temp file, fsync, rename, fsync the directory."""
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    fsync_path(tmp)
    os.rename(tmp, path)
    fsync_path(path.parent, os.O_RDONLY | os.O_DIRECTORY)


def dcp_save(state: dict[str, object], path: Path) -> int:
    """A torch.distributed.checkpoint save with one file per tensor (what many ranks, or
    ``single_file_per_rank=False``, produce), then fsync of every file; the number of files."""
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():  # "assuming the intent is to save in a single process": yes
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        dcp.save(state, storage_writer=dcp.FileSystemWriter(str(path), single_file_per_rank=False))
    files = [p for p in path.iterdir() if p.is_file()]
    for p in files:
        fsync_path(p)
    fsync_path(path, os.O_RDONLY | os.O_DIRECTORY)
    return len(files)


def write_small(path: Path, count: int, size: int) -> int:
    """``count`` files of ``size`` bytes, each written and fsynced (a tokenizer's or a
    metadata-heavy checkpoint's many small files), then the directory; the number of files."""
    path.mkdir(parents=True)
    data = os.urandom(size)
    for i in range(count):
        fd = os.open(path / f"part_{i:05}.bin", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
    fsync_path(path, os.O_RDONLY | os.O_DIRECTORY)
    return count


def dcp_load(state: dict[str, object], path: Path) -> None:
    """A torch.distributed.checkpoint load into ``state`` (tensors of the saved shapes)."""
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        dcp.load(state, storage_reader=dcp.FileSystemReader(str(path)))
