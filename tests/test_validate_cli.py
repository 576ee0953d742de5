"""``reconciler validate``: what a person (or a CI job) sees, and the exit
codes: 0 clean, 1 problems, 2 usage."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from reconciler.cli import main as cli
from reconciler.cli.commands.validate import github_annotation
from reconciler.spec.model import Problem
from tests.corpus import write_tree

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "example-repo"


def broken_repo(root: Path) -> Path:
    (root / "nodes").mkdir(parents=True)
    (root / "rollouts").mkdir()
    (root / "nodes" / "gpu-a1.yaml").write_text(
        "apiVersion: reconciler/v1\nkind: Node\nmetadata: {name: gpu-a1}\n"
        "spec:\n  agent: http://127.0.0.1:8710\n"
    )
    (root / "rollouts" / "llama.yaml").write_text(
        "apiVersion: reconciler/v1\n"
        "kind: Rollout\n"
        "metadata: {name: llama}\n"
        "spec:\n"
        "  target: {runtime: hermes, provider: ollama, model: llama3.1-8b}\n"
        "  nodeIds: [gpu-a1]\n"
        "  batchSize: 0\n"
    )
    (root / "rollouts" / "x.yml").write_text("a: 1\n")
    return root


def test_the_example_repository_validates_clean(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["validate", str(EXAMPLE)]) == 0
    captured = capsys.readouterr()
    assert captured.out == "ok: 8 nodes, 6 rollouts\n"
    assert "ok:" not in captured.err


def test_problems_print_one_line_each_and_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = broken_repo(tmp_path / "fleet")

    code = cli.main(["validate", str(root)])

    assert code == 1
    out = capsys.readouterr()
    assert out.out.splitlines() == [
        f"{root}/rollouts/llama.yaml:7:14: spec.batchSize: must be at least 1, got 0",
        f"{root}/rollouts/x.yml: Rollout files must end in .yaml: rename it to "
        "rollouts/x.yaml; the daemon ignores it as it is",
    ]
    assert "2 problems in 2 files" in out.err


def test_inside_the_repository_paths_are_relative(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    root = broken_repo(tmp_path / "fleet")
    monkeypatch.chdir(root)

    assert cli.main(["validate"]) == 1

    first = capsys.readouterr().out.splitlines()[0]
    assert first == "rollouts/llama.yaml:7:14: spec.batchSize: must be at least 1, got 0"


def test_github_format_prints_error_annotations(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    root = broken_repo(tmp_path / "fleet")
    monkeypatch.chdir(root)

    assert cli.main(["validate", ".", "--format", "github"]) == 1

    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "::error file=rollouts/llama.yaml,line=7,col=14,title=spec.batchSize::"
        "spec.batchSize: must be at least 1, got 0",
        "::error file=rollouts/x.yml,title=document::Rollout files must end in .yaml: "
        "rename it to rollouts/x.yaml; the daemon ignores it as it is",
    ]


def test_github_annotations_escape_what_github_would_misread() -> None:
    problem = Problem("nodes/a,b.yaml", 3, 4, "spec.labels.a:b", "50% done\nnext line")
    assert github_annotation(problem, "fleet/") == (
        "::error file=fleet/nodes/a%2Cb.yaml,line=3,col=4,title=spec.labels.a%3Ab::"
        "spec.labels.a:b: 50%25 done%0Anext line"
    )


def test_the_whole_corpus_fails_with_one_line_per_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    cases = write_tree(tmp_path)
    monkeypatch.chdir(tmp_path)

    assert cli.main(["validate"]) == 1

    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == sum(len(case.expected) for case in cases)
    assert all(line.split(":")[0] in {c.path for c in cases} for line in lines)


@pytest.mark.parametrize(
    "argv",
    [
        ["validate", "/nonexistent/fleet"],
        ["validate", "--format", "xml"],
        ["validate", "a", "b"],
    ],
)
def test_usage_errors_exit_2(argv: list[str]) -> None:
    try:
        code = cli.main(argv)
    except SystemExit as exited:  # argparse's own errors
        code = int(exited.code or 0)
    assert code == 2


def test_a_file_instead_of_a_directory_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "file.yaml"
    target.write_text("a: 1\n")
    assert cli.main(["validate", str(target)]) == 2
    assert "is not a directory" in capsys.readouterr().err


def test_the_installed_command_runs_as_a_process(tmp_path: Path) -> None:
    root = broken_repo(tmp_path / "fleet")
    env = {**os.environ, "PYTHONWARNINGS": "error"}

    clean = subprocess.run(
        [sys.executable, "-m", "reconciler", "validate", str(EXAMPLE)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    broken = subprocess.run(
        [sys.executable, "-m", "reconciler", "validate", "--format", "github"],
        capture_output=True,
        text=True,
        env=env,
        cwd=root,
        check=False,
    )

    assert (clean.returncode, clean.stdout) == (0, "ok: 8 nodes, 6 rollouts\n")
    assert broken.returncode == 1
    assert broken.stdout.startswith("::error file=rollouts/llama.yaml,line=7,col=14,")


def test_a_node_id_in_maintenance_is_a_warning_and_exits_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = broken_repo(tmp_path / "fleet")
    (root / "rollouts" / "x.yml").unlink()
    (root / "nodes" / "gpu-a5.yaml").write_text(
        "apiVersion: reconciler/v1\nkind: Node\nmetadata: {name: gpu-a5}\n"
        "spec:\n  agent: http://127.0.0.1:8710\n  maintenance: true\n"
    )
    llama = root / "rollouts" / "llama.yaml"
    llama.write_text(
        llama.read_text().replace("[gpu-a1]", "[gpu-a1, gpu-a5]").replace("0\n", "1\n")
    )

    assert cli.main(["validate", str(root)]) == 0
    out, err = capsys.readouterr()
    assert (
        f"{root}/rollouts/llama.yaml: spec.nodeIds: warning: gpu-a5 is in maintenance and is "
        "left out; set includeMaintenance: true to include it, or take it out of maintenance"
    ) in err
    assert out == "ok: 2 nodes, 1 rollout\n"

    assert cli.main(["validate", str(root), "--format", "github"]) == 0
    assert capsys.readouterr().out.startswith(
        f"::warning file={root}/rollouts/llama.yaml,title=spec.nodeIds::spec.nodeIds: warning: gpu-a5"
    )


def test_a_selector_that_matches_no_node_is_a_warning_naming_the_values_in_use(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "fleet"
    (root / "nodes").mkdir(parents=True)
    (root / "rollouts").mkdir()
    for name, role in (("gpu-a1", "canary"), ("gpu-b1", "serving")):
        (root / "nodes" / f"{name}.yaml").write_text(
            f"apiVersion: reconciler/v1\nkind: Node\nmetadata: {{name: {name}}}\n"
            f"spec:\n  agent: http://127.0.0.1:8710\n  labels: {{role: {role}}}\n"
        )
    rollout = (
        "apiVersion: reconciler/v1\nkind: Rollout\nmetadata: {{name: {name}}}\nspec:\n"
        "  target: {{runtime: hermes, provider: ollama, model: llama3.1-8b}}\n"
        "  selector: {selector}\n"
    )
    (root / "rollouts" / "typo.yaml").write_text(
        rollout.format(name="typo", selector="{role: servng}")
    )
    (root / "rollouts" / "fine.yaml").write_text(
        rollout.format(name="fine", selector="{role: serving}")
    )

    assert cli.main(["validate", str(root)]) == 0

    out, err = capsys.readouterr()
    assert (
        f"{root}/rollouts/typo.yaml: spec.selector: warning: the selector {{role: servng}} "
        "matches no node, so the rollout stays pending until one does "
        "(in nodes/: role is canary, serving)"
    ) in err
    assert "fine.yaml" not in err
    assert out == "ok: 2 nodes, 2 rollouts\n"


ARTIFACT_ROLLOUT = """\
apiVersion: reconciler/v1
kind: Rollout
metadata: {{name: {name}}}
spec:
  target:
    runtime: hermes
    provider: ollama
    model: llama3.1-8b
    artifacts:
      - name: weights
        url: https://mirror.example/m.gguf
        sha256: "{digest}"
        size: 4920734976
  nodeIds: [gpu-a1]
  live: true
"""
DIGEST = "0f3a" * 16

# Each broken document's text and the one line validate must print for it.
MISSING_KEYS = {
    "drain-without-url": (
        '  drain:\n    idle: {metric: "vllm:num_requests_running"}\n',
        "17:11: spec.drain.idle: give url and metric, or runtime and port (a preset such as "
        "{runtime: vllm, port: 8000}); neither is given",
    ),
    "drain-without-idle": (
        "  drain:\n    timeout: 2m\n",
        '16:3: spec.drain.idle: missing required field "idle" (when the node is idle: '
        "metrics read from a Prometheus text endpoint on the node itself, summed over their "
        "series)",
    ),
    "warmup-without-http": (
        "  warmup:\n    - times: 2\n",
        "17:7: spec.warmup[0]: give http, or runtime and port (a preset such as "
        "{runtime: vllm, port: 8000, times: 2}); neither is given",
    ),
    "warmup-without-url": (
        "  warmup:\n    - http: {method: POST}\n",
        '17:7: spec.warmup[0].http.url: missing required field "url" (http:// or https:// '
        "on a loopback address or {node})",
    ),
    "artifact-without-url": (
        None,
        '10:9: spec.target.artifacts[0].url: missing required field "url" (where the node '
        "downloads it: http:// or https://)",
    ),
    "spread-without-label": (
        "  spreadBy: {maxPerBatch: 1}\n",
        '16:3: spec.spreadBy.label: missing required field "label" (the label key whose '
        "values are the failure domains, such as zone or rack)",
    ),
    "digest-as-number": (
        "digits",
        "12:17: spec.target.artifacts[0].sha256: must be text, but "
        + "1" * 64
        + " without quotes is read as a number; put it in quotes: "
        + '"'
        + "1" * 64
        + '"',
    ),
}


def test_documents_missing_keys_give_file_line_field_and_exit_1_never_a_traceback(
    tmp_path: Path,
) -> None:
    """The real command, as a process, on documents the schema rejects for a
    missing key the rules would need."""
    (tmp_path / "nodes").mkdir()
    (tmp_path / "rollouts").mkdir()
    (tmp_path / "nodes" / "gpu-a1.yaml").write_text(
        "apiVersion: reconciler/v1\nkind: Node\nmetadata: {name: gpu-a1}\n"
        "spec:\n  agent: http://127.0.0.1:8710\n  labels: {zone: a}\n"
    )
    expected = []
    for name, (tail, line) in MISSING_KEYS.items():
        text = ARTIFACT_ROLLOUT.format(name=name, digest=DIGEST)
        if tail is None:
            text = text.replace("        url: https://mirror.example/m.gguf\n", "")
        elif tail == "digits":
            text = text.replace(f'"{DIGEST}"', "1" * 64)
        else:
            text += tail
        (tmp_path / "rollouts" / f"{name}.yaml").write_text(text)
        expected.append(f"rollouts/{name}.yaml:{line}")

    done = subprocess.run(
        [sys.executable, "-m", "reconciler", "validate"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )

    assert "Traceback" not in done.stderr
    assert done.returncode == 1
    assert sorted(done.stdout.splitlines()) == sorted(expected)
    assert done.stderr.strip() == f"{len(expected)} problems in {len(expected)} files"


def test_evals_without_drain_are_a_warning_and_exit_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "fleet"
    for folder in ("nodes", "rollouts", "evals"):
        (root / folder).mkdir(parents=True)
    (root / "nodes" / "gpu-a1.yaml").write_text(
        "apiVersion: reconciler/v1\nkind: Node\nmetadata: {name: gpu-a1}\n"
        "spec:\n  agent: http://127.0.0.1:8710\n"
    )
    (root / "evals" / "golden.yaml").write_text(
        "apiVersion: reconciler/v1\nkind: EvalSuite\nmetadata: {name: golden}\nspec:\n"
        "  cases:\n    - {name: capital, prompt: 'The capital of France is', "
        "expect: {contains: Paris}}\n"
    )
    rollout = (
        "apiVersion: reconciler/v1\nkind: Rollout\nmetadata: {{name: {name}}}\nspec:\n"
        "  target: {{runtime: hermes, provider: ollama, model: llama3.1-8b}}\n"
        "  nodeIds: [gpu-a1]\n  live: true\n"
        "  health: {{evals: [{{name: golden, suite: golden, url: 'http://127.0.0.1:8080'}}]}}\n"
        "{drain}"
    )
    drain = "  drain: {idle: {url: 'http://127.0.0.1:8080/metrics', metric: running}}\n"
    (root / "rollouts" / "bare.yaml").write_text(rollout.format(name="bare", drain=""))
    (root / "rollouts" / "drained.yaml").write_text(rollout.format(name="drained", drain=drain))

    assert cli.main(["validate", str(root)]) == 0

    out, err = capsys.readouterr()
    assert (
        f"{root}/rollouts/bare.yaml: spec.health.evals: warning: without drain the evals run "
        "while the node already takes requests"
    ) in err
    assert "drained.yaml" not in err
    assert out == "ok: 1 node, 2 rollouts\n"
