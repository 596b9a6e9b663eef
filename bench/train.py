"""A small, deterministic CPU training job that checkpoints the way real trainers do.

Every ``--every`` steps it writes ``<run>/step_NNNNNN/state.pt`` (model, optimizer, LR
scheduler, every RNG it draws from, and the step) with plain ``torch.save`` to a temp file,
fsync, rename and fsync of the directory, and then the ``COMPLETE`` marker the same way. With
``--resume`` it starts from the newest checkpoint that has its marker. It knows nothing about
ckptgw: ``<run>`` is just a directory, on a mount or on a disk.

Each step's loss goes to ``--losses`` as a JSON line (``{"step": N, "loss": L}``), flushed at
once, so whoever watches the job sees it even if the job is killed.

    python -m bench.train --run DIR --steps 100 --every 10 --losses FILE [--resume]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
from pathlib import Path
from typing import Any

import torch

from bench.workloads import save_atomic

MARKER = "COMPLETE"
STEP_DIR = re.compile(r"step_(\d+)$")


def build(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer, Any, torch.Generator]:
    """Model, optimizer, scheduler and the data generator, all from one seed."""
    torch.manual_seed(seed)
    random.seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 2048),
        torch.nn.GELU(),
        torch.nn.Dropout(0.1),  # draws from the global RNG: a resume must restore it
        torch.nn.Linear(2048, 2048),
        torch.nn.GELU(),
        torch.nn.Linear(2048, 8),
    )
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=10_000)
    data = torch.Generator().manual_seed(seed + 1)
    return model, opt, sched, data


def batch(data: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A synthetic regression task: the targets are a fixed random projection, plus noise."""
    x = torch.randn(128, 256, generator=data)
    w = torch.Generator().manual_seed(7)
    target = torch.tanh(x @ torch.randn(256, 8, generator=w)) + 0.05 * torch.randn(
        128, 8, generator=data
    )
    return x, target


def latest(run: Path) -> Path | None:
    """The newest checkpoint directory whose marker exists."""
    if not run.is_dir():
        return None
    steps = [(int(m[1]), p) for p in run.iterdir() if (m := STEP_DIR.match(p.name))]
    for _, path in sorted(steps, reverse=True):
        if (path / MARKER).exists():
            return path
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, help="checkpoint directory (none: no checkpoints)")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--losses", type=Path, required=True)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    # One thread and deterministic kernels: the same step gives the same loss in any process.
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    model, opt, sched, data = build(args.seed)
    start = 0
    if args.resume and args.run is not None and (ckpt := latest(args.run)) is not None:
        t0 = time.perf_counter()
        state = torch.load(ckpt / "state.pt", weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        data.set_state(state["rng"]["data"])
        torch.set_rng_state(state["rng"]["torch"])
        random.setstate(state["rng"]["python"])
        start = state["step"]
        print(f"resumed from {ckpt} (step {start}) in {time.perf_counter() - t0:.2f} s", flush=True)
    elif args.resume:
        print("no complete checkpoint found: starting from step 0", flush=True)
    with open(args.losses, "a", buffering=1) as log:
        for step in range(start + 1, args.steps + 1):
            model.train()
            x, target = batch(data)
            loss = torch.nn.functional.mse_loss(model(x), target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            log.write(json.dumps({"step": step, "loss": loss.item()}) + "\n")
            if args.run is not None and step % args.every == 0:
                t0 = time.perf_counter()
                ckpt = args.run / f"step_{step:06d}"
                ckpt.mkdir(parents=True, exist_ok=True)
                state = {
                    "model": model.state_dict(),
                    "optimizer": opt.state_dict(),
                    "scheduler": sched.state_dict(),
                    "rng": {
                        "data": data.get_state(),
                        "torch": torch.get_rng_state(),
                        "python": random.getstate(),
                    },
                    "step": step,
                }
                save_atomic(state, ckpt / "state.pt")
                save_atomic({"step": step}, ckpt / MARKER)
                print(
                    f"step {step:4d}  loss {loss.item():.5f}  checkpoint {ckpt.name} "
                    f"saved in {time.perf_counter() - t0:.2f} s",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
