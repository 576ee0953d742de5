"""The chaos scenarios, shared by the tests in this folder and by
``bench/reliability.py``. Each builds a ``Lab``, breaks something on
purpose, lets the daemon carry on, and returns a ``Result``: what was tried
(crash points, faults, bad inputs), what was lost (commits, jobs executed
twice) and every violation found, as sentences. No violation: the daemon did
what docs/rollouts.md says.

Every scenario ends with ``audit``: the history checks of ``invariants``
(linear, status-only writes that parse, status never backwards, batch
order), the job checks against the simulator's records (each job executed
at most once, one payload per job id, recorded before sent), commits lost,
and the daemon still running and stopping cleanly on SIGTERM.

Timings are short on purpose: ``healthTimeout: 2s``, ``offlineAfter: 2s``,
``--interval 0.2s``.
"""

from __future__ import annotations

import itertools
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pygit2

from tests.kit.documents import node_yaml, rollout_yaml

from .harness import (
    AgentProcess,
    DaemonProcess,
    Lab,
    LabError,
    SimProcess,
    describe,
    settings_text,
)
from .invariants import (
    Snapshot,
    check_history,
    check_jobs,
    lost_commits,
    outcome,
    unrecorded_jobs,
    walk,
)

POLICIES = ("observe", "pause", "retry_once", "stop", "rollback")
SHORT = {"observe": "obs", "pause": "pau", "retry_once": "rty", "stop": "stp", "rollback": "rbk"}
FAILED_STATES = frozenset({"failed", "timed_out"})
LIVE_TARGET = "{runtime: hermes, provider: ollama, model: llama3.1-70b, profile: default}"


@dataclass
class Result:
    name: str
    category: str  # crash | fault | repository | input
    crash_points: int = 0  # crash points the scenario kills the daemon at
    fault_cases: int = 0  # faults it injects (a fault against a policy counts once)
    crashes: int = 0  # crash points the daemon was killed at (and restarted after)
    faults: int = 0  # fault cases that ended as docs/rollouts.md says
    bad_inputs: int = 0  # invalid documents committed into the live repository
    commits_lost: int = 0
    executed_twice: int = 0
    violations: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.violations

    def explain(self) -> str:
        """The violations, one per paragraph, for an assertion message."""
        return f"{self.name}:\n- " + "\n- ".join(self.violations)

    def expect(self, condition: bool, message: str) -> bool:
        if not condition:
            self.violations.append(message)
        return condition


def timed(run: Callable[[Result], None], result: Result) -> Result:
    """Run a scenario body; a LabError (a state never reached, a process
    that would not start) becomes a violation, not a crash of the suite."""
    started = time.monotonic()
    try:
        run(result)
    except LabError as exc:
        result.violations.append(str(exc))
    except Exception as exc:  # the harness itself broke: say so, keep the run going
        trace = "".join(traceback.format_exception(exc)[-6:])
        result.violations.append(f"scenario error: {exc!r}\n{trace}")
    result.seconds = time.monotonic() - started
    return result


def audit(
    lab: Lab,
    result: Result,
    *,
    sim: SimProcess | None = None,
    daemon: DaemonProcess | None = None,
    clocks_agree: bool = True,
    people: Iterable[str] = (),
    allowed_errors: Iterable[str] = (),
) -> None:
    """The checks every scenario ends with (see the module docstring)."""
    # The log first: a commit is logged only after the branch moved to it,
    # so every commit logged by now is in the history of the tip read next.
    logged = {e["commit"] for e in lab.daemon_events("transition") if e.get("commit")}
    tip = lab.tip()
    assert tip is not None
    history = walk(lab.repo, tip)
    result.violations += check_history(history).violations
    if sim is not None:
        jobs = check_jobs(history, sim.stats(), sim.journal(), clocks_agree=clocks_agree)
        result.violations += jobs.violations
        result.executed_twice += jobs.executed_twice
    lost = lost_commits(lab.repo, tip, [*people, *sorted(logged)])
    result.commits_lost += len(lost)
    result.expect(not lost, f"commits lost from main: {lost}")
    allowed = set(allowed_errors)
    for event in lab.daemon_events():
        if event.get("level") == "error" and event.get("event") not in allowed:
            result.violations.append(f"daemon logged an error: {event}")
    for d in lab.daemons:
        if "Traceback" in d.log_text():
            result.violations.append(f"{d.name} printed a traceback:\n{d.log_text()[-2500:]}")
    alive = daemon is not None and result.expect(
        daemon.alive(), f"the daemon exited ({daemon.popen.returncode})"
    )
    if daemon is not None and alive:
        code = daemon.stop()
        result.expect(code == 0, f"the daemon did not stop cleanly on SIGTERM: exit {code}")


def fleet_files(
    url: str,
    groups: Mapping[str, Sequence[str]],
    *,
    offline_after: str = "2s",
    agents: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Node files (label ``group``) pointing at ``url`` (or ``agents[node]``)
    and reconciler.yaml with ``offlineAfter``."""
    files = {"reconciler.yaml": settings_text(offline_after)}
    for group, names in groups.items():
        for name in names:
            address = (agents or {}).get(name, url)
            files[f"nodes/{name}.yaml"] = node_yaml(
                name, address, {"group": group}, maintenance=None
            )
    return files


def _terminal(name: str) -> Callable[[Snapshot], bool]:
    return lambda s: (st := s.get(name)) is not None and st.terminal


# -- crashes -----------------------------------------------------------------

CRASH_NODES = tuple(f"c-{i}" for i in range(1, 7))
CRASH_ROLLOUT = "crashy"
# c-3 fails its first attempt: retry_once sends it again, and it passes.
CRASH_BEHAVIOUR = {
    "default": {"action": "succeed", "delay": 0.3},
    "nodes": {"c-3": {"action": "succeed", "delay": 0.3, "attempts": {"1": "fail"}}},
}
CRASH_SPEC = {
    "selector": {"group": "crash"},
    "batchSize": 2,
    "onFailure": "retry_once",
    "healthTimeout": "30s",
}


def crash_reference(root: Path, *, remote: bool = False) -> tuple[Any, ...]:
    """The outcome of the crash scenario run without any crash."""
    with Lab(root) as lab:
        sim = lab.sim(CRASH_NODES, CRASH_BEHAVIOUR)
        lab.init_repo(fleet_files(sim.url, {"crash": CRASH_NODES}))
        lab.push(
            {f"rollouts/{CRASH_ROLLOUT}.yaml": rollout_yaml(CRASH_ROLLOUT, **CRASH_SPEC)},
            "Roll out",
        )
        daemon = lab.daemon(remote=remote)
        final = lab.wait(_terminal(CRASH_ROLLOUT), what="the reference run ends", daemon=daemon)
        daemon.stop()
        return outcome(final[CRASH_ROLLOUT])


def _crash_at(
    lab: Lab,
    point: str,
    name: str,
    result: Result,
    remote: bool,
    received: Callable[[], Iterable[str]],
) -> None:
    """Start the daemon with a crash point and wait for its SIGKILL. Right
    after it, every job an agent has received must be recorded in the
    branch's history (invariant 1: recorded before sent). A point never
    reached (the rollout ended first) is a flaw of the scenario, reported
    as a violation too."""
    daemon = lab.daemon(crash_at=point, remote=remote)
    deadline = time.monotonic() + 40
    ended_at: float | None = None
    while time.monotonic() < deadline:
        code = daemon.wait(0.2)
        if code is not None:
            if daemon.crashed(0):
                result.crashes += 1
                tip = lab.tip()
                if tip is not None:
                    early = unrecorded_jobs(lab.repo, tip, received())
                    result.expect(
                        not early,
                        f"killed at {point}: agents hold jobs no committed status records: {early}",
                    )
            else:
                result.violations.append(
                    f"daemon with crash point {point} exited {code} instead of being killed:\n"
                    f"{daemon.log_text()[-2000:]}"
                )
            return
        if ended_at is None and _terminal(name)(lab.snapshot()):
            ended_at = time.monotonic()
        if ended_at is not None and time.monotonic() - ended_at > 2:
            break
    daemon.kill()
    result.violations.append(f"crash point {point} was never reached")


def crash_scenario(
    root: Path,
    points: Sequence[str],
    reference: tuple[Any, ...],
    *,
    remote: bool = False,
) -> Result:
    """A rollout of 6 simulated nodes in batches of 2 (one node fails its
    first attempt, retry_once) with the daemon SIGKILLed at each of
    ``points`` in turn (``NAME:N``: the N-th time that daemon reaches NAME),
    restarted each time, and finally run without a crash point: it ends
    exactly as the uninterrupted ``reference`` did."""
    where = "remote" if remote else "local"
    result = Result(f"crash {'+'.join(points)} ({where})", "crash", crash_points=len(points))

    def run(result: Result) -> None:
        with Lab(root) as lab:
            sim = lab.sim(CRASH_NODES, CRASH_BEHAVIOUR)
            lab.init_repo(fleet_files(sim.url, {"crash": CRASH_NODES}))
            person = lab.push(
                {f"rollouts/{CRASH_ROLLOUT}.yaml": rollout_yaml(CRASH_ROLLOUT, **CRASH_SPEC)},
                "Roll out",
            )
            for point in points:
                _crash_at(
                    lab, point, CRASH_ROLLOUT, result, remote, lambda: sim.stats()["received"]
                )
            daemon = lab.daemon(remote=remote)
            final = lab.wait(_terminal(CRASH_ROLLOUT), what="the rollout ends", daemon=daemon)
            got = outcome(final[CRASH_ROLLOUT])
            result.expect(
                got == reference,
                f"after crashes at {points} the rollout ended as {got}, "
                f"an uninterrupted run as {reference}",
            )
            result.expect(lab.unchanged_for(1.0), "an idle daemon kept committing")
            audit(lab, result, sim=sim, daemon=daemon, people=[person])

    return timed(run, result)


def two_daemons_scenario(
    root: Path, reference: tuple[Any, ...], *, crash_at: str | None = None
) -> Result:
    """Two daemons on one repository at once (invariant 7), the second one
    SIGKILLed at ``crash_at`` if given: the compare-and-swap lets one win
    each pass and the other re-reads; the rollout ends as the uninterrupted
    ``reference``, and no agent executes a job twice."""
    killed = f", one killed at {crash_at}" if crash_at else ""
    result = Result(f"two daemons at once{killed}", "crash", crash_points=1 if crash_at else 0)

    def run(result: Result) -> None:
        with Lab(root) as lab:
            sim = lab.sim(CRASH_NODES, CRASH_BEHAVIOUR)
            lab.init_repo(fleet_files(sim.url, {"crash": CRASH_NODES}))
            person = lab.push(
                {f"rollouts/{CRASH_ROLLOUT}.yaml": rollout_yaml(CRASH_ROLLOUT, **CRASH_SPEC)},
                "Roll out",
            )
            steady = lab.daemon()
            other = lab.daemon(crash_at=crash_at)
            final = lab.wait(_terminal(CRASH_ROLLOUT), what="the rollout ends", daemon=steady)
            if crash_at is None:
                result.expect(
                    other.alive(), f"the second daemon exited: {other.log_text()[-2000:]}"
                )
                other.stop()
            elif other.crashed(10):
                result.crashes += 1
            else:
                result.violations.append(f"the second daemon was not killed at {crash_at}")
                other.stop()
            got = outcome(final[CRASH_ROLLOUT])
            result.expect(got == reference, f"two daemons ended as {got}, one as {reference}")
            result.expect(lab.unchanged_for(1.0), "idle daemons kept committing")
            audit(lab, result, sim=sim, daemon=steady, people=[person])

    return timed(run, result)


def paged_crash_scenario(root: Path, points: Sequence[str], nodes: int = 250) -> Result:
    """The crash scenario at a size where node records move to page files
    (over 200 nodes: status/NAME/nodes-0001.yaml, ...), two batches: the
    daemon is killed at each of ``points`` and ends as a run without
    crashes does."""
    result = Result(
        f"crash {'+'.join(points)} ({nodes} nodes, paged status)",
        "crash",
        crash_points=len(points),
    )
    names = [f"p-{i:03d}" for i in range(1, nodes + 1)]
    behaviour = {"default": {"action": "succeed", "delay": 0.5}}
    spec = {"selector": {"group": "paged"}, "batchSize": nodes // 2 + 1, "healthTimeout": "60s"}

    def world(lab: Lab) -> tuple[SimProcess, str]:
        sim = lab.sim(names, behaviour)
        lab.init_repo(fleet_files(sim.url, {"paged": names}))
        return sim, lab.push({"rollouts/paged.yaml": rollout_yaml("paged", **spec)}, "Roll out")

    def run(result: Result) -> None:
        with Lab(root / "reference") as lab:
            world(lab)
            daemon = lab.daemon()
            reference = outcome(
                lab.wait(_terminal("paged"), what="reference", daemon=daemon)["paged"]
            )
            daemon.stop()
        with Lab(root / "crashed") as lab:
            sim, person = world(lab)
            for point in points:
                _crash_at(lab, point, "paged", result, False, lambda: sim.stats()["received"])
            daemon = lab.daemon()
            final = lab.wait(_terminal("paged"), what="the rollout ends", daemon=daemon)
            got = outcome(final["paged"])
            result.expect(got == reference, f"after crashes at {points}: {describe(final)[:2000]}")
            paged = lab.file_at_tip("status/paged/nodes-0002.yaml")
            result.expect(paged is not None, "the node records were not paged")
            audit(lab, result, sim=sim, daemon=daemon, people=[person])

    return timed(run, result)


def unreadable_status_overlap_scenario(root: Path) -> Result:
    """While a running rollout's status file is unreadable, the nodes it
    holds stay its own: a second rollout on the same nodes (allowOverlap
    false) waits in pending (docs/rollouts.md: pending while it overlaps
    a running or paused rollout), and no node gets jobs of two rollouts."""
    result = Result("unreadable status keeps its nodes claimed", "repository", fault_cases=1)

    def run(result: Result) -> None:
        with Lab(root) as lab:
            v = ["v-1", "v-2", "v-3"]
            sim = lab.sim(v, {"default": {"action": "succeed", "delay": 1.0}})
            lab.init_repo(fleet_files(sim.url, {"victim": v}))
            spec = {"selector": {"group": "victim"}, "healthTimeout": "30s"}
            people = [
                lab.push({"rollouts/victim.yaml": rollout_yaml("victim", **spec)}, "Roll out")
            ]
            daemon = lab.daemon()
            lab.wait(
                lambda s: (n := _node(s, "victim", "v-1")) is not None and n.state == "dispatched",
                what="victim's first batch dispatched",
                daemon=daemon,
            )
            people.append(lab.push({"status/victim.yaml": "phase: [nonsense\n"}, "Break status"))
            people.append(
                lab.push(
                    {"rollouts/second.yaml": rollout_yaml("second", **spec)},
                    "A second rollout on the same nodes",
                )
            )
            time.sleep(3.0)
            second = lab.snapshot().get("second")
            result.expect(
                second is not None and second.phase == "pending",
                f"second rollout on victim's nodes is {second.phase if second else None}: "
                f"{second.message if second else ''}",
            )
            both = {e["payload"]["rollout"] for e in sim.journal() if e.get("e") == "accept"}
            result.expect(both == {"victim"}, f"rollouts that sent jobs to victim's nodes: {both}")
            result.faults += result.ok
            audit(lab, result, sim=sim, daemon=daemon, people=people)

    return timed(run, result)


AGENT_NODES = ("a-1", "a-2", "a-3", "a-4")
INITIAL_CONFIG = {"provider": "ollama", "model": "llama3.1-8b", "profile": "default"}


def agent_crash_scenario(root: Path, points: Sequence[str]) -> Result:
    """A live rollout on four real agents (two batches of 2) with the
    daemon SIGKILLed at each of ``points``: it completes, every agent's
    config shows the target, and every agent holds exactly one backup per
    applied job (a job executed twice would have made two)."""
    result = Result(
        f"crash {'+'.join(points)} (real agents, live)", "crash", crash_points=len(points)
    )

    def run(result: Result) -> None:
        with Lab(root) as lab:
            agents: dict[str, AgentProcess] = {
                node: lab.agent(node, initial=INITIAL_CONFIG) for node in AGENT_NODES
            }
            lab.init_repo(
                fleet_files(
                    "",
                    {"agents": AGENT_NODES},
                    agents={n: a.url for n, a in agents.items()},
                )
            )
            spec = {
                "target": LIVE_TARGET,
                "selector": {"group": "agents"},
                "batchSize": 2,
                "live": True,
                "healthTimeout": "30s",
            }
            person = lab.push({"rollouts/live.yaml": rollout_yaml("live", **spec)}, "Go live")
            for point in points:
                _crash_at(
                    lab,
                    point,
                    "live",
                    result,
                    False,
                    lambda: [j for a in agents.values() for j in a.job_ids()],
                )
            daemon = lab.daemon()
            final = lab.wait(_terminal("live"), what="the live rollout ends", daemon=daemon)
            status = final["live"]
            result.expect(
                status.phase == "completed",
                f"the live rollout ended {status.phase}: {describe(final)}",
            )
            for node in status.nodes:
                agent = agents[node.name]
                result.expect(
                    "llama3.1-70b" in agent.config(),
                    f"{node.name}: config is {agent.config()!r}, not the target",
                )
                record = agent.job(node.job_id or "")
                result.expect(
                    record is not None and record.get("state") == "succeeded",
                    f"{node.name}: agent's record of {node.job_id} is {record}",
                )
                jobs = [b.get("jobId") for b in agent.backups()]
                twice = len(jobs) - len(set(jobs))
                result.executed_twice += twice
                result.expect(
                    jobs == [node.job_id],
                    f"{node.name}: backups made by jobs {jobs}, expected one by {node.job_id}",
                )
            audit(lab, result, daemon=daemon, people=[person])

    return timed(run, result)


# -- agent faults ------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    """A misbehaving agent. The faulty node sits in batch 1 next to a
    healthy node; a healthy node waits in batch 2."""

    name: str
    behaviour: Mapping[str, Any] | None  # sim behaviour; None: nothing listens at its address
    verdict: str  # what docs/rollouts.md makes of it: failed | unknown
    live: bool = False
    rollback_hold: str = "rollback_unavailable"  # rollback policy's hold on a failed verdict
    error_has: str = ""  # words the faulty node's recorded error must contain
    retry_passes: bool = False  # the second attempt behaves: retry_once completes
    settle_seconds: float = 1.0  # how long an idle daemon is watched for commits


FAULTS_FAILED = (
    Fault("hangs: accepts the job, never finishes", {"action": "hang"}, "failed",
          error_has="deadline passed"),
    Fault("slow past the timeout (attempt 1 only)",
          {"action": "succeed", "delay": 4.5, "attempts": {"2": {"action": "succeed", "delay": 0}}},
          "failed", retry_passes=True, settle_seconds=3.0),
    Fault("refuses with 403", {"action": "refuse", "status": 403, "code": "forbidden"}, "failed",
          error_has="forbidden"),
    Fault("answers as another node", {"action": "impostor", "as": "someone-else"}, "failed",
          error_has="wrong_node"),
    Fault("heartbeat drift that never clears", {"action": "drift"}, "failed", live=True,
          rollback_hold="rolled_back", error_has="drift"),
    Fault("clock an hour ahead", {"action": "succeed", "clockSkew": 3600}, "failed", live=True,
          error_has="expired"),
    Fault("clock an hour behind", {"action": "succeed", "clockSkew": -3600}, "failed", live=True,
          error_has="not_yet_valid"),
)  # fmt: skip

FAULTS_UNKNOWN = (
    Fault("down from the start (nothing listens)", None, "unknown"),
    Fault("answers 500", {"action": "error500"}, "unknown"),
    Fault("answers garbage instead of JSON", {"action": "garbage"}, "unknown"),
    Fault("stalls: never answers a request", {"action": "stall"}, "unknown"),
)


@dataclass(frozen=True)
class Expect:
    phase: str
    hold: str | None
    faulty: frozenset[str]  # allowed states of the faulty node
    later: str  # state of the batch-2 node
    attempt: int  # the faulty node's attempt


def expected(policy: str, fault: Fault) -> Expect:
    """docs/rollouts.md, for a faulty node in batch 1."""
    if fault.verdict == "unknown":
        if policy == "observe":
            return Expect("failed", None, frozenset({"unknown"}), "succeeded", 1)
        return Expect("paused", "health_unknown", frozenset({"unknown"}), "pending", 1)
    if policy == "observe":
        return Expect("failed", None, FAILED_STATES, "succeeded", 1)
    if policy == "pause":
        return Expect("paused", "health_failed", FAILED_STATES, "pending", 1)
    if policy == "retry_once":
        if fault.retry_passes:
            return Expect("completed", None, frozenset({"succeeded"}), "succeeded", 2)
        return Expect("paused", "retry_exhausted", FAILED_STATES, "pending", 2)
    if policy == "stop":
        return Expect("paused", "stopped", frozenset({"stopped"}), "pending", 1)
    states = frozenset({"rolled_back"}) if fault.rollback_hold == "rolled_back" else FAILED_STATES
    return Expect("paused", fault.rollback_hold, states, "pending", 1)


def _fault_layout(index: int, policy: str) -> tuple[str, str, list[str]]:
    """(rollout name, group, [healthy batch 1, faulty batch 1, healthy batch 2])."""
    group = f"f{index}-{SHORT[policy]}"
    return group, group, [f"{group}-1", f"{group}-2", f"{group}-3"]


def fault_scenario(root: Path, faults: Sequence[Fault], title: str) -> Result:
    """Every fault in ``faults`` against every failure policy, all at once:
    one rollout per (fault, policy) on its own three nodes, one daemon, one
    simulated fleet. Each rollout must end as ``expected`` says, the
    daemon still running, an idle daemon committing nothing."""
    result = Result(title, "fault", fault_cases=len(faults) * len(POLICIES))

    def run(result: Result) -> None:
        with Lab(root) as lab:
            layout = {(i, p): _fault_layout(i, p) for i in range(len(faults)) for p in POLICIES}
            names = [n for _, _, nodes in layout.values() for n in nodes]
            behaviour: dict[str, Any] = {"default": "succeed", "nodes": {}}
            dead: dict[str, str] = {}
            for (i, _), (_, _, nodes) in layout.items():
                if faults[i].behaviour is None:
                    dead[nodes[1]] = lab.closed_url()
                else:
                    behaviour["nodes"][nodes[1]] = faults[i].behaviour
            sim = lab.sim(names, behaviour)
            groups = {group: nodes for group, _, nodes in layout.values()}
            lab.init_repo(fleet_files(sim.url, groups, agents=dead))
            rollouts = {}
            for (i, policy), (name, group, _) in layout.items():
                spec: dict[str, Any] = {
                    "selector": {"group": group},
                    "batchSize": 2,
                    "healthTimeout": "2s",
                    "onFailure": policy,
                    "live": faults[i].live,
                }
                if faults[i].live:
                    spec["target"] = LIVE_TARGET
                rollouts[f"rollouts/{name}.yaml"] = rollout_yaml(name, **spec)
            person = lab.push(rollouts, f"Roll out {len(rollouts)} rollouts into faults")
            daemon = lab.daemon()
            wanted = {
                layout[(i, p)][0]: expected(p, faults[i])
                for i in range(len(faults))
                for p in POLICIES
            }

            def ended(snapshot: Snapshot) -> bool:
                for name, want in wanted.items():
                    st = snapshot.get(name)
                    if st is None or st.phase != want.phase:
                        return False
                    if (st.hold.reason if st.hold else None) != want.hold:
                        return False
                return True

            try:
                final = lab.wait(ended, what=title, daemon=daemon, timeout=60)
            except LabError as exc:
                result.violations.append(str(exc))
                final = lab.snapshot()
            settle = max(f.settle_seconds for f in faults)
            result.expect(lab.unchanged_for(settle), f"{title}: an idle daemon kept committing")
            final = lab.snapshot()
            for (i, policy), (name, _, nodes) in layout.items():
                fault, want = faults[i], wanted[layout[(i, policy)][0]]
                ok = _check_fault(result, fault, policy, want, final, name, nodes)
                result.faults += ok
            audit(lab, result, sim=sim, daemon=daemon, people=[person],
                  clocks_agree=not any("clockSkew" in (f.behaviour or {}) for f in faults))  # fmt: skip

    return timed(run, result)


def _check_fault(
    result: Result,
    fault: Fault,
    policy: str,
    want: Expect,
    final: Snapshot,
    name: str,
    nodes: Sequence[str],
) -> bool:
    where = f"{fault.name} / {policy}"
    st = final.get(name)
    if st is None:
        result.violations.append(f"{where}: no status for {name}")
        return False
    by_name = {n.name: n for n in st.nodes}
    healthy, faulty, later = (by_name.get(n) for n in nodes)
    before = len(result.violations)
    got_hold = st.hold.reason if st.hold else None
    result.expect(
        (st.phase, got_hold) == (want.phase, want.hold),
        f"{where}: phase {st.phase} hold {got_hold}, expected {want.phase} hold {want.hold}"
        f" ({describe(Snapshot(final.commit, {name: st}, {}))})",
    )
    if healthy is None or faulty is None or later is None:
        result.violations.append(f"{where}: nodes missing from status: {list(by_name)}")
        return False
    result.expect(healthy.state == "succeeded", f"{where}: healthy batch-1 node {healthy.state}")
    result.expect(
        faulty.state in want.faulty,
        f"{where}: faulty node {faulty.state} ({faulty.error}), expected one of {sorted(want.faulty)}",
    )
    result.expect(
        faulty.attempt == want.attempt,
        f"{where}: faulty node at attempt {faulty.attempt}, expected {want.attempt}",
    )
    result.expect(
        later.state == want.later, f"{where}: batch-2 node {later.state}, expected {want.later}"
    )
    if fault.error_has and not (policy == "retry_once" and fault.retry_passes):
        result.expect(
            fault.error_has.lower() in faulty.error.lower(),
            f"{where}: faulty node's error {faulty.error!r} does not say {fault.error_has!r}",
        )
    if st.hold is not None:
        result.expect(
            nodes[1] in st.hold.message and bool(st.hold.nodes),
            f"{where}: hold message does not name the node: {st.hold.message!r}",
        )
    return len(result.violations) == before


def outage_scenario(root: Path) -> Result:
    """Agents go down mid-batch and come back. Each policy's faulty node has
    its job running when its agent starts answering 503 for longer than
    offlineAfter: unknown, hold health_unknown (observe: recorded, carries
    on). The agent comes back: the hold stays (unknown waits for a person).
    A resumeRequest dispatches a new attempt, and the rollouts complete."""
    result = Result(
        "agent down mid-batch past offlineAfter, back, resumed",
        "fault",
        fault_cases=len(POLICIES),
    )
    fault = Fault("down mid-batch", {"action": "succeed", "delay": 3.0}, "unknown")

    def run(result: Result) -> None:
        with Lab(root) as lab:
            layout = {p: _fault_layout(0, p) for p in POLICIES}
            names = [n for _, _, nodes in layout.values() for n in nodes]
            faulty = [nodes[1] for _, _, nodes in layout.values()]
            slow = {n: dict(fault.behaviour or {}) for n in faulty}
            sim = lab.sim(names, {"default": "succeed", "nodes": slow})
            lab.init_repo(fleet_files(sim.url, {g: nodes for g, _, nodes in layout.values()}))
            specs = {
                p: {"selector": {"group": g}, "batchSize": 2, "healthTimeout": "4s", "onFailure": p}
                for p, (_, g, _) in layout.items()
            }
            files = {
                f"rollouts/{n}.yaml": rollout_yaml(n, **specs[p]) for p, (n, _, _) in layout.items()
            }
            people = [lab.push(files, "Roll out")]
            daemon = lab.daemon()

            def dispatched(s: Snapshot) -> bool:
                return all(
                    (st := s.get(n)) is not None
                    and any(x.name == nodes[1] and x.state == "dispatched" for x in st.nodes)
                    for n, _, nodes in layout.values()
                )

            lab.wait(dispatched, what="faulty nodes dispatched", daemon=daemon)
            sim.set_behaviour({"default": "succeed", "nodes": dict.fromkeys(faulty, "unreachable")})
            wanted = {n: expected(p, fault) for p, (n, _, _) in layout.items()}
            held = lab.wait(
                lambda s: all(
                    (st := s.get(n)) is not None
                    and st.phase == w.phase
                    and (st.hold.reason if st.hold else None) == w.hold
                    for n, w in wanted.items()
                ),
                what="unknown verdicts while the agents are down",
                daemon=daemon,
            )
            for p, (n, _, nodes) in layout.items():
                _check_fault(result, fault, p, wanted[n], held, n, nodes)
            sim.set_behaviour({"default": "succeed"})
            result.expect(
                lab.unchanged_for(1.5),
                "the daemon changed status when the agents came back: unknown must wait for a person",
            )
            resumed = {
                f"rollouts/{n}.yaml": rollout_yaml(n, resumeRequest="after-outage", **specs[p])
                for p, (n, _, _) in layout.items()
                if p != "observe"
            }
            people.append(lab.push(resumed, "Resume after the outage"))
            final = lab.wait(
                lambda s: all(
                    (st := s.get(n)) is not None and st.terminal for n, _, _ in layout.values()
                ),
                what="rollouts end after the resume",
                daemon=daemon,
            )
            for p, (n, _, nodes) in layout.items():
                st = final[n]
                want_phase = "failed" if p == "observe" else "completed"
                node = next(x for x in st.nodes if x.name == nodes[1])
                ok = result.expect(
                    st.phase == want_phase and node.attempt == (1 if p == "observe" else 2),
                    f"down mid-batch / {p}: after the resume {describe(Snapshot(final.commit, {n: st}, {}))}",
                )
                result.faults += ok
            audit(lab, result, sim=sim, daemon=daemon, people=people)

    return timed(run, result)


def blip_scenario(root: Path) -> Result:
    """Faults the daemon must ride out without a verdict: an agent down for
    less than offlineAfter in the middle of a batch, and agent clocks 90 s
    ahead and behind (heartbeat and job times are compared on the agent's
    own clock). A live rollout completes with one attempt per node."""
    result = Result("agent blips: short outage, clocks 90s off", "fault", fault_cases=3)

    def run(result: Result) -> None:
        with Lab(root) as lab:
            names = ["blip-1", "blip-2", "blip-3", "blip-4"]
            nodes: dict[str, Any] = {
                "blip-2": {"action": "succeed", "delay": 2.5},
                "blip-3": {"action": "succeed", "clockSkew": 90},
                "blip-4": {"action": "succeed", "clockSkew": -90},
            }
            script = {"default": "succeed", "nodes": nodes}
            sim = lab.sim(names, script)
            lab.init_repo(fleet_files(sim.url, {"blip": names}, offline_after="6s"))
            spec = {
                "target": LIVE_TARGET,
                "selector": {"group": "blip"},
                "batchSize": 2,
                "healthTimeout": "15s",
                "live": True,
            }
            person = lab.push({"rollouts/blip.yaml": rollout_yaml("blip", **spec)}, "Roll out")
            daemon = lab.daemon()
            lab.wait(
                lambda s: (
                    (st := s.get("blip")) is not None
                    and any(n.name == "blip-2" and n.state == "dispatched" for n in st.nodes)
                ),
                what="blip-2 dispatched",
                daemon=daemon,
            )
            down = {"default": "succeed", "nodes": {**nodes, "blip-2": "unreachable"}}
            sim.set_behaviour(down)
            time.sleep(1.5)
            sim.set_behaviour(script)
            final = lab.wait(_terminal("blip"), what="the blip rollout ends", daemon=daemon)
            st = final["blip"]
            ok = result.expect(
                st.phase == "completed" and all(n.attempt == 1 for n in st.nodes),
                f"short outage and skewed clocks: {describe(final)}",
            )
            result.faults += 3 if ok else 0
            audit(lab, result, sim=sim, daemon=daemon, people=[person], clocks_agree=False)

    return timed(run, result)


# -- repository faults -------------------------------------------------------


def _simple_world(
    lab: Lab, prefix: str, count: int, behaviour: Mapping[str, Any] | None = None
) -> SimProcess:
    """``count`` simulated nodes PREFIX-1.. in group PREFIX, in a new repository."""
    names = [f"{prefix}-{i}" for i in range(1, count + 1)]
    sim = lab.sim(names, behaviour or {"default": {"action": "succeed", "delay": 0.3}})
    lab.init_repo(fleet_files(sim.url, {prefix: names}))
    return sim


def _node(snapshot: Snapshot, rollout: str, node: str) -> Any:
    st = snapshot.get(rollout)
    return next((n for n in st.nodes if n.name == node), None) if st is not None else None


def remote_outage_scenario(root: Path) -> Result:
    """The daemon acts on a ``file://`` remote. Mid-rollout the repository is
    renamed away for 3 seconds: the daemon logs that it cannot fetch, waits
    (backoff), and once the repository is back it resumes and completes."""
    result = Result("remote unreachable for 3s mid-rollout", "repository", fault_cases=1)

    def run(result: Result) -> None:
        with Lab(root) as lab:
            sim = _simple_world(lab, "ro", 4)
            spec = {"selector": {"group": "ro"}, "batchSize": 1, "healthTimeout": "30s"}
            person = lab.push({"rollouts/ro.yaml": rollout_yaml("ro", **spec)}, "Roll out")
            daemon = lab.daemon(remote=True)
            lab.wait(
                lambda s: (n := _node(s, "ro", "ro-2")) is not None and n.state != "pending",
                what="second batch started",
                daemon=daemon,
            )
            away = lab.remove_repo()
            time.sleep(3.0)
            lab.restore_repo(away)
            final = lab.wait(
                _terminal("ro"), what="the rollout ends after the outage", daemon=daemon
            )
            result.expect(final["ro"].phase == "completed", f"after the outage: {describe(final)}")
            failures = lab.daemon_events("pass_failed")
            result.expect(
                any("fetch" in e.get("message", "") for e in failures),
                f"the daemon did not log the unreachable remote: {failures}",
            )
            result.faults += result.ok
            audit(
                lab, result, sim=sim, daemon=daemon, people=[person], allowed_errors={"pass_failed"}
            )

    return timed(run, result)


def force_push_scenario(root: Path) -> Result:
    """Mid-rollout a person force-pushes main back to the commit that added
    the rollout, dropping the daemon's status commits. The daemon refuses to
    act on history it has not seen as a fast-forward, says so in its log,
    and commits nothing. Restarted, it accepts the new history: the rollout
    starts again from the same start commit, so the same job ids are sent
    and no agent executes any of them twice."""
    result = Result("force-push of main backwards mid-rollout", "repository", fault_cases=1)

    def run(result: Result) -> None:
        with Lab(root) as lab:
            sim = _simple_world(lab, "fp", 4)
            spec = {"selector": {"group": "fp"}, "batchSize": 1, "healthTimeout": "30s"}
            added = lab.push({"rollouts/fp.yaml": rollout_yaml("fp", **spec)}, "Roll out")
            daemon = lab.daemon()
            lab.wait(
                lambda s: (n := _node(s, "fp", "fp-2")) is not None and n.state == "succeeded",
                what="two batches done",
                daemon=daemon,
            )
            lab.force_push(added)
            time.sleep(1.0)  # a pass or more
            rewritten = lab.daemon_events("history_rewritten")
            result.expect(bool(rewritten), "the daemon did not log the rewritten history")
            result.expect(
                lab.tip() == added and lab.unchanged_for(1.5),
                "the daemon committed on top of history it had not seen as a fast-forward",
            )
            result.expect(daemon.alive(), "the daemon exited on a force-push")
            daemon.stop()
            restarted = lab.daemon()
            final = lab.wait(
                _terminal("fp"), what="the rollout ends after a restart", daemon=restarted
            )
            result.expect(final["fp"].phase == "completed", f"after the restart: {describe(final)}")
            result.faults += result.ok
            # The first daemon's commits were dropped by the person, on purpose.
            first = lab.daemons.pop(0)
            audit(lab, result, sim=sim, daemon=restarted, people=[added])
            lab.daemons.insert(0, first)

    return timed(run, result)


def status_nonsense_scenario(root: Path) -> Result:
    """Mid-rollout a person commits nonsense into status/victim.yaml: first
    text that is not YAML, then YAML that looks like a status but says
    nothing sensible. Each time the rollout is held (no job for its later
    nodes), the file is left byte for byte as the person wrote it, the log
    says why, and another rollout carries on to completion. Restoring the
    file lets the rollout finish."""
    result = Result("status file hand-edited into nonsense", "repository", fault_cases=2)

    def run(result: Result) -> None:
        with Lab(root) as lab:
            v = ["v-1", "v-2", "v-3"]
            b = ["b-1", "b-2", "b-3"]
            behaviour = {
                "default": {"action": "succeed", "delay": 0.3},
                "nodes": {"v-1": {"action": "succeed", "delay": 3.0}},
            }
            sim = lab.sim(v + b, behaviour)
            lab.init_repo(fleet_files(sim.url, {"victim": v, "bystander": b}))
            people = [
                lab.push(
                    {
                        "rollouts/victim.yaml": rollout_yaml(
                            "victim", selector={"group": "victim"}, healthTimeout="30s"
                        )
                    },
                    "Roll out the victim",
                )
            ]
            daemon = lab.daemon()
            lab.wait(
                lambda s: (n := _node(s, "victim", "v-1")) is not None and n.state == "dispatched",
                what="victim's first batch dispatched",
                daemon=daemon,
            )
            good = lab.file_at_tip("status/victim.yaml")
            assert good is not None
            plausible = (
                good.decode()
                .replace("phase: running", "phase: banana")
                .replace("attempt: 1", "attempt: -7")
                .replace("state: dispatched", "state: on-fire")
                .encode()
            )
            variants = [
                ("not YAML", b"phase: [this is {not yaml\n\t- at all\n"),
                ("a plausible status with impossible values", plausible),
            ]
            bystander = rollout_yaml("bystander", selector={"group": "bystander"}, batchSize=1)
            for index, (what, data) in enumerate(variants):
                files: dict[str, str | bytes | None] = {"status/victim.yaml": data}
                if index == 0:
                    files["rollouts/bystander.yaml"] = bystander
                people.append(lab.push(files, f"Hand-edit status/victim.yaml: {what}"))
                time.sleep(1.5)  # passes go by
                kept = lab.file_at_tip("status/victim.yaml")
                ok = result.expect(
                    kept == data,
                    f"{what}: status/victim.yaml was overwritten with {(kept or b'')[:200]!r}",
                )
                received = {e["payload"]["node"] for e in sim.journal() if e.get("e") == "accept"}
                ok &= result.expect(
                    not {"v-2", "v-3"} & received,
                    f"{what}: later victim nodes got jobs while its status is nonsense",
                )
                unreadable = [
                    e
                    for e in lab.daemon_events("status_unreadable")
                    if e.get("rollout") == "victim"
                ]
                ok &= result.expect(
                    len(unreadable) > index, f"{what}: the daemon did not log why it holds victim"
                )
                ok &= result.expect(daemon.alive(), f"{what}: the daemon exited")
                result.faults += ok
            final = lab.wait(_terminal("bystander"), what="bystander completes", daemon=daemon)
            result.expect(final["bystander"].phase == "completed", f"bystander: {describe(final)}")
            people.append(
                lab.push({"status/victim.yaml": good.decode()}, "Restore victim's status")
            )
            final = lab.wait(
                _terminal("victim"), what="victim completes once restored", daemon=daemon
            )
            result.expect(final["victim"].phase == "completed", f"victim: {describe(final)}")
            audit(lab, result, sim=sim, daemon=daemon, people=people)

    return timed(run, result)


def rollout_removed_scenario(root: Path) -> Result:
    """A person deletes a rollout's file while its second batch is in
    flight (the agent hangs): the rollout is aborted with reason
    spec_removed, its status file stays, the in-flight job is still
    observed to its deadline, and no later batch gets a job."""
    result = Result("rollout file deleted mid-run", "repository", fault_cases=1)

    def run(result: Result) -> None:
        with Lab(root) as lab:
            behaviour = {"default": {"action": "succeed", "delay": 0.2}, "nodes": {"rm-2": "hang"}}
            sim = _simple_world(lab, "rm", 4, behaviour)
            spec = {"selector": {"group": "rm"}, "batchSize": 1, "healthTimeout": "2s"}
            people = [lab.push({"rollouts/rm.yaml": rollout_yaml("rm", **spec)}, "Roll out")]
            daemon = lab.daemon()
            lab.wait(
                lambda s: (n := _node(s, "rm", "rm-2")) is not None and n.state == "dispatched",
                what="second batch in flight",
                daemon=daemon,
            )
            people.append(lab.push({"rollouts/rm.yaml": None}, "Remove the rollout"))
            final = lab.wait(
                lambda s: (
                    (st := s.get("rm")) is not None
                    and st.phase == "aborted"
                    and all(n.state != "dispatched" for n in st.nodes)
                ),
                what="aborted and the in-flight job judged",
                daemon=daemon,
            )
            st = final["rm"]
            result.expect(st.reason == "spec_removed", f"aborted with reason {st.reason!r}")
            states = {n.name: n.state for n in st.nodes}
            result.expect(
                states.get("rm-2") in FAILED_STATES
                and states.get("rm-3") == "pending"
                and states.get("rm-4") == "pending",
                f"node states after removal: {states}",
            )
            received = {e["payload"]["node"] for e in sim.journal() if e.get("e") == "accept"}
            result.expect(not {"rm-3", "rm-4"} & received, "a later batch got a job after removal")
            result.expect(lab.unchanged_for(1.0), "an aborted rollout kept committing")
            result.faults += result.ok
            audit(lab, result, sim=sim, daemon=daemon, people=people)

    return timed(run, result)


def stale_lock_scenario(root: Path) -> Result:
    """A git process killed while updating main leaves refs/heads/main.lock
    behind for 4 seconds, mid-rollout. The daemon cannot move the branch:
    it logs which lock file to remove and retries with backoff; once the
    lock is gone it completes the rollout."""
    result = Result("stale ref lock for 4s mid-rollout", "repository", fault_cases=1)

    def run(result: Result) -> None:
        with Lab(root) as lab:
            sim = _simple_world(lab, "lk", 3, {"default": {"action": "succeed", "delay": 1.0}})
            spec = {"selector": {"group": "lk"}, "healthTimeout": "30s"}
            person = lab.push({"rollouts/lk.yaml": rollout_yaml("lk", **spec)}, "Roll out")
            daemon = lab.daemon()
            lab.wait(
                lambda s: (n := _node(s, "lk", "lk-2")) is not None and n.state == "dispatched",
                what="second batch in flight",
                daemon=daemon,
            )
            assert lab.bare is not None
            lock = lab.bare / "refs" / "heads" / "main.lock"
            lock.write_text("")
            time.sleep(4.0)
            lock.unlink()
            final = lab.wait(_terminal("lk"), what="the rollout ends once unlocked", daemon=daemon)
            result.expect(final["lk"].phase == "completed", f"after the lock: {describe(final)}")
            said = [e for e in lab.daemon_events("pass_failed") if "main.lock" in e["message"]]
            result.expect(bool(said), "the daemon did not name the lock file in its log")
            result.faults += result.ok
            audit(
                lab, result, sim=sim, daemon=daemon, people=[person], allowed_errors={"pass_failed"}
            )

    return timed(run, result)


def node_removed_scenario(root: Path) -> Result:
    """A person removes a node's file while its job is in flight: no
    evidence, so the verdict is unknown and the rollout holds
    health_unknown (docs/rollouts.md); the next batch gets nothing."""
    result = Result("node file removed mid-batch", "repository", fault_cases=1)

    def run(result: Result) -> None:
        with Lab(root) as lab:
            sim = _simple_world(lab, "nr", 3, {"default": {"action": "succeed", "delay": 1.5}})
            spec = {"selector": {"group": "nr"}, "healthTimeout": "3s"}
            people = [lab.push({"rollouts/nr.yaml": rollout_yaml("nr", **spec)}, "Roll out")]
            daemon = lab.daemon()
            lab.wait(
                lambda s: (n := _node(s, "nr", "nr-2")) is not None and n.state == "dispatched",
                what="second batch in flight",
                daemon=daemon,
            )
            people.append(lab.push({"nodes/nr-2.yaml": None}, "Remove nr-2"))
            final = lab.wait(
                lambda s: (st := s.get("nr")) is not None and st.phase == "paused",
                what="held after the node's removal",
                daemon=daemon,
            )
            st = final["nr"]
            states = {n.name: n.state for n in st.nodes}
            result.expect(
                st.hold is not None
                and st.hold.reason == "health_unknown"
                and states == {"nr-1": "succeeded", "nr-2": "unknown", "nr-3": "pending"},
                f"after removing nr-2: {describe(final)}",
            )
            result.expect(lab.unchanged_for(1.0), "a held rollout kept committing")
            result.faults += result.ok
            audit(lab, result, sim=sim, daemon=daemon, people=people)

    return timed(run, result)


def concurrent_pushes_scenario(root: Path, people: int = 50, workers: int = 3) -> Result:
    """``people`` persons, each with an own clone and one commit ready, push
    to main at once (pulling with rebase and pushing again when refused)
    while the daemon commits the status of a rollout of 10 nodes. Nothing
    is lost on either side: every person's commit is in the final history,
    every status commit the daemon logged is too, the history stays linear,
    and the rollout completes with consistent status."""
    from concurrent.futures import ThreadPoolExecutor

    result = Result(
        f"{people} concurrent pushes while the daemon commits", "repository", fault_cases=1
    )

    def run(result: Result) -> None:
        with Lab(root) as lab:
            sim = _simple_world(lab, "cp", 10, {"default": {"action": "succeed", "delay": 0.6}})
            spec = {"selector": {"group": "cp"}, "batchSize": 1, "healthTimeout": "30s"}
            first = lab.push({"rollouts/cp.yaml": rollout_yaml("cp", **spec)}, "Roll out")

            def prepare(i: int) -> Path:
                work = lab.person(f"person-{i:02d}")
                note = {f"notes/person-{i:02d}.txt": f"note {i}\n"}
                lab.commit_local(work, note, f"Note from person {i:02d}")
                return work

            with ThreadPoolExecutor(4) as pool:
                clones = list(pool.map(prepare, range(people)))
            daemon = lab.daemon()
            lab.wait(lambda s: "cp" in s.statuses, what="the rollout started", daemon=daemon)
            with ThreadPoolExecutor(workers) as pool:
                pushed = list(pool.map(lab.push_committed, clones))
            final = lab.wait(_terminal("cp"), what="the rollout ends", daemon=daemon)
            result.expect(
                final["cp"].phase == "completed", f"under concurrent pushes: {describe(final)}"
            )
            tip = lab.tip()
            assert tip is not None
            tree = lab.repo[tip].peel(pygit2.Tree)
            missing = [i for i in range(people) if f"notes/person-{i:02d}.txt" not in tree]
            result.expect(not missing, f"people's files missing from main: {missing}")
            # The pushes and the daemon's commits really interleaved.
            authors = [c.author.name for c in lab.repo.walk(tip)]
            between = authors[authors.index("Ada Operator") :]
            interleaved = sum(
                1 for a, b in itertools.pairwise(between) if a != b and "reconciler" in (a, b)
            )
            result.expect(
                interleaved >= 4,
                f"the people's pushes and the daemon's commits hardly interleaved ({interleaved})",
            )
            result.faults += result.ok
            audit(lab, result, sim=sim, daemon=daemon, people=[first, *pushed])

    return timed(run, result)


# -- bad input ---------------------------------------------------------------


def bad_input_scenario(root: Path) -> Result:
    """The validation corpus (tests/corpus: every broken document we know
    of, and the base fleet its cases refer to) committed in one commit into
    a live repository next to a good rollout. The good rollouts complete;
    each broken rollout file with a usable name gets a pending status that
    states its problem; the daemon never exits."""
    import re

    from tests.corpus import bad_cases, cases  # tests/corpus

    result = Result("validation corpus committed into a live repository", "input")

    def run(result: Result) -> None:
        with Lab(root) as lab:
            every = cases()
            bad = bad_cases()
            base_nodes = [
                c.path[len("nodes/") : -len(".yaml")]
                for c in every
                if not c.expected and c.path.startswith("nodes/")
            ]
            ok_nodes = ["ok-1", "ok-2"]
            sim = lab.sim([*base_nodes, *ok_nodes], {"default": "succeed"})
            lab.init_repo(fleet_files(sim.url, {"ok": ok_nodes}))
            daemon = lab.daemon()
            # A push racing the watcher's start-up can kill the daemon (reported
            # to the lead); this scenario is about documents, so it waits.
            daemon.wait_started()
            # Every agent address in the corpus points at our simulator, never at a
            # port someone else may be using.
            files: dict[str, str | bytes | None] = {
                case.path: case.data.replace(b"http://127.0.0.1:8710", sim.url.encode())
                for case in every
            }
            files["rollouts/chaos-good.yaml"] = rollout_yaml(
                "chaos-good", nodeIds=ok_nodes, batchSize=1, healthTimeout="30s"
            )
            person = lab.push(files, f"Commit the validation corpus ({len(bad)} broken documents)")
            result.bad_inputs = len(bad)
            good = ["chaos-good", "good-canary"]
            final = lab.wait(
                lambda s: all((st := s.get(n)) is not None and st.terminal for n in good),
                what="the good rollouts end next to the corpus",
                daemon=daemon,
            )
            for name in good:
                result.expect(final[name].phase == "completed", f"{name}: {describe(final)}")
            name_re = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
            checked = 0
            for case in bad:
                parts = case.path.split("/")
                if len(parts) != 2 or parts[0] != "rollouts" or not parts[1].endswith(".yaml"):
                    continue
                stem = parts[1][: -len(".yaml")]
                if not name_re.fullmatch(stem):
                    continue
                checked += 1
                st = final.get(stem)
                if not result.expect(st is not None, f"{case.path}: no status/{stem}.yaml"):
                    continue
                assert st is not None
                said = " ".join([st.message, *(c.message for c in st.conditions)]).lower()
                result.expect(
                    st.phase == "pending" and all(e.words.lower() in said for e in case.expected),
                    f"{case.path}: status {st.phase} says {st.message!r}; expected pending "
                    f"saying {[e.words for e in case.expected]}",
                )
            result.expect(checked > 10, f"only {checked} broken rollout files were checked")
            result.expect(
                lab.unchanged_for(1.0), "an idle daemon kept committing next to the corpus"
            )
            audit(lab, result, sim=sim, daemon=daemon, people=[person])

    return timed(run, result)
