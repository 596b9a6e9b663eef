"""What a store error at mount means (gateway/storecheck.py): the user's to fix (the mount
fails, saying what), maybe a node still starting (checked again for a while), or one that may
pass (a warning). The end-to-end cases run against moto in test_drain.py."""

from __future__ import annotations

import socket

import pytest

from ckptgw.gateway.storecheck import explain, may_come_right
from ckptgw.store.interface import StoreError
from ckptgw.store.url import parse_store_url

URL = parse_store_url("s3://my-bucket/run/")
NO_DNS = "Transport: ConnectError: [Errno -2] Name or service not known"
NO_NET = "Transport: ConnectError: [Errno 111] Connection refused"


@pytest.mark.parametrize(
    "code, message, endpoint, yours, wait, says",
    [
        ("NoSuchBucket", "the bucket does not exist", None, True, False, "check the bucket name"),
        ("InvalidAccessKeyId", "access denied", "http://s3:9000", True, False, "credentials"),
        ("NoCredentials", "no credentials found", None, True, True, "credentials"),
        ("PermanentRedirect", "moved", None, True, False, "AWS_REGION"),
        ("RequestTimeTooSkewed", "skewed", None, True, False, "clock"),
        ("Transport", NO_NET, None, True, True, "--endpoint-url"),
        ("Transport", NO_DNS, None, True, False, "--endpoint-url"),
        ("Transport", NO_DNS, "http://minio.lan:9000", True, False, "does not resolve"),
        ("Transport", NO_NET, "http://minio.lan:9000", False, True, NO_NET),
        ("SlowDown", "503 SlowDown", None, False, False, "SlowDown"),
    ],
)
def test_store_errors_at_mount(
    code: str, message: str, endpoint: str | None, yours: bool, wait: bool, says: str
) -> None:
    temporary = code in ("Transport", "SlowDown", "RequestTimeTooSkewed")
    e = StoreError(f"checking bucket my-bucket: {message}", temporary=temporary, code=code)
    line, is_yours = explain(e, URL, endpoint)
    assert is_yours is yours
    assert line.startswith("store s3://my-bucket/run/: ") and says in line, line
    assert "\n" not in line
    if yours:
        assert may_come_right(e, endpoint, resolves) is wait


def resolves(host: str, port: int) -> object:
    return [("an address",)]


def no_such_name(host: str, port: int) -> object:
    raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")


def no_dns_yet(host: str, port: int) -> object:
    raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")


def test_an_unreachable_default_endpoint_is_waited_for_only_while_dns_may_come() -> None:
    """The client's EndpointConnectionError does not say why: the name is resolved to tell."""
    e = StoreError("Transport: EndpointConnectionError: Could not connect", temporary=True,
                   code="Transport")  # fmt: skip
    assert may_come_right(e, None, no_dns_yet)
    assert not may_come_right(e, None, no_such_name)
    assert may_come_right(e, None, resolves)  # a network that is not up yet
