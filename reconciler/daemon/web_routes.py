"""What ``run --http`` answers (docs/web.md): who may ask, which path is
which answer, and the views the answers come from.

Access: a request whose ``Host`` is not the served address or a name the
operator allows (``HostRule``) gets 421, so a page from a DNS-rebound name
cannot read the answers. With a token file, every request but the
``/healthz`` probe (the page included) needs ``Authorization: Bearer
TOKEN``, compared in constant time; without one, only clients whose
address is 127.0.0.1 or ::1 are served (any other source address, the rest
of 127.0.0.0/8 included, gets 401). Errors are JSON, ``{"error",
"message"}``: 401, 404 (unknown paths and rollouts), 405 (any method but
GET and HEAD, with ``Allow: GET, HEAD``), 400 (bad ``offset``/``limit``), 421 (a Host not served), 503 (before
the first view). Nothing secret is served: answers are the committed
status files and the page's own assets.

The paths are a route table (``protocol.http_routes``); the Host check
wraps the whole table, and the access check every route but the probe.

Must not: read Git or touch sockets (the server core, run by
``web_server``, does), or change anything: actions stay commits.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote

from reconciler.protocol.h11_server import Answer, Request, Response, Stream
from reconciler.protocol.http_routes import Params, Route, RouteHandler, RouteTable
from reconciler.spec.paths import NAME_RE
from reconciler.text.web_answers import (
    DEFAULT_LIMIT,
    MAX_LIMIT,
    Answers,
    StatusView,
    answers_for,
    events_between,
)

ASSETS_DIR = Path(__file__).resolve().parent / "web"
# path -> (file, content type); nothing else is read from disk
ASSETS = {
    "/page.js": ("page.js", "text/javascript; charset=utf-8"),
    "/page.css": ("page.css", "text/css; charset=utf-8"),
}
_JSON = "application/json"
_COMMON = (("Cache-Control", "no-store"), ("X-Content-Type-Options", "nosniff"))
_PAGE_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
STREAM_OPENING = b"retry: 2000\n: events of committed status\n\n"
READ_METHODS = frozenset({"GET", "HEAD"})
ALLOW = "GET, HEAD"
NOT_READY_PAGE = (
    b'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
    b'<meta http-equiv="refresh" content="1"><title>reconciler: starting</title></head>'
    b"<body><h1>reconciler</h1><p>The daemon has not read the status branch yet; this "
    b"page reloads by itself.</p></body></html>\n"
)


Metrics = Callable[[], bytes]  # the Prometheus text, when /metrics shares the address
Health = Callable[[], tuple[bool, dict[str, Any]]]  # /healthz: (healthy, why), likewise

LOOPBACK_NAMES = frozenset({"127.0.0.1", "::1", "localhost"})
_ANY_ADDRESS = frozenset({"0.0.0.0", "::", ""})


@dataclass(frozen=True)
class HostRule:
    """Which ``Host`` headers are answered: the served address (bound to a
    loopback address, ``localhost`` too), the names the operator allows
    (``run --http-allow-host``), and when bound to every address any IP
    address written as such. A DNS-rebinding page always sends a name."""

    names: frozenset[str] = LOOPBACK_NAMES
    any_address: bool = False

    @classmethod
    def served(cls, bound: str, allowed: Iterable[str] = ()) -> HostRule:
        bound = bound.strip("[]").lower()
        names = {bound} | {_host_name(name) for name in allowed}
        if bound in LOOPBACK_NAMES or _loopback(bound):
            names |= LOOPBACK_NAMES
        return cls(frozenset(names - _ANY_ADDRESS), bound in _ANY_ADDRESS)

    def allows(self, header: str | None) -> bool:
        if header is None:  # HTTP/1.0 without a Host: no browser sends that
            return True
        name = _host_name(header)
        return name in self.names or (self.any_address and _ip_address(name))


class Routes:
    """The answers of the latest view, and who gets them."""

    def __init__(
        self,
        *,
        token: str | None = None,
        metrics: Metrics | None = None,
        health: Health | None = None,
        hosts: HostRule = HostRule(),
    ) -> None:
        self.token = token
        self.metrics = metrics
        self.health = health
        self.hosts = hosts
        self.answers: Answers | None = None
        self.assets = {
            path: (ASSETS_DIR.joinpath(name).read_bytes(), kind)
            for path, (name, kind) in ASSETS.items()
        }
        self.table = self._table()

    # -- views --------------------------------------------------------------------

    def events(self, view: StatusView) -> list[bytes]:
        """The event frames ``view`` brings since the view answered from
        (none for the first: nothing is replayed)."""
        before = self.answers
        if before is None or self._same(before.view, view):
            return []
        return [event.frame() for event in events_between(before.view, view)]

    def take(self, view: StatusView) -> None:
        """Answer from ``view`` from now on."""
        before = self.answers
        if before is None or not self._same(before.view, view):
            self.answers = answers_for(view, before)

    @staticmethod
    def _same(before: StatusView, view: StatusView) -> bool:
        """The daemon's own commit, read back by its next pass."""
        return (
            view.commit is not None and before.commit == view.commit and before.fleet == view.fleet
        )

    # -- requests -------------------------------------------------------------------

    def _table(self) -> RouteTable:
        """Which path is which answer. Every route but the probe is behind
        ``_authorized``, and every one behind ``_host_served``; the API's
        answers wait for the first view (``_ready``)."""
        authorized, ready = self._authorized, self._ready
        routes = [Route(READ_METHODS, "/healthz", self._health)] if self.health is not None else []
        routes += [
            Route(READ_METHODS, "/", authorized(self._page)),
            *(Route(READ_METHODS, path, authorized(self._asset)) for path in self.assets),
        ]
        if self.metrics is not None:
            routes.append(Route(READ_METHODS, "/metrics", authorized(self._metrics)))
        routes += [
            Route(frozenset({"GET"}), "/api/v1/events", authorized(self._events)),
            Route(frozenset({"HEAD"}), "/api/v1/events", authorized(self._events_head)),
            Route(READ_METHODS, "/api/v1/rollouts", authorized(ready(self._rollouts))),
            Route(READ_METHODS, "/api/v1/fleet", authorized(ready(self._fleet))),
            Route(READ_METHODS, "/api/v1/rollouts/{name...}", authorized(ready(self._rollout))),
            Route(READ_METHODS, "/api/v1/{rest...}", authorized(ready(self._not_found))),
        ]
        return RouteTable(routes, missing=authorized(self._unrouted))

    def answer(self, request: Request) -> Response | Stream:
        """The answer to one request (the server core's handler): only for
        a ``Host`` served, then from the route table."""
        if not self.hosts.allows(request.headers.get("host")):
            return self._wrong_host(request.headers.get("host", ""))
        answer = self.table.answer(request)
        assert isinstance(answer, Response | Stream)
        return answer

    def handle(
        self, method: str, target: str, headers: dict[str, str], peer: str
    ) -> Response | Stream:
        """The answer to one request; ``headers`` by lower-case name."""
        path, _, query = target.partition("?")
        return self.answer(Request(method, path, b"", query, headers=headers, peer=peer))

    def _authorized(self, handler: RouteHandler) -> RouteHandler:
        """``handler`` for a client with the token, or without one from loopback; else 401."""

        def authorized(request: Request, params: Params) -> Answer:
            refused = self._refusal(request.headers, request.peer)
            return handler(request, params) if refused is None else refused

        return authorized

    def _ready(self, handler: Callable[[Request, Params, Answers], Response]) -> RouteHandler:
        """``handler`` with the latest view's answers; 503 before the first."""

        def ready(request: Request, params: Params) -> Response:
            answers = self.answers
            if answers is None:
                reply = self.error(
                    503, "not_ready", "the daemon has not read the status branch yet"
                )
                return Response(503, reply.body, (*reply.headers, ("Retry-After", "1")))
            return handler(request, params, answers)

        return ready

    def _unrouted(self, request: Request, params: Params) -> Response:
        """A method this API never answers (405), else a path it does not serve (404)."""
        if request.method not in READ_METHODS:
            return self._not_allowed(request, params)
        return self._not_found_anywhere(request, params)

    def _not_allowed(self, request: Request, params: Params) -> Response:
        reply = self.error(
            405, "method_not_allowed", f"{request.method} is not allowed: this API only reads"
        )
        return Response(reply.status, reply.body, (*reply.headers, ("Allow", ALLOW)))

    def _not_found_anywhere(self, request: Request, params: Params) -> Response:
        return self.error(404, "not_found", f"no such path: {request.path}; see /api/v1/rollouts")

    def _not_found(self, request: Request, params: Params, answers: Answers) -> Response:
        return self._not_found_anywhere(request, params)

    def _asset(self, request: Request, params: Params) -> Response:
        body, kind = self.assets[request.path]
        return Response(200, body, (*_COMMON, ("Content-Type", kind)))

    def _metrics(self, request: Request, params: Params) -> Response:
        assert self.metrics is not None
        return Response(200, self.metrics(), (("Content-Type", "text/plain; version=0.0.4"),))

    def _events(self, request: Request, params: Params) -> Stream:
        return Stream(
            (*_COMMON, ("Content-Type", "text/event-stream"), ("X-Accel-Buffering", "no")),
            STREAM_OPENING,
        )

    def _events_head(self, request: Request, params: Params) -> Response:
        # the stream's head, and no stream
        return Response(200, b"", (*_COMMON, ("Content-Type", "text/event-stream")))

    def _page(self, request: Request, params: Params) -> Response:
        """The page, rendered from the latest view (``?rollout=NAME``: that
        rollout in full); before the first view, a page that reloads itself."""
        headers = (
            *_COMMON,
            ("Content-Type", "text/html; charset=utf-8"),
            ("Content-Security-Policy", _PAGE_POLICY),
        )
        answers = self.answers
        if answers is None:
            return Response(503, NOT_READY_PAGE, (*headers, ("Retry-After", "1")))
        chosen = parse_qs(request.query).get("rollout", [""])[-1] or None
        commit = (("X-Status-Commit", answers.view.commit or ""),)
        return Response(200, answers.page(chosen), (*headers, *commit))

    @staticmethod
    def _rollouts(request: Request, params: Params, answers: Answers) -> Response:
        commit = ("X-Status-Commit", answers.view.commit or "")
        return Response(200, answers.rollouts, (*_COMMON, ("Content-Type", _JSON), commit))

    @staticmethod
    def _fleet(request: Request, params: Params, answers: Answers) -> Response:
        commit = ("X-Status-Commit", answers.view.commit or "")
        return Response(200, answers.fleet, (*_COMMON, ("Content-Type", _JSON), commit))

    def _rollout(self, request: Request, params: Params, answers: Answers) -> Response:
        """One rollout's status, its nodes a page at a time."""
        name = unquote(params["name"])
        if not name:
            return self._not_found(request, params, answers)
        paging = _paging(request.query)
        if isinstance(paging, Response):
            return paging
        offset, limit = paging
        body = answers.rollout(name, offset, limit) if NAME_RE.fullmatch(name) else None
        if body is None:
            return self.error(404, "no_such_rollout", f"no rollout named {name!r} has a status")
        total = len(answers.view.statuses[name].nodes)
        headers: tuple[tuple[str, str], ...] = (
            *_COMMON,
            ("Content-Type", _JSON),
            ("X-Status-Commit", answers.view.commit or ""),
            ("X-Node-Count", str(total)),
        )
        if offset + limit < total:
            link = f"</api/v1/rollouts/{quote(name)}?offset={offset + limit}&limit={limit}>"
            headers += (("Link", f'{link}; rel="next"'),)
        return Response(200, body, headers)

    def _health(self, request: Request, params: Params) -> Response:
        assert self.health is not None
        healthy, body = self.health()
        data = json.dumps(body).encode() + b"\n"
        return Response(200 if healthy else 503, data, (*_COMMON, ("Content-Type", _JSON)))

    def _wrong_host(self, host: str) -> Response:
        shown = ", ".join(sorted(self.hosts.names)) or "an IP address"
        return self.error(
            421,
            "unknown_host",
            f"this server does not answer for Host {host!r}, only for {shown}: behind a "
            "reverse proxy that passes its own name, start the daemon with "
            "--http-allow-host NAME",
        )

    def _refusal(self, headers: Mapping[str, str], peer: str) -> Response | None:
        if self.token is None:
            if _loopback(peer):
                return None
            reply = self.error(
                401,
                "unauthorized",
                "only 127.0.0.1 and ::1 are served without a token; start the daemon with "
                "--http-token-file and send Authorization: Bearer TOKEN",
            )
        else:
            given = headers.get("authorization", "")
            scheme, _, value = given.partition(" ")
            if scheme.lower() == "bearer" and hmac.compare_digest(
                value.strip().encode(), self.token.encode()
            ):
                return None
            reply = self.error(
                401, "unauthorized", "missing or wrong token: send Authorization: Bearer TOKEN"
            )
        return Response(401, reply.body, (*reply.headers, ("WWW-Authenticate", "Bearer")))

    @staticmethod
    def error(status: int, code: str, message: str) -> Response:
        body = json.dumps({"error": code, "message": message}).encode()
        return Response(status, body, (*_COMMON, ("Content-Type", _JSON)))


def _loopback(peer: str) -> bool:
    """127.0.0.1 or ::1 (also as an IPv4-mapped IPv6 address)."""
    try:
        address = ipaddress.ip_address(peer.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return str(address) in ("127.0.0.1", "::1")


def _host_name(header: str) -> str:
    """The name in a ``Host`` header: no port, no brackets, lower case."""
    value = header.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    name, sep, port = value.rpartition(":")
    if sep and ":" not in name and ((port.isascii() and port.isdigit()) or not port):
        value = name
    return value.rstrip(".")


def _ip_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _paging(query: str) -> tuple[int, int] | Response:
    """``offset`` and ``limit`` of a rollout's nodes (defaults 0 and 500)."""
    values = parse_qs(query, keep_blank_values=True)
    found = []
    for key, default, low in (("offset", 0, 0), ("limit", DEFAULT_LIMIT, 1)):
        text = values.get(key, [str(default)])[-1]
        high = MAX_LIMIT if key == "limit" else 10**9
        # ASCII only: str.isdigit also says yes to "²", which int() refuses
        if not (text.isascii() and text.isdigit()) or not low <= int(text) <= high:
            top = MAX_LIMIT if key == "limit" else "1000000000"
            return Routes.error(400, "bad_query", f"{key} must be an integer from {low} to {top}")
        found.append(int(text))
    return found[0], found[1]


def read_token(path: Path) -> str:
    """The token in ``path`` (surrounding white space dropped); ValueError when empty."""
    token = path.read_text(encoding="utf-8").strip()
    if not token or any(c.isspace() for c in token):
        raise ValueError(f"{path}: the token must be one word of text, not empty")
    return token


__all__ = ["ASSETS_DIR", "HostRule", "Routes", "read_token"]
