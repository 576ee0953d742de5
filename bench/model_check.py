"""The exhaustive bounded model check of the engine (``tests/modelcheck.py``):
3 nodes, batch sizes 1 and 2, each of the 5 failure policies, every sequence
of events up to ``--depth``, states deduplicated by a canonical hash. Prints
distinct states, transitions and time per setup; exit status 1 on any
violation, with its shortest counterexample.

    .venv/bin/python bench/model_check.py --depth 5 --jobs 2
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from modelcheck import BATCH_SIZES, POLICIES, Report, check


def _one(setup: tuple[str, int, int]) -> Report:
    policy, batch_size, depth = setup
    return check(policy, batch_size, depth)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depth", type=int, default=5, help="events per sequence (default 5)")
    parser.add_argument("--jobs", type=int, default=2, help="setups checked at once (default 2)")
    args = parser.parse_args()
    started = time.monotonic()
    setups = [(p, b, args.depth) for p in POLICIES for b in BATCH_SIZES]
    with ProcessPoolExecutor(args.jobs) as pool:
        reports = list(pool.map(_one, setups))
    print(f"model check, depth {args.depth}")
    print(f"{'policy':<11}{'batch':>5}{'states':>10}{'transitions':>13}{'sec':>8}  result")
    for r in reports:
        result = "ok" if not r.violations else f"VIOLATION ({r.violations[0].rule})"
        print(
            f"{r.policy:<11}{r.batch_size:>5}{r.states:>10}{r.transitions:>13}"
            f"{r.seconds:>8.1f}  {result}"
        )
    states = sum(r.states for r in reports)
    transitions = sum(r.transitions for r in reports)
    wall = time.monotonic() - started
    print(f"{'total':<16}{states:>10}{transitions:>13}{wall:>8.1f}  wall, {args.jobs} at a time")
    bad = [r for r in reports if r.violations]
    for r in bad:
        v = r.violations[0]
        print(f"\n{r.policy}, batch size {r.batch_size}: {v.rule}: {v.message}")
        for number, event in enumerate(v.events, 1):
            print(f"  {number}. {event}")
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
