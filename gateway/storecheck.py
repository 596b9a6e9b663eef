"""What a failed store check means for the user: something only they can fix, or something
that may pass by itself.

``mount`` (and ``doctor``) check the store before anything is written. A mount that went ahead
against a misspelled bucket would take checkpoints that can never drain, so an error that
will not pass by itself fails the mount with one line that says what to fix; one that may pass
(the store unreachable for now, a 5xx) mounts with a warning, and the drain keeps retrying."""

from __future__ import annotations

import socket
from collections.abc import Callable
from urllib.parse import urlsplit

from ckptgw.store.interface import CREDENTIAL_CODES, StoreError
from ckptgw.store.url import StoreURL

DEFAULT_S3_HOST = "s3.amazonaws.com"  # where the client goes without an endpoint URL

# getaddrinfo's "no such name" (EAI_NONAME): the host name is wrong, not the network down
# ("Temporary failure in name resolution", EAI_AGAIN, may pass).
_NO_SUCH_HOST = ("Name or service not known", "nodename nor servname provided")

# Codes whose fix says all the store's message would (a second copy of it would only repeat).
_SAYS_ALL = {"NoSuchBucket", "RequestTimeTooSkewed"}


SYNC_CLOCK = "sync it (timedatectl set-ntp true, or chronyc makestep)"


def explain(e: StoreError, url: StoreURL, endpoint_url: str | None) -> tuple[str, bool]:
    """``e`` in one line that says what to do, and whether only the user can fix it (a mount
    then fails; otherwise it may pass by itself)."""
    fix = what_to_fix(e, url, endpoint_url)
    if fix is None:
        return f"store {url}: {e}", False
    if e.code in _SAYS_ALL:
        return f"store {url}: {fix}", True
    return f"store {url}: {e}: {fix}", True


def may_come_right(
    e: StoreError,
    endpoint_url: str | None,
    resolve: Callable[[str, int], object] = socket.getaddrinfo,
) -> bool:
    """Whether an error only the user can fix may still be a node that is starting: credentials
    from an instance role not served yet, the network not up. Worth a bounded wait at mount;
    a missing bucket, refused credentials or an endpoint whose name does not exist are not.
    The S3 client's message does not say why it could not connect, so the endpoint's name is
    resolved here (blocking: call it on a worker thread): "no such name" is final, "try
    again" (no DNS yet) is not."""
    if e.code == "NoCredentials":
        return True
    if e.code != "Transport" or any(s in str(e) for s in _NO_SUCH_HOST):
        return False
    host = urlsplit(endpoint_url).hostname if endpoint_url else DEFAULT_S3_HOST
    try:
        resolve(host or "", 443)
    except socket.gaierror as g:
        return g.errno != socket.EAI_NONAME
    return True


def what_to_fix(e: StoreError, url: StoreURL, endpoint_url: str | None) -> str | None:
    """What the user must change for ``e`` to go away, or None when it may pass by itself."""
    if e.code == "NoSuchBucket":
        where = endpoint_url or "AWS S3"
        return (
            f"bucket {url.bucket!r} does not exist at {where}: check the bucket name in "
            "--store (or create the bucket)"
        )
    if e.code == "RequestTimeTooSkewed":
        return f"this machine's clock is more than 15 minutes off: {SYNC_CLOCK}"
    if e.code in CREDENTIAL_CODES:
        return (
            "check the credentials (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE or the "
            "instance role) and that the bucket policy allows them"
        )
    if e.code in ("PermanentRedirect", "AuthorizationHeaderMalformed", "IllegalLocation"):
        return "the bucket is in another region: set AWS_REGION (or AWS_DEFAULT_REGION) to it"
    if e.code == "Transport" and url.scheme == "s3":
        if endpoint_url is None:
            return (
                "cannot reach AWS S3 at its default endpoint (check the network); for an "
                "S3-compatible store "
                "(MinIO, Ceph, ...) set --endpoint-url (store.endpoint_url, AWS_ENDPOINT_URL)"
            )
        if any(s in str(e) for s in _NO_SUCH_HOST):
            return f"the host of --endpoint-url {endpoint_url} does not resolve: check the URL"
        return None
    if e.temporary:
        return None
    return "fix the store's settings (the error above says which)"
