"""Reliability under crashes, faults and bad input: runs the chaos scenarios
of ``tests/chaos`` (the real daemon as a subprocess, real repositories, the
simulated fleet and real agents on 127.0.0.1) and prints what was tried and
what was lost.

The full set goes beyond the CI tests: every crash point at its 1st, 2nd
and 3rd occurrence, more crash storms (local, ``file://`` remote, real
agents on a live rollout), every agent fault against every failure policy,
every repository fault, 50 people pushing with more concurrency, and the
whole validation corpus, two daemons at once, and a 250-node rollout whose
status is paged. ``--repeat N`` runs it N times (a soak).

    .venv/bin/python bench/reliability.py              # everything once, 2 at a time
    .venv/bin/python bench/reliability.py --quick      # the CI set
    .venv/bin/python bench/reliability.py --repeat 5 --jobs 1 --keep /tmp/soak

Exit status 1 when any scenario broke an invariant, lost a commit or ran
a job twice.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the tests package

from tests.chaos import scenarios
from tests.chaos.scenarios import Result

Scenario = Callable[[Path], Result]
POINTS = ("after_step", "after_commit", "after_push", "mid_send")


def crash_set(quick: bool, reference: tuple[Any, ...]) -> list[Scenario]:
    def crash(points: list[str], remote: bool = False) -> Scenario:
        return lambda root: scenarios.crash_scenario(root, points, reference, remote=remote)

    def agents(points: list[str]) -> Scenario:
        return lambda root: scenarios.agent_crash_scenario(root, points)

    def two(point: str | None) -> Scenario:
        return lambda root: scenarios.two_daemons_scenario(root, reference, crash_at=point)

    def paged(points: list[str]) -> Scenario:
        return lambda root: scenarios.paged_crash_scenario(root, points)

    storms = [
        crash(["after_step:1", "after_commit:1", "after_push:1", "mid_send:1"]),
        crash(["mid_send:1", "mid_send:1", "mid_send:1"]),
        crash(["after_step:3", "after_commit:2", "after_push:1"]),
        crash(["after_commit:1", "after_commit:2", "after_push:2"], remote=True),
        agents(["after_commit:1", "after_push:1", "mid_send:1"]),
        two(None),
    ]
    if quick:
        return storms
    singles = [crash([f"{p}:{n}"]) for p in POINTS for n in (1, 2, 3)]
    more = [
        crash(["after_push:1", "mid_send:1", "after_step:2"], remote=True),
        crash(["after_commit:3", "after_push:2"]),
        agents(["after_step:2", "after_push:2"]),
        agents(["mid_send:1", "mid_send:1"]),
        two("after_step:5"),
        paged(["mid_send:1", "after_commit:2"]),
        paged(["after_push:1", "mid_send:1", "after_step:2"]),
    ]
    return storms + singles + more


def other_set(quick: bool) -> list[Scenario]:
    return [
        lambda root: scenarios.fault_scenario(
            root, scenarios.FAULTS_FAILED, "faults with a failed verdict x 5 policies"
        ),
        lambda root: scenarios.fault_scenario(
            root, scenarios.FAULTS_UNKNOWN, "faults with no evidence x 5 policies"
        ),
        scenarios.outage_scenario,
        scenarios.blip_scenario,
        scenarios.remote_outage_scenario,
        scenarios.force_push_scenario,
        scenarios.status_nonsense_scenario,
        scenarios.rollout_removed_scenario,
        scenarios.stale_lock_scenario,
        scenarios.node_removed_scenario,
        lambda root: scenarios.concurrent_pushes_scenario(
            root, people=50, workers=3 if quick else 8
        ),
        scenarios.bad_input_scenario,
    ]


def run_all(
    work: Path, quick: bool, jobs: int, repeat: int
) -> tuple[list[Result], list[tuple[Any, ...]]]:
    results: list[Result] = []
    references = []
    for round_ in range(1, repeat + 1):
        base = work / f"round-{round_}"
        reference = scenarios.crash_reference(base / "reference")
        references.append(reference)
        todo = [
            (round_, base / f"s{index:02d}", scenario)
            for index, scenario in enumerate(crash_set(quick, reference) + other_set(quick))
        ]
        with ThreadPoolExecutor(jobs) as pool:
            results += list(pool.map(_run_one, todo))
    return results, references


def _run_one(item: tuple[int, Path, Scenario]) -> Result:
    round_, root, scenario = item
    result = scenario(root)
    mark = "ok" if result.ok else "VIOLATIONS"
    print(f"  [{round_}] {result.name}: {mark} ({result.seconds:.1f} s)", file=sys.stderr)
    return result


def print_table(results: list[Result], seconds: float, jobs: int) -> None:
    width = max(len(r.name) for r in results)
    head = f"{'scenario':<{width}}  {'result':<6} {'sec':>5} {'crashes':>7} {'faults':>6} {'bad':>4} {'lost':>4} {'twice':>5}"
    print(head)
    print("-" * len(head))
    for r in results:
        print(
            f"{r.name:<{width}}  {'ok' if r.ok else 'FAIL':<6} {r.seconds:>5.1f} "
            f"{r.crashes:>7} {r.faults:>6} {r.bad_inputs:>4} {r.commits_lost:>4} "
            f"{r.executed_twice:>5}"
        )
    ok = [r for r in results if r.ok]
    tried_crashes = sum(r.crash_points for r in results)
    tried_faults = sum(r.fault_cases for r in results)
    rows = [
        ("scenarios run", f"{len(results)} ({len(ok)} without a violation)"),
        ("crash points survived", f"{sum(r.crashes for r in ok)} of {tried_crashes}"),
        ("faults survived", f"{sum(r.faults for r in ok)} of {tried_faults}"),
        ("bad inputs tried", f"{sum(r.bad_inputs for r in results)}"),
        ("commits lost", f"{sum(r.commits_lost for r in results)} (must be 0)"),
        ("jobs executed twice", f"{sum(r.executed_twice for r in results)} (must be 0)"),
        ("invariant violations", f"{sum(len(r.violations) for r in results)}"),
        ("wall time", f"{seconds:.0f} s, {jobs} scenario(s) at a time"),
    ]
    print()
    for label, value in rows:
        print(f"{label:<24}{value}")
    for r in results:
        if not r.ok:
            print(f"\n{r.explain()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="only the CI set of scenarios")
    parser.add_argument("--jobs", type=int, default=2, help="scenarios run at once (default 2)")
    parser.add_argument("--repeat", type=int, default=1, help="run the whole set N times")
    parser.add_argument("--keep", type=Path, help="keep every scenario's files under DIR")
    args = parser.parse_args()
    started = time.monotonic()
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        results, _ = run_all(args.keep, args.quick, args.jobs, args.repeat)
    else:
        with tempfile.TemporaryDirectory(prefix="reliability-") as tmp:
            results, _ = run_all(Path(tmp), args.quick, args.jobs, args.repeat)
    print_table(results, time.monotonic() - started, args.jobs)
    bad = any(not r.ok or r.commits_lost or r.executed_twice for r in results)
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
