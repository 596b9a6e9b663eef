"""Which names the filesystem accepts: only names that can become object keys.

A path in the mount becomes the object key ``prefix + path``. S3 keys are UTF-8 and at most
1,024 bytes, so a name that is not UTF-8, or a path whose key would be longer, is refused when
it is created (create, mkdir, symlink, mknod, rename) instead of failing later in the drain.
Names starting with ``.ckptgw-`` are the gateway's (``.ckptgw-pins/``, doctor's test objects),
at every level, and get ``EPERM``.
"""

from __future__ import annotations

import errno

from ckptgw.fsops.inodes import fs_error

NAME_MAX = 255
KEY_MAX = 1024
RESERVED = b".ckptgw-"  # the gateway's own names (pins, directory markers), never files


class KeyRules:
    def __init__(self, prefix: str) -> None:
        self.prefix_len = len(prefix.encode())

    def check_name(self, name: bytes) -> None:
        if len(name) > NAME_MAX:
            raise fs_error(errno.ENAMETOOLONG)
        try:
            name.decode("utf-8")
        except UnicodeDecodeError:
            raise fs_error(errno.EILSEQ) from None

    def check_key(self, parent_components: list[bytes], name: bytes, subtree: int = 0) -> None:
        """Refuse ``parent/name`` (plus ``subtree`` bytes of descendants) if its key is too long,
        and the reserved names."""
        if name.startswith(RESERVED):
            raise fs_error(errno.EPERM)
        path_len = sum(len(c) + 1 for c in parent_components) + len(name) + subtree
        if self.prefix_len + path_len > KEY_MAX:
            raise fs_error(errno.ENAMETOOLONG)
