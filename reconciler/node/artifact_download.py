"""Fetching an artifact over http(s) into the store's ``Partial``: resumed
with ``Range`` from the bytes already held (a ``206`` whose
``Content-Range`` starts there is appended; a ``200`` starts over), capped
at ``--stage-rate`` bytes a second, https verified against the system store
plus ``--ca-file``. A body that breaks off is resumed at once; only a
request that brings no byte, several times in a row, fails.

Every httpx error is said here as ``download_failed: ...`` in words a
person can act on.

Must not: check digests or name files (``artifact_store`` does), or fetch
anything a signed job did not name.
"""

from __future__ import annotations

import re
import ssl
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx

from reconciler.node.artifact_store import Partial, StageFailed

ATTEMPTS_WITHOUT_PROGRESS = 3
CHUNK = 64 * 1024
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")


@dataclass(frozen=True)
class DownloadSettings:
    rate: int | None = None  # bytes per second; None: uncapped
    ca_file: str | None = None  # CAs trusted besides the system store
    connect_timeout: float = 30.0
    read_timeout: float = 60.0  # seconds without a byte


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


class Downloader:
    """One httpx client for the agent's downloads (the job thread's only)."""

    def __init__(self, settings: DownloadSettings) -> None:
        self.settings = settings
        timeout = httpx.Timeout(settings.read_timeout, connect=settings.connect_timeout)
        self._client = httpx.Client(
            verify=tls_context(settings.ca_file),
            timeout=timeout,
            follow_redirects=True,
            # The bytes as published: a compressed body would not be the digest's.
            headers={"Accept-Encoding": "identity"},
        )
        self._chunk = CHUNK if settings.rate is None else max(1024, min(CHUNK, settings.rate // 20))

    def close(self) -> None:
        self._client.close()

    def fetch(self, url: str, partial: Partial, size: int) -> None:
        """Bring ``partial`` to the end of the body (at most ``size`` + 1 bytes)."""
        throttle = _Throttle(self.settings.rate)
        fruitless = 0
        while partial.size < size:
            start = partial.size
            try:
                if self._one_request(url, partial, size, throttle):
                    return
            except httpx.HTTPError as exc:
                if partial.size == start:
                    fruitless += 1
                    if fruitless >= ATTEMPTS_WITHOUT_PROGRESS:
                        raise StageFailed("download_failed", _said(url, exc)) from None
                else:
                    fruitless = 0

    def _one_request(self, url: str, partial: Partial, size: int, throttle: _Throttle) -> bool:
        """One GET from ``partial.size`` on; True once the body ended."""
        start = partial.size
        headers = {"Range": f"bytes={start}-"} if start else {}
        with self._client.stream("GET", url, headers=headers) as answer:
            if answer.status_code == 206 and _range_start(answer) == start:
                pass
            elif answer.status_code == 200 or (start and answer.status_code in (206, 416)):
                partial.restart()  # the whole file again, or a range we did not ask for
                if answer.status_code != 200:
                    return False
            else:
                raise StageFailed("download_failed", _status(url, answer))
            for chunk in answer.iter_raw(self._chunk):
                partial.append(chunk)
                if partial.size > size:
                    return True  # longer than declared: the size check says so
                throttle.took(len(chunk))
        return True

    def remote_size(self, url: str) -> int | None:
        """The size the server reports (``HEAD``, else a one-byte ``Range``);
        None when it does not say."""
        try:
            answer = self._client.head(url)
            if answer.status_code == 200 and "content-length" in answer.headers:
                return int(answer.headers["content-length"])
            if answer.status_code not in (200, 405, 501):
                raise StageFailed("download_failed", _status(url, answer))
            with self._client.stream("GET", url, headers={"Range": "bytes=0-0"}) as ranged:
                if ranged.status_code == 206:
                    match = _CONTENT_RANGE.fullmatch(ranged.headers.get("content-range", ""))
                    return int(match[3]) if match and match[3] != "*" else None
                if ranged.status_code == 200 and "content-length" in ranged.headers:
                    return int(ranged.headers["content-length"])
                raise StageFailed("download_failed", _status(url, ranged))
        except httpx.HTTPError as exc:
            raise StageFailed("download_failed", _said(url, exc)) from None
        except ValueError:
            return None


def _range_start(answer: httpx.Response) -> int | None:
    match = _CONTENT_RANGE.fullmatch(answer.headers.get("content-range", ""))
    return int(match[1]) if match else None


def _status(url: str, answer: httpx.Response) -> str:
    return f"GET {url} answered {answer.status_code} {answer.reason_phrase}".rstrip()


def _said(url: str, exc: httpx.HTTPError) -> str:
    """An httpx error as a person reads it."""
    parts = urlsplit(url)
    where = parts.netloc
    cause = exc.__context__ or exc.__cause__
    if isinstance(cause, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY_FAILED" in str(exc):
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
