"""Every exception of botocore or the HTTP layer as a classified :class:`StoreError`:
temporary (worth retrying) or permanent, with the server's code. Messages name the operation,
the key and the code, never credentials."""

from __future__ import annotations

import asyncio

import aiohttp
import botocore.exceptions as bex

from ckptgw.store.interface import CREDENTIAL_CODES, NotFound, Stale, StoreError

TEMPORARY_CODES = {
    "SlowDown",
    "RequestTimeout",
    "Throttling",
    "ThrottlingException",
    "InternalError",
    "ServiceUnavailable",
    "RequestTimeTooSkewed",
    "OperationAborted",
    "BadDigest",  # the bytes that arrived do not match their CRC32: damaged on the way
    "503",
    "500",
}


def translate(e: BaseException, what: str) -> StoreError:
    """Classify any exception of botocore or the HTTP layer."""
    if isinstance(e, StoreError):
        return e
    if isinstance(e, bex.ClientError):
        err = e.response.get("Error", {})
        meta = e.response.get("ResponseMetadata", {})
        code = str(err.get("Code", ""))
        status = int(meta.get("HTTPStatusCode", 0) or 0)
        message = str(err.get("Message", "")) or code
        headers = meta.get("HTTPHeaders", {}) or {}
        retry_after = _retry_after(headers.get("retry-after"))
        if code in ("NoSuchKey", "NoSuchUpload") or (status == 404 and code in ("404", "")):
            return NotFound(f"{what}: not found", code or "NoSuchKey")
        if code in ("PreconditionFailed", "412") or status == 412:  # If-Match: a new version
            return Stale(f"{what}: the object changed (it no longer has the ETag asked for)")
        if code == "NoSuchBucket":
            return StoreError(f"{what}: the bucket does not exist", temporary=False, code=code)
        if code in CREDENTIAL_CODES:
            return StoreError(
                f"{what}: access denied ({code}): check the credentials and the bucket policy",
                temporary=False,
                code=code,
            )
        temporary = status >= 500 or status == 429 or code in TEMPORARY_CODES
        return StoreError(
            f"{what}: {code or status} {message}".strip(),
            temporary=temporary,
            code=code,
            retry_after=retry_after,
        )
    if isinstance(e, bex.NoCredentialsError | bex.PartialCredentialsError):
        return StoreError(
            f"{what}: no credentials found (environment, profile or instance role)",
            temporary=False,
            code="NoCredentials",
        )
    if isinstance(e, bex.ParamValidationError):
        return StoreError(f"{what}: {e}", temporary=False, code="BadRequest")
    if isinstance(e, bex.BotoCoreError | OSError | EOFError) or _is_transport_error(e):
        return StoreError(f"{what}: {type(e).__name__}: {e}", temporary=True, code="Transport")
    raise e


def _is_transport_error(e: BaseException) -> bool:
    """aiohttp's errors that reach us unwrapped: while a body streams (a connection reset,
    a payload cut short) and timeouts."""
    return isinstance(e, aiohttp.ClientError | asyncio.TimeoutError)


def _retry_after(value: object) -> float | None:
    try:
        return max(0.0, float(str(value)))
    except (TypeError, ValueError):
        return None
