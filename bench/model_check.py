"""The exhaustive bounded model check of the engine (``tests/modelcheck.py``):
3 nodes, batch sizes 1 and 2, each of the 5 failure policies, the
capacity setup (observe, two zones, spreadBy and failureBudget 1), the
staging setup and the two standby setups (release jobs under untilSoaked
and untilCompleted), every sequence
of events up to ``--depth``, states deduplicated by a canonical hash of their
abstraction (``--unreduced``: of the concrete state). Prints distinct states,
transitions and time per setup and per depth; exit status 1 on any
violation, with its shortest counterexample.

    .venv/bin/python bench/model_check.py --depth 8 --jobs 2   # about 42 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the tests package

from tests.modelcheck import BATCH_SIZES, SETUPS, Level, Report, check


def _one(setup: tuple[str, int, int, bool]) -> Report:
    policy, batch_size, depth, reduced = setup

    def progress(level: Level) -> None:
        # Each depth as it ends: a run stopped early still leaves its figures.
        print(
            f"  done: {policy} batch {batch_size} depth {level.depth}: {level.states:,} states, "
            f"{level.transitions:,} transitions, {level.seconds:.1f} s",
            flush=True,
        )

    return check(policy, batch_size, depth, reduced=reduced, on_level=progress)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depth", type=int, default=8, help="events per sequence (default 8)")
    parser.add_argument("--jobs", type=int, default=2, help="setups checked at once (default 2)")
    parser.add_argument(
        "--unreduced", action="store_true", help="deduplicate concrete states (no reductions)"
    )
    parser.add_argument(
        "--policy", action="append", choices=SETUPS, help="only this setup (repeatable)"
    )
    parser.add_argument(
        "--batch-size", action="append", type=int, choices=BATCH_SIZES, help="only this size"
    )
    parser.add_argument(
        "--setup",
        action="append",
        metavar="POLICY:BATCH",
        help="only this setup, e.g. stop:1 (repeatable; instead of --policy, --batch-size)",
    )
    args = parser.parse_args()
    started = time.monotonic()
    # The biggest setups (batch size 2) first, so two processes end together.
    setups = [
        (p, b, args.depth, not args.unreduced)
        for b in sorted(BATCH_SIZES, reverse=True)
        for p in SETUPS
        if (not args.policy or p in args.policy) and (not args.batch_size or b in args.batch_size)
        if not args.setup or f"{p}:{b}" in args.setup
    ]
    if not setups:
        parser.error(f"no setup matches; setups are POLICY:BATCH of {SETUPS} and {BATCH_SIZES}")
    kind = "unreduced" if args.unreduced else "reduced"
    print(f"model check, depth {args.depth}, {kind}, {args.jobs} setup(s) at a time", flush=True)
    with ProcessPoolExecutor(args.jobs) as pool:
        reports = list(pool.map(_one, setups))
    wall = time.monotonic() - started
    print()
    print(f"{'policy':<11}{'batch':>5}{'states':>12}{'transitions':>14}{'sec':>9}  result")
    for r in reports:
        result = "ok" if not r.violations else f"VIOLATION ({r.violations[0].rule})"
        print(
            f"{r.policy:<11}{r.batch_size:>5}{r.states:>12,}{r.transitions:>14,}"
            f"{r.seconds:>9.1f}  {result}"
        )
    states = sum(r.states for r in reports)
    transitions = sum(r.transitions for r in reports)
    print(f"{'total':<16}{states:>12,}{transitions:>14,}{wall:>9.1f}  wall, {args.jobs} at a time")
    print(f"\nper depth, {len(reports)} setup(s) (seconds: summed over setups, one core each)")
    print(f"{'depth':>5}{'states':>12}{'transitions':>14}{'growth':>8}{'sec':>9}")
    previous = 0
    for depth in range(1, args.depth + 1):
        levels = [lv for r in reports for lv in r.levels if lv.depth == depth]
        if len(levels) < len(reports):
            break  # a setup stopped at a violation
        level_states = sum(lv.states for lv in levels)
        growth = f"{level_states / previous:.1f}x" if previous else ""
        print(
            f"{depth:>5}{level_states:>12,}{sum(lv.transitions for lv in levels):>14,}"
            f"{growth:>8}{sum(lv.seconds for lv in levels):>9.1f}"
        )
        previous = level_states
    bad = [r for r in reports if r.violations]
    for r in bad:
        v = r.violations[0]
        print(f"\n{r.policy}, batch size {r.batch_size}: {v.rule}: {v.message}")
        for number, event in enumerate(v.events, 1):
            print(f"  {number}. {event}")
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
