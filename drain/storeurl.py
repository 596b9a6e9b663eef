"""Store URLs: ``s3://BUCKET[/PREFIX]`` and ``file:///ABS/PATH``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

# S3 bucket naming rules: 3-63 characters, lower case letters, digits, dots and hyphens,
# starting and ending with a letter or digit.
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


class StoreURLError(ValueError):
    pass


@dataclass(frozen=True)
class StoreURL:
    scheme: str  # "s3" or "file"
    bucket: str  # s3 only
    prefix: str  # s3: key prefix ("" or ending in "/"); file: the directory
    url: str  # normalised form

    @property
    def key_prefix(self) -> str:
        """What goes in front of a path in the mount to make its object key."""
        return self.prefix if self.scheme == "s3" else ""

    def __str__(self) -> str:
        return self.url


def parse_store_url(text: str) -> StoreURL:
    expected = "expected s3://BUCKET[/PREFIX] or file:///ABSOLUTE/PATH"
    parts = urlsplit(text)
    if parts.scheme == "s3":
        bucket = parts.netloc
        if parts.username is not None or parts.password is not None or ":" in bucket:
            raise StoreURLError("bad store URL: credentials do not belong in the URL")
        if not _BUCKET.match(bucket) or ".." in bucket:
            raise StoreURLError(f"bad store URL {text!r}: {bucket!r} is not a valid bucket name")
        if parts.query or parts.fragment:
            raise StoreURLError(f"bad store URL {text!r}: {expected}")
        prefix = parts.path.strip("/")
        if "//" in prefix:
            raise StoreURLError(f"bad store URL {text!r}: empty path component in the prefix")
        prefix = prefix + "/" if prefix else ""
        return StoreURL("s3", bucket, prefix, f"s3://{bucket}/{prefix}")
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise StoreURLError(f"bad store URL {text!r}: {expected}")
        path = "/" + parts.path.strip("/")
        return StoreURL("file", "", path, f"file://{path}")
    raise StoreURLError(f"bad store URL {text!r}: {expected}")
