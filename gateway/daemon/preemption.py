"""The preemption watcher: poll the cloud's instance metadata service for a termination notice.

Off by default. When a notice arrives, the daemon switches to the emergency drain (newest files
first, no settle delay) and runs the configured command once, e.g. to tell the trainer to save
now. It keeps serving: the node's shutdown sends SIGTERM later, and that drains what is left.

* aws: the spot ``instance-action`` document (an IMDSv2 token is asked for first); 404 means
  no notice, 200 with ``{"action": ..., "time": ...}`` is one.
* gcp: ``instance/preempted`` with ``Metadata-Flavor: Google``; the body ``TRUE`` is a notice.
* azure: ``scheduledevents``; an event of type ``Preempt`` or ``Terminate`` is a notice.

The URLs are in ``DEFAULT_URLS``; ``preemption.url`` replaces them (tests, proxies).
"""

from __future__ import annotations

import json
import logging
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

import trio

log = logging.getLogger(__name__)

DEFAULT_URLS = {
    "aws": "http://169.254.169.254/latest/meta-data/spot/instance-action",
    "gcp": "http://metadata.google.internal/computeMetadata/v1/instance/preempted",
    "azure": "http://169.254.169.254/metadata/scheduledevents?api-version=2020-07-01",
}
_HEADERS = {"gcp": {"Metadata-Flavor": "Google"}, "azure": {"Metadata": "true"}}
HTTP_TIMEOUT = 2.0
# Never through a proxy: the metadata service is link-local.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True)
class WatchConfig:
    provider: str
    url: str = ""
    interval: float = 5.0
    command: str = ""


def _http(method: str, url: str, headers: dict[str, str]) -> tuple[int, bytes]:
    req = urllib.request.Request(url, method=method, headers=headers)
    try:
        with _OPENER.open(req, timeout=HTTP_TIMEOUT) as r:
            return int(r.status), r.read(1 << 20)
    except urllib.error.HTTPError as e:
        return int(e.code), b""


def _aws_token(url: str) -> dict[str, str]:
    """IMDSv2: a session token from the same host; without one, IMDSv1 is tried."""
    parts = urllib.parse.urlsplit(url)
    token_url = urllib.parse.urlunsplit((parts.scheme, parts.netloc, "/latest/api/token", "", ""))
    try:
        status, body = _http("PUT", token_url, {"X-aws-ec2-metadata-token-ttl-seconds": "300"})
    except OSError:
        return {}
    return {"X-aws-ec2-metadata-token": body.decode()} if status == 200 and body else {}


def check(provider: str, url: str) -> str | None:
    """One poll: a description of the notice, or None. Raises OSError when unreachable."""
    headers = dict(_HEADERS.get(provider, {}))
    if provider == "aws":
        headers |= _aws_token(url)
    status, body = _http("GET", url, headers)
    if status == 404:
        return None
    if status != 200:
        raise OSError(f"HTTP {status} from {url}")
    if provider == "gcp":
        return "GCP preempted" if body.strip().upper() == b"TRUE" else None
    try:
        doc = json.loads(body)
    except ValueError:
        raise OSError(f"{url} answered something that is not JSON") from None
    if provider == "aws":
        if isinstance(doc, dict) and doc.get("action"):
            return f"AWS spot {doc['action']} at {doc.get('time', '?')}"
        return None
    events = doc.get("Events", []) if isinstance(doc, dict) else []
    for ev in events:
        if isinstance(ev, dict) and ev.get("EventType") in ("Preempt", "Terminate"):
            return f"Azure {ev['EventType']} not before {ev.get('NotBefore', '?')}"
    return None


class PreemptionWatcher:
    def __init__(
        self, config: WatchConfig, on_notice: Callable[[str], None], env: dict[str, str]
    ) -> None:
        self.config = config
        self.url = config.url or DEFAULT_URLS[config.provider]
        self.on_notice = on_notice
        self.env = env  # extra environment for the command
        self.notice: str | None = None
        self.command_status: int | None = None

    def view(self) -> dict[str, object]:
        return {
            "provider": self.config.provider,
            "url": self.url,
            "notice": self.notice,
            "command_exit": self.command_status,
        }

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        log.info("watching %s for a preemption notice every %g s", self.url, self.config.interval)
        task_status.started()
        failing = False
        while self.notice is None:
            try:
                notice = await trio.to_thread.run_sync(
                    check, self.config.provider, self.url, abandon_on_cancel=True
                )
            except OSError as e:
                if not failing:
                    log.warning("cannot poll the metadata service for preemption: %s", e)
                failing = True
                notice = None
            else:
                if failing:
                    log.info("the metadata service answers again")
                failing = False
            if notice is not None:
                self.notice = notice
                log.warning("preemption notice: %s", notice)
                self.on_notice(notice)
                await self._run_command(notice)
                return
            await trio.sleep(self.config.interval)

    async def _run_command(self, notice: str) -> None:
        if not self.config.command:
            return
        env = dict(os.environ, **self.env, CKPTGW_NOTICE=notice)
        log.info("running the preemption command")
        try:
            with trio.fail_after(300):
                r = await trio.run_process(
                    ["/bin/sh", "-c", self.config.command],
                    env=env,
                    check=False,
                    stdin=b"",
                    capture_stdout=True,
                    capture_stderr=True,
                )
        except (OSError, trio.TooSlowError) as e:
            log.error("the preemption command failed: %r", e)
            return
        self.command_status = r.returncode
        if r.returncode != 0:
            err = r.stderr.decode(errors="replace").strip().splitlines()
            log.error(
                "the preemption command exited with %d: %s", r.returncode, err[-1] if err else ""
            )
        else:
            log.info("the preemption command finished")
