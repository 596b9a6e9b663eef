"""`make demo`: what ckptgw is for, end to end.

1. A reference run trains a small model on the CPU without interruption (on the local disk).
2. Node A mounts a gateway and runs the same job, checkpointing every few steps with plain
   ``torch.save`` (temp + fsync + rename) into the mount. The gateway drains each checkpoint to
   the store in the background.
3. Midway the trainer is killed with SIGKILL, as a spot preemption would, and the node goes
   away: its gateway gets SIGTERM (drains what is left) and its cache is deleted.
4. Node B, a fresh node with an empty cache, mounts the same store, and the job resumes there
   from the newest complete checkpoint (model, optimizer, LR scheduler, RNGs and step).
5. The resumed loss curve must match the reference step for step. The curves go to a PNG, and
   the demo ends with the retention plan for the run.

    python -m bench.demo [--store URL] [--endpoint-url URL] [--steps 120] [--every 10]
                         [--kill-at 75] [--out bench/results]

Without ``--store``, the store is a directory (``file://``) in the demo's temp dir.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from ckptgw.gateway.harness import Gateway, exit_on_sigterm

HERE = Path(__file__).resolve().parent


def say(msg: str) -> None:
    print(f"\n[demo] {msg}", flush=True)


def losses(path: Path) -> dict[int, float]:
    out: dict[int, float] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.endswith("}"):  # a line cut short by SIGKILL is not a step
                rec = json.loads(line)
                out[rec["step"]] = rec["loss"]
    return out


def trainer(*args: str) -> list[str]:
    return [sys.executable, "-m", "bench.train", *args]


def run_until(cmd: list[str], loss_log: Path, kill_at: int) -> subprocess.Popen[bytes]:
    """Start the trainer; SIGKILL it once it has logged step ``kill_at``."""
    proc = subprocess.Popen(cmd, cwd=HERE.parent)
    while proc.poll() is None:
        if max(losses(loss_log), default=0) >= kill_at:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            break
        time.sleep(0.05)
    return proc


def plot(
    reference: dict[int, float],
    a: dict[int, float],
    b: dict[int, float],
    resumed: int,
    killed: int,
    out: Path,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5))
    ax.plot(
        list(reference),
        list(reference.values()),
        color="0.75",
        lw=6,
        label="reference (uninterrupted, local disk)",
    )
    ax.plot(list(a), list(a.values()), color="tab:blue", lw=1.6, label="node A (through the mount)")
    ax.plot(
        list(b),
        list(b.values()),
        color="tab:orange",
        lw=1.6,
        ls="--",
        label=f"node B (fresh cache, resumed from step {resumed})",
    )
    ax.axvline(killed, color="tab:red", ls=":", lw=1.2)
    ax.annotate(
        "SIGKILL",
        (killed, max(reference.values())),
        color="tab:red",
        xytext=(4, -12),
        textcoords="offset points",
    )
    ax.axvline(resumed, color="tab:green", ls=":", lw=1.2)
    ax.annotate(
        f"resume (step {resumed})",
        (resumed, max(reference.values())),
        color="tab:green",
        xytext=(-4, -26),
        textcoords="offset points",
        ha="right",
    )
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (MSE)")
    ax.set_yscale("log")
    ax.set_title("ckptgw demo: a preempted run resumed on a fresh node matches the reference")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main() -> None:
    exit_on_sigterm()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", help="s3://BUCKET[/PREFIX] or file:///DIR (default: a temp dir)")
    ap.add_argument("--endpoint-url", help="for an S3-compatible store")
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--kill-at", type=int, default=75)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args()
    if not 0 < args.every < args.kill_at < args.steps:
        ap.error("need 0 < --every < --kill-at < --steps")

    t_start = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="ckptgw-demo-", dir="/var/tmp"))
    os.environ["CKPTGW_RUNTIME_DIR"] = str(work / "run")  # the demo's gateways are its own
    store = args.store or f"file://{work / 'store'}"
    if store.startswith("s3://"):
        # A prefix of its own, so that the demo never touches anything else in the bucket.
        store = f"{store.rstrip('/')}/ckptgw-demo-{uuid.uuid4().hex[:8]}"
    config = work / "ckptgw.toml"
    config.write_text(
        "[[retention]]\n"
        'run = "run1"\n'
        "keep_last = 2\n"
        f"keep_every = {args.every * 5}\n"
        "min_age = 0\n"
        'marker = "COMPLETE"\n'
    )
    extra = ["--config", str(config)]
    if args.endpoint_url:
        extra += ["--endpoint-url", args.endpoint_url]
    node_a = Gateway(work / "nodeA" / "mnt", work / "nodeA" / "cache", store, *extra)
    node_b = Gateway(work / "nodeB" / "mnt", work / "nodeB" / "cache", store, *extra)
    steps = ["--steps", str(args.steps), "--every", str(args.every)]
    try:
        say(f"1/5 reference run: {args.steps} steps without interruption, on the local disk")
        ref_log = work / "reference.jsonl"
        subprocess.run(trainer(*steps, "--losses", str(ref_log)), cwd=HERE.parent, check=True)
        reference = losses(ref_log)

        say(f"2/5 node A: mount {node_a.mountpoint} -> {store}")
        node_a.start()
        run_a = node_a.mountpoint / "run1"
        log_a = work / "nodeA.jsonl"
        print(f"training; checkpoints every {args.every} steps go to {run_a}", flush=True)
        proc = run_until(
            trainer(*steps, "--run", str(run_a), "--losses", str(log_a)), log_a, args.kill_at
        )
        if proc.returncode != -signal.SIGKILL:
            raise SystemExit(f"[demo] FAILED: the trainer exited with {proc.returncode}")
        a = losses(log_a)
        killed = max(a)

        say(f"3/5 preemption: trainer SIGKILLed after step {killed}. Node A's gateway now:")
        print(node_a.cli("status", str(node_a.mountpoint)).stdout, flush=True)
        say("the node shuts down: SIGTERM to node A's gateway, which drains what is left")
        node_a.terminate()
        for line in (node_a.cache_dir / "ckptgw.log").read_text().splitlines()[-4:]:
            print("  log: " + line, flush=True)
        shutil.rmtree(work / "nodeA")
        print("node A is gone, and its cache with it", flush=True)

        say(f"4/5 node B: a fresh node, empty cache, mounts the same store at {node_b.mountpoint}")
        node_b.start()
        run_b = node_b.mountpoint / "run1"
        visible = sorted(p.name for p in run_b.iterdir())
        print(f"checkpoints visible on node B: {', '.join(visible)}", flush=True)
        log_b = work / "nodeB.jsonl"
        subprocess.run(
            trainer(*steps, "--run", str(run_b), "--losses", str(log_b), "--resume"),
            cwd=HERE.parent,
            check=True,
        )
        b = losses(log_b)
        resumed = min(b) - 1

        say("5/5 the loss curve, step by step, against the reference")
        combined = {s: v for s, v in a.items() if s <= resumed} | b
        mismatched = [s for s in reference if combined.get(s) != reference[s]]
        lost = killed - resumed
        print(
            f"node A ran steps 1-{killed}; node B resumed from checkpoint step {resumed} "
            f"(steps {resumed + 1}-{killed} were recomputed: {lost} steps lost to the preemption, "
            f"at most {args.every}); node B ran to step {max(b)}",
            flush=True,
        )
        args.out.mkdir(parents=True, exist_ok=True)
        png = args.out / "demo_loss.png"
        plot(reference, a, b, resumed, killed, png)
        print(f"loss curves: {png}", flush=True)
        if mismatched or set(combined) != set(reference):
            raise SystemExit(
                f"[demo] FAILED: {len(mismatched)} steps differ from the reference "
                f"(first: {mismatched[:5]})"
            )
        recomputed = range(resumed + 1, killed + 1)
        differ = [s for s in recomputed if a[s] != b[s]]
        same = (
            f"the {len(recomputed)} recomputed steps equal node A's"
            if not differ
            else f"{len(differ)} of the {len(recomputed)} recomputed steps differ from node A's "
            f"(first: step {differ[0]})"
        )
        print(
            f"all {len(reference)} steps identical to the reference (bit for bit); {same}",
            flush=True,
        )
        node_b.cli("flush", str(run_b), "--wait", "--timeout", "120")
        print(node_b.cli("status", str(node_b.mountpoint)).stdout, flush=True)
        say(
            "retention for run1 (keep_last 2, milestones every "
            f"{args.every * 5} steps); `ckptgw lifecycle apply` would carry this out"
        )
        print(node_b.cli("lifecycle", "plan", str(node_b.mountpoint)).stdout, flush=True)
        node_b.stop(timeout=120, drain=True)
        say(f"demo OK in {time.monotonic() - t_start:.0f} s; mounts cleaned up")
    finally:
        node_a.stop()
        node_b.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
