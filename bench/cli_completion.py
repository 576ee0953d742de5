"""What one Tab costs: the wall time of ``reconciler`` answering a shell
completion request (argcomplete's protocol, as the script that
``reconciler completion bash`` prints drives it), next to
``reconciler validate --help`` (one verb's parser, the least a run costs).

While the verb is typed every verb's parser is built; once the line names
a verb, only that verb's.

    .venv/bin/python bench/cli_completion.py
    .venv/bin/python bench/cli_completion.py --runs 5
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import emit, median, row

LINES = {
    "the verb (reconciler sta)": "reconciler sta",
    "a flag (reconciler status --for)": "reconciler status --for",
    "a choice (reconciler plan -o )": "reconciler plan -o ",
}


def reconciler() -> str:
    return str(Path(sys.executable).parent / "reconciler")


def answer_seconds(line: str, out: Path) -> float:
    env = {
        **os.environ,
        "_ARGCOMPLETE": "1",
        "_ARGCOMPLETE_SHELL": "bash",
        "COMP_LINE": line,
        "COMP_POINT": str(len(line)),
        "_ARGCOMPLETE_STDOUT_FILENAME": str(out),
    }
    start = time.perf_counter()
    subprocess.run([reconciler()], env=env, check=True, capture_output=True)
    took = time.perf_counter() - start
    if not out.read_text().strip():
        raise SystemExit(f"no completion for {line!r}")
    return took


def help_seconds() -> float:
    start = time.perf_counter()
    subprocess.run([reconciler(), "validate", "--help"], check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--quick", action="store_true", help="3 runs")
    args = parser.parse_args()
    runs = 3 if args.quick else args.runs
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "answer"
        samples: dict[str, list[float]] = {label: [] for label in LINES}
        reference: list[float] = []
        for _ in range(runs):  # the sides alternate, so load hits them alike
            reference.append(help_seconds())
            for label, line in LINES.items():
                samples[label].append(answer_seconds(line, out))
    base = median(reference) * 1000
    rows = [row("cli: validate --help, median", base, "ms")]
    rows += [
        row(f"cli: completing {label}, median", median(s) * 1000, "ms", base, "validate --help")
        for label, s in samples.items()
    ]
    emit(rows)


if __name__ == "__main__":
    main()
