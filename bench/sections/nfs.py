"""Files written through the NFS gateway mode (:mod:`bench.nfs`) against the FUSE mount and
the disk."""

from __future__ import annotations

import statistics

from bench import nfs
from bench.common import (
    Bench,
    Row,
    mib,
    say,
)


def nfs_writes(b: Bench, size: int, n: int) -> None:
    x = mib(size) if n == 1 else f"{n}x{mib(size)}"
    say(f"\n## NFS gateway: {n} writer(s), {mib(size)} each: NFS vs FUSE mount vs disk")
    s = nfs.nfs_rounds(b, size, n)
    b.samples[f"nfs {n} {b.path}"] = {"file_bytes": size, "samples": s}
    med = {k: statistics.median(v) for k, v in s.items()}
    b.add(
        Row("write + fsync (mount)", x, "disk", med["disk"], med["mount"], "s"),
        Row("write + fsync (NFS)", x, "disk", med["disk"], med["nfs"], "s"),
        Row("write + fsync (NFS/mount)", x, "FUSE mount", med["mount"], med["nfs"], "s"),
    )
    if "nfs4" in med:  # libnfs 5 built into the venv (make test)
        b.add(
            Row("write + fsync (NFSv4)", x, "disk", med["disk"], med["nfs4"], "s"),
            Row("write + fsync (NFSv4/mount)", x, "FUSE mount", med["mount"], med["nfs4"], "s"),
            Row("write + fsync (NFSv4 floor)", x, "disk", med["disk"], med["floor4"], "s"),
            Row(
                "write + fsync (NFSv4/floor)",
                x,
                "Ganesha, plain dir",
                med["floor4"],
                med["nfs4"],
                "s",
            ),
        )
