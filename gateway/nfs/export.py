"""The NFS export of a gateway mount: its settings (``[nfs]`` and the ``serve nfs`` flags), what
the node must have before NFS-Ganesha can serve it, and Ganesha's config file.

Ganesha's FSAL_VFS serves the FUSE mount by file handle (``name_to_handle_at`` and
``open_by_handle_at``); the mount answers the kernel's lookups of "." by inode number from the
journal, so a handle outlives the kernel forgetting its inode. Ganesha names the file system in
each handle by the export's ``Filesystem_id``, fixed from the mountpoint (``fsid_type =
Major64``), not by the device number the kernel gives out anew at each mount, so clients'
handles keep working after the gateway is mounted again (docs/deploy/nfs.md)."""

from __future__ import annotations

import contextlib
import glob
import ipaddress
import shutil
import socket
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptgw.gateway.config import read_config_file
from ckptgw.gateway.errors import UserError
from ckptgw.gateway.mountpoint import mount_options
from ckptgw.gateway.settings import BY_NAME, default

RPCBIND_SOCKET = "/run/rpcbind.sock"
INSTALL = "apt-get install nfs-ganesha nfs-ganesha-vfs"


@dataclass(frozen=True)
class Export:
    mountpoint: Path  # the gateway's FUSE mount, the directory exported
    pseudo: str  # the path clients mount
    clients: tuple[str, ...]  # CIDR networks, read-write
    listen: tuple[str, int]
    mount_port: int
    protocols: tuple[int, ...]
    root_squash: bool
    grace: float

    def describe(self) -> dict[str, Any]:
        """The export as status shows it."""
        host, port = self.listen
        return {
            "export": self.pseudo,
            "listen": f"{host}:{port}",
            "clients": list(self.clients),
            "protocols": list(self.protocols),
            "root_squash": self.root_squash,
            "mount_port": self.mount_port,
        }


def load_export(
    mountpoint: Path,
    config_file: str | None = None,
    *,
    listen: str | None = None,
    export: str | None = None,
    clients: str | None = None,
    protocols: str | None = None,
    root_squash: bool | None = None,
) -> Export:
    """The export from the [nfs] section of ``config_file`` (checked whole, as ``mount`` checks
    it), overridden by the flags."""
    table = read_config_file(Path(config_file)).get("nfs", {}) if config_file else {}

    def get(key: str, override: object = None) -> Any:
        return BY_NAME[f"nfs.{key}"].read(table, override)

    pseudo = get("export", export)
    if not pseudo.startswith("/") or pseudo == "/" or "//" in pseudo or "\n" in pseudo:
        raise UserError(
            f"nfs.export = {pseudo!r}: give an absolute path below /, e.g. /checkpoints"
        )
    nets = get("clients", clients)
    if not nets:
        raise UserError(
            "serve nfs needs the client networks allowed to mount: --clients CIDR[,CIDR...] "
            "(nfs.clients), e.g. --clients 10.0.0.0/16"
        )
    return Export(
        mountpoint=mountpoint,
        pseudo=pseudo.rstrip("/"),
        clients=nets,
        listen=get("listen", listen) or default("nfs.listen"),  # "" means the default here
        mount_port=get("mount_port"),
        protocols=get("protocols", protocols),
        root_squash=get("root_squash", root_squash),
        grace=get("grace"),
    )


def ganesha_binary() -> str:
    exe = shutil.which("ganesha.nfsd") or shutil.which("ganesha.nfsd", path="/usr/bin:/usr/sbin")
    if exe is None:
        raise UserError(f"NFS-Ganesha is not installed ({INSTALL})")
    return exe


def who_may_write(root: Path, root_squash: bool) -> str:
    """How clients may write at the export's root, from its owner and mode: a client's root
    is squashed to nobody (65534) unless asked otherwise, and every other user acts as its own
    uid, so the root's owner and mode decide who may create there."""
    st = root.stat()
    mode = st.st_mode & 0o7777
    if mode & 0o002:
        who = "every client user may create files in it"
    else:
        who = f"only uid {st.st_uid}" + (f" and gid {st.st_gid}" if mode & 0o020 else "")
        who += " may create files in it"
    squash = (
        "a client's root acts as nobody (uid 65534)"
        if root_squash
        else "a client's root acts as root"
    )
    hint = (
        ""
        if mode & 0o002 or not root_squash
        else f"; give each user a directory of their own (mkdir, chown on this node) or "
        f"chmod 1777 {root}"
    )
    return f"{root} is uid {st.st_uid} gid {st.st_gid} mode {mode:04o}: {who} ({squash}){hint}"


def host_problem(export: Export) -> str | None:
    """Why this node cannot serve the export, or None."""
    try:
        ganesha_binary()
    except UserError as e:
        return str(e)
    if not glob.glob("/usr/lib/*/ganesha/libfsalvfs.so") + glob.glob(
        "/usr/lib*/ganesha/libfsalvfs.so"
    ):
        return f"NFS-Ganesha's VFS backend is not installed ({INSTALL})"
    if "allow_other" not in mount_options(export.mountpoint):
        return (
            f"{export.mountpoint} is mounted without --allow-other: NFS clients reach it as "
            "their own users, so mount it again with --allow-other (mount.allow_other)"
        )
    if 3 in export.protocols and not rpcbind_running():
        return (
            "NFSv3 needs rpcbind running on this node (apt-get install rpcbind; "
            "systemctl enable --now rpcbind.socket), or serve NFSv4 only: --protocols 4"
        )
    return None


def rpcbind_running() -> bool:
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as s:
        s.connect(RPCBIND_SOCKET)
        return True
    with contextlib.suppress(OSError):
        socket.create_connection(("127.0.0.1", 111), timeout=1.0).close()
        return True
    return False


def ganesha_conf(export: Export, state_dir: Path) -> str:
    """NFS-Ganesha's config for the export (its log, pid file and NFSv4 recovery records are in
    ``state_dir``)."""
    host, port = export.listen
    bind = "" if ipaddress.ip_address(host).is_unspecified else f"\n  Bind_addr = {host};"
    versions = ", ".join(str(v) for v in export.protocols)
    grace = (
        "Graceless = true;"
        if export.grace <= 0
        else f"Graceless = false;\n  Grace_Period = {max(int(export.grace), 1)};"
    )
    squash = "Root_Squash" if export.root_squash else "No_Root_Squash"
    # The file system's id clients see in attributes: the same for every mount at this path
    # (Ganesha's default is taken from the mount's device number, new at each mount).
    fsid = f"{zlib.crc32(str(export.mountpoint).encode())}.1"
    return f"""# Written by ckptgw serve nfs for {export.mountpoint} at every start.
NFS_CORE_PARAM {{
  Protocols = {versions};
  NFS_Port = {port};
  MNT_Port = {export.mount_port};{bind}
  Enable_NLM = false;
  Enable_RQUOTA = false;
  Enable_UDP = false;
  mount_path_pseudo = true;
}}
NFSV4 {{
  RecoveryBackend = fs;
  RecoveryRoot = "{state_dir / "recovery"}";
  {grace}
  # sec=sys: owners travel as numbers ("1000"), as the Linux client sends them without
  # idmapd; names would need the same users and domain on every node, else all is nobody.
  Only_Numeric_Owners = true;
}}
NFS_KRB5 {{
  Active_krb5 = false;
}}
EXPORT_DEFAULTS {{
  Access_Type = None;
}}
EXPORT {{
  Export_Id = 1;
  Filesystem_id = {fsid};
  Path = "{export.mountpoint}";
  Pseudo = "{export.pseudo}";
  Protocols = {versions};
  Transports = TCP;
  SecType = sys;
  Squash = {squash};
  Anonymous_Uid = 65534;
  Anonymous_Gid = 65534;
  Access_Type = None;
  FSAL {{
    Name = VFS;
    # File handles name the file system by its id. A FUSE mount has none (f_fsid 0), so
    # Ganesha would use the device number, which the kernel hands out anew at each mount:
    # every handle would be stale after the gateway is mounted again. Major64 keeps only the
    # device's major number, 0 for every FUSE mount, so handles outlive a remount (their
    # inode part is stable: fsops.journal). One FUSE file system per Ganesha, as here.
    fsid_type = Major64;
  }}
  CLIENT {{
    Clients = {", ".join(export.clients)};
    Access_Type = RW;
  }}
}}
MDCACHE {{
  # NFSv3 has no CLOSE: Ganesha closes a file once it is idle. Keep no idle file open, so a
  # file a client has finished is closed on the mount within a second or two and drains.
  FD_HWMark_Percent = 1;
  FD_LWMark_Percent = 0;
  LRU_Run_Interval = 1;
}}
LOG {{
  Default_Log_Level = EVENT;
}}
"""


def connected_clients(ganesha_pid: int, ports: tuple[int, ...]) -> list[str]:
    """The addresses with a TCP connection to the NFS or MOUNT port, as Ganesha's own network
    namespace sees them (/proc/PID/net/tcp and tcp6)."""
    found: set[str] = set()
    for name, width in (("tcp", 4), ("tcp6", 16)):
        try:
            with open(f"/proc/{ganesha_pid}/net/{name}") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) < 4 or fields[3] != "01":  # 01: ESTABLISHED
                continue
            local, remote = fields[1], fields[2]
            if int(local.rsplit(":", 1)[1], 16) in ports:
                found.add(_address(remote.rsplit(":", 1)[0], width))
    return sorted(found)


def _address(hexed: str, width: int) -> str:
    raw = bytes.fromhex(hexed)
    # /proc prints each 32-bit word in host (little-endian) order
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, width, 4))
    addr = ipaddress.ip_address(words)
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return str(addr.ipv4_mapped)
    return str(addr)
