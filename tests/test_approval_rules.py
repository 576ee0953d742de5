"""Approval rules by target (docs/approval-rules.md), judged by the walk on
real repositories: commits signed by the real ``git commit -S``, approvals
made by ``reconciler approve``, keys made by ``ssh-keygen``; and
``reconciler verify`` giving the same verdict rule by rule."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pygit2
import pytest

from reconciler.cli.main import main
from reconciler.git.approval import Approver, load_allowed_signers
from tests.kit.documents import node_yaml, rollout_yaml
from tests.kit.git import git, git_env

PEOPLE = ("alice", "bob", "sre-1", "sre-2", "res-1", "carol", "dave")

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
      principals: [carol@example.com, dave@example.com]
      require: 1
"""

LOOSER = RULES.replace("{role: serving}", "{role: nothing-at-all}")


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


@dataclass
class Fleet:
    """One repository, everyone's keys, and an allowed-signers file."""

    work: Path
    keys: dict[str, Path]
    signers: Path

    def commit(self, files: dict[str, str | None], who: str = "alice", sign: bool = True) -> str:
        for name, text in files.items():
            target = self.work / name
            if text is None:
                target.unlink()
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        env = git_env(who, f"{who}@example.com")
        git("add", "-A", cwd=self.work, env=env)
        signing = ["-c", "gpg.format=ssh", "-c", f"user.signingKey={self.keys[who]}"]
        git(
            *(signing if sign else []), "commit", "-q", *(["-S"] if sign else []),
            "-m", f"change by {who}", cwd=self.work, env=env,
        )  # fmt: skip
        return git("rev-parse", "HEAD", cwd=self.work)

    def approve(self, commit: str, *who: str) -> None:
        for person in who:
            args = ["approve", commit, "--key", str(self.keys[person]), "--repo", str(self.work)]
            assert main(args) == 0

    def approver(self, required: int = 0) -> Approver:
        repo = pygit2.Repository(str(self.work))
        return Approver(repo, load_allowed_signers(self.signers), required_approvals=required)

    def verify(self, capsys: pytest.CaptureFixture[str], required: int = 0) -> tuple[int, str]:
        capsys.readouterr()
        code = main(
            ["verify", "--repo", str(self.work), "--allowed-signers", str(self.signers),
             "--require-approvals", str(required)]
        )  # fmt: skip
        return code, capsys.readouterr().out


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("people")
    return {name: keygen(d / name) for name in PEOPLE}


@pytest.fixture
def fleet(tmp_path: Path, keys: dict[str, Path]) -> Fleet:
    signers = tmp_path / "allowed_signers"
    signers.write_text("".join(f"{n}@example.com {public(k)}\n" for n, k in keys.items()))
    work = tmp_path / "work"
    work.mkdir()
    git("init", "-q", "-b", "main", cwd=work)
    kit = Fleet(work, keys, signers)
    first = kit.commit(
        {
            "reconciler.yaml": RULES,
            "nodes/s1.yaml": node_yaml("s1", "http://127.0.0.1:9", {"role": "serving"}),
            "nodes/r1.yaml": node_yaml("r1", "http://127.0.0.1:9", {"role": "research"}),
        }
    )
    # a first commit is judged by its own rules: it adds settings and a serving node
    kit.approve(first, "carol", "sre-1")
    assert kit.approver().approve(first).verified_commit == first
    return kit


def serving(**spec: object) -> str:
    return rollout_yaml("srv", selector={"role": "serving"}, **spec)


def research(**spec: object) -> str:
    return rollout_yaml("res", selector={"role": "research"}, **spec)


def test_a_serving_rollout_needs_a_serving_owner_not_a_research_principal(
    fleet: Fleet, capsys: pytest.CaptureFixture[str]
) -> None:
    change = fleet.commit({"rollouts/srv.yaml": serving()})
    fleet.approve(change, "res-1")
    approval = fleet.approver(required=1).approve(change)
    assert approval.verified_commit != change
    reason = approval.refusals[0].reason
    assert "needs 1 of serving-owners (sre-1@example.com, sre-2@example.com); has 0" in reason
    code, out = fleet.verify(capsys, required=1)
    assert code == 1
    assert "rule serving-owners: needs 1 of serving-owners" in out

    fleet.approve(change, "sre-2")
    judgement = fleet.approver(required=1).judgement(change)
    assert judgement.ok
    assert [(a.principal, a.rules) for a in judgement.approved_by()] == [
        ("res-1@example.com", ()),
        ("sre-2@example.com", ("serving-owners",)),
    ]
    assert fleet.approver(required=1).approve(change).verified_commit == change
    code, out = fleet.verify(capsys, required=1)
    assert code == 0
    assert "rule serving-owners: approved by sre-2@example.com" in out


def test_the_commits_own_signer_does_not_count_for_a_rule(fleet: Fleet) -> None:
    change = fleet.commit({"rollouts/srv.yaml": serving()}, who="sre-1")
    fleet.approve(change, "sre-1")
    assert not fleet.approver().judgement(change).ok
    fleet.approve(change, "sre-2")
    assert fleet.approver().judgement(change).ok


def test_a_research_rollout_needs_only_the_global_minimum(fleet: Fleet) -> None:
    change = fleet.commit({"rollouts/res.yaml": research()})
    assert fleet.approver().approve(change).verified_commit == change
    assert fleet.approver(required=1).approve(change).verified_commit != change
    fleet.approve(change, "bob")
    judgement = fleet.approver(required=1).judgement(change)
    assert judgement.ok and judgement.rules == ()


def test_relabelling_a_serving_node_needs_the_serving_owners(fleet: Fleet) -> None:
    moved = node_yaml("s1", "http://127.0.0.1:9", {"role": "research"})
    unsigned = fleet.commit({"nodes/s1.yaml": moved}, sign=False)
    approver = fleet.approver()
    assert approver.approve(unsigned).verified_commit != unsigned
    fleet.commit({"nodes/s1.yaml": moved.replace("research", "research ")})  # signed, unapproved
    tip = git("rev-parse", "HEAD", cwd=fleet.work)
    refused = fleet.approver().approve(tip)
    assert refused.verified_commit not in (unsigned, tip)
    assert "needs 1 of serving-owners" in refused.refusals[0].reason


def test_loosening_the_rules_is_judged_by_the_old_rules(fleet: Fleet) -> None:
    change = fleet.commit({"reconciler.yaml": LOOSER, "rollouts/srv.yaml": serving()})
    fleet.approve(change, "carol")  # the settings owner, but no serving owner
    judgement = fleet.approver().judgement(change)
    assert not judgement.ok
    assert [r.rule for r in judgement.rules] == ["serving-owners", "settings-owners"]
    assert "needs 1 of serving-owners" in judgement.reason


def test_a_refused_commit_cannot_slip_through_behind_a_later_one(fleet: Fleet) -> None:
    fleet.commit({"rollouts/srv.yaml": serving()})  # refused: no serving owner
    later = fleet.commit({"rollouts/res.yaml": research()})  # touches research only
    fleet.approve(later, "bob")
    judgement = fleet.approver(required=1).judgement(later)
    assert not judgement.ok
    assert [r.rule for r in judgement.rules] == ["serving-owners"]


def test_abort_needs_only_a_signature_while_resume_needs_the_owners(fleet: Fleet) -> None:
    start = fleet.commit({"rollouts/srv.yaml": serving()})
    fleet.approve(start, "sre-1", "bob")
    for required in (0, 1):
        assert fleet.approver(required).approve(start).verified_commit == start
    stop = fleet.commit({"rollouts/srv.yaml": serving(abort=True, paused=True)}, who="bob")
    for required in (0, 1, 2):
        judgement = fleet.approver(required).judgement(stop)
        assert judgement.ok and judgement.stops_only, (required, judgement.reason)
    resume = fleet.commit({"rollouts/srv.yaml": serving(abort=True, resumeRequest="r1")})
    judgement = fleet.approver().judgement(resume)
    assert not judgement.ok and not judgement.stops_only
    assert "needs 1 of serving-owners" in judgement.reason
    # an unsigned abort is still nothing
    unsigned = fleet.commit({"rollouts/srv.yaml": serving(abort=True)}, sign=False)
    assert not fleet.approver().judgement(unsigned).ok


def test_a_selector_grown_to_a_serving_node_is_refused(fleet: Fleet) -> None:
    start = fleet.commit({"rollouts/res.yaml": research()})
    assert fleet.approver().approve(start).verified_commit == start
    grown = fleet.commit({"rollouts/res.yaml": rollout_yaml("res", selector={})})
    judgement = fleet.approver().judgement(grown)
    assert not judgement.ok
    assert [r.rule for r in judgement.rules] == ["serving-owners"]


def test_a_first_commit_is_judged_by_its_own_rules(tmp_path: Path, keys: dict[str, Path]) -> None:
    signers = tmp_path / "allowed_signers"
    signers.write_text("".join(f"{n}@example.com {public(k)}\n" for n, k in keys.items()))
    work = tmp_path / "w"
    work.mkdir()
    git("init", "-q", "-b", "main", cwd=work)
    kit = Fleet(work, keys, signers)
    first = kit.commit({"reconciler.yaml": RULES, "rollouts/srv.yaml": serving()})
    judgement = kit.approver().judgement(first)
    assert [r.rule for r in judgement.rules] == ["settings-owners"]  # no serving node yet
    assert not judgement.ok
    kit.approve(first, "dave")
    assert kit.approver().judgement(first).ok


def test_one_reviewer_with_two_key_lines_is_one_approval(
    tmp_path: Path, keys: dict[str, Path]
) -> None:
    # rev@example.com KEY1 and rev@example.com,rev@corp.example KEY2: one person
    signers = tmp_path / "allowed_signers"
    signers.write_text(
        f"alice@example.com {public(keys['alice'])}\n"
        f"rev@example.com {public(keys['bob'])}\n"
        f"rev@example.com,rev@corp.example {public(keys['dave'])}\n"
        f"other@example.com {public(keys['carol'])}\n"
    )
    work = tmp_path / "w"
    work.mkdir()
    git("init", "-q", "-b", "main", cwd=work)
    kit = Fleet(work, keys, signers)
    change = kit.commit({"rollouts/res.yaml": research()})
    kit.approve(change, "bob", "dave")
    approvals = kit.approver(required=2).approvals(change)
    assert [a.principal for a in approvals.counted] == ["rev@example.com"]
    assert any("shares a principal with rev@example.com" in why for why in approvals.ignored)
    assert not kit.approver(required=2).judgement(change).ok
    kit.approve(change, "carol")
    assert kit.approver(required=2).judgement(change).ok


def test_validate_names_each_bad_rule(
    tmp_path: Path, keys: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "reconciler.yaml").write_text(
        RULES
        + """    - name: serving-owners
      settings: true
      principals: [carol@example.com]
      require: 1
    - name: nothing
      principals: [carol@example.com]
      require: 1
    - name: greedy
      settings: true
      principals: [carol@example.com, dave@example.com]
      require: 3
"""
    )
    signers = tmp_path / "allowed_signers"
    signers.write_text("".join(f"{n}@example.com {public(k)}\n" for n, k in keys.items()))
    capsys.readouterr()
    assert main(["validate", str(tmp_path), "--allowed-signers", str(signers)]) == 1
    out = capsys.readouterr().out
    assert 'spec.approvalRules[2].name: approval rule "serving-owners" is named twice' in out
    assert 'spec.approvalRules[3]: approval rule "nothing" covers nothing' in out
    assert 'spec.approvalRules[4].require: approval rule "greedy" requires 3 approvals' in out

    (tmp_path / "reconciler.yaml").write_text(RULES.replace("dave@", "nobody@"))
    assert main(["validate", str(tmp_path), "--allowed-signers", str(signers)]) == 1
    out = capsys.readouterr().out
    assert (
        "reconciler.yaml:11:39: spec.approvalRules[1].principals[1]: approval rule "
        "'settings-owners': nobody@example.com is not in the allowed-signers file" in out
    )
    assert main(["validate", str(tmp_path)]) == 0  # without the file, nothing to check against


def test_plan_lists_the_rules_that_apply_with_approvals_present_and_missing(
    fleet: Fleet, capsys: pytest.CaptureFixture[str]
) -> None:
    change = fleet.commit({"rollouts/srv.yaml": serving()})
    fleet.approve(change, "res-1")
    plan = ["plan", "--repo", str(fleet.work), "--head", change, "--base", f"{change}~1"]
    capsys.readouterr()
    main([*plan, "--allowed-signers", str(fleet.signers)])
    out = capsys.readouterr().out
    assert (
        "rule serving-owners: needs 1 of sre-1@example.com, sre-2@example.com; has 0, 1 missing"
        in out
    )
    assert "approved by res-1@example.com" in out

    fleet.approve(change, "sre-1")
    capsys.readouterr()
    main([*plan, "--allowed-signers", str(fleet.signers), "--format", "json"])
    record = json.loads(capsys.readouterr().out)["approvals"]
    assert record["verified"] is True
    assert record["rules"] == [
        {
            "name": "serving-owners",
            "require": 1,
            "principals": ["sre-1@example.com", "sre-2@example.com"],
            "approvedBy": ["sre-1@example.com"],
            "missing": 0,
            "summary": "serving-owners: approved by sre-1@example.com",
        }
    ]
    assert [(a["principal"], a["rules"]) for a in record["approvedBy"]] == [
        ("res-1@example.com", []),
        ("sre-1@example.com", ["serving-owners"]),
    ]


def test_one_approver_sees_an_older_commits_new_approval_through_the_chain(fleet: Fleet) -> None:
    older = fleet.commit({"rollouts/srv.yaml": serving()})  # refused: no serving owner
    later = fleet.commit({"rollouts/res.yaml": research()})
    fleet.approve(later, "bob")
    approver = fleet.approver(required=1)
    assert approver.approve(later).verified_commit not in (older, later)
    fleet.approve(later, "res-1")  # a note on the tip alone changes nothing below it
    assert approver.approve(later).verified_commit not in (older, later)
    fleet.approve(older, "sre-1")
    assert approver.approve(later).verified_commit == later  # judged on its own change now
    assert approver.approve(older).verified_commit == older


def test_after_settings_that_cannot_be_read_a_commit_is_judged_by_its_own_rules(
    fleet: Fleet,
) -> None:
    broken = fleet.commit({"reconciler.yaml": RULES + "  bogus: [\n"})
    assert [r.rule for r in fleet.approver().judgement(broken).rules] == ["settings-owners"]
    fleet.approve(broken, "carol")  # breaking the settings took their owner
    assert fleet.approver().judgement(broken).ok
    mended = fleet.commit({"reconciler.yaml": RULES, "rollouts/srv.yaml": serving()})
    judgement = fleet.approver().judgement(mended)
    assert judgement.base == broken
    assert [r.rule for r in judgement.rules] == ["serving-owners", "settings-owners"]


def test_a_signer_leaving_hands_no_commit_the_rules_before_the_one_acted_on(
    tmp_path: Path, keys: dict[str, Path]
) -> None:
    # bob's commit verifies under the new signers; alice's rules after it,
    # which the daemon acted on, do not: what follows is judged by hers
    signers = tmp_path / "allowed_signers"
    signers.write_text("".join(f"{n}@example.com {public(k)}\n" for n, k in keys.items()))
    work = tmp_path / "w"
    work.mkdir()
    git("init", "-q", "-b", "main", cwd=work)
    kit = Fleet(work, keys, signers)
    kit.commit(
        {
            "nodes/s1.yaml": node_yaml("s1", "http://127.0.0.1:9", {"role": "serving"}),
            "nodes/r1.yaml": node_yaml("r1", "http://127.0.0.1:9", {"role": "research"}),
        },
        who="bob",
    )
    acted = kit.commit({"reconciler.yaml": RULES})
    assert kit.approver().approve(acted).verified_commit == acted
    signers.write_text(
        "".join(f"{n}@example.com {public(k)}\n" for n, k in keys.items() if n != "alice")
    )
    loose = kit.commit(
        {"reconciler.yaml": "apiVersion: reconciler/v1\nkind: Settings\nspec: {}\n",
         "rollouts/srv.yaml": serving()},
        who="bob",
    )  # fmt: skip
    kit.approve(loose, "res-1")

    approver = kit.approver()
    approver.judge_after(acted)
    judgement = approver.judgement(loose)

    assert judgement.base == acted and not judgement.ok
    assert [r.rule for r in judgement.rules] == ["serving-owners", "settings-owners"]
    assert approver.approve(loose).verified_commit != loose
    kit.approve(loose, "sre-1", "carol")
    approver = kit.approver()
    approver.judge_after(acted)
    assert approver.approve(loose).verified_commit == loose
