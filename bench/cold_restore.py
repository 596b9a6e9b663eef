"""Cold restore: ``torch.load`` of a 1 GiB checkpoint through a fresh gateway (an empty cache,
like a new node after a failure) against boto3's ``download_file`` of the same object from the
same S3 server (moto on loopback), with the same chunk size and concurrency. Also the same
load from a warm cache, and boto3 download + ``torch.load`` of the local copy.

    python -m bench.cold_restore [--size-mib 1024] [--runs 3]

Target (issue 4): the cold load at most 1.0x boto3 ``download_file``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import boto3
import torch
from boto3.s3.transfer import TransferConfig

from bench.drain_time import CREDS, wait_for_object
from bench.results import save
from bench.save_stall import save_atomic, state_dict
from gateway.harness import Gateway, exit_on_sigterm
from tests.s3server import moto_server

CHUNK = 8 << 20
CONCURRENCY = 8


def main() -> None:
    exit_on_sigterm()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    os.environ.update(CREDS)
    work = Path(tempfile.mkdtemp(prefix="ckptgw-restore-", dir=args.workdir))
    res: dict[str, list[float]] = {"cold_s": [], "warm_s": [], "boto3_s": [], "boto3_load_s": []}
    try:
        with moto_server() as endpoint:
            s3 = boto3.client("s3", endpoint_url=endpoint)
            s3.create_bucket(Bucket="bench")
            cfg = work / "gw.toml"
            cfg.write_text(
                f'[cache]\nfetch_chunk = "{CHUNK >> 20}MiB"\nfetch_parallel = {CONCURRENCY}\n'
            )

            def node(name: str) -> Gateway:
                return Gateway(
                    work / name / "mnt",
                    work / name / "cache",
                    "s3://bench/gw/",
                    "--endpoint-url",
                    endpoint,
                    "--config",
                    str(cfg),
                    env={"CKPTGW_RUNTIME_DIR": str(work / "run")},
                )

            key = "step_1/ckpt.pt"
            sd = state_dict(args.size_mib << 20)
            with node("writer") as gw:
                (gw.mountpoint / "step_1").mkdir()
                save_atomic(sd, gw.mountpoint / key)
                size = (gw.mountpoint / key).stat().st_size
                wait_for_object(s3, f"gw/{key}", size)
            del sd
            tc = TransferConfig(
                multipart_threshold=CHUNK, multipart_chunksize=CHUNK, max_concurrency=CONCURRENCY
            )
            local = work / "download.pt"
            for i in range(args.runs):
                shutil.rmtree(work / "reader", ignore_errors=True)
                with node("reader") as gw:  # a fresh node: empty cache
                    t0 = time.perf_counter()
                    cold = torch.load(gw.mountpoint / key, weights_only=True)
                    cold_s = time.perf_counter() - t0
                    del cold
                    t0 = time.perf_counter()
                    warm = torch.load(gw.mountpoint / key, weights_only=True)
                    warm_s = time.perf_counter() - t0
                    del warm
                t0 = time.perf_counter()
                s3.download_file("bench", f"gw/{key}", str(local), Config=tc)
                boto3_s = time.perf_counter() - t0
                loaded = torch.load(local, weights_only=True)
                boto3_load_s = time.perf_counter() - t0
                del loaded
                local.unlink()
                for k, v in (
                    ("cold_s", cold_s),
                    ("warm_s", warm_s),
                    ("boto3_s", boto3_s),
                    ("boto3_load_s", boto3_load_s),
                ):
                    res[k].append(v)
                print(
                    f"  run {i}: cold load {cold_s:6.2f} s, warm load {warm_s:6.2f} s, "
                    f"boto3 download_file {boto3_s:6.2f} s (+ load {boto3_load_s:6.2f} s)",
                    flush=True,
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in res.items()}
    ratio = med["cold_s"] / med["boto3_s"]
    print()
    print(f"{'metric (median of ' + str(args.runs) + ')':44} {'seconds':>8} {'vs boto3':>9}")
    for label, k in (
        ("torch.load through a fresh mount (cold)", "cold_s"),
        ("torch.load through the mount (warm cache)", "warm_s"),
        ("boto3 download_file", "boto3_s"),
        ("boto3 download_file + torch.load", "boto3_load_s"),
    ):
        print(f"{label:44} {med[k]:8.2f} {med[k] / med['boto3_s']:8.2f}x")
    print(
        f"cold load vs boto3 download_file: {ratio:.2f}x (target <= 1.00: "
        f"{'MET' if ratio <= 1.0 else 'MISSED'})"
    )
    save(
        "cold_restore",
        {
            "bytes": size,
            "chunk": CHUNK,
            "concurrency": CONCURRENCY,
            "samples": res,
            "median": med,
            "ratio": ratio,
        },
    )


if __name__ == "__main__":
    main()
