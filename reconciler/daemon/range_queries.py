"""Asks Prometheus the range queries of the rollouts' comparisons
(docs/health.md): ``GET URL/api/v1/query_range?query=...&start=...&end=...&step=...``,
many at once with bounded concurrency and a timeout; identical queries
(same text, window and step) in one round are asked once.

A judging pass asks thousands (three per node of a batch and of its
baseline). Queries over the same window and step are combined, up to
``BATCH_PARTS`` a request (``_Ask``: each part tagged with a label of its
own, joined with PromQL's ``or``, sent as a form ``POST``), so a batch of a
thousand nodes is some sixty requests, not six thousand; a combined query
Prometheus refuses is asked again part by part, so every error is the
part's own. ``run --plain`` asks each query on its own. Over ``http`` a
round goes through the daemon's own h11
client (``agent_http``) on one event loop: ``concurrency`` keep-alive
connections, each reused for the whole round, at a fraction of httpx's CPU
per request. A round in which one query times out asks no more, as
Prometheus is then not answering (the rest are errors at once).
``https`` goes through ``outside_http`` (httpx, which checks the
certificate against the system's trust store: the h11 client only knows
pinned agent certificates). Both bound each answer's time and size.

Every failure is an answer, never an exception: a connection error, a
timeout, an HTTP error or a body we cannot use is a ``RangeAnswer`` with
``error`` (no evidence).

Must not: decide anything (``canary_readings`` judges the samples).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import quote_plus, urlsplit

from reconciler.daemon.agent_http import MAX_ANSWER_BYTES, HttpClient, Unreachable
from reconciler.daemon.outside_http import Answered, Ask, OutsideHttp, json_of
from reconciler.daemon.prometheus_client import error_text

DEFAULT_CONCURRENCY = 16  # Prometheus is the wait: it evaluates queries on all its cores
DEFAULT_TIMEOUT = 5.0  # seconds per query


@dataclass(frozen=True)
class RangeQuery:
    query: str
    start: datetime
    end: datetime
    step: int  # seconds


@dataclass(frozen=True)
class RangeAnswer:
    """Each series' samples, ``(unix time, value)`` in time order; or why none."""

    series: tuple[tuple[tuple[float, float], ...], ...] = ()
    error: str = ""

    def values(self) -> list[float]:
        """Every sample of every series, pooled."""
        return [v for one in self.series for _, v in one]

    def by_time(self) -> dict[float, float]:
        """The sum over the series at each step (a count over its labels)."""
        summed: dict[float, float] = {}
        for one in self.series:
            for t, v in one:
                summed[t] = summed.get(t, 0.0) + v
        return summed


class RangeQueries:
    """``batched``: queries over the same window and step go to Prometheus
    combined, up to ``BATCH_PARTS`` in one request (``_Ask``); off, each is
    a request of its own (``run --plain``). The answers are the same:
    ``tests/test_range_queries.py`` asks both ways."""

    def __init__(
        self,
        *,
        concurrency: int = DEFAULT_CONCURRENCY,
        timeout: float = DEFAULT_TIMEOUT,
        batched: bool = True,
    ) -> None:
        self.concurrency = concurrency
        self.timeout = timeout
        self.batched = batched
        self.http = OutsideHttp()  # the https path

    def ask_all(
        self, base_url: str, queries: Iterable[RangeQuery]
    ) -> dict[RangeQuery, RangeAnswer]:
        """Each distinct query's answer."""
        distinct = list(dict.fromkeys(queries))
        if not distinct:
            return {}
        why = _url_problem(base_url)
        if why:
            return {q: RangeAnswer(error=why) for q in distinct}
        endpoint = base_url.rstrip("/") + PATH
        asks = _combined(distinct) if self.batched else [_Ask((q,)) for q in distinct]
        answers: dict[RangeQuery, RangeAnswer] = {}
        while asks:  # two rounds at most: a query on its own always has its answer
            alone: list[RangeQuery] = []
            for ask, reply in zip(asks, self._send_all(base_url, asks), strict=True):
                split = _split(endpoint, ask, reply)
                if split is None:  # Prometheus refused the combined query: each on its own
                    alone.extend(ask.parts)
                else:
                    answers.update(split)
            asks = [_Ask((q,)) for q in alone]
        return {q: answers[q] for q in distinct}

    def _send_all(self, base_url: str, asks: Sequence[_Ask]) -> list[_Reply]:
        if base_url.startswith("https:"):
            return self._send_all_httpx(base_url, asks)
        return asyncio.run(self._send_all_h11(base_url, asks))

    async def _send_all_h11(self, base_url: str, asks: Sequence[_Ask]) -> list[_Reply]:
        # A client for this round only: its connections belong to this loop.
        client = HttpClient(self.timeout, self.concurrency)
        replies: list[_Reply] = [""] * len(asks)
        todo: Iterator[tuple[int, _Ask]] = iter(enumerate(asks))
        base = base_url.rstrip("/")

        async def worker() -> None:
            for i, ask in todo:
                try:
                    if ask.combined:
                        replies[i] = await client.request(
                            base, "POST", PATH, ask.form().encode(), content_type=FORM
                        )
                    else:
                        replies[i] = await client.request(base, "GET", f"{PATH}?{ask.form()}")
                except Unreachable as exc:
                    replies[i] = f"cannot reach {base}{PATH}: {exc}"

        workers = min(self.concurrency, len(asks))
        try:
            await asyncio.gather(*(worker() for _ in range(workers)))
        finally:
            client.close()
        return replies

    def _send_all_httpx(self, base_url: str, asks: Sequence[_Ask]) -> list[_Reply]:
        endpoint = base_url.rstrip("/") + PATH
        sent = [
            Ask(endpoint, endpoint, "POST", ask.form().encode(), (("Content-Type", FORM.decode()),))
            if ask.combined
            else Ask(endpoint, f"{endpoint}?{ask.form()}")
            for ask in asks
        ]
        replies = self.http.ask_all(
            sent, timeout=self.timeout, concurrency=self.concurrency, max_bytes=MAX_ANSWER_BYTES
        )
        return [(r.status, r.body) if isinstance(r, Answered) else r.reason for r in replies]


PATH = "/api/v1/query_range"
FORM = b"application/x-www-form-urlencoded"
# Each part of a combined query is tagged with its index in this label, so
# its series can be told apart in the answer.
PART_LABEL = "reconciler_query_part"
BATCH_PARTS = 25
BATCH_POINTS = 200_000  # steps x parts in one combined query, far under Prometheus's sample cap

_Reply = tuple[int, bytes] | str  # (status, body), or why there is none


@dataclass(frozen=True)
class _Ask:
    """One request to Prometheus: a query on its own, or several over the
    same window and step combined into one expression, each part's result
    tagged with ``PART_LABEL`` and joined with ``or`` (its series never
    collide: their tags differ). Each part stands on lines of its own, so a
    comment in one (``#`` to the end of the line) ends there."""

    parts: tuple[RangeQuery, ...]

    @property
    def combined(self) -> bool:
        return len(self.parts) > 1

    def form(self) -> str:
        first = self.parts[0]
        text = first.query
        if self.combined:
            text = "\nor\n".join(
                f'label_replace(\n(\n{q.query}\n),\n"{PART_LABEL}", "{i}", "", "")'
                for i, q in enumerate(self.parts)
            )
        return (
            f"query={quote_plus(text)}&start={first.start.timestamp():.3f}"
            f"&end={first.end.timestamp():.3f}&step={first.step}"
        )


def _combined(queries: Sequence[RangeQuery]) -> list[_Ask]:
    """The queries grouped by window and step, in requests of at most
    ``BATCH_PARTS`` parts and ``BATCH_POINTS`` steps in all."""
    by_window: dict[tuple[datetime, datetime, int], list[RangeQuery]] = {}
    for q in queries:
        by_window.setdefault((q.start, q.end, q.step), []).append(q)
    asks: list[_Ask] = []
    for (start, end, step), group in by_window.items():
        steps = max(1, int((end - start).total_seconds() // max(step, 1)) + 1)
        size = max(1, min(BATCH_PARTS, BATCH_POINTS // steps))
        asks.extend(_Ask(tuple(group[i : i + size])) for i in range(0, len(group), size))
    return asks


def _split(endpoint: str, ask: _Ask, reply: _Reply) -> dict[RangeQuery, RangeAnswer] | None:
    """Each part's answer; None when Prometheus answered a combined query
    with an error (a part it cannot combine, such as a scalar)."""
    if isinstance(reply, str):
        return {q: RangeAnswer(error=reply) for q in ask.parts}
    status, content = reply
    if not ask.combined:
        return {ask.parts[0]: _answer(endpoint, status, content)}
    body = _body(content)
    if status != 200 or body is None or body.get("status") != "success":
        return None
    parts = parse_parts(body)
    if parts is None:
        return None
    return {q: RangeAnswer(series=parts.get(str(i), ())) for i, q in enumerate(ask.parts)}


def _url_problem(url: str) -> str:
    parts = urlsplit(url)
    try:
        parts.port  # noqa: B018 (raises on a port that is not one)
    except ValueError as exc:
        return f"settings.spec.prometheus.url {url!r}: {exc}"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"settings.spec.prometheus.url {url!r} is not an http(s) URL"
    return ""


def _body(content: bytes) -> dict[str, Any] | None:
    body = json_of(content)
    return body if isinstance(body, dict) else None


def _answer(endpoint: str, status: int, content: bytes) -> RangeAnswer:
    body = _body(content)
    if status != 200 or body is None:
        why = error_text(body) or f"HTTP {status}"
        return RangeAnswer(error=f"{endpoint} answered {why}")
    return parse_matrix(body)


Series = tuple[tuple[float, float], ...]


def parse_matrix(body: dict[str, Any]) -> RangeAnswer:
    """A successful ``/api/v1/query_range`` body as series of samples;
    samples that are not numbers (NaN, as a quantile of nothing gives) are
    left out."""
    data = body.get("data")
    if body.get("status") != "success" or not isinstance(data, dict):
        return RangeAnswer(error=error_text(body) or "an answer without data")
    if data.get("resultType") != "matrix" or not isinstance(data.get("result"), list):
        return RangeAnswer(error=f"a {data.get('resultType')} result: expected a matrix")
    try:
        series = tuple(_samples(one) for one in data["result"])
    except (KeyError, TypeError, ValueError, AttributeError):
        return RangeAnswer(error="a result whose samples are not numbers")
    return RangeAnswer(series=series)


def parse_parts(body: dict[str, Any]) -> dict[str, tuple[Series, ...]] | None:
    """A combined query's answer: each part's series, by its ``PART_LABEL``;
    None when it is not a matrix of numbers."""
    data = body.get("data")
    if not isinstance(data, dict) or data.get("resultType") != "matrix":
        return None
    parts: dict[str, list[Series]] = {}
    try:
        for one in data["result"]:
            parts.setdefault(one["metric"][PART_LABEL], []).append(_samples(one))
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    return {part: tuple(series) for part, series in parts.items()}


def _samples(one: dict[str, Any]) -> Series:
    found = []
    for t, v in one["values"]:  # a loop, not generators: a round parses 100,000 samples
        value = float(v)
        if math.isfinite(value):
            found.append((float(t), value))
    return tuple(found)
