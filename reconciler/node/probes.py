"""The agent's health probes (docs/health.md): the ``http`` and
``tcp`` checks a signed live apply carried, probed on the node itself every
``intervalSeconds`` from the end of the successful apply until the next job
for that runtime, and reported in the heartbeat as
``checks: [{name, jobId, ok, okSince, failures, lastError, probedAt}]``.

An agent probes only its own node: a host must resolve to loopback or to an
address of this machine (one it can bind), else the probe fails saying so.
One thread per runtime with checks; probes of one run go one after another.

Must not: decide anything about rollouts, or probe anything a signed job did
not ask for.
"""

from __future__ import annotations

import http.client
import ipaddress
import socket
import ssl
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from reconciler.spec.times import format_time

BODY_LIMIT = 64 * 1024  # bytes of an answer searched for bodyContains
ERROR_LIMIT = 300  # characters of an error kept in a report


class ProbeFailed(Exception):
    """One probe did not hold; the message says why, for ``lastError``."""


@dataclass(frozen=True)
class CheckState:
    name: str
    job_id: str
    ok: bool = False
    ok_since: str | None = None
    failures: int = 0
    last_error: str = ""
    probed_at: str | None = None

    def after(self, error: str, now: str) -> CheckState:
        """This state after one more probe (``error`` empty: it held)."""
        if not error:
            return replace(
                self,
                ok=True,
                ok_since=self.ok_since or now,
                failures=0,
                last_error="",
                probed_at=now,
            )
        return replace(
            self,
            ok=False,
            ok_since=None,
            failures=self.failures + 1,
            last_error=error[:ERROR_LIMIT],
            probed_at=now,
        )

    def report(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "jobId": self.job_id,
            "ok": self.ok,
            "okSince": self.ok_since,
            "failures": self.failures,
            "lastError": self.last_error,
            "probedAt": self.probed_at,
        }


# -- one probe -------------------------------------------------------------------


def _is_own_address(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%")[0])
    if ip.is_loopback:
        return True
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((address, 0))  # only an address of this machine can be bound
        return True
    except OSError:
        return False


def own_addresses(host: str, port: int) -> list[tuple[Any, ...]]:
    """The addresses ``host`` resolves to, all of this machine; else ProbeFailed."""
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise ProbeFailed(f"cannot resolve {host}: {exc}") from None
    foreign = sorted({str(info[4][0]) for info in found if not _is_own_address(str(info[4][0]))})
    if foreign:
        raise ProbeFailed(
            f"{host} resolves to {', '.join(foreign)}, not this node: an agent probes only its own node"
        )
    return [info[4] for info in found]


def probe_tcp(spec: Mapping[str, Any]) -> None:
    host, port, timeout = spec["host"], spec["port"], spec["timeoutSeconds"]
    own_addresses(host, port)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as exc:
        raise ProbeFailed(f"tcp {host}:{port}: {exc.strerror or exc}") from None


def probe_http(spec: Mapping[str, Any]) -> None:
    url, timeout = spec["url"], spec["timeoutSeconds"]
    parts = urlsplit(url)
    host = parts.hostname or ""
    secure = parts.scheme == "https"
    port = parts.port or (443 if secure else 80)
    own_addresses(host, port)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    connection: http.client.HTTPConnection
    if secure:
        # The node's own endpoint, often with a self-signed certificate:
        # locality is what the check relies on, not a CA.
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        connection = http.client.HTTPSConnection(host, port, timeout=timeout, context=context)
    else:
        connection = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        connection.request("GET", path, headers={"User-Agent": "reconciler-agent-probe"})
        answer = connection.getresponse()
        body = answer.read(BODY_LIMIT)
    except (OSError, http.client.HTTPException) as exc:
        raise ProbeFailed(f"GET {url}: {exc}") from None
    finally:
        connection.close()
    if answer.status != spec["expectStatus"]:
        raise ProbeFailed(f"GET {url}: status {answer.status} (expected {spec['expectStatus']})")
    wanted = spec["bodyContains"]
    if wanted and wanted not in body.decode("utf-8", errors="replace"):
        raise ProbeFailed(f"GET {url}: the body does not contain {wanted!r}")


def probe(check: Mapping[str, Any]) -> str:
    """Run one check once: empty when it held, else why not."""
    try:
        if "http" in check:
            probe_http(check["http"])
        else:
            probe_tcp(check["tcp"])
    except ProbeFailed as exc:
        return str(exc)
    except Exception as exc:  # a probe must never stop the prober
        return f"probe error: {exc!r}"
    return ""


# -- runs ------------------------------------------------------------------------


class _Run:
    """One job's checks, probed on a thread until stopped."""

    def __init__(
        self,
        job_id: str,
        checks: Sequence[Mapping[str, Any]],
        clock: Callable[[], datetime],
        run_probe: Callable[[Mapping[str, Any]], str],
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.job_id = job_id
        self.on_change = on_change
        self.checks = list(checks)
        self.clock = clock
        self.run_probe = run_probe
        self.states = [CheckState(c["name"], job_id) for c in self.checks]
        self.interval = min(c["intervalSeconds"] for c in self.checks)
        self.stopped = threading.Event()
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._loop, name=f"probe-{job_id}", daemon=True)

    def _loop(self) -> None:
        while not self.stopped.is_set():
            for index, check in enumerate(self.checks):
                error = self.run_probe(check)
                if self.stopped.is_set():
                    return
                with self.lock:
                    old = self.states[index]
                    self.states[index] = new = old.after(error, format_time(self.clock()))
                if replace(old, probed_at=None) != replace(new, probed_at=None):
                    self.on_change()  # held heartbeat reads answer (not for probedAt alone)
            self.stopped.wait(self.interval)

    def reports(self) -> list[dict[str, Any]]:
        with self.lock:
            return [s.report() for s in self.states if s.probed_at is not None]


class Prober:
    """The agent's probing, one run per runtime."""

    def __init__(
        self,
        clock: Callable[[], datetime],
        run_probe: Callable[[Mapping[str, Any]], str] = probe,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.clock = clock
        self.run_probe = run_probe
        self.on_change = on_change  # a check's reported outcome moved
        self._runs: dict[str, _Run] = {}
        self._lock = threading.Lock()

    def start(self, runtime: str, job_id: str, checks: Sequence[Mapping[str, Any]]) -> None:
        """Probe ``checks`` for ``job_id`` from now on, instead of anything before."""
        run = _Run(job_id, checks, self.clock, self.run_probe, self.on_change)
        with self._lock:
            old = self._runs.pop(runtime, None)
            self._runs[runtime] = run
        if old is not None:
            old.stopped.set()
        run.thread.start()

    def stop(self, runtime: str) -> None:
        """A new job for ``runtime``: the old job's checks say nothing about it."""
        with self._lock:
            old = self._runs.pop(runtime, None)
        if old is not None:
            old.stopped.set()

    def reports(self) -> list[dict[str, Any]]:
        with self._lock:
            runs = [self._runs[r] for r in sorted(self._runs)]
        return [report for run in runs for report in run.reports()]

    def close(self) -> None:
        with self._lock:
            runs = list(self._runs.values())
            self._runs.clear()
        for run in runs:
            run.stopped.set()
        for run in runs:
            run.thread.join(timeout=5)
