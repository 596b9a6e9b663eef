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
        # One "/" may end the prefix; any other empty component ("s3://b//p", "p//q", "p//")
        # would be part of every key (S3 keys are not paths), so it is refused, not dropped.
        path = parts.path.removeprefix("/")
        components = path.split("/") if path else []
        if components and components[-1] == "":
            components.pop()
        path = "/".join(components)
        if "" in components:
            fixed = "/".join(c for c in components if c)
            raise StoreURLError(
                f"bad store URL {text!r}: empty path component (//) in the key prefix; "
                f"write s3://{bucket}{'/' if fixed else ''}{fixed}"
            )
        prefix = path + "/" if path else ""
        return StoreURL("s3", bucket, prefix, f"s3://{bucket}/{prefix}")
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise StoreURLError(f"bad store URL {text!r}: {expected}")
        # A directory: "//" means "/" to the kernel, so it is normalised away (one spelling
        # per store, which is what the cache dir's binding to its store compares).
        path = "/" + "/".join(c for c in parts.path.split("/") if c)
        return StoreURL("file", "", path, f"file://{path}")
    raise StoreURLError(f"bad store URL {text!r}: {expected}")


def without_userinfo(url: str) -> str:
    """An endpoint URL as it may be shown: a user and password in it left out (the config
    refuses them, but AWS_ENDPOINT_URL_S3 or a profile's endpoint_url may carry them)."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()
