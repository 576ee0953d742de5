"""The route table both servers answer from: a request goes to the first
route whose methods and pattern match, with the names the pattern
captured, else to ``missing``."""

from __future__ import annotations

from reconciler.protocol.h11_server import Request, Response
from reconciler.protocol.http_routes import Params, Route, RouteHandler, RouteTable

GET = frozenset({"GET"})


def named(name: str) -> RouteHandler:
    def handler(request: Request, params: Params) -> Response:
        shown = ",".join(f"{k}={v}" for k, v in sorted(params.items()))
        return Response(200, f"{name} {shown}".encode())

    return handler


TABLE = RouteTable(
    [
        Route(GET, "/v1/nodes/{node}/jobs/{job}", named("job")),
        Route(None, "/v1/nodes/{node}/{rest...}", named("rest")),
        Route(GET, "/metrics", named("metrics")),
    ],
    missing=named("missing"),
)


def answer(method: str, path: str) -> str:
    response = TABLE.answer(Request(method, path, b""))
    assert isinstance(response, Response)
    return response.body.decode()


def test_names_capture_one_segment_each_and_the_first_match_wins() -> None:
    assert answer("GET", "/v1/nodes/a/jobs/j1") == "job job=j1,node=a"
    assert answer("POST", "/v1/nodes/a/jobs/j1") == "rest node=a,rest=jobs/j1"


def test_a_name_matches_an_empty_segment_and_a_rest_needs_one_segment_at_least() -> None:
    assert answer("GET", "/v1/nodes/a/jobs/") == "job job=,node=a"
    assert answer("GET", "/v1/nodes//heartbeat") == "rest node=,rest=heartbeat"
    assert answer("GET", "/v1/nodes/a/") == "rest node=a,rest="
    assert answer("GET", "/v1/nodes/a") == "missing "


def test_a_method_not_listed_falls_through_to_missing() -> None:
    assert answer("GET", "/metrics") == "metrics "
    assert answer("DELETE", "/metrics") == "missing "
    assert answer("GET", "/metrics/") == "missing "
