"""Fetching an artifact over http(s) into the store's ``Partial``: resumed
with ``Range`` from the bytes already held (a ``206`` whose
``Content-Range`` starts there is appended; a ``200`` starts over), capped
at ``--stage-rate`` bytes a second, https verified against the system store
plus ``--ca-file``.

A download ends in bounded time, whatever the server does:

- a total deadline (the stage job's ``timeoutSeconds``, the rollout's
  ``stage.timeout``) bounds every request, read and pause;
- a body slower than ``min_rate`` bytes a second, averaged over
  ``rate_window`` seconds, fails;
- an answer that brings the file no further than the furthest it ever got
  (a 416, a range not asked for, a 200 that starts over, a body that
  breaks off before a new byte) counts, and ``ATTEMPTS_WITHOUT_PROGRESS``
  of them in a row fail; a body that breaks off after new bytes is resumed
  at once;
- a refused connection or a 5xx is asked again after a pause that doubles
  (a mirror restarting), until the deadline.

Redirects are followed by hand, each judged by ``download_fence``.

Every httpx error is said here as ``download_failed: ...`` in words a
person can act on.

Must not: check digests or name files (``artifact_store`` does), fetch
anything a signed job did not name, or run past its deadline.
"""

from __future__ import annotations

import re
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx

from reconciler.node.artifact_store import Partial, StageFailed
from reconciler.node.download_fence import Fence

ATTEMPTS_WITHOUT_PROGRESS = 3
MAX_REDIRECTS = 5
CHUNK = 64 * 1024
MIN_RATE = 16 * 1024  # bytes a second: a body slower than this over RATE_WINDOW fails
RATE_WINDOW = 60.0  # seconds
FIRST_PAUSE = 0.5  # seconds before asking again after a refused connection or a 5xx
LONGEST_PAUSE = 30.0
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")


@dataclass(frozen=True)
class DownloadSettings:
    rate: int | None = None  # bytes per second; None: uncapped
    ca_file: str | None = None  # CAs trusted besides the system store
    connect_timeout: float = 30.0
    read_timeout: float = 60.0  # seconds without a byte
    min_rate: int = MIN_RATE  # at most half of ``rate`` is asked for
    rate_window: float = RATE_WINDOW
    first_pause: float = FIRST_PAUSE


@dataclass(frozen=True)
class Deadline:
    """When a stage job's downloads must have ended: ``seconds`` (its
    stage.timeout) from the moment it began, at ``at`` (``time.monotonic``)."""

    seconds: float
    at: float

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        return cls(seconds, time.monotonic() + seconds)


def tls_context(ca_file: str | None) -> ssl.SSLContext:
    context = ssl.create_default_context()
    if ca_file is not None:
        context.load_verify_locations(cafile=ca_file)
    return context


class _Throttle:
    """Sleeps so that bytes counted since the start never run ahead of ``rate``."""

    def __init__(self, rate: int | None) -> None:
        self.rate = rate
        self.started = time.monotonic()
        self.count = 0

    def took(self, size: int) -> None:
        if self.rate is None:
            return
        self.count += size
        ahead = self.count / self.rate - (time.monotonic() - self.started)
        if ahead > 0:
            time.sleep(ahead)


class _Transient(Exception):
    """A refused connection or a 5xx: worth asking again after a pause."""

    def __init__(self, said: str) -> None:
        super().__init__(said)
        self.said = said


class _Fruitless(Exception):
    """An answer that brings nothing to append: a 416, a range not asked for."""

    def __init__(self, said: str) -> None:
        super().__init__(said)
        self.said = said


class _Budget:
    """One download's limits: the deadline, and the rate measured over
    windows of wall time (a pause after a transient failure starts a new
    window: the deadline bounds those)."""

    def __init__(self, settings: DownloadSettings, deadline: Deadline, url: str) -> None:
        self.seconds = deadline.seconds
        self.deadline = deadline.at
        least = settings.min_rate
        if settings.rate is not None:
            least = min(least, settings.rate // 2)
        self.least = least
        self.window = settings.rate_window
        self.url = url
        self.restart_window()

    def restart_window(self) -> None:
        self.window_start = time.monotonic()
        self.window_bytes = 0

    def left(self) -> float:
        """Seconds before the deadline; ``StageFailed`` once it passed."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise StageFailed(
                "download_failed",
                f"GET {self.url} did not finish within {self.seconds:g}s (stage.timeout)",
            )
        return left

    def took(self, size: int) -> None:
        """``size`` new bytes; ``StageFailed`` when a window ends below the least rate."""
        self.window_bytes += size
        self.check_rate()

    def check_rate(self) -> None:
        lasted = time.monotonic() - self.window_start
        if lasted < self.window:
            return
        if self.window_bytes < self.least * lasted:
            raise StageFailed(
                "download_failed",
                f"GET {self.url} brought {self.window_bytes} bytes in {lasted:.0f}s, "
                f"less than the least rate of {self.least} bytes/s",
            )
        self.restart_window()


class Downloader:
    """One httpx client for the agent's downloads (the stage worker's only);
    a download under way ends at its next byte or pause once ``stopping`` is set."""

    def __init__(self, settings: DownloadSettings, stopping: threading.Event | None = None) -> None:
        self.settings = settings
        self._client = httpx.Client(
            verify=tls_context(settings.ca_file),
            follow_redirects=False,  # each hop is judged by ``download_fence``
            # The bytes as published: a compressed body would not be the digest's.
            headers={"Accept-Encoding": "identity"},
        )
        self._chunk = CHUNK if settings.rate is None else max(1024, min(CHUNK, settings.rate // 20))
        self._closing = stopping if stopping is not None else threading.Event()

    def close(self) -> None:
        self._client.close()

    def fetch(self, url: str, partial: Partial, size: int, deadline: Deadline) -> None:
        """Bring ``partial`` to the end of the body (at most ``size`` + 1
        bytes) before ``deadline``."""
        budget = _Budget(self.settings, deadline, url)
        throttle = _Throttle(self.settings.rate)
        fence = Fence(url)
        furthest = partial.size
        fruitless = 0
        pause = self.settings.first_pause
        while True:
            try:
                self._one_request(url, partial, size, (throttle, budget, fence))
                return
            except _Fruitless as exc:
                said = exc.said
            except _Transient as exc:
                self._pause(pause, budget, exc.said)
                pause = min(2 * pause, LONGEST_PAUSE)
                continue
            except httpx.HTTPError as exc:
                said = _said(url, exc)
            budget.check_rate()
            if partial.size > furthest:
                furthest, fruitless = partial.size, 0
                continue
            fruitless += 1
            if fruitless >= ATTEMPTS_WITHOUT_PROGRESS:
                raise StageFailed(
                    "download_failed",
                    f"{said}; {fruitless} requests in a row brought no byte beyond byte {furthest}",
                )

    def _pause(self, seconds: float, budget: _Budget, said: str) -> None:
        """Wait before asking again; ``StageFailed`` saying ``said`` when the
        deadline comes first or the agent stops."""
        try:
            left = budget.left()
        except StageFailed as exc:
            raise StageFailed("download_failed", f"{said}; {exc.message}") from None
        if seconds >= left:
            raise StageFailed(
                "download_failed", f"{said} (asked again until the deadline, {budget.seconds:g}s)"
            )
        if self._closing.wait(seconds):
            raise StageFailed("download_failed", f"{said}; the agent is stopping")
        budget.restart_window()

    def _one_request(
        self, url: str, partial: Partial, size: int, limits: tuple[_Throttle, _Budget, Fence]
    ) -> None:
        """One GET from ``partial.size`` on, to the end of the body; raises
        when it ends otherwise."""
        throttle, budget, fence = limits
        start = partial.size
        headers = {"Range": f"bytes={start}-"} if start else {}
        with self._open(url, headers, budget, fence) as answer:
            if answer.status_code == 206 and _range_start(answer) == start:
                pass
            elif answer.status_code == 200 or (start and answer.status_code in (206, 416)):
                partial.restart()  # the whole file again, or a range we did not ask for
                if answer.status_code != 200:
                    raise _Fruitless(
                        _status(url, answer)
                        + f" to Range: bytes={start}- (Content-Range "
                        + f"{answer.headers.get('content-range', 'none')!r})"
                    )
            elif answer.status_code >= 500:
                raise _Transient(_status(url, answer))
            else:
                raise StageFailed("download_failed", _status(url, answer))
            # Bytes as they come (a fixed chunk size would wait for a drip to fill it).
            for received in answer.iter_raw():
                for at in range(0, len(received), self._chunk):
                    chunk = received[at : at + self._chunk]
                    if self._closing.is_set():
                        raise StageFailed("download_failed", "the agent is stopping")
                    partial.append(chunk)
                    if partial.size > size:
                        return  # longer than declared: the size check says so
                    budget.left()
                    budget.took(len(chunk))
                    throttle.took(len(chunk))

    @contextmanager
    def _open(
        self, url: str, headers: dict[str, str], budget: _Budget, fence: Fence, method: str = "GET"
    ) -> Iterator[httpx.Response]:
        """The answer to ``method url``, redirects followed as ``fence``
        allows; a refused connection is ``_Transient``."""
        target = url
        for _ in range(MAX_REDIRECTS + 1):
            left = budget.left()
            timeout = httpx.Timeout(
                min(self.settings.read_timeout, left),
                connect=min(self.settings.connect_timeout, left),
            )
            request = self._client.build_request(method, target, headers=headers, timeout=timeout)
            try:
                answer = self._client.send(request, stream=True)
            except httpx.ConnectError as exc:
                if _untrusted(exc):  # asking again would not change the certificate
                    raise StageFailed("download_failed", _said(url, exc)) from None
                raise _Transient(_said(url, exc)) from None
            if not (answer.is_redirect and "location" in answer.headers):
                try:
                    yield answer
                finally:
                    answer.close()
                return
            answer.close()
            try:
                target = str(answer.url.join(answer.headers["location"]))
            except (httpx.InvalidURL, ValueError):
                raise StageFailed(
                    "download_failed", f"{method} {url} was redirected to an invalid URL"
                ) from None
            fence.check_redirect(target)
        raise StageFailed(
            "download_failed", f"{method} {url} was redirected more than {MAX_REDIRECTS} times"
        )

    def remote_size(self, url: str, deadline: Deadline) -> int | None:
        """The size the server reports (``HEAD``, else a one-byte ``Range``);
        None when it does not say."""
        budget = _Budget(self.settings, deadline, url)
        fence = Fence(url)
        try:
            with self._open(url, {}, budget, fence, "HEAD") as answer:
                if answer.status_code == 200 and "content-length" in answer.headers:
                    return int(answer.headers["content-length"])
                if answer.status_code not in (200, 405, 501):
                    raise StageFailed("download_failed", _status(url, answer))
            with self._open(url, {"Range": "bytes=0-0"}, budget, fence) as ranged:
                if ranged.status_code == 206:
                    match = _CONTENT_RANGE.fullmatch(ranged.headers.get("content-range", ""))
                    return int(match[3]) if match and match[3] != "*" else None
                if ranged.status_code == 200 and "content-length" in ranged.headers:
                    return int(ranged.headers["content-length"])
                raise StageFailed("download_failed", _status(url, ranged))
        except _Transient as exc:
            raise StageFailed("download_failed", exc.said) from None
        except httpx.HTTPError as exc:
            raise StageFailed("download_failed", _said(url, exc)) from None
        except ValueError:
            return None


def _range_start(answer: httpx.Response) -> int | None:
    match = _CONTENT_RANGE.fullmatch(answer.headers.get("content-range", ""))
    return int(match[1]) if match else None


def _status(url: str, answer: httpx.Response) -> str:
    return f"GET {url} answered {answer.status_code} {answer.reason_phrase}".rstrip()


def _untrusted(exc: httpx.HTTPError) -> bool:
    cause = exc.__context__ or exc.__cause__
    return isinstance(cause, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY_FAILED" in str(
        exc
    )


def _said(url: str, exc: httpx.HTTPError) -> str:
    """An httpx error as a person reads it."""
    parts = urlsplit(url)
    where = parts.netloc
    cause = exc.__context__ or exc.__cause__
    if _untrusted(exc):
        reason = getattr(cause, "verify_message", "") or str(exc)
        return (
            f"the certificate of {where} is not trusted ({reason}); "
            "give the CA that signed it with agent --ca-file"
        )
    if isinstance(exc, httpx.ConnectError):
        return f"cannot connect to {where}: {exc}"
    if isinstance(exc, httpx.TimeoutException):
        return f"{where} sent nothing for too long ({type(exc).__name__})"
    return f"GET {url} broke off: {exc}"
