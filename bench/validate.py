"""How long ``reconciler validate`` takes on a big fleet repository.

Generates 10,000 nodes and 1,000 rollouts (half by selector, half by
nodeIds) in a temporary directory, then times ``load_directory`` on it and
prints seconds and files per second, median of a few runs. Also times the
parts: reading + YAML only, and ``assemble`` alone.

    .venv/bin/python bench/validate.py [--nodes N] [--rollouts N] [--runs N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from _common import emit, row

from reconciler.spec import safe_yaml
from reconciler.spec.documents import assemble, load_directory, parse_file, tree_paths

ZONES = ("lab", "east", "west", "north")
ROLES = ("canary", "serving", "batch", "edge")


def node_text(index: int) -> str:
    return f"""\
apiVersion: reconciler/v1
kind: Node
metadata:
  name: node-{index:05d}
spec:
  agent: http://10.{index // 65536 % 256}.{index // 256 % 256}.{index % 256}:8710
  labels:
    role: {ROLES[index % len(ROLES)]}
    zone: {ZONES[index // 7 % len(ZONES)]}
    rack: r{index // 40:03d}
  maintenance: {"true" if index % 97 == 0 else "false"}
"""


def rollout_text(index: int, nodes: int) -> str:
    if index % 2:
        chosen = ", ".join(f"node-{(index * 13 + k) % nodes:05d}" for k in range(8))
        selection = f"nodeIds: [{chosen}]"
    else:
        selection = f"selector: {{role: {ROLES[index % 4]}, zone: {ZONES[index % 3]}}}"
    return f"""\
# Rollout {index}: generated for the benchmark.
apiVersion: reconciler/v1
kind: Rollout
metadata:
  name: rollout-{index:04d}
spec:
  target: {{runtime: hermes, provider: ollama, model: llama3.1-8b, profile: default}}
  {selection}
  batchSize: {1 + index % 5}
  healthTimeout: 5m
  live: {"true" if index % 3 == 0 else "false"}
  onFailure: {("pause", "retry_once", "rollback", "observe", "stop")[index % 5]}
  pauseAfter: [1]
  startAt: "2026-12-01T09:00:00Z"
  paused: false
  resumeRequest: ""
"""


def generate(root: Path, nodes: int, rollouts: int) -> None:
    (root / "nodes").mkdir()
    (root / "rollouts").mkdir()
    (root / "reconciler.yaml").write_text(
        "apiVersion: reconciler/v1\nkind: Settings\nspec:\n  offlineAfter: 2m\n"
    )
    for i in range(nodes):
        (root / "nodes" / f"node-{i:05d}.yaml").write_text(node_text(i))
    for i in range(rollouts):
        (root / "rollouts" / f"rollout-{i:04d}.yaml").write_text(rollout_text(i, nodes))


def timed(func: Callable[[], object], runs: int, cpu: list[float] | None = None) -> list[float]:
    """Wall-clock seconds of each run; CPU seconds of this process into ``cpu``."""
    out = []
    for _ in range(runs):
        start, start_cpu = time.perf_counter(), time.process_time()
        func()
        out.append(time.perf_counter() - start)
        if cpu is not None:
            cpu.append(time.process_time() - start_cpu)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--rollouts", type=int, default=1_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    print(f"C loader in use: {safe_yaml.C_LOADER}")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        generate(root, args.nodes, args.rollouts)
        files = len(tree_paths(root))
        documents = load_directory(root)
        if documents.problems:
            print("generated repository has problems:", *documents.problems[:5], sep="\n")
            return 1
        print(
            f"{files} files: {len(documents.fleet.nodes)} nodes, {len(documents.rollouts)} rollouts"
        )

        cpu: list[float] = []
        full = timed(lambda: load_directory(root), args.runs, cpu)
        median = statistics.median(full)
        print(
            f"load_directory: median {median:.3f} s over {args.runs} runs "
            f"(min {min(full):.3f}, max {max(full):.3f}), {files / median:,.0f} files/s; "
            f"CPU of the parent process median {statistics.median(cpu):.3f} s"
        )
        print(f"  load average while measuring: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")

        serial_cpu: list[float] = []
        serial = timed(lambda: load_directory(root, workers=1), args.runs, serial_cpu)
        print(
            f"  one process: median {statistics.median(serial):.3f} s, "
            f"CPU median {statistics.median(serial_cpu):.3f} s"
        )

        blobs = [(rel, (root / rel).read_bytes()) for rel in tree_paths(root)]
        yaml_only = timed(lambda: [safe_yaml.load_yaml(p, d) for p, d in blobs], args.runs)
        print(f"  YAML only (from memory): median {statistics.median(yaml_only):.3f} s")
        parse_only = timed(lambda: [parse_file(p, d) for p, d in blobs], args.runs)
        print(f"  parse_file (from memory): median {statistics.median(parse_only):.3f} s")
        parsed = [parse_file(p, d) for p, d in blobs]
        assembled = timed(lambda: assemble(parsed), args.runs)
        print(f"  assemble (cached parses): median {statistics.median(assembled) * 1000:.1f} ms")
        tag = f"validate {files:,} files"
        emit(
            [
                row(f"{tag}: load_directory, median", median, "s"),
                row(f"{tag}: load_directory, files/s", files / median, "files/s"),
                row(f"{tag}: one process, median", statistics.median(serial), "s"),
                row(f"{tag}: YAML only, median", statistics.median(yaml_only), "s"),
                row(f"{tag}: assemble (cached parses)", statistics.median(assembled) * 1e3, "ms"),
            ]
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
