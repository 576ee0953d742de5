"""A route table: method and path pattern to handler, first match wins.

A pattern is a path whose segments may be ``{name}`` (any one segment,
empty included) or end in ``{name...}`` (the rest of the path, one segment
or more, slashes kept). What a handler needs before it runs (a token, the
node it serves) is a wrapper around it, not a branch here.

Must not: touch sockets, or know what a path means; the server core
(``h11_server``) carries the requests and answers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from reconciler.protocol.h11_server import Answer, Request

Params = Mapping[str, str]
RouteHandler = Callable[[Request, Params], Answer]


@dataclass(frozen=True)
class Route:
    """``methods`` None: any method."""

    methods: frozenset[str] | None
    pattern: str
    handler: RouteHandler


class RouteTable:
    """Answers a request with the handler of the first route that matches
    its method and path, else with ``missing`` (given no parameters)."""

    def __init__(self, routes: Iterable[Route], missing: RouteHandler) -> None:
        self._routes = [(route, _compiled(route.pattern)) for route in routes]
        self._missing = missing

    def answer(self, request: Request) -> Answer:
        segments = request.path.split("/")
        for route, pattern in self._routes:
            if route.methods is not None and request.method not in route.methods:
                continue
            params = _match(pattern, segments)
            if params is not None:
                return route.handler(request, params)
        return self._missing(request, {})


# A compiled pattern: its fixed segments (None where a name captures), the
# names by position, and the name of a captured rest ("" when none).
_Compiled = tuple[tuple[str | None, ...], tuple[str, ...], str]


def _compiled(pattern: str) -> _Compiled:
    parts = pattern.split("/")
    rest = ""
    if parts[-1].startswith("{") and parts[-1].endswith("...}"):
        rest = parts.pop()[1:-4]
    fixed = tuple(None if p.startswith("{") and p.endswith("}") else p for p in parts)
    names = tuple(p[1:-1] if f is None else "" for p, f in zip(parts, fixed, strict=True))
    return fixed, names, rest


def _match(pattern: _Compiled, segments: list[str]) -> dict[str, str] | None:
    fixed, names, rest = pattern
    # A rest takes one segment at least (an empty one too: a trailing slash).
    if (len(segments) <= len(fixed)) if rest else (len(segments) != len(fixed)):
        return None
    params: dict[str, str] = {}
    for want, name, got in zip(fixed, names, segments, strict=False):
        if want is None:
            params[name] = got
        elif want != got:
            return None
    if rest:
        params[rest] = "/".join(segments[len(fixed) :])
    return params
