"""The daemon's Prometheus client against a real Prometheus (Debian's
package, on loopback): vector answers as samples, a query Prometheus
rejects, and a server that is gone as no evidence."""

from __future__ import annotations

from pathlib import Path

from reconciler.daemon.prometheus_client import PrometheusClient
from tests.kit.prometheus import Exporter, PrometheusServer


def test_answers_rejections_and_a_stopped_server(tmp_path: Path) -> None:
    client = PrometheusClient(concurrency=2, timeout=2)
    with Exporter() as exporter, PrometheusServer(tmp_path, exporter) as prom:
        exporter.set("errors_ratio", 0.25, node="gpu-a1")
        exporter.set("errors_ratio", 0.5, node="gpu-a2")
        prom.wait_for_value('errors_ratio{node="gpu-a2"}', 0.5)
        answers = client.query_all(
            prom.url,
            [
                'errors_ratio{node="gpu-a1"}',
                "errors_ratio",
                "sum(rate(errors_ratio[1m]",  # unbalanced: rejected
                'errors_ratio{node="nobody"}',
            ],
        )
        one = answers['errors_ratio{node="gpu-a1"}']
        assert one.error == "" and [v for _, v in one.samples] == [0.25]
        assert 'node="gpu-a1"' in one.samples[0][0]
        assert sorted(v for _, v in answers["errors_ratio"].samples) == [0.25, 0.5]
        rejected = answers["sum(rate(errors_ratio[1m]"]
        assert rejected.rejected and rejected.error.startswith("bad_data: ")
        assert answers['errors_ratio{node="nobody"}'].samples == ()
        prom.stop()
        gone = client.query_all(prom.url, ["errors_ratio"])["errors_ratio"]
        assert gone.error.startswith("cannot reach ") and not gone.rejected
