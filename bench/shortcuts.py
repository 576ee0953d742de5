"""What each speed shortcut is worth: the tracked figures it serves
(docs/performance.md, Targets), measured with the shortcut and without it,
the two sides alternating in one sitting, medians.

    .venv/bin/python bench/shortcuts.py                     # every shortcut
    .venv/bin/python bench/shortcuts.py --only step-memo,inert-statuses --rounds 5
    .venv/bin/python bench/shortcuts.py --only nothing --benches engine,fleet --rounds 7
    .venv/bin/python bench/shortcuts.py --list

"Without" runs the same bench script with the shortcut replaced by its
plain twin (``bench/_without.py``), in the bench process and every process
it starts. ``change`` is without / with - 1 for times (positive: the
shortcut saves that much), with / without - 1 for rates such as jobs/s.
A shortcut earns its place when some figure it serves changes by more
than 10%.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from _common import Row, fmt, machine, parse_rows
from _without import ENV, SHORTCUTS

HERE = Path(__file__).resolve().parent

ENGINE = ("engine", ("--nodes", "10000", "--batch", "500"), ("whole rollout", "idle step"))
VALIDATE = ("validate", ("--runs", "1"), ("load_directory, median", "one process, median"))
PASSES = (
    "passes",
    ("--rollouts", "50", "--sizes", "5000", "--rounds", "5"),
    (
        "idle pass, 5,000",
        "starting 1 new rollout, 5,000 finished, median",
        "starting 1 new rollout, 5,000 finished, CPU median",
        "running, median",
    ),
)
DISPATCH = ("dispatch", (), ("jobs/s end to end", "client CPU", "sim fleet CPU"))
GITSTORE = (
    "gitstore",
    ("--files", "100000", "--commits", "300", "--runs", "3"),
    ("GitStore.commit, 2 status files", "lookups"),
)
AGENT = ("agent_cpu", ("--quick",), ("CPU per live apply",))
FLEET = ("fleet", ("--quick",), ("daemon overhead per node", "daemon CPU per node"))
CANARY = ("canary", (), ("two comparisons, wall", "daemon CPU"))
APPROVAL_WALK = ("approval_walk", ("--specs", "200", "--runs", "3"), ("rules",))

# shortcut -> the benches (script, arguments, figures by part of their name) it serves
SERVES: dict[str, tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...]] = {
    "nothing": (ENGINE, VALIDATE, FLEET),
    "times-cache": (ENGINE, DISPATCH, FLEET),
    "agent-url-cache": (VALIDATE, FLEET),
    "yaml-scalar-caches": (VALIDATE, PASSES, FLEET),
    "schema-fast-check": (VALIDATE, PASSES),
    "job-fast-path": (DISPATCH,),
    "agent-head-cache": (DISPATCH, AGENT),
    "agent-stored-time-cache": (AGENT,),
    "fleet-index-cache": (ENGINE,),
    "step-memo": (PASSES,),
    "inert-statuses": (PASSES,),
    "git-write-shortcuts": (GITSTORE,),
    "read-shortcuts": (PASSES,),
    "combined-range-queries": (CANARY,),
    "rule-tables": (APPROVAL_WALK,),
}

RATE_UNITS = ("/s", "jobs/s", "files/s")


@dataclass(frozen=True)
class Result:
    shortcut: str
    command: str
    figure: str
    unit: str
    with_: float
    without: float

    @property
    def change(self) -> float:
        """How much worse the figure is without the shortcut (0.25: 25%)."""
        if self.unit in RATE_UNITS or self.unit.endswith("/s"):
            return self.with_ / self.without - 1 if self.without else 0.0
        return self.without / self.with_ - 1 if self.with_ else 0.0


def _site(root: Path) -> Path:
    """A folder whose ``sitecustomize`` turns off what ``BENCH_WITHOUT`` names."""
    (root / "sitecustomize.py").write_text(
        "import os, sys\n"
        f"if os.environ.get({ENV!r}):\n"
        f"    sys.path.insert(0, {str(HERE)!r})\n"
        "    import _without\n"
        f"    _without.apply(os.environ[{ENV!r}])\n"
    )
    return root


def run_bench(script: str, args: tuple[str, ...], without: str, site: Path) -> list[Row]:
    env = {**os.environ, "BENCH_ROWS": "1", ENV: without}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(site), env.get("PYTHONPATH"))))
    done = subprocess.run(
        [sys.executable, str(HERE / f"{script}.py"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    if done.returncode != 0:
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
        raise SystemExit(f"{script} {' '.join(args)} (without {without or 'nothing'}): {tail}")
    return parse_rows(done.stdout)


def measure(shortcut: str, rounds: int, site: Path, benches: set[str] | None) -> list[Result]:
    results: list[Result] = []
    for script, args, wanted in SERVES[shortcut]:
        if benches is not None and script not in benches:
            continue
        sides: dict[bool, list[list[Row]]] = {True: [], False: []}
        for n in range(rounds):
            # Alternate which side goes first, so drift in the machine's load cancels.
            for with_it in (True, False) if n % 2 == 0 else (False, True):
                sides[with_it].append(run_bench(script, args, "" if with_it else shortcut, site))
        command = f".venv/bin/python bench/{script}.py {' '.join(args)}".strip()
        for first in sides[True][0]:
            if not any(part in first.figure for part in wanted):
                continue
            values = {
                side: statistics.median(
                    r.value for rows in runs for r in rows if r.figure == first.figure
                )
                for side, runs in sides.items()
            }
            results.append(
                Result(shortcut, command, first.figure, first.unit, values[True], values[False])
            )
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated shortcut names (default: all)")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each side (default 3)")
    parser.add_argument("--benches", help="only these bench scripts, comma-separated")
    parser.add_argument("--list", action="store_true", help="name the shortcuts and exit")
    args = parser.parse_args()
    if args.list:
        for name, benches in SERVES.items():
            print(f"{name}: {', '.join(b[0] for b in benches)}")
        return 0
    chosen = args.only.split(",") if args.only else list(SERVES)
    unknown = [name for name in chosen if name not in SHORTCUTS]
    if unknown:
        parser.error(f"unknown shortcuts: {', '.join(unknown)} (see --list)")
    print(f"bench/shortcuts.py, {args.rounds} rounds a side, on {machine()}", flush=True)
    print("| shortcut | figure | with | without | change | command |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        site = _site(Path(tmp))
        for name in chosen:
            start = time.perf_counter()
            benches = set(args.benches.split(",")) if args.benches else None
            for r in measure(name, args.rounds, site, benches):
                print(
                    f"| {name} | {r.figure} | {fmt(r.with_)} {r.unit} | {fmt(r.without)} {r.unit} "
                    f"| {r.change:+.1%} | `{r.command}` |",
                    flush=True,
                )
            print(f"<!-- {name}: {time.perf_counter() - start:.0f} s -->", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
