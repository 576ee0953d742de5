"""What a real ``reconciler agent`` process tells its operator
(docs/operating.md): one log line per job accepted, finished or refused, in
text or JSON, and Prometheus metrics on ``GET /metrics``."""

from __future__ import annotations

import json
import re
from importlib.metadata import version
from pathlib import Path

import httpx
import pytest

from tests.kit.agents import RealAgent, start_agent
from tests.kit.jobs import envelope, job
from tests.kit.keys import make_key
from tests.kit.waiting import wait_for

pytestmark = pytest.mark.slow

OLD = b"provider: ollama\nmodel: llama3-old\nprofile: default\n"


def post(agent: RealAgent, body: object) -> httpx.Response:
    return httpx.post(f"{agent.url}/v1/nodes/{agent.node}/jobs", json=body, timeout=10)


def run_three_jobs(tmp_path: Path, fmt: str) -> tuple[RealAgent, list[str], str]:
    key = make_key(tmp_path / "keys" / "reconciler")
    stranger = make_key(tmp_path / "stranger" / "reconciler")
    agent = start_agent(
        tmp_path / "agent", "node-a", key.public, config=OLD, extra=("--log-format", fmt)
    )
    try:
        assert post(agent, envelope(job("apply-0001"), key.signing)).status_code == 202
        agent.wait_idle()
        assert post(agent, envelope(job("apply-0002"), stranger.signing)).status_code == 403
        dry = job("apply-0003", mode="dry_run")
        assert post(agent, envelope(dry, key.signing)).status_code == 202
        agent.wait_idle()
        lines = wait_for(
            lambda: (
                [
                    line
                    for line in agent.log.read_text().splitlines()
                    if "job_" in line and "apply-0003" in line and "finished" in line
                ]
                and agent.log.read_text().splitlines()
            ),
            30,
            "the last job's line",
        )
        metrics = httpx.get(f"{agent.url}/metrics", timeout=10)
        assert metrics.status_code == 200
        return agent, [line for line in lines if "job_" in line], metrics.text
    finally:
        agent.stop()


def test_the_agent_logs_one_json_line_per_job_accepted_finished_or_refused(
    tmp_path: Path,
) -> None:
    _, lines, _ = run_three_jobs(tmp_path, "json")

    records = [json.loads(line) for line in lines]
    assert [(r["event"], r.get("job"), r.get("state") or r.get("code")) for r in records] == [
        ("job_accepted", "apply-0001", None),
        ("job_finished", "apply-0001", "succeeded"),
        ("job_refused", "apply-0002", "untrusted_key"),
        ("job_accepted", "apply-0003", None),
        ("job_finished", "apply-0003", "succeeded"),
    ]
    assert records[0]["rollout"] == "llama" and records[0]["runtime"] == "hermes"
    assert records[2]["level"] == "warning" and records[2]["status"] == 403


def test_the_agent_logs_text_lines_and_counts_jobs_refusals_and_backups(
    tmp_path: Path,
) -> None:
    _, lines, text = run_three_jobs(tmp_path, "text")

    assert len(lines) == 5
    assert re.search(r" info +job_accepted +apply accepted .*job=apply-0001", lines[0])
    assert re.search(r" warning +job_refused .*code=untrusted_key", lines[2])

    def value(sample: str) -> float:
        match = re.search("^" + re.escape(sample) + r" (\S+)$", text, re.M)
        assert match, sample
        return float(match.group(1))

    assert value('reconciler_agent_jobs_total{kind="apply",outcome="accepted"}') == 2.0
    assert value('reconciler_agent_jobs_total{kind="apply",outcome="succeeded"}') == 2.0
    assert value('reconciler_agent_jobs_total{kind="restore",outcome="failed"}') == 0.0
    assert value('reconciler_agent_refusals_total{code="untrusted_key"}') == 1.0
    assert value('reconciler_agent_refusals_total{code="expired"}') == 0.0
    assert value('reconciler_agent_backups{runtime="hermes"}') == 1.0  # the live apply's
    assert value('reconciler_agent_checks{result="failing"}') == 0.0
    # The installed distribution's version, as the daemon reports its own.
    installed = version("fleet-rollout-reconciler")
    assert value(f'reconciler_build_info{{version="{installed}"}}') == 1.0
