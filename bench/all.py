"""Run every benchmark under ``bench/`` and print one table: figure, value,
reference, ratio.

    .venv/bin/python bench/all.py             # full sizes (about 10 minutes on 2 cores)
    .venv/bin/python bench/all.py --quick     # small sizes, a smoke run (about a minute)
    .venv/bin/python bench/all.py --only fleet,passes

Each script runs as its own process (memory, CPU and event loops stay
apart), one after another, with ``BENCH_ROWS=1`` so it prints its figures
as ``BENCH-ROW`` JSON lines besides its text; each is also runnable alone.
Every script takes medians over several runs and runs the two sides of a
comparison alternately in one run; the machine is noisy, so read the
figures as orders of magnitude and compare ratios.

``ratio`` is value / reference: under 1 means under the target, or faster
(smaller) than the reference. A script that fails, or a ``bench/*.py``
this runner does not know, is listed under the table; the exit status is
1 if any script failed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from _common import Row, fmt, machine, parse_rows

HERE = Path(__file__).resolve().parent
# reliability, model_check: chaos scenarios and the engine's exhaustive check, not speed; shortcuts: the runner of benches with and without each shortcut
NOT_BENCHMARKS = {"all", "_common", "_without", "shortcuts", "reliability", "model_check"}


@dataclass(frozen=True)
class Script:
    name: str
    full: tuple[str, ...] = ()
    quick: tuple[str, ...] = ("--quick",)
    timeout: float = 600.0


SCRIPTS = (
    Script("fleet", (), ("--quick",)),
    Script("passes", (), ("--quick",)),
    Script("growth", (), ("--quick",)),
    Script("reaction", (), ("--quick",)),
    Script("gitstore", (), ("--files", "2000", "--commits", "50", "--runs", "3")),
    Script("engine", (), ("--nodes", "1000", "--batch", "100")),
    Script("dispatch", (), ("--nodes", "1000")),
    Script("job_parts", (), ("--quick",)),
    Script("client_floor", (), ("--quick",)),
    Script("fleet_watch", (), ("--quick",)),
    Script("validate", ("--runs", "3"), ("--nodes", "1000", "--rollouts", "100", "--runs", "1")),
    Script("sshsig", (), ("--commits", "20", "--git-sample", "3", "--status", "200")),
    Script("approvals", (), ("--commits", "5", "--runs", "1")),
    Script("approval_walk", (), ("--specs", "20", "--status", "5", "--nodes", "50", "--runs", "1")),
    Script("operator_views", (), ("--nodes", "500", "--rollouts", "5")),
    Script("yaml_nesting", (), ("--runs", "1")),
    Script("health", (), ("--quick",)),
    Script("shapes", (), ("--nodes", "1000", "--calls", "2000")),
    # Ansible side by side (installs ansible-core into a temporary venv when missing).
    Script("peers/ansible", (), ("--quick",), timeout=1800.0),
    Script("agent_soak", (), ("--quick",), timeout=1200.0),
    Script("agent_cpu", (), ("--quick",)),
    Script("agent_stage", (), ("--quick",)),
    Script("standby_rollback", (), ("--rounds", "2")),  # real llama-server slots and nginx
    Script("notify", (), ("--quick",)),
    Script("branch_watch", ("--samples", "300", "--idle", "60"), ("--quick",)),
    Script("cli_completion", (), ("--quick",)),
    Script("api", (), ("--quick",)),
    Script("first_paint", (), ("--rollouts", "200", "--nodes", "100")),
    Script("canary", (), ("--nodes", "200", "--soak", "10")),
)


def run_script(script: Script, quick: bool, verbose: bool) -> tuple[list[Row], str, float]:
    """(rows, error text or "", seconds) for one script."""
    args = script.quick if quick else script.full
    command = [sys.executable, str(HERE / f"{script.name}.py"), *args]
    env = {**os.environ, "BENCH_ROWS": "1"}
    start = time.perf_counter()
    print(f"-- {script.name} {' '.join(args)}".rstrip(), flush=True)
    try:
        done = subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=script.timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return [], f"timed out after {script.timeout:.0f} s", time.perf_counter() - start
    seconds = time.perf_counter() - start
    if verbose:
        for line in done.stdout.splitlines():
            if not line.startswith("BENCH-ROW "):
                print(f"   {line}")
    rows = parse_rows(done.stdout)
    error = ""
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        error = f"exit {done.returncode}: " + " | ".join(tail)
    elif not rows:
        error = "printed no BENCH-ROW figures"
    print(f"   {len(rows)} figures in {seconds:.0f} s{'; ' + error if error else ''}", flush=True)
    return rows, error, seconds


def table(rows: list[tuple[str, Row]]) -> str:
    header = ("figure", "value", "reference", "ratio")
    lines: list[tuple[str, str, str, str]] = []
    section = ""
    for script, r in rows:
        if script != section:
            section = script
            lines.append((f"**{script}**", "", "", ""))
        lines.append(
            (
                r.figure,
                f"{fmt(r.value)} {r.unit}".strip(),
                r.reference + (f" {r.unit}" if r.reference and r.unit else ""),
                f"{r.ratio:.3g}" if r.ratio is not None else "",
            )
        )
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]

    def render(cells: tuple[str, ...]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    out = [render(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [render(line) for line in lines]
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument("--only", help="comma-separated script names (default: all)")
    parser.add_argument("--verbose", action="store_true", help="show each script's own output")
    args = parser.parse_args()

    known = {s.name for s in SCRIPTS}
    chosen = [s for s in SCRIPTS if not args.only or s.name in args.only.split(",")]
    present = {p.stem for p in HERE.glob("*.py")} - NOT_BENCHMARKS
    print(f"bench/all.py{' --quick' if args.quick else ''} on {machine()}", flush=True)
    rows: list[tuple[str, Row]] = []
    problems: list[str] = []
    started = time.perf_counter()
    for script in chosen:
        if script.name not in present:
            problems.append(f"{script.name}: bench/{script.name}.py not found")
            continue
        found, error, _ = run_script(script, args.quick, args.verbose)
        rows += [(script.name, r) for r in found]
        if error:
            problems.append(f"{script.name}: {error}")
    for stem in sorted(present - known):
        problems.append(f"{stem}: bench/{stem}.py is not known to bench/all.py, not run")
    print()
    print(table(rows))
    print()
    print(
        f"{len(rows)} figures from {len(chosen)} scripts in {time.perf_counter() - started:.0f} s; "
        "ratio = value / reference (under 1: under the target, or faster than the reference)"
    )
    for problem in problems:
        print(f"  ! {problem}")
    return 1 if any("not known" not in p for p in problems) else 0


if __name__ == "__main__":
    sys.exit(main())
