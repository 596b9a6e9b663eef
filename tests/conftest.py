"""Fixtures: isolated runtime dirs, and real gateways that are always unmounted and stopped.

Every gateway started through the ``gateway`` fixture is stopped at teardown, also when the
test fails: clean unmount, else lazy unmount, else SIGKILL of the daemon. Its log is then
checked: an ERROR line or a traceback fails the test unless the test said it expects one
(``gw.expect_errors = True``), so problems the daemon only logs are not missed.

Markers are also set here from the fixtures a test uses (``pytest_collection_modifyitems``),
so ``-m "not mount and not s3 and not torch"`` (``make test-fast``) leaves out every test that
needs a FUSE mount or an S3 server without each test having to say so.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ckptgw.fsops import passthrough
from ckptgw.fsops.passthrough import DAEMON, PASSTHROUGH
from ckptgw.gateway.harness import Gateway

DATA_PATHS = (PASSTHROUGH, DAEMON)
ANY_DATA_PATH = "any"
# For a test of what the data path does not touch (names, listings, the drain's scheduling):
# it runs once, on the kernel's path where this machine has it, else on the daemon's.
any_data_path = pytest.mark.parametrize("data_path", [ANY_DATA_PATH], indirect=True)

HAVE_FUSE = os.path.exists("/dev/fuse") and shutil.which("fusermount3") is not None
needs_fuse = pytest.mark.skipif(not HAVE_FUSE, reason="needs /dev/fuse and fusermount3")

# A test that uses one of these fixtures (directly or through another fixture) gets the marker.
MOUNT_FIXTURES = {"gateway", "mnt"}
# s3_env too: a test that starts its own moto server (e.g. with other credentials) needs it.
S3_FIXTURES = {"s3_endpoint", "bucket", "s3_env"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark tests ``mount`` and ``s3`` by the fixtures they use. A fixture parametrized with
    "s3" (``store_cm``, ``drain``, ``nodes``) asks for ``s3_endpoint`` only when it runs, so
    that parameter value counts as using it."""
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        callspec = getattr(item, "callspec", None)
        params = callspec.params.values() if callspec is not None else ()
        if names & MOUNT_FIXTURES:
            item.add_marker(pytest.mark.mount)
        if names & S3_FIXTURES or any(v == "s3" for v in params):
            item.add_marker(pytest.mark.s3)


class CheckedGateway(Gateway):
    expect_errors = False

    def log_problems(self) -> list[str]:
        log = self.cache_dir / "ckptgw.log"
        if not log.exists():
            return []
        problems: list[str] = []
        in_problem = False
        for line in log.read_text(errors="replace").splitlines():
            if line[:4].isdigit():  # a new record: "2026-11-22 06:01:37,227 LEVEL ..."
                in_problem = " ERROR " in line or " CRITICAL " in line
            elif line.startswith("Traceback"):
                in_problem = True
            if in_problem:  # the record and its traceback, so the failure shows the cause
                problems.append(line)
        return problems


class _BugLines(logging.Handler):
    """Collects the ``bug: ...`` ERROR records of ckptgw's own loggers."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("bug:"):
            self.lines.append(f"{record.name}: {message}")


@pytest.fixture(autouse=True)
def no_bug_lines(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail any test in whose process ckptgw logged a ``bug:`` line (a state refused, a lost
    wake-up the audit found, ...), unless it is marked ``bug_expected``: the code provokes
    it on purpose and checks the line itself. Daemons' logs are checked by ``gateway``."""
    handler = _BugLines()
    logger = logging.getLogger("ckptgw")
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
    if handler.lines and request.node.get_closest_marker("bug_expected") is None:
        pytest.fail("ckptgw logged a bug:\n" + "\n".join(handler.lines), pytrace=False)


def errno_of(fn: object, *args: object) -> int:
    with pytest.raises(OSError) as e:
        fn(*args)  # type: ignore[operator]
    assert e.value.errno is not None
    return e.value.errno


@pytest.fixture
def runtime_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "run"
    monkeypatch.setenv("CKPTGW_RUNTIME_DIR", str(d))
    return d


GatewayFactory = Callable[..., CheckedGateway]


@pytest.fixture(params=DATA_PATHS)
def data_path(request: pytest.FixtureRequest) -> str:
    """Every mount test runs on both data paths (fsops.passthrough): the kernel's, where
    this machine can do it, and the daemon's (``any_data_path``: the first of them here)."""
    if request.param == ANY_DATA_PATH:
        return PASSTHROUGH if passthrough.unavailable(True) is None else DAEMON
    if request.param == PASSTHROUGH and (why := passthrough.unavailable(True)) is not None:
        pytest.skip(f"no FUSE passthrough here: {why}")
    return str(request.param)


def wait_data_path(gw: Gateway, mode: str, timeout: float = 10.0) -> None:
    """The mount uses ``mode``: its log says so at INIT (or fail the test)."""
    line = f"data path: {mode}"
    log = gw.cache_dir / "ckptgw.log"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and line in log.read_text(errors="replace"):
            return
        time.sleep(0.05)
    raise AssertionError(f"the mount did not log {line!r}")


@pytest.fixture
def gateway(tmp_path: Path, runtime_dir: Path, data_path: str) -> Iterator[GatewayFactory]:
    """Factory: ``gateway(name="a", store=None, *extra_args)`` -> a started CheckedGateway,
    on the test's data path (``data_path``)."""
    started: list[CheckedGateway] = []

    def make(
        name: str = "gw", *extra: str, store: str | None = None, start: bool = True
    ) -> CheckedGateway:
        store = store or f"file://{tmp_path / 'store'}"
        if data_path == DAEMON:
            extra = (*extra, "--no-passthrough")
        gw = CheckedGateway(
            tmp_path / name / "mnt",
            tmp_path / name / "cache",
            store,
            *extra,
            env={"CKPTGW_RUNTIME_DIR": str(runtime_dir)},
        )
        started.append(gw)
        if start:
            gw.start()
            wait_data_path(gw, data_path)
        return gw

    yield make
    problems: list[str] = []
    for gw in started:
        try:
            gw.stop()
        finally:
            if not gw.expect_errors:
                problems += gw.log_problems()
    assert not problems, "the daemon logged errors:\n" + "\n".join(problems)


@pytest.fixture
def mnt(gateway: GatewayFactory) -> Path:
    """A mounted gateway's mountpoint (embedded file:// store)."""
    return gateway().mountpoint


# -- S3 on loopback ----------------------------------------------------------------------------

S3_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "ckptgw-test",
    "AWS_SECRET_ACCESS_KEY": "ckptgw-test-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    from tests.s3server import moto_server

    with moto_server() as url:
        yield url


@pytest.fixture
def s3_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    for k, v in S3_CREDENTIALS.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    return dict(S3_CREDENTIALS)


@pytest.fixture
def bucket(s3_endpoint: str, s3_env: dict[str, str], request: pytest.FixtureRequest) -> str:
    """A fresh, empty bucket for this test."""
    import re
    import uuid

    import boto3

    name = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-")
    name = f"{name}-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1").create_bucket(Bucket=name)
    return name
