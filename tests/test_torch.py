"""Real torch through the mount: torch.save/torch.load with temp + fsync + rename, and
torch.distributed.checkpoint saved and loaded by 2 processes (gloo)."""

from __future__ import annotations

import os
import socket

import pytest

from tests.conftest import GatewayFactory, needs_fuse

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.mount, pytest.mark.torch, needs_fuse]


def training_state(seed: int) -> dict[str, object]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss = model(torch.randn(32, 256)).square().mean()
    loss.backward()
    opt.step()
    return {
        "model": model.state_dict(),
        "optim": opt.state_dict(),
        "step": 7,
        "rng": torch.get_rng_state(),
    }


def test_save_fsync_rename_then_load_after_remount(gateway: GatewayFactory) -> None:
    gw = gateway()
    state = training_state(0)
    d = gw.mountpoint / "run1" / "step_7"
    d.mkdir(parents=True)
    tmp, final = d / "ckpt.pt.tmp", d / "ckpt.pt"
    torch.save(state, tmp)
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.rename(tmp, final)
    dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(dfd)
    os.close(dfd)
    gw.stop()
    gw.start()
    loaded = torch.load(final, weights_only=True)
    assert loaded["step"] == 7
    for k, v in state["model"].items():  # type: ignore[attr-defined]
        assert torch.equal(loaded["model"][k], v)
    assert torch.equal(loaded["rng"], state["rng"])
    assert loaded["optim"]["state"][0]["exp_avg"].shape == (512, 256)
    assert sorted(os.listdir(d)) == ["ckpt.pt"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _dcp_rank(rank: int, world: int, port: int, ckpt: str, mode: str) -> None:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        torch.manual_seed(100 + rank)
        mine = {"weights": torch.randn(1 << 18), "bias": torch.full((7,), float(rank))}
        if mode == "save":
            dcp.save({f"rank{rank}": mine}, checkpoint_id=ckpt)
        else:
            target = {f"rank{rank}": {"weights": torch.zeros(1 << 18), "bias": torch.zeros(7)}}
            dcp.load(target, checkpoint_id=ckpt)
            for k, v in mine.items():
                assert torch.equal(target[f"rank{rank}"][k], v), k
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_distributed_checkpoint_two_ranks(gateway: GatewayFactory) -> None:
    import torch.multiprocessing as mp

    gw = gateway()
    ckpt = str(gw.mountpoint / "dcp" / "step_100")
    mp.spawn(_dcp_rank, args=(2, _free_port(), ckpt, "save"), nprocs=2, join=True)
    files = sorted(os.listdir(ckpt))
    assert ".metadata" in files and len([f for f in files if f.endswith(".distcp")]) == 2
    gw.stop()
    gw.start()
    mp.spawn(_dcp_rank, args=(2, _free_port(), ckpt, "load"), nprocs=2, join=True)
