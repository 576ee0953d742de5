"""How long a YAML file of deep nesting costs to refuse (the error path).

A file of N ``[`` is refused at the nesting limit; finding the field path
for the message used to walk the whole text building a path per event
(quadratic: 32k took 5 s, 1 MiB over 8 minutes). Prints the time for each
size, median of a few runs, and the time per MiB.

    .venv/bin/python bench/yaml_nesting.py [--runs N]
"""

from __future__ import annotations

import argparse
import statistics
import time

from _common import emit, row

from reconciler.spec.safe_yaml import YamlProblem, load_yaml

SIZES = (8_000, 32_000, 64_000, 1024 * 1024)


def refuse_seconds(text: bytes) -> float:
    started = time.perf_counter()
    try:
        load_yaml("status/x.yaml", text)
    except YamlProblem:
        return time.perf_counter() - started
    raise AssertionError("deep nesting was accepted")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    rows = []
    for size in SIZES:
        seconds = statistics.median(refuse_seconds(b"[" * size) for _ in range(args.runs))
        # The target: linear, well under a second for the largest file read.
        rows.append(row(f"refuse {size:,} x '['", seconds, "s", 1.0, "target <"))
    # Within the nesting limit, the error at the very end: every event of
    # the MiB is walked (twice) to name the field.
    items = b"{k: [" * 30 + b"1, " * ((1024 * 1024 - 150) // 3)
    seconds = statistics.median(refuse_seconds(items + b"}") for _ in range(args.runs))
    rows.append(row("refuse 1 MiB, 60 levels, error at the end", seconds, "s", 1.0, "target <"))
    emit(rows)


if __name__ == "__main__":
    main()
