"""One rank of a node: builds its shard of the training state once, then saves it (temp + fsync
+ rename) each time the parent says where, like ranks that checkpoint at the same moment.

The parent reads ``ready`` once, then writes a directory per line; the rank answers each with
the CLOCK_MONOTONIC time at which its save returned (comparable across processes).

    python -m bench.rank --rank R --bytes N
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from bench.workloads import save_atomic, state_dict


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--bytes", type=int, required=True)
    args = ap.parse_args()
    shard = state_dict(args.bytes, layers=12, seed=args.rank)
    print("ready", flush=True)
    for line in sys.stdin:
        target = Path(line.strip()) / f"rank_{args.rank}.pt"
        save_atomic(shard, target)
        print(time.monotonic(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
