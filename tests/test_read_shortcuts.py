"""The shortcuts that make a pass cost what changed, pinned against the
plain behaviour: a daemon that keeps its memory from read to read
(changed paths from History, statuses and documents read again only where
files changed, engine inputs kept, rollouts at rest not stepped, inert
statuses not observed, the dashboard's order kept) must read and decide
exactly what a daemon reading everything afresh does.

Real repository, real `git` pushes by a person, real daemon status commits
with the simulated fleet, across random sequences of adds, edits, deletes,
renames, invalid files, names declared twice, ``after`` lists, node and
settings edits, status files a person broke or removed, and force-pushed
rewinds. The whole-pass oracles (the plain daemon of ``run --plain``, and
a fresh daemon) run in a process of their own (``tests.kit.oracle``), so
they share nothing with the daemon they check but the agents."""

from __future__ import annotations

import random
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from reconciler.daemon.inert import InertStatuses, needs_passes
from reconciler.daemon.loop import Daemon
from reconciler.daemon.reader import Delta
from reconciler.engine import step as engine
from reconciler.engine.step import RolloutInput
from reconciler.protocol.observations import Observations
from reconciler.spec.documents import Documents
from reconciler.spec.rollout_status import RolloutStatus
from reconciler.text import dashboard
from reconciler.text.status_text import ordered
from tests.kit.documents import node_yaml, rollout_yaml
from tests.kit.fleets import FleetKit
from tests.kit.git import git, write_files
from tests.kit.oracle import Oracle, gauge_lines

NODES = {f"n{i}": {"role": "web" if i % 2 else "db", "zone": f"z{i % 3}"} for i in range(1, 7)}
NAMES = [f"r{i}" for i in range(8)]
NOW = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


@pytest.fixture
def kit(tmp_path: Path) -> Iterator[FleetKit]:
    kit = FleetKit.create(tmp_path, NODES)
    yield kit
    kit.close()


def push(kit: FleetKit, files: dict[str, str | None], message: str) -> None:
    """As a person does, on top of the daemon's status commits (an edit
    that changes nothing is still a commit)."""
    git("pull", "--quiet", "--rebase", "origin", "main", cwd=kit.work)
    write_files(kit.work, files)
    git("add", "-A", cwd=kit.work)
    git("commit", "--quiet", "--allow-empty", "-m", message, cwd=kit.work)
    git("push", "--quiet", "origin", "HEAD:main", cwd=kit.work)


@dataclass(frozen=True)
class Read:
    """What the verify step hands the steps after it."""

    documents: Documents
    statuses: dict[str, RolloutStatus]
    broken: dict[str, str]
    inputs: list[RolloutInput]
    input_changes: dict[str, RolloutInput | None] | None
    delta: Delta


def read_step(daemon: Daemon) -> Read:
    """The pass's read: the tip, then the verify step (documents, statuses,
    inputs). Called directly, so a rewind is read rather than refused."""
    tip = daemon.store.refresh()
    assert tip is not None
    snapshot, delta, built = daemon._verify(tip)
    return Read(
        snapshot.documents,
        snapshot.statuses,
        snapshot.broken,
        list(built.inputs),
        built.changes,
        delta,
    )


def a_rollout(rng: random.Random, name: str) -> str:
    spec: dict[str, object] = {"batchSize": rng.randint(1, 3)}
    if rng.random() < 0.5:
        spec["selector"] = {"role": rng.choice(["web", "db"])}
    else:
        spec["nodeIds"] = sorted(rng.sample([*sorted(NODES), "ghost"], rng.randint(1, 3)))
    if rng.random() < 0.2:
        spec["paused"] = True
    if rng.random() < 0.15:
        spec["abort"] = True
    if rng.random() < 0.1:
        spec["after"] = [rng.choice(NAMES)]
    if rng.random() < 0.1:
        spec["resumeRequest"] = f'"{rng.randrange(1000)}"'
    if rng.random() < 0.1:
        spec["allowOverlap"] = True
    return rollout_yaml(name, **spec)


def person_edit(rng: random.Random, kit: FleetKit) -> dict[str, str | None]:
    work = kit.work
    present = sorted(p.stem for p in (work / "rollouts").glob("*.yaml") if p.stem in NAMES)
    move = rng.choice(
        [
            "add",
            "add",
            "add",
            "edit",
            "edit",
            "delete",
            "rename",
            "invalid",
            "declared",
            "node",
            "settings",
            "status",
        ]
    )
    name = rng.choice(NAMES)
    if move in ("edit", "delete", "rename") and present:
        name = rng.choice(present)
    if move in ("add", "edit"):
        return {f"rollouts/{name}.yaml": a_rollout(rng, name)}
    if move == "delete":
        return {f"rollouts/{name}.yaml": None}
    if move == "rename":
        other = rng.choice(NAMES)
        return {f"rollouts/{name}.yaml": None, f"rollouts/{other}.yaml": a_rollout(rng, other)}
    if move == "invalid":
        return {
            f"rollouts/{name}.yaml": f"apiVersion: reconciler/v1\nkind: Rollout\n"
            f"metadata: {{name: {name}}}\nspec: {{batchSize: -1}}\n"
        }
    if move == "declared":
        return {f"rollouts/{name}.yaml": a_rollout(rng, rng.choice(NAMES))}
    if move == "node":
        node = f"n{rng.randint(1, 8)}"
        used = [
            line.split("name:")[1].strip()
            for path in sorted((work / "status").glob("*.yaml"))
            for line in path.read_text(errors="replace").splitlines()
            if line.startswith("  - name: ")
        ]
        if used and rng.random() < 0.6:
            node = rng.choice(used)  # a node a started rollout uses: its specCommit moves
        if rng.random() < 0.25 and node not in ("n1", "n2"):
            return {f"nodes/{node}.yaml": None}
        labels = {"role": rng.choice(["web", "db"]), "zone": f"z{rng.randrange(100)}"}
        return {f"nodes/{node}.yaml": node_yaml(node, kit.fleet.url, labels)}
    if move == "settings":
        return {
            "reconciler.yaml": "apiVersion: reconciler/v1\nkind: Settings\n"
            f"spec:\n  defaults: {{batchSize: {rng.randint(1, 3)}}}\n"
        }
    statuses = sorted(p.stem for p in (work / "status").glob("*.yaml") if p.stem in NAMES)
    if not statuses:
        return {f"rollouts/{name}.yaml": a_rollout(rng, name)}
    target = rng.choice(statuses)
    path = f"status/{target}.yaml"
    roll = rng.random()
    if roll < 0.35:
        return {path: None}
    if roll < 0.7:
        return {path: "phase: [not, a, status\n"}
    return older_status(rng, kit, target)


def older_status(rng: random.Random, kit: FleetKit, target: str = "") -> dict[str, str | None]:
    """An older version of a status file put back (as ``git revert`` does):
    a valid status with another value than the daemon wrote last."""
    work = kit.work
    if not target:
        names = sorted(p.stem for p in (work / "status").glob("*.yaml") if p.stem in NAMES)
        if not names:
            return {}
        target = rng.choice(names)
    path = f"status/{target}.yaml"
    git("fetch", "--quiet", "origin", cwd=work)
    versions = git("log", "--format=%H", "origin/main", "--", path, cwd=work).split()
    if len(versions) < 2:
        return {path: None}
    older = rng.choice(versions[1:])
    shown = subprocess.run(
        ["git", "show", f"{older}:{path}"], cwd=work, capture_output=True, text=True
    )
    return {path: shown.stdout if shown.returncode == 0 else None}


def test_a_daemon_reading_what_changed_reads_and_decides_what_reading_everything_does(
    kit: FleetKit,
) -> None:
    rng = random.Random(2020)
    kept = kit.daemon()  # keeps its memory from read to read
    writer = kit.daemon()  # commits statuses, as the running daemon would
    tips = [git("rev-parse", "main", cwd=kit.bare)]
    rewinds = incremental_reads = lively_kept = 0
    for step in range(70):
        roll = rng.random()
        if roll < 0.08 and len(tips) > 4:
            git("fetch", "-q", "origin", cwd=kit.work)
            git("reset", "--hard", "-q", rng.choice(tips[:-2]), cwd=kit.work)
            git("push", "-q", "-f", "origin", "HEAD:main", cwd=kit.work)
            writer = kit.daemon()  # the old one refuses the rewritten history
            rewinds += 1
        elif roll < 0.4:
            for _ in range(rng.randint(1, 3)):
                writer.run_pass()
        else:
            push(kit, person_edit(rng, kit), f"step {step}")
        tips.append(git("rev-parse", "main", cwd=kit.bare))
        if kept.reader.caches.status_reader.at is not None:
            incremental_reads += 1

        fresh = kit.daemon()  # reads everything
        got, want = read_step(kept), read_step(fresh)
        assert got.documents == want.documents, step
        # In the same order too (a mapping's equality does not look at it).
        assert list(got.documents.rollouts) == list(want.documents.rollouts), step
        assert list(got.documents.invalid_rollouts) == list(want.documents.invalid_rollouts)
        assert got.statuses == want.statuses and got.broken == want.broken, step
        by_name = lambda inputs: sorted(inputs, key=lambda i: i.name)  # noqa: E731
        assert by_name(got.inputs) == by_name(want.inputs), step

        # The engine with rollouts at rest left alone decides the same.
        docs = want.documents
        # Told what changed since its last step, it builds on that step's seed.
        with_memo = engine.step_fleet(
            got.inputs,
            docs.fleet,
            docs.settings,
            Observations(),
            NOW,
            memo=kept.memo,
            changed=got.input_changes,
        )
        plain = engine.step_fleet(want.inputs, docs.fleet, docs.settings, Observations(), NOW)
        assert with_memo == plain, step

        # Inert statuses ask nothing: observing only the lively ones is the same.
        every = list(want.statuses.values())
        # Judged again only where statuses were read again, as observe does.
        changes = got.delta.since_pass
        inert = kept.observer.inert
        if changes is None:
            lively = inert.lively(got.statuses)
        else:
            lively = inert.lively_changed(got.statuses, changes)
            assert sorted(lively, key=lambda s: s.name) == sorted(
                InertStatuses().lively(want.statuses), key=lambda s: s.name
            ), step
            lively_kept += 1
        kept.reader.settle()  # as at the end of a pass
        for ask in (
            engine.in_flight,
            engine.wanted_heartbeats,
            engine.wanted_backups,
            engine.wanted_metric_checks,
            engine.next_wakeup,
        ):
            assert ask(lively) == ask(every), (step, ask)
        assert any(map(needs_passes, lively)) == any(map(needs_passes, every))

        # The dashboard's kept order is the order.
        assert kept.files.order.place(got.statuses) == ordered(want.statuses), step
        assert dashboard.render_dashboard(got.statuses, kept.files.order) == (
            dashboard.render_dashboard(want.statuses)
        )
    assert rewinds >= 3 and incremental_reads > 50
    # It did take the shortcuts: most reads assembled only what changed.
    assert kept.reader.caches.assembly.full_assemblies < 40
    assert kept.memo.seeds_kept > 30  # and most steps built on the last seed
    assert lively_kept > 30, lively_kept


def test_a_position_whose_objects_are_gone_means_reading_everything_again(kit: FleetKit) -> None:
    # A mirror fetched after a force-push may no longer hold the commit read
    # last; the pass then reads every file, as on start, instead of failing.
    kept = kit.daemon()
    push(kit, {"rollouts/r1.yaml": rollout_yaml("r1", selector={"role": "web"})}, "add r1")
    read_step(kept)
    gone = "0" * 40
    kept.reader.caches.status_reader.at = gone
    kept.reader.caches.documents_commit = gone
    push(kit, {"rollouts/r2.yaml": rollout_yaml("r2", selector={"role": "db"})}, "add r2")
    kit.daemon().run_pass()  # statuses too

    got, want = read_step(kept), read_step(kit.daemon())

    assert got.documents == want.documents and set(got.documents.rollouts) == {"r1", "r2"}
    assert got.statuses == want.statuses and set(got.statuses) == {"r1", "r2"}
    assert got.delta.status is None and got.delta.spec is None


def test_a_daemon_that_keeps_its_memory_commits_what_a_fresh_one_commits(
    kit: FleetKit, tmp_path: Path
) -> None:
    # Whole passes, with every shortcut at once (changed paths, kept
    # documents, statuses and inputs, the engine's kept seed and rest set,
    # inert statuses, the dashboard's kept order, phase counts kept): at
    # every step a fresh daemon passes over a copy of the repository as it
    # stands, and the kept one over the repository itself; both make the
    # same commit (tree and message), the same outcome and the same gauges.
    rng = random.Random(2021)
    kept, commits = _pass_beside_an_oracle(kit, tmp_path, rng, 60, plain=False)
    assert commits > 15, commits
    assert kept.memo.seeds_kept > 15
    assert kept.reader.caches.assembly.full_assemblies < 30


@pytest.mark.parametrize("seed", [31, 32, 33])
def test_the_fast_daemon_decides_after_every_commit_what_the_plain_one_decides(
    kit: FleetKit, tmp_path: Path, seed: int
) -> None:
    # The differential test of ``run --plain``: random histories of a
    # person's edits (files added, edited, deleted, renamed, invalid, names
    # declared twice, node and settings edits, status files broken, removed
    # or put back older, and files no rollout can own: names that are not
    # UTF-8 or not valid names), and after every commit a plain daemon
    # (nothing cached, nothing skipped) passes over a copy of the repository
    # and the fast one over the repository itself: the same status commit,
    # the same jobs recorded, the same outcome and gauges.
    rng = random.Random(seed)
    kept, commits = _pass_beside_an_oracle(kit, tmp_path, rng, 30, plain=True, bad_names=True)
    assert commits > 5, commits
    assert kept.memo.seeds_kept > 5  # the fast one did take its shortcuts


def bad_names_edit(rng: random.Random, kit: FleetKit, step: int) -> None:
    """A commit adding (or emptying) a file no rollout can own."""
    name = rng.choice(
        [b"status/\xff%d.yaml", b"rollouts/\xfe%d.yaml", b"rollouts/R%d.yaml", b"status/x%d.yml"]
    )
    path = name.replace(b"%d", str(rng.randrange(3)).encode())
    git("pull", "--quiet", "--rebase", "origin", "main", cwd=kit.work)
    blob = git("hash-object", "-w", "--stdin", cwd=kit.work, input=f"step {step}\n")
    subprocess.run(
        [
            b"git",
            b"update-index",
            b"--add",
            b"--cacheinfo",
            b"100644," + blob.encode() + b"," + path,
        ],
        cwd=kit.work,
        check=True,
    )
    git("commit", "--quiet", "-m", f"step {step}: a file no rollout can own", cwd=kit.work)
    git("push", "--quiet", "origin", "HEAD:main", cwd=kit.work)
    git("reset", "--quiet", "--hard", cwd=kit.work)


def _pass_beside_an_oracle(
    kit: FleetKit,
    tmp_path: Path,
    rng: random.Random,
    steps: int,
    *,
    plain: bool,
    bad_names: bool = False,
) -> tuple[Daemon, int]:
    """``steps`` random commits; after each, a new daemon (``plain`` or not)
    in the oracle's process passes over a copy of the repository and the
    kept one over the repository: they must decide the same. Returns the
    kept daemon and how many status commits were compared."""
    now = [datetime.now(UTC).replace(microsecond=0)]  # the agents check signatures' times
    kept = kit.daemon(clock=lambda: now[0])
    oracle = Oracle(kit.key_path, kit.agent_timeout)
    try:
        commits = _compare_passes(kit, tmp_path, rng, steps, (kept, now), oracle, plain, bad_names)
    finally:
        oracle.close()
    return kept, commits


def _compare_passes(
    kit: FleetKit,
    tmp_path: Path,
    rng: random.Random,
    steps: int,
    daemon: tuple[Daemon, list[datetime]],  # the kept one, and the clock it reads
    oracle: Oracle,
    plain: bool,
    bad_names: bool,
) -> int:
    kept, now = daemon
    commits = 0
    for step in range(steps):
        roll = rng.random()
        if bad_names and roll < 0.12:
            bad_names_edit(rng, kit, step)
        elif roll < 0.45:
            push(kit, person_edit(rng, kit), f"step {step}")
        elif roll < 0.6:
            push(kit, older_status(rng, kit), f"step {step}: an older status put back")
        now[0] = datetime.now(UTC).replace(microsecond=0)  # one clock for both daemons
        copy = tmp_path / f"copy-{step}.git"
        shutil.copytree(kit.bare, copy)
        want = oracle.run_pass(copy, now[0], plain=plain)
        got = kept.run_pass()
        time.sleep(0.05)  # the jobs both sent finish before the next reads

        assert (got.commit is None) == (want["commit"] is None), step
        wakeup = got.wakeup.isoformat() if got.wakeup is not None else None
        assert (got.transitions, got.jobs_sent, got.active, wakeup, got.refused) == (
            want["transitions"],
            want["jobs_sent"],
            want["active"],
            want["wakeup"],
            want["refused"],
        ), step
        assert list(got.job_ids) == want["job_ids"], step
        if got.commit is not None:
            made = kept.store.repository()[got.commit]
            assert str(made.tree_id) == want["tree"], step
            assert made.message == want["message"], step
            commits += 1
        assert gauge_lines(generate_latest(kept.metrics.registry).decode()) == want["gauges"], step
        shutil.rmtree(copy)
    return commits
