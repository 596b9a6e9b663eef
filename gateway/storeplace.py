"""Where a store keeps its objects, as far as losing this node goes.

A checkpoint must survive the node that wrote it. An ``s3://`` store does; a ``file://`` store
does only on a filesystem shared with other machines (NFS, Lustre, CephFS, ...). On this
node's own disks it is lost with the node, so ``mount`` refuses such a store unless it is
asked for (``--allow-local-store``), and every view then calls its data "durable (local
store)", never plain durable."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from ckptgw.gateway.mountpoint import existing_parent, unescape
from ckptgw.store.url import StoreURL

# Filesystems whose data lives on other machines (or on storage other machines mount).
SHARED_FSTYPES = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "ceph",
        "glusterfs",
        "lustre",
        "gpfs",
        "beegfs",
        "panfs",
        "orangefs",
        "pvfs2",
        "afs",
        "gfs2",
        "ocfs2",
        "9p",
        "virtiofs",
        "wekafs",
        "quobyte",
    }
)


@dataclass(frozen=True)
class Place:
    """The filesystem that holds a path: its type and where it is mounted."""

    fstype: str
    mountpoint: str

    @property
    def shared(self) -> bool:
        """Whether its data is elsewhere than this node's own disks. Other FUSE filesystems
        (sshfs, s3fs, JuiceFS, ...) are counted as shared: which of them keep data on this node
        cannot be told from here."""
        return self.fstype in SHARED_FSTYPES or (
            self.fstype.startswith("fuse.") and self.fstype != "fuse.ckptgw"
        )

    def __str__(self) -> str:
        return f"{self.fstype} at {self.mountpoint}"


def place_of(path: Path) -> Place:
    """The mount that holds ``path`` (or its nearest existing parent), from mountinfo."""
    target = os.path.realpath(existing_parent(path))
    best = Place("unknown", "/")
    best_len = -1
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            try:
                sep = fields.index("-")
            except ValueError:
                continue
            mp = unescape(fields[4])
            inside = target == mp or target.startswith(mp.rstrip("/") + "/")
            if inside and len(mp) >= best_len:  # the last mount listed on a path is on top
                best, best_len = Place(fields[sep + 1], mp), len(mp)
    return best


def local_store(url: StoreURL) -> Place | None:
    """Where a store on this node's own disks is; None for a store that survives the node."""
    if url.scheme != "file":
        return None
    place = place_of(Path(url.prefix))
    return None if place.shared else place


def local_store_problem(url: StoreURL, cache_dir: Path) -> str:
    """Why a mount refuses a local store, and what to do instead, in one line."""
    place = local_store(url)
    assert place is not None
    devices = {existing_parent(p).stat().st_dev for p in (Path(url.prefix), cache_dir)}
    disk = "the same disk as the cache" if len(devices) == 1 else "this node's own disk"
    return (
        f"store {url} is on {disk} ({place}): a checkpoint there is lost with this node. "
        "Use --store s3://BUCKET/PREFIX (or a file:// store on a shared filesystem such as "
        "NFS), or pass --allow-local-store (store.allow_local) to keep checkpoints on this "
        "node only"
    )


def local_store_warning(url: StoreURL) -> str:
    place = local_store(url)
    return (
        f"store {url} is on this node ({place}), allowed by --allow-local-store: checkpoints "
        "are not safe from losing this node"
    )


def endpoint_on_this_node(endpoint_url: str | None) -> bool:
    """Whether an S3 endpoint is a loopback address (MinIO on this node, or a proxy to storage
    elsewhere: which of the two cannot be told from here, so this is never a refusal)."""
    host = urlsplit(endpoint_url or "").hostname
    if host is None:
        return False
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
