"""What a process has used, from /proc: CPU seconds and peak resident memory."""

from __future__ import annotations

import contextlib
import os


def _stat(pid: int) -> list[str]:
    """/proc/PID/stat's fields after the command name: state, ppid, ... utime is [11]."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def cpu_seconds(pid: int) -> float:
    fields = _stat(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    """The live child processes of ``pid`` (the daemon's: its part workers)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                state, ppid = _stat(int(entry))[:2]
            except OSError:
                continue
            if int(ppid) == pid and state != "Z":
                out.append(int(entry))
    return out


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of ``pid``, its live children and the children it has reaped."""
    fields = _stat(pid)
    total = sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    for child in children(pid):
        with contextlib.suppress(OSError):  # ended meanwhile (once reaped: counted above)
            total += cpu_seconds(child)
    return total


def tree_peak_rss(pid: int) -> int:
    """The peak resident memory of ``pid`` plus its live children's (each its own VmHWM)."""
    total = peak_rss(pid)
    for child in children(pid):
        with contextlib.suppress(OSError, RuntimeError):
            total += peak_rss(child)
    return total


def peak_rss(pid: int) -> int:
    """VmHWM in bytes: the most resident memory the process has had."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmHWM for pid {pid}")
