"""The read API of ``run --http`` (docs/web.md), asked with httpx of a real
daemon process over a real fleet: answers that match their schemas and what
``status``/``fleet --format json`` print for the same commit, events on a
committed transition, JSON errors, who is served, and clients that cannot
hold the daemon."""

from __future__ import annotations

import json
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.kit.documents import rollout_yaml
from tests.kit.fleets import FleetKit
from tests.kit.git import git
from tests.kit.signed import Repo
from tests.kit.waiting import wait_for
from tests.kit.web import WebDaemon, check_answer

pytestmark = pytest.mark.slow

SETTINGS = "apiVersion: reconciler/v1\nkind: Settings\nspec:\n  fleetCheck: {interval: 1s}\n"
NODES = {f"n{i}": {"role": "web"} for i in range(1, 6)}
BEHAVIOUR = "default: succeed\nnodes:\n  slow: hang\n"  # slow's jobs never finish


@pytest.fixture
def kit(tmp_path: Path) -> Iterator[FleetKit]:
    kit = FleetKit.create(
        tmp_path,
        {**NODES, "slow": {"role": "slow"}},
        behaviour=BEHAVIOUR,
        files={"reconciler.yaml": SETTINGS},
    )
    kit.push(
        {
            "rollouts/web.yaml": rollout_yaml("web", selector={"role": "web"}, batchSize=5),
            "rollouts/held.yaml": rollout_yaml(
                "held", nodeIds=["n1"], allowOverlap=True, paused=True
            ),
        }
    )
    yield kit
    kit.close()


@pytest.fixture
def served(kit: FleetKit, tmp_path: Path) -> Iterator[WebDaemon]:
    daemon = WebDaemon.start(kit, tmp_path)
    yield daemon
    daemon.stop()


def _get(url: str, **kwargs: Any) -> httpx.Response:
    return httpx.get(url, timeout=10, **kwargs)


def _cli(*args: str, cwd: Path | None = None) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "reconciler", *args],
        capture_output=True,
        text=True,
        check=True,
        cwd=cwd,
        timeout=60,
    )
    return done.stdout


def _settled(served: WebDaemon) -> dict[str, Any]:
    """The list once ``web`` completed and the fleet status is committed."""

    def ready() -> dict[str, Any] | None:
        answer = _get(served.url + "/api/v1/rollouts")
        if answer.status_code != 200:
            return None
        phases = {r["name"]: r["phase"] for r in answer.json()}
        fleet = _get(served.url + "/api/v1/fleet").json()
        if phases.get("web") == "completed" and fleet["nodes"]:
            return {r["name"]: r for r in answer.json()}
        return None

    return wait_for(ready, timeout=60, what="web completed and a fleet status")


def test_answers_match_their_schemas_and_what_the_cli_prints_for_the_same_commit(
    kit: FleetKit, served: WebDaemon
) -> None:
    rollouts = _settled(served)

    listing = _get(served.url + "/api/v1/rollouts")
    check_answer("api-rollouts", listing.json())
    assert rollouts["web"]["progress"] == {"succeeded": 5}
    assert rollouts["web"]["target"]["model"] == "llama3.1-8b"
    assert rollouts["held"]["phase"] == "pending"
    # Equal for the same commit: the CLI reads the commit the answers name.
    for _ in range(3):
        one = _get(served.url + "/api/v1/rollouts/web?limit=10000")
        fleet = _get(served.url + "/api/v1/fleet")
        commit = one.headers["X-Status-Commit"]
        tip = git("rev-parse", "main", cwd=kit.bare)
        if commit == tip == fleet.headers["X-Status-Commit"]:
            break
    assert commit == tip
    check_answer("api-rollout", one.json())
    check_answer("api-fleet", fleet.json())
    assert one.text == _cli("status", "web", "--repo", str(kit.bare), "--format", "json")
    assert fleet.text == _cli("fleet", "--repo", str(kit.bare), "--format", "json")
    assert [n["name"] for n in fleet.json()["nodes"]] == sorted([*NODES, "slow"])


def test_a_rollout_s_nodes_come_in_pages_with_a_link_to_the_next(served: WebDaemon) -> None:
    _settled(served)

    first = _get(served.url + "/api/v1/rollouts/web?limit=2")
    last = _get(served.url + "/api/v1/rollouts/web?offset=4&limit=2")

    check_answer("api-rollout", first.json())
    assert [n["name"] for n in first.json()["nodes"]] == ["n1", "n2"]
    assert first.headers["X-Node-Count"] == "5"
    assert first.headers["Link"] == '</api/v1/rollouts/web?offset=2&limit=2>; rel="next"'
    assert [n["name"] for n in last.json()["nodes"]] == ["n5"]
    assert "Link" not in last.headers
    assert first.json()["frozen"]["nodes"] == sorted(NODES)  # the frozen list stays whole


@pytest.mark.parametrize(
    ("method", "path", "status", "code"),
    [
        ("GET", "/api/v1/rollouts/nonesuch", 404, "no_such_rollout"),
        ("GET", "/api/v1/nothing", 404, "not_found"),
        ("GET", "/favicon.ico", 404, "not_found"),
        ("POST", "/api/v1/rollouts", 405, "method_not_allowed"),
        ("DELETE", "/api/v1/rollouts/web", 405, "method_not_allowed"),
        ("GET", "/api/v1/rollouts/web?limit=0", 400, "bad_query"),
        ("GET", "/api/v1/rollouts/web?offset=-1", 400, "bad_query"),
        ("GET", "/api/v1/rollouts/web?limit=%C2%B2", 400, "bad_query"),
    ],
)
def test_errors_are_json_with_a_code_and_a_message(
    served: WebDaemon, method: str, path: str, status: int, code: str
) -> None:
    _settled(served)

    answer = httpx.request(method, served.url + path, timeout=10)

    assert answer.status_code == status
    assert answer.headers["Content-Type"] == "application/json"
    assert answer.json()["error"] == code
    assert answer.json()["message"]


@pytest.mark.parametrize(
    ("method", "body"),
    [
        ("POST", b'{"resume": true}'),
        ("PUT", b"x" * (3 * 1024 * 1024)),  # past what is read and dropped: answered at once
        ("PATCH", b""),
        ("DELETE", None),
        ("OPTIONS", None),
    ],
)
def test_any_other_method_is_405_with_allow_get_and_head_whatever_its_body(
    served: WebDaemon, method: str, body: bytes | None
) -> None:
    _settled(served)

    answer = httpx.request(method, served.url + "/api/v1/rollouts", content=body, timeout=10)

    assert answer.status_code == 405
    assert answer.headers["Allow"] == "GET, HEAD"
    assert answer.json()["error"] == "method_not_allowed"


def test_head_answers_the_head_of_get_with_no_body(served: WebDaemon) -> None:
    _settled(served)
    for path in ("/", "/api/v1/rollouts", "/api/v1/rollouts/web", "/page.css"):
        got = _get(served.url + path)
        head = httpx.head(served.url + path, timeout=10)
        assert head.status_code == 200, path
        assert head.content == b""
        assert head.headers["Content-Type"] == got.headers["Content-Type"]


def test_a_committed_pause_arrives_on_the_event_stream_as_a_transition(
    kit: FleetKit, served: WebDaemon
) -> None:
    _settled(served)
    kit.push({"rollouts/late.yaml": rollout_yaml("late", nodeIds=["slow"])})
    wait_for(
        lambda: _get(served.url + "/api/v1/rollouts/late").status_code == 200,
        timeout=30,
        what="late running",
    )
    events: list[tuple[str, str, dict[str, Any]]] = []

    with httpx.stream("GET", served.url + "/api/v1/events", timeout=60) as stream:
        assert stream.headers["Content-Type"] == "text/event-stream"
        kit.push({"rollouts/late.yaml": rollout_yaml("late", nodeIds=["slow"], paused=True)})
        fields: dict[str, str] = {}
        deadline = time.monotonic() + 60
        for line in stream.iter_lines():
            assert time.monotonic() < deadline, f"no paused transition in 60 s: {events}"
            if line and not line.startswith(":"):
                key, _, value = line.partition(": ")
                fields[key] = value
                continue
            if "data" in fields:
                events.append((fields["event"], fields["id"], json.loads(fields["data"])))
                check_answer("api-event", events[-1][2])
                last = events[-1][2]
                if events[-1][0] == "transition" and last["to"] == "paused":
                    break
            fields = {}

    kinds = [kind for kind, _, _ in events]
    assert "commit" in kinds
    transition = next(d for k, _, d in events if k == "transition" and d["to"] == "paused")
    assert (transition["rollout"], transition["reason"]) == ("late", "operator_paused")
    assert len({event_id for _, event_id, _ in events}) == len(events)


def test_the_page_and_its_assets_are_served_with_no_outside_source(served: WebDaemon) -> None:
    page = _get(served.url + "/")
    script = _get(served.url + "/page.js")
    style = _get(served.url + "/page.css")

    assert page.status_code == script.status_code == style.status_code == 200
    assert page.headers["Content-Type"].startswith("text/html")
    assert "default-src 'none'" in page.headers["Content-Security-Policy"]
    for text in (page.text, script.text, style.text):
        assert "http://" not in text and "https://" not in text


def test_metrics_share_the_address_when_both_name_it(kit: FleetKit, tmp_path: Path) -> None:
    with socket.socket() as probe:  # an address only this test names: the daemon binds it
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    address = f"127.0.0.1:{port}"
    # The probe is closed before the daemon binds: a race with another
    # listener would show as a start-up failure naming the address, never
    # as a wrong answer.
    daemon = WebDaemon.start(kit, tmp_path, http=address, extra=("--metrics", address))
    try:
        metrics = _get(daemon.url + "/metrics")
        assert metrics.status_code == 200
        assert "reconciler_passes_total" in metrics.text
    finally:
        daemon.stop()


# --- who is served -----------------------------------------------------------------


def test_a_client_from_another_address_gets_401_without_a_token(
    kit: FleetKit, tmp_path: Path
) -> None:
    daemon = WebDaemon.start(kit, tmp_path, http="127.0.0.2:0")
    try:
        other = httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2"), timeout=10)
        refused = other.get(daemon.url + "/api/v1/rollouts")
        page = other.get(daemon.url + "/")
        local = _get(daemon.url + "/api/v1/rollouts")  # from 127.0.0.1

        assert refused.status_code == page.status_code == 401
        assert refused.json()["error"] == "unauthorized"
        assert refused.headers["WWW-Authenticate"] == "Bearer"
        assert local.status_code in (200, 503)  # 503 only before the first read
    finally:
        daemon.stop()


def test_with_a_token_file_every_request_needs_that_token(kit: FleetKit, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token-value\n")
    daemon = WebDaemon.start(kit, tmp_path, extra=("--http-token-file", str(token_file)))
    try:
        missing = _get(daemon.url + "/api/v1/rollouts")
        wrong = _get(daemon.url + "/", headers={"Authorization": "Bearer s3cret-token-valuf"})
        basic = _get(daemon.url + "/", headers={"Authorization": "Basic s3cret-token-value"})
        right = wait_for(
            lambda: (
                answer
                if (
                    answer := _get(
                        daemon.url + "/api/v1/rollouts",
                        headers={"Authorization": "Bearer s3cret-token-value"},
                    )
                ).status_code
                == 200
                else None
            ),
            timeout=30,
            what="an answer with the token",
        )
        page = _get(daemon.url + "/", headers={"Authorization": "Bearer s3cret-token-value"})

        assert missing.status_code == wrong.status_code == basic.status_code == 401
        assert wrong.json()["error"] == "unauthorized"
        assert right.status_code == page.status_code == 200
        assert "s3cret" not in daemon.log.read_text()
    finally:
        daemon.stop()


def test_only_the_served_address_and_the_names_allowed_are_answered(
    kit: FleetKit, tmp_path: Path
) -> None:
    extra = ("--http-allow-host", "rollouts.example.internal")
    daemon = WebDaemon.start(kit, tmp_path, extra=extra)
    try:
        rebound = _get(daemon.url + "/", headers={"Host": "rebound.attacker.example"})
        proxied = _get(daemon.url + "/", headers={"Host": "rollouts.example.internal"})
        direct = _get(daemon.url + "/")  # Host: 127.0.0.1:PORT

        assert rebound.status_code == 421 and rebound.json()["error"] == "unknown_host"
        assert proxied.status_code == direct.status_code == 200
    finally:
        daemon.stop()


def test_with_a_token_and_metrics_on_one_address_healthz_stays_open(
    kit: FleetKit, tmp_path: Path
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token-value\n")
    with socket.socket() as probe:  # an address only this test names: the daemon binds it
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"
    extra = ("--metrics", address, "--http-token-file", str(token_file))
    daemon = WebDaemon.start(kit, tmp_path, http=address, extra=extra)
    try:
        health = wait_for(
            lambda: a if (a := _get(daemon.url + "/healthz")).status_code == 200 else None,
            timeout=30,
            what="a healthy answer without the token",
        )
        closed = _get(daemon.url + "/metrics")
        metrics = _get(
            daemon.url + "/metrics", headers={"Authorization": "Bearer s3cret-token-value"}
        )

        assert health.json()["status"] == "ok"
        assert closed.status_code == 401
        assert metrics.status_code == 200 and "reconciler_passes_total" in metrics.text
    finally:
        daemon.stop()


# --- clients that cannot hold the daemon ------------------------------------------


def test_a_thousand_idle_connections_do_not_stop_a_pass(
    kit: FleetKit, served: WebDaemon, tmp_path: Path
) -> None:
    _settled(served)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard))
    host, port = served.url.removeprefix("http://").rsplit(":", 1)
    idle: list[socket.socket] = []
    try:
        for _ in range(1000):
            conn = socket.socket()
            conn.setblocking(False)
            conn.connect_ex((host, int(port)))  # never sends a byte
            idle.append(conn)
        before = git("rev-parse", "main", cwd=kit.bare)

        kit.push({"rollouts/held.yaml": rollout_yaml("held", nodeIds=["n1"], allowOverlap=True)})

        def started() -> bool:
            answer = _get(served.url + "/api/v1/rollouts/held")
            return answer.status_code == 200 and answer.json()["phase"] != "pending"

        wait_for(started, timeout=60, what="the pass that starts held, answered over http")
        assert git("rev-parse", "main", cwd=kit.bare) != before
    finally:
        for conn in idle:
            conn.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


# --- only the daemon's own fleet status ----------------------------------------------

PUSHED_FLEET = (
    "apiVersion: reconciler/v1\nkind: FleetStatus\nmetadata: {name: fleet}\nnodes:\n"
    "  - {name: pushed-node, state: ok, since: '2026-12-01T09:00:00Z', runtimes: []}\n"
)


def _fleet_after(daemon: WebDaemon, kit: FleetKit, commit: str) -> dict[str, Any]:
    """The fleet answer once the daemon answers from ``commit`` or a commit after it."""

    def answered() -> dict[str, Any] | None:
        answer = _get(daemon.url + "/api/v1/fleet")
        at = answer.headers.get("X-Status-Commit", "") if answer.status_code == 200 else ""
        if not at:
            return None
        after = subprocess.run(
            ["git", "merge-base", "--is-ancestor", commit, at], cwd=kit.bare, check=False
        )
        return answer.json() if after.returncode == 0 else None

    return wait_for(answered, timeout=60, what=f"the fleet answer after {commit[:12]}")


def test_a_pushed_fleet_status_is_not_served_with_the_fleet_check_off(tmp_path: Path) -> None:
    off = "apiVersion: reconciler/v1\nkind: Settings\nspec:\n  fleetCheck: {interval: 0s}\n"
    kit = FleetKit.create(tmp_path, NODES, files={"reconciler.yaml": off})
    daemon = None
    try:
        pushed = kit.push({"status/fleet.yaml": PUSHED_FLEET}, "a fleet status by hand")
        daemon = WebDaemon.start(kit, tmp_path)

        assert _fleet_after(daemon, kit, pushed)["nodes"] is None
    finally:
        if daemon is not None:
            daemon.stop()
        kit.close()


def test_a_pushed_fleet_status_is_not_served_under_signed_status_commits(
    tmp_path: Path,
) -> None:
    hourly = "apiVersion: reconciler/v1\nkind: Settings\nspec:\n  fleetCheck: {interval: 1h}\n"
    kit = FleetKit.create(tmp_path, NODES)
    daemon = None
    try:
        repo = Repo(kit, tmp_path)
        signers = repo.signers
        signers.write_text(
            signers.read_text() + f"daemon {kit.key_path.with_suffix('.pub').read_text()}"
        )
        repo.push({"reconciler.yaml": hourly}, "check the fleet hourly", signed=True)
        extra = ("--allowed-signers", str(signers), "--sign-commits")
        daemon = WebDaemon.start(kit, tmp_path, extra=extra)
        pushed = repo.push({"status/fleet.yaml": PUSHED_FLEET}, "by hand", signed=False)

        assert _fleet_after(daemon, kit, pushed)["nodes"] is None
        assert "fleet_status_unwritten" in daemon.log.read_text()
    finally:
        if daemon is not None:
            daemon.stop()
        kit.close()
