"""Delivery of notification events to receivers (docs/operating.md).

The pass hands events (``text.notification_events``) to ``Notifier.publish``,
which only puts them on each receiver's bounded queue: a slow or dead
receiver never delays a pass. One thread per receiver sends them in order
through ``outside_http`` (each answer whole within the timeout and under
its size cap): a 2xx is sent; a connection error, a timeout or a 5xx is
retried with exponential backoff (1 s doubling to 5 min) for up to 1 h,
then dropped; any other answer (a 4xx) is logged and dropped. Every retry
carries the same delivery id. Counters per receiver: sent, failed
(attempts that will be retried) and dropped.

With a state directory (``run --state-dir``), the delivery ids a
receiver accepted are kept there, the newest ``REMEMBERED_IDS`` per
receiver, written after each success: chat receivers do not drop
duplicates, so an id once accepted is never posted to that receiver again,
across restarts too. Without one, a restart delivers again what is still
true (at least once).

Configuration is checked whole before anything starts: each receiver's URL
must be set in the environment and be http(s), its secret set when named;
``ReceiverConfigError`` lists every problem, naming the receiver. The URL is
a secret: no log line or error shows it.

Must not: decide which events exist (status does), or block a pass.
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import json
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import httpx
from prometheus_client import Counter

from reconciler.daemon.logs import EventLog
from reconciler.daemon.metrics import Metrics
from reconciler.daemon.outside_http import Ask, NoAnswer, OutsideHttp
from reconciler.daemon.state import DaemonState
from reconciler.spec.documents import parse_file
from reconciler.spec.errors import ReconcilerError
from reconciler.spec.model import Receiver
from reconciler.spec.paths import SETTINGS_PATH
from reconciler.text.notification_events import Event, json_body, slack_text

if TYPE_CHECKING:
    from reconciler.git.store import GitStore

QUEUE_SIZE = 1000  # events waiting per receiver; more are dropped and counted
REMEMBERED_IDS = 10_000  # delivery ids per receiver queued or accepted, to post each once
BACKOFF_FIRST = 1.0  # seconds
BACKOFF_CAP = 300.0  # 5 min
GIVE_UP_AFTER = 3600.0  # 1 h
REQUEST_TIMEOUT = 10.0  # seconds per attempt


class ReceiverConfigError(ReconcilerError):
    """Receivers that cannot be used as configured; nothing was started."""


@dataclass(frozen=True)
class Destination:
    """A receiver with its URL and secret read from the environment."""

    receiver: Receiver
    url: str
    secret: bytes | None

    def wants(self, event: Event) -> bool:
        r = self.receiver
        if event.name not in r.events:
            return False
        if event.rollout is None or not r.rollouts:
            return True  # fleet events are about nodes, not rollouts
        return any(fnmatch.fnmatchcase(event.rollout, glob) for glob in r.rollouts)

    def request(self, event: Event) -> tuple[bytes, dict[str, str]]:
        """The body and headers of one delivery of ``event``."""
        data = {"text": slack_text(event)} if self.receiver.format == "slack" else json_body(event)
        body = json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()
        headers = {
            "Content-Type": "application/json",
            "X-Reconciler-Event": event.name,
            "X-Reconciler-Delivery": event.delivery_id,
        }
        if self.secret is not None:
            digest = hmac.new(self.secret, body, hashlib.sha256).hexdigest()
            headers["X-Reconciler-Signature"] = f"sha256={digest}"
        return body, headers


def resolve(receivers: Iterable[Receiver], environ: Mapping[str, str]) -> tuple[Destination, ...]:
    """Every receiver's URL and secret from ``environ``; all problems at
    once, each naming its receiver (never showing a URL)."""
    problems: list[str] = []
    destinations: list[Destination] = []
    names: set[str] = set()
    for r in receivers:
        if r.name in names:
            problems.append(f"receiver {r.name!r} is named twice: give each its own name")
            continue
        names.add(r.name)
        url = environ.get(r.url_env, "").strip()
        if not url:
            problems.append(
                f"receiver {r.name!r}: environment variable {r.url_env} (urlEnv) is not set; "
                "set it to the receiver's http(s) URL in the daemon's environment"
            )
        elif not _is_http_url(url):
            scheme = url.split(":", 1)[0] if ":" in url else "no scheme"
            problems.append(
                f"receiver {r.name!r}: {r.url_env} is not an http(s) URL ({scheme}); "
                "set it to a URL starting with https:// or http://"
            )
        secret = None
        if r.secret_env is not None:
            value = environ.get(r.secret_env, "")
            if not value:
                problems.append(
                    f"receiver {r.name!r}: environment variable {r.secret_env} (secretEnv) is "
                    "not set; set it to the shared secret, or remove secretEnv"
                )
            secret = value.encode()
        destinations.append(Destination(r, url, secret))
    if problems:
        raise ReceiverConfigError(
            "notifications cannot start: " + "; ".join(problems),
            f"fix spec.notifications in {SETTINGS_PATH} or the daemon's environment",
        )
    return tuple(destinations)


def _is_http_url(url: str) -> bool:
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, ValueError):
        return False
    return parsed.scheme in ("http", "https") and bool(parsed.host)


def receivers_at(store: GitStore, commit: str | None) -> tuple[Receiver, ...]:
    """The receivers ``reconciler.yaml`` declares at ``commit``, for the
    check at start: a settings file whose notifications cannot be read
    stops the start, rather than run without them."""
    blob = store.file_blob(commit, SETTINGS_PATH) if commit else None
    if blob is None:
        return ()
    data = store.blob(blob)
    parsed = parse_file(SETTINGS_PATH, data)
    if parsed.problems and (
        b"notifications" in data or any("notifications" in p.field for p in parsed.problems)
    ):
        raise ReceiverConfigError(
            "notifications cannot start: " + "; ".join(str(p) for p in parsed.problems),
            f"fix {SETTINGS_PATH}",
        )
    return parsed.settings.notifications if parsed.settings is not None else ()


class NotificationMetrics:
    def __init__(self, metrics: Metrics) -> None:
        r = metrics.registry
        self.sent = Counter(
            "reconciler_notifications_sent", "Deliveries a receiver accepted", ["receiver"],
            registry=r,
        )  # fmt: skip
        self.failed = Counter(
            "reconciler_notifications_failed",
            "Delivery attempts that failed and are retried (connection error, timeout, 5xx)",
            ["receiver"],
            registry=r,
        )
        self.dropped = Counter(
            "reconciler_notifications_dropped",
            "Deliveries given up: a 4xx, an hour of failures, or a full queue",
            ["receiver"],
            registry=r,
        )


@dataclass(frozen=True)
class Backoff:
    first: float = BACKOFF_FIRST
    cap: float = BACKOFF_CAP
    give_up: float = GIVE_UP_AFTER


class Delivered:
    """The delivery ids one receiver accepted, oldest first, kept in the
    state directory (one file per receiver) so that a restart never posts
    one again. Without a state directory it remembers nothing."""

    def __init__(self, state: DaemonState | None, receiver: str) -> None:
        self.state = state
        digest = hashlib.sha256(receiver.encode()).hexdigest()[:16]
        self.name = f"delivered-{digest}"
        self.ids: OrderedDict[str, None] = OrderedDict()
        text = state.read(self.name) if state is not None else None
        for line in (text or "").splitlines():
            if line.strip():
                self.ids[line.strip()] = None

    def __contains__(self, delivery_id: str) -> bool:
        return delivery_id in self.ids

    def add(self, delivery_id: str) -> None:
        """Record an accepted id, written at once (atomically)."""
        self.ids[delivery_id] = None
        self.ids.move_to_end(delivery_id)
        while len(self.ids) > REMEMBERED_IDS:
            self.ids.popitem(last=False)
        if self.state is not None:
            self.state.write(self.name, "".join(f"{i}\n" for i in self.ids))


class _Worker:
    """One receiver's queue and the thread that empties it in order."""

    def __init__(
        self,
        destination: Destination,
        log: EventLog,
        metrics: NotificationMetrics,
        backoff: Backoff,
        timeout: float,
        queue_size: int,
        delivered: Delivered,
    ) -> None:
        self.destination = destination
        self.delivered = delivered
        self.name = destination.receiver.name
        for counter in (metrics.sent, metrics.failed, metrics.dropped):
            counter.labels(receiver=self.name)  # at 0 from the start
        self.log = log
        self.metrics = metrics
        self.backoff = backoff
        self.queue: queue.Queue[Event] = queue.Queue(maxsize=queue_size)
        self.queued: OrderedDict[str, None] = OrderedDict()  # delivery ids, oldest first
        self.stopping = threading.Event()
        self.busy = False
        self.timeout = timeout
        self.http = OutsideHttp()
        self.thread = threading.Thread(target=self._run, name=f"notify-{self.name}", daemon=True)
        self.thread.start()

    def offer(self, event: Event) -> None:
        """Queue ``event`` unless it was queued or accepted before; never
        blocks."""
        if event.delivery_id in self.queued or event.delivery_id in self.delivered:
            return
        try:
            self.queue.put_nowait(event)
        except queue.Full:
            self.metrics.dropped.labels(receiver=self.name).inc()
            self.log.error(
                "notify_dropped",
                f"queue full ({self.queue.maxsize} events waiting): {event.name} dropped",
                receiver=self.name,
                rollout=event.rollout or "",
                delivery=event.delivery_id,
            )
            return
        self.queued[event.delivery_id] = None
        if len(self.queued) > REMEMBERED_IDS:
            self.queued.popitem(last=False)

    def idle(self) -> bool:
        return self.queue.empty() and not self.busy

    def stop(self) -> None:
        self.stopping.set()

    def join(self, timeout: float) -> None:
        self.thread.join(timeout)

    def _run(self) -> None:
        while not self.stopping.is_set():
            try:
                event = self.queue.get(timeout=0.2)
            except queue.Empty:
                continue
            self.busy = True
            try:
                self._deliver(event)
            except Exception as exc:  # a bug must not silence the receiver for good
                self.metrics.dropped.labels(receiver=self.name).inc()
                self.log.error(
                    "notify_failed", f"{event.name} dropped: {type(exc).__name__}: {exc}",
                    receiver=self.name, delivery=event.delivery_id,
                )  # fmt: skip
            finally:
                self.busy = False

    def _remember(self, event: Event) -> None:
        try:
            self.delivered.add(event.delivery_id)
        except ReconcilerError as exc:  # the post went out; only the record is lost
            self.log.error("notify_record", f"{exc}; a restart may post it again", **{
                "receiver": self.name, "delivery": event.delivery_id,
            })  # fmt: skip

    def _deliver(self, event: Event) -> None:
        body, headers = self.destination.request(event)
        # Named by the receiver, never by its URL, which may hold a secret.
        where = f"receiver {self.name}"
        ask = Ask(where, self.destination.url, "POST", body, tuple(headers.items()))
        fields = {"receiver": self.name, "notification": event.name, "delivery": event.delivery_id}
        if event.rollout:
            fields["rollout"] = event.rollout
        started = time.monotonic()
        delay = self.backoff.first
        attempt = 0
        while not self.stopping.is_set():
            attempt += 1
            (answer,) = self.http.ask_all([ask], timeout=self.timeout, concurrency=1)
            if isinstance(answer, NoAnswer):  # refused, reset, late, or too long
                why = answer.reason
            else:
                if 200 <= answer.status < 300:
                    self.metrics.sent.labels(receiver=self.name).inc()
                    self._remember(event)
                    self.log.info("notified", f"{event.name} delivered", attempt=attempt, **fields)
                    return
                if answer.status < 500:
                    self.metrics.dropped.labels(receiver=self.name).inc()
                    self.log.warning(
                        "notify_refused",
                        f"the receiver answered {answer.status}: {event.name} dropped "
                        "(a 4xx is not retried; check the receiver's configuration)",
                        **fields,
                    )
                    return
                why = f"HTTP {answer.status}"
            self.metrics.failed.labels(receiver=self.name).inc()
            if time.monotonic() - started + delay > self.backoff.give_up:
                self.metrics.dropped.labels(receiver=self.name).inc()
                self.log.error(
                    "notify_gave_up",
                    f"{event.name} dropped after {attempt} attempts over "
                    f"{time.monotonic() - started:.0f}s; last: {why}",
                    **fields,
                )
                return
            self.log.warning(
                "notify_retry", f"attempt {attempt} failed ({why}); retrying in {delay:g}s",
                **fields,
            )  # fmt: skip
            if self.stopping.wait(delay):
                return
            delay = min(delay * 2, self.backoff.cap)


class Notifier:
    """The receivers of one daemon and their queues. ``publish`` is the
    pass's only call, and it never waits for a receiver."""

    def __init__(
        self,
        destinations: Iterable[Destination],
        *,
        log: EventLog | None = None,
        metrics: Metrics | None = None,
        backoff: Backoff = Backoff(),
        timeout: float = REQUEST_TIMEOUT,
        queue_size: int = QUEUE_SIZE,
        environ: Mapping[str, str] | None = None,
        state: DaemonState | None = None,
    ) -> None:
        self.log = log or EventLog()
        self.state = state
        self.metrics = NotificationMetrics(metrics or Metrics())
        self.backoff = backoff
        self.timeout = timeout
        self.queue_size = queue_size
        self.environ = environ
        self.workers: dict[str, _Worker] = {}
        self.receivers: tuple[Receiver, ...] = ()
        self._set(tuple(destinations))

    def _set(self, destinations: tuple[Destination, ...]) -> None:
        keep = {d.receiver.name: d for d in destinations}
        for name in [n for n, w in self.workers.items() if keep.get(n) != w.destination]:
            self.workers.pop(name).stop()
        for name, destination in keep.items():
            if name not in self.workers:
                self.workers[name] = _Worker(
                    destination, self.log, self.metrics, self.backoff, self.timeout,
                    self.queue_size, Delivered(self.state, name),
                )  # fmt: skip
        self.receivers = tuple(d.receiver for d in destinations)

    def reconfigure(self, receivers: tuple[Receiver, ...], environ: Mapping[str, str]) -> None:
        """Use the receivers of newer settings. Ones that cannot be used
        (an environment variable missing) leave the current ones running,
        with an error in the log: the daemon keeps going."""
        if receivers == self.receivers:
            return
        try:
            destinations = resolve(receivers, environ)
        except ReceiverConfigError as exc:
            self.log.error("notify_config", f"{exc}; the previous receivers stay in use")
            self.receivers = receivers  # reported once, not on every pass
            return
        self._set(destinations)
        self.log.info(
            "notify_config", "receivers: " + (", ".join(r.name for r in receivers) or "none")
        )

    def publish(self, events: Iterable[Event]) -> None:
        for event in events:
            for worker in self.workers.values():
                if worker.destination.wants(event):
                    worker.offer(event)

    def drain(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for every queue to empty; True if
        they did."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(w.idle() for w in self.workers.values()):
                return True
            time.sleep(0.05)
        return all(w.idle() for w in self.workers.values())

    def close(self, timeout: float = 2.0) -> None:
        """Stop every receiver's thread; what is still queued is not sent
        (a restart delivers again what is still true)."""
        for worker in self.workers.values():
            worker.stop()
        for worker in self.workers.values():
            worker.join(timeout)


__all__ = [
    "Backoff",
    "Destination",
    "Notifier",
    "ReceiverConfigError",
    "receivers_at",
    "resolve",
]
