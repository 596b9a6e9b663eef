"""`make demo`: mount a gateway, checkpoint a small training run through it, watch the
checkpoints drain to the store, crash the gateway with SIGKILL, mount again and resume from the
checkpoint, then unmount.

(The full demo, resuming on a fresh node from the store, arrives with the read-through issue.)
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import torch

from bench.save_stall import save_atomic
from gateway.client import wait_durable
from gateway.harness import Gateway, exit_on_sigterm


def say(msg: str) -> None:
    print(f"[demo] {msg}", flush=True)


def make_run(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, step: int) -> float:
    g = torch.Generator().manual_seed(step)
    x = torch.randn(128, 64, generator=g)
    y = x[:, :1] * 3 - x[:, 1:2]
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return float(loss.item())


def save_checkpoint(state: dict[str, object], path: Path) -> float:
    """temp file + fsync + rename + fsync(dir): the pattern that survives crashes. Seconds."""
    t0 = time.perf_counter()
    path.parent.mkdir(parents=True, exist_ok=True)
    save_atomic(state, path)
    return time.perf_counter() - t0


def main() -> None:
    exit_on_sigterm()
    work = Path(tempfile.mkdtemp(prefix="ckptgw-demo-"))
    os.environ["CKPTGW_RUNTIME_DIR"] = str(work / "run")  # the demo's gateways are its own
    gw = Gateway(work / "mnt", work / "cache", f"file://{work / 'store'}")
    try:
        gw.start()
        say(f"mounted {gw.mountpoint} (cache {gw.cache_dir}, daemon pid {gw.pid})")
        model, opt = make_run()
        run = gw.mountpoint / "run1"
        for step in range(1, 31):
            loss = train_step(model, opt, step)
            if step % 10 == 0:
                ckpt = run / f"step_{step}" / "ckpt.pt"
                took = save_checkpoint(
                    {"model": model.state_dict(), "optim": opt.state_dict(), "step": step},
                    ckpt,
                )
                say(
                    f"step {step}: loss {loss:.4f}, checkpoint saved in {took * 1000:.0f} ms "
                    f"-> {ckpt.relative_to(gw.mountpoint)}"
                )
        reference = {k: v.clone() for k, v in model.state_dict().items()}
        store = work / "store" / "run1"
        wait_durable(run, timeout=120)  # what training code calls before it trusts a checkpoint
        durable = sorted(p.parent.name for p in store.glob("step_*/ckpt.pt"))
        say(f"drained to the store ({gw.store}): {durable}")
        print(gw.cli("status", str(gw.mountpoint)).stdout, flush=True)

        say("killing the gateway daemon with SIGKILL, as a crash would")
        gw.kill()
        gw.start()
        say("mounted again on the same cache dir: the stale mount was cleared, journal recovered")
        for line in (gw.cache_dir / "ckptgw.log").read_text().splitlines():
            if "recovered" in line:
                say("log: " + line.split(": ", 1)[-1])

        steps = sorted(int(p.name.split("_")[1]) for p in run.iterdir())
        latest = run / f"step_{steps[-1]}" / "ckpt.pt"
        state = torch.load(latest, weights_only=True)
        model2, opt2 = make_run(seed=123)
        model2.load_state_dict(state["model"])
        opt2.load_state_dict(state["optim"])
        same = all(torch.equal(reference[k], v) for k, v in model2.state_dict().items())
        say(
            f"checkpoints found: {steps}; resumed from step {state['step']}: "
            f"weights identical = {same}"
        )
        if not same:
            raise SystemExit("[demo] FAILED: the resumed weights differ")
        loss = train_step(model2, opt2, state["step"] + 1)
        say(f"training continues: step {state['step'] + 1} loss {loss:.4f}")
        gw.stop()
        say("unmounted; demo OK")
    finally:
        gw.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
