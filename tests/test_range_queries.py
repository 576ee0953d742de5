"""The daemon's range-query client against a real Prometheus (Debian's
package, on loopback): one series per node, each step's sample, identical
queries asked once, a query Prometheus rejects and a server that is gone
as errors (no evidence), never exceptions; and a server that never answers
stalls the rest of the round rather than costing a timeout per query."""

from __future__ import annotations

import math
import socket
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from reconciler.daemon.range_queries import BATCH_PARTS, RangeAnswer, RangeQueries, RangeQuery
from tests.kit.ports import HeldPort
from tests.kit.prometheus import Exporter, PrometheusServer


def test_series_by_step_errors_and_a_stopped_server(tmp_path: Path) -> None:
    client = RangeQueries(concurrency=2, timeout=2)
    with Exporter() as exporter, PrometheusServer(tmp_path, exporter) as prom:
        exporter.set("latency_seconds", 0.1, node="gpu-a1")
        exporter.set("latency_seconds", 0.2, node="gpu-a2")
        prom.wait_for_value('latency_seconds{node="gpu-a2"}', 0.2)
        time.sleep(3)  # a few scrapes to ask for
        end = datetime.now(UTC)
        start = end - timedelta(seconds=2)
        one = RangeQuery('latency_seconds{node="gpu-a1"}', start, end, 1)
        both = RangeQuery("latency_seconds", start, end, 1)
        bad = RangeQuery("sum(rate(latency_seconds[1m]", start, end, 1)

        answers = client.ask_all(prom.url, [one, both, one, bad])

        assert len(answers) == 3  # the same query twice is asked once
        assert answers[one].error == "" and answers[one].values() == [0.1, 0.1, 0.1]
        times = [t for t, _ in answers[one].series[0]]
        assert times == sorted(times) and len(times) == 3
        assert sorted(answers[both].values()) == [0.1] * 3 + [0.2] * 3
        assert answers[both].by_time() == pytest.approx({t: 0.3 for t in times})
        assert "bad_data" in answers[bad].error
        prom.stop()
        gone = client.ask_all(prom.url, [one])[one]
        assert gone.error.startswith("cannot reach ") and gone.series == ()


@pytest.mark.parametrize("batched", [False, True])
def test_a_prometheus_that_never_answers_costs_one_timeout_a_round(batched: bool) -> None:
    # Listening, never accepting: connections complete, requests are sent,
    # nothing ever answers.
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)
    url = f"http://127.0.0.1:{silent.getsockname()[1]}"
    end = datetime.now(UTC)
    queries = [
        RangeQuery(f'latency_seconds{{node="n{i}"}}', end - timedelta(seconds=5), end, 1)
        for i in range(40)
    ]
    client = RangeQueries(concurrency=4, timeout=1, batched=batched)
    began = time.monotonic()
    try:
        answers = client.ask_all(url, queries)
    finally:
        silent.close()

    errors = [answers[q].error for q in queries]
    assert all(e.startswith(f"cannot reach {url}/api/v1/query_range: ") for e in errors)
    timed_out = [e for e in errors if e.endswith("no answer within 1s")]
    if batched:  # one window and step: one request, one timeout
        assert len(timed_out) == len(queries) and time.monotonic() - began < 3
        return
    # The first to time out stalls the server: the rest fail at once rather
    # than each waiting its second (at most the 4 already waiting time out).
    assert 1 <= len(timed_out) <= 4
    assert all("not waited for until it answers" in e for e in errors if e not in timed_out)


def test_a_url_that_is_not_one_and_a_refused_connection_are_errors_that_say_so(
    held_port: HeldPort,
) -> None:
    end = datetime.now(UTC)
    query = RangeQuery("up", end - timedelta(seconds=5), end, 1)
    client = RangeQueries(timeout=2)

    for url, error in (
        ("prometheus:9090", "settings.spec.prometheus.url 'prometheus:9090' is not an http(s) URL"),
        ("http://127.0.0.1:99999", "settings.spec.prometheus.url 'http://127.0.0.1:99999': Port"),
        (held_port.url, f"cannot reach {held_port.url}/api/v1/query_range: cannot connect"),
        # https goes through httpx, which checks certificates against the system's trust
        (held_port.url.replace("http:", "https:"), "cannot reach https://"),
    ):
        assert client.ask_all(url, [query])[query].error.startswith(error), url


def test_combined_queries_answer_exactly_what_each_alone_does(tmp_path: Path) -> None:
    with Exporter() as exporter, PrometheusServer(tmp_path, exporter) as prom:
        for i in range(30):
            exporter.set("latency_seconds", 0.1 + i / 100, node=f"n{i}", zone="a" if i % 2 else "b")
            exporter.set("requests_total", 10.0 * i, node=f"n{i}")
        prom.wait_for_value('latency_seconds{node="n29"}', 0.39)
        time.sleep(3)
        end = datetime.now(UTC)
        start = end - timedelta(seconds=2)
        texts = [f'latency_seconds{{node="n{i}"}}' for i in range(30)] + [
            'sum(increase(requests_total{node="n3"}[1m]))',
            "latency_seconds",  # many series
            'latency_seconds{node="gone"}',  # no series
            'latency_seconds{node="n1"} / 0 - latency_seconds{node="n1"} / 0',  # NaN, left out
            'latency_seconds{node="n2"} # a comment to the end of the line',
            'label_replace(latency_seconds{node="n4"}, "reconciler_query_part", "x", "", "")',
        ]
        queries = [RangeQuery(t, start, end, 1) for t in texts]
        queries.append(RangeQuery('latency_seconds{node="n0"}', start, end, 2))  # another step
        # Another window, combined with what cannot be: a scalar, a query refused
        queries += [RangeQuery(t, start, end, 3) for t in ("1 + 1", "sum(rate(x[1m]", "up")]
        plain, combined = RangeQueries(batched=False), RangeQueries()

        before = prom.range_queries_answered()
        alone = plain.ask_all(prom.url, queries)
        asked_alone = prom.range_queries_answered() - before
        together = combined.ask_all(prom.url, queries)
        asked_together = prom.range_queries_answered() - before - asked_alone

        def shown(answer: RangeAnswer) -> tuple[object, ...]:
            return (sorted(answer.series), answer.error)

        assert {q: shown(a) for q, a in together.items()} == {q: shown(a) for q, a in alone.items()}
        assert alone[queries[0]].values() and len(alone[queries[31]].series) == 30
        assert "bad_data" in alone[queries[-2]].error
        assert alone[queries[-3]].values() == [2.0]
        assert asked_alone == len(queries)
        # One combined request per window and step; the one Prometheus
        # refused (a scalar, a parse error) is asked again part by part.
        assert asked_together == math.ceil(len(texts) / BATCH_PARTS) + 1 + (1 + 3)
