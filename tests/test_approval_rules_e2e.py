"""Approval rules by target end to end (docs/approval-rules.md): the real
daemon (``reconciler run --allowed-signers ... --require-approvals 1``),
real ``reconciler agent`` processes for two serving nodes and two research
nodes, commits signed by the real ``git commit -S`` with keys made by
``ssh-keygen``, approvals by ``reconciler approve --push``; and at every
step ``reconciler verify`` giving the daemon's verdict."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from reconciler.cli.main import main
from tests.kit.documents import rollout_yaml
from tests.kit.fleets import AgentFleet
from tests.kit.git import git, git_env, write_files
from tests.kit.producer_keys import openssl_key, signers_yaml

pytestmark = pytest.mark.slow

PEOPLE = ("alice", "bob", "carol", "sre-1", "sre-2", "res-1")

RULES = """apiVersion: reconciler/v1
kind: Settings
spec:
  approvalRules:
    - name: serving-owners
      nodes: {selector: {role: serving}}
      principals: [sre-1@example.com, sre-2@example.com]
      require: 1
    - name: settings-owners
      settings: true
      principals: [carol@example.com]
      require: 1
"""

REFUSED_SERVING = "needs 1 of serving-owners (sre-1@example.com, sre-2@example.com); has 0"


def keygen(path: Path) -> Path:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f", str(path)],
        check=True,
        capture_output=True,
    )
    return path


def public(path: Path) -> str:
    kind, blob, *_ = Path(f"{path}.pub").read_text().split()
    return f"{kind} {blob}"


def wait_for(
    what: str, check: Callable[[], Any], seen: Callable[[], Any], timeout: float = 60
) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout}s; seen: {seen()}")
        time.sleep(0.1)


@dataclass
class Team:
    """The fleet, everyone's keys, the allowed-signers file and the daemon."""

    fleet: AgentFleet
    keys: dict[str, Path]
    signers: Path
    daemon: subprocess.Popen[str] | None = None

    def push(self, files: dict[str, str | None], who: str, *, sign: bool = True) -> str:
        """Commit ``files`` on top of main as ``who`` and push; again from the
        new tip when a status commit of the daemon came first (a rebase
        would drop the signature)."""
        work, env = self.fleet.work, git_env(who, f"{who}@example.com")
        for _ in range(20):
            git("fetch", "-q", "origin", cwd=work, env=env)
            git("reset", "-q", "--hard", "origin/main", cwd=work, env=env)
            write_files(work, files)
            git("add", "-A", cwd=work, env=env)
            signing = ["-c", "gpg.format=ssh", "-c", f"user.signingKey={self.keys[who]}"]
            git(
                *(signing if sign else []), "commit", "-q", *(["-S"] if sign else []),
                "-m", f"change by {who}", cwd=work, env=env,
            )  # fmt: skip
            pushed = subprocess.run(
                ["git", "push", "-q", "origin", "HEAD:main"], cwd=work, env=env, capture_output=True
            )
            if pushed.returncode == 0:
                return git("rev-parse", "HEAD", cwd=work)
        raise AssertionError("could not push past the daemon's status commits")

    def approve(self, commit: str, *who: str) -> None:
        for person in who:
            args = ["approve", commit, "--key", str(self.keys[person])]
            assert main([*args, "--repo", str(self.fleet.work), "--push"]) == 0

    def status(self, name: str) -> dict[str, Any]:
        return dict(self.fleet.statuses().get(name) or {})

    def jobs(self, node: str, rollout: str | None = None) -> list[dict[str, Any]]:
        return [
            r
            for r in self.fleet.agents[node].journal()
            if rollout is None or r["payload"].get("rollout") == rollout
        ]

    def verify(self, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
        """``reconciler verify`` of main's tip, as the daemon runs."""
        capsys.readouterr()
        code = main(
            ["verify", "--repo", str(self.fleet.bare), "--allowed-signers", str(self.signers),
             "--require-approvals", "1"]
        )  # fmt: skip
        return code, capsys.readouterr().out

    def start(self, tmp: Path) -> None:
        self.daemon = subprocess.Popen(
            [sys.executable, "-m", "reconciler", "run", "--repo", str(self.fleet.bare),
             "--key", str(self.fleet.key_path), "--allowed-signers", str(self.signers),
             "--require-approvals", "1", "--interval", "0.2s", "--poll", "0.5s",
             "--cache-dir", str(tmp / "cache")],
            env={**os.environ},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip

    def stop(self) -> str:
        if self.daemon is None:
            return ""
        self.daemon.send_signal(signal.SIGTERM)
        out, _ = self.daemon.communicate(timeout=30)
        assert self.daemon.returncode == 0, out
        assert "Traceback" not in out, out
        return out


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("people")
    return {name: keygen(d / name) for name in PEOPLE}


@pytest.fixture
def team(tmp_path: Path, keys: dict[str, Path]) -> Iterator[Team]:
    nodes = {
        "r1": {"live": False, "labels": {"role": "research"}},
        "r2": {"live": False, "labels": {"role": "research"}},
        "s1": {"live": False, "labels": {"role": "serving"}},
        "s2": {"live": False, "labels": {"role": "serving"}},
    }
    fleet = AgentFleet.create(tmp_path, nodes, files={"reconciler.yaml": RULES})
    signers = tmp_path / "allowed_signers"
    signers.write_text("".join(f"{n}@example.com {public(k)}\n" for n, k in keys.items()))
    kit = Team(fleet, keys, signers)
    try:
        # The first signed commit is judged by its own rules: it brings the
        # settings and the serving nodes, so their owners approve it.
        first = kit.push(
            {"rollouts/base.yaml": rollout_yaml("base", nodeIds=["r1"], batchSize=1)}, "alice"
        )
        kit.approve(first, "carol", "sre-1")
        kit.start(tmp_path)
        wait_for(
            "the first rollout to complete",
            lambda: kit.status("base").get("phase") == "completed",
            lambda: kit.status("base"),
        )
        yield kit
    finally:
        try:
            kit.stop()
        finally:
            fleet.close()


def serving(**spec: Any) -> str:
    return rollout_yaml("srv", selector={"role": "serving"}, batchSize=1, pauseAfter=[1], **spec)


def test_serving_needs_its_owners_and_stopping_never_waits(
    team: Team, capsys: pytest.CaptureFixture[str]
) -> None:
    # a research rollout needs only the global minimum: one other person
    res = team.push(
        {"rollouts/res.yaml": rollout_yaml("res", selector={"role": "research"})}, "alice"
    )
    team.approve(res, "bob")
    wait_for(
        "res to complete",
        lambda: team.status("res").get("phase") == "completed",
        team.fleet.statuses,
    )
    assert team.verify(capsys)[0] == 0

    # a serving rollout approved by a research principal only does not start
    srv = team.push({"rollouts/srv.yaml": serving()}, "alice")
    team.approve(srv, "res-1")
    wait_for(
        "the refusal naming the serving owners",
        lambda: REFUSED_SERVING in team.status("srv").get("message", ""),
        lambda: team.status("srv"),
    )
    assert team.status("srv")["phase"] == "pending"
    dashboard = git("show", "main:status/README.md", cwd=team.fleet.bare)
    assert "waiting for approval of serving-owners" in dashboard
    code, out = team.verify(capsys)
    assert code == 1 and f"rule serving-owners: {REFUSED_SERVING}" in out
    assert team.jobs("s1") == team.jobs("s2") == []

    # a serving owner's approval starts it; approvedBy says which rule it counted for
    team.approve(srv, "sre-2")
    wait_for(
        "srv to hold after its first batch",
        lambda: (team.status("srv").get("hold") or {}).get("reason") == "pause_after_batch",
        lambda: team.status("srv"),
    )
    approved = {a["principal"]: a.get("rules", []) for a in team.status("srv")["approvedBy"]}
    assert approved == {"res-1@example.com": [], "sre-2@example.com": ["serving-owners"]}
    assert len(team.jobs("s1", "srv")) == 1 and team.jobs("s2", "srv") == []
    assert team.verify(capsys)[0] == 0

    # a resume needs the serving owners too: bob's approval is not enough
    resume = team.push({"rollouts/srv.yaml": serving(resumeRequest="go")}, "alice")
    team.approve(resume, "bob")
    wait_for(
        "the resume refused",
        lambda: any(
            REFUSED_SERVING in c.get("message", "")
            for c in team.status("srv").get("conditions", [])
        ),
        lambda: team.status("srv"),
    )
    code, out = team.verify(capsys)
    assert code == 1 and f"rule serving-owners: {REFUSED_SERVING}" in out
    assert team.jobs("s2", "srv") == []

    # abort by any allowed signer, on the verified version, stops it at once
    team.push({"rollouts/srv.yaml": serving(abort=True)}, "bob")
    wait_for(
        "srv aborted",
        lambda: team.status("srv").get("phase") == "aborted",
        lambda: team.status("srv"),
    )
    code, out = team.verify(capsys)
    assert code == 0 and "it only sets paused or abort" in out
    assert team.jobs("s2", "srv") == []


def test_a_signed_pause_by_one_person_holds_at_the_next_pass(
    team: Team, capsys: pytest.CaptureFixture[str]
) -> None:
    def slow(**spec: Any) -> str:
        return rollout_yaml("p", nodeIds=["r1", "r2"], batchSize=1, pauseAfter=[1], **spec)

    start = team.push({"rollouts/p.yaml": slow()}, "alice")
    team.approve(start, "bob")
    wait_for(
        "p to hold after its first batch",
        lambda: (team.status("p").get("hold") or {}).get("reason") == "pause_after_batch",
        lambda: team.status("p"),
    )
    # one on-call person, nobody else awake, with the CLI and git's own signing
    work = team.fleet.work
    git("fetch", "-q", "origin", cwd=work)
    git("reset", "-q", "--hard", "origin/main", cwd=work)
    for key, value in (
        ("user.name", "alice"),
        ("user.email", "alice@example.com"),
        ("gpg.format", "ssh"),
        ("user.signingKey", str(team.keys["alice"])),
        ("commit.gpgsign", "true"),
    ):
        git("config", key, value, cwd=work)
    assert main(["pause", "p", "--repo", str(work), "-m", "emergency: stop p now", "--push"]) == 0
    wait_for(
        "the pause taken",
        lambda: team.status("p").get("operatorPaused") is True,
        lambda: team.status("p"),
    )
    assert team.verify(capsys)[0] == 0
    # a resume answer, even approved, sends nothing while paused ...
    resume = team.push({"rollouts/p.yaml": slow(paused=True, resumeRequest="go")}, "alice")
    team.approve(resume, "bob")
    wait_for(
        "the resume acted on",
        lambda: team.status("p").get("specCommit") == resume,
        lambda: team.status("p"),
    )
    assert team.status("p")["phase"] == "paused"
    assert team.status("p")["operatorPaused"] is True
    assert team.jobs("r2", "p") == []
    # ... until the pause is lifted, which, being more work, needs its approval
    lift = team.push({"rollouts/p.yaml": slow(resumeRequest="go")}, "alice")
    wait_for(
        "the lift refused",
        lambda: any(
            "needs 1 approval besides alice@example.com's" in c.get("message", "")
            for c in team.status("p").get("conditions", [])
        ),
        lambda: team.status("p"),
    )
    assert team.verify(capsys)[0] == 1
    assert team.jobs("r2", "p") == []
    team.approve(lift, "bob")
    wait_for("batch 2 sent", lambda: len(team.jobs("r2", "p")) == 1, lambda: team.status("p"))


@pytest.mark.parametrize("case", ["relabel-unsigned", "relabel-unapproved", "loosen", "grow"])
def test_a_change_that_reaches_serving_nodes_another_way_is_refused(
    team: Team, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    later = rollout_yaml("later", selector={"role": "research"}, startAt='"2099-01-01T00:00:00Z"')
    if case == "grow":
        approved = team.push({"rollouts/later.yaml": later}, "alice")
        team.approve(approved, "bob")
        wait_for(
            "later scheduled",
            lambda: team.status("later").get("phase") == "scheduled",
            lambda: team.status("later"),
        )
    relabelled = team.fleet.work / "nodes" / "s1.yaml"
    changes: dict[str, dict[str, str | None]] = {
        "relabel-unsigned": {},
        "relabel-unapproved": {},
        "loosen": {
            "reconciler.yaml": RULES.replace("{role: serving}", "{role: nobody}"),
            "rollouts/grab.yaml": rollout_yaml("grab", selector={"role": "serving"}),
        },
        "grow": {"rollouts/later.yaml": rollout_yaml("later", selector={})},
    }
    if case.startswith("relabel"):
        git("fetch", "-q", "origin", cwd=team.fleet.work)
        git("reset", "-q", "--hard", "origin/main", cwd=team.fleet.work)
        text = relabelled.read_text().replace("role: serving", "role: research")
        changes[case] = {
            "nodes/s1.yaml": text,
            "rollouts/grab.yaml": rollout_yaml("grab", selector={"role": "research"}),
        }
    change = team.push(changes[case], "alice", sign=case != "relabel-unsigned")
    team.approve(change, "bob", "carol")  # the global minimum and the settings owner
    watched = "later" if case == "grow" else "grab"
    expected = "not signed" if case == "relabel-unsigned" else REFUSED_SERVING

    def refused() -> bool:
        status = team.status(watched)
        texts = [status.get("message", "")] + [c["message"] for c in status.get("conditions", [])]
        return any(expected in t for t in texts)

    if case == "relabel-unsigned":
        # A rollout only an unsigned commit has gets no status (docs/trust.md).
        code, out = team.verify(capsys)
        assert code == 1 and expected in out
        assert "rollouts/grab.yaml is only in commits that are not verified" in out, out
        assert team.status("grab") == {}
        assert team.jobs("s1") == team.jobs("s2") == []
        return
    wait_for("the refusal", refused, lambda: team.status(watched))
    code, out = team.verify(capsys)
    assert code == 1 and expected in out
    assert team.jobs("s1") == team.jobs("s2") == []
    # the rule is what held it: a serving owner's approval lets it through
    team.approve(change, "sre-1")
    wait_for("the change acted on", lambda: not refused(), lambda: team.status(watched))
    assert team.verify(capsys)[0] == 0
    if case != "grow":  # later waits for 2099
        wait_for(
            "grab on s1",
            lambda: len(team.jobs("s1", "grab")) == 1,
            lambda: team.status("grab"),
        )


def test_a_new_model_signer_needs_the_settings_owners(
    team: Team, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Who vouches for model files lives in reconciler.yaml: adding a signer
    # is a settings change, so the settings rule judges it.
    _, pem = openssl_key(tmp_path, "producer")
    signer = signers_yaml(("ml-release", pem, ["llama-*"]))
    change = team.push(
        {
            "reconciler.yaml": RULES + signer,
            "rollouts/res2.yaml": rollout_yaml("res2", nodeIds=["r2"]),
            # once the signer counts, this model needs a signature
            "rollouts/llama.yaml": rollout_yaml(
                "llama",
                nodeIds=["r1"],
                target="{runtime: hermes, provider: ollama, model: llama-3}",
            ),
        },
        "alice",
    )
    team.approve(change, "bob")  # the global minimum, not the settings owner
    expected = "needs 1 of settings-owners (carol@example.com); has 0"

    def refused() -> bool:
        status = team.status("res2")
        texts = [status.get("message", "")] + [c["message"] for c in status.get("conditions", [])]
        return any(expected in t for t in texts)

    wait_for("the refusal", refused, lambda: team.status("res2"))
    code, out = team.verify(capsys)
    assert code == 1 and expected in out, out
    assert team.jobs("r2", "res2") == [] and team.jobs("r1", "llama") == []
    team.approve(change, "carol")
    wait_for(
        "res2 acted on once the settings owner approved",
        lambda: team.status("res2").get("phase") == "completed",
        lambda: team.status("res2"),
    )
    # and the signer with it: the unsigned llama model is not rolled out
    wait_for(
        "llama refused for want of a signature",
        lambda: 'model "llama-3" is covered by signer ml-release' in str(team.status("llama")),
        lambda: team.status("llama"),
    )
    assert team.jobs("r1", "llama") == []
