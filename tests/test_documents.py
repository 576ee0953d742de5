"""Documents: files to domain values plus problems. The corpus of broken
files, the example repository, and the cross-document rules."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.spec.documents import (
    Documents,
    ParsedFile,
    assemble,
    classify,
    load_directory,
    parse_file,
)
from reconciler.spec.model import Defaults, Problem, RollbackRequest, Settings, Target
from tests.corpus import Case, bad_cases, base_fleet, cases, write_tree

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "example-repo"

NODE = b"""\
apiVersion: reconciler/v1
kind: Node
metadata: {name: NAME}
spec:
  agent: http://127.0.0.1:8710
  labels: {role: canary, zone: lab}
"""


def node(name: str, extra: str = "") -> tuple[str, bytes]:
    return f"nodes/{name}.yaml", NODE.replace(b"NAME", name.encode()) + extra.encode()


def rollout(name: str, body: str) -> tuple[str, bytes]:
    text = (
        "apiVersion: reconciler/v1\nkind: Rollout\n"
        f"metadata: {{name: {name}}}\nspec:\n"
        "  target: {runtime: hermes, provider: ollama, model: llama3.1-8b}\n" + body
    )
    return f"rollouts/{name}.yaml", text.encode()


def assemble_files(*files: tuple[str, bytes]) -> Documents:
    return assemble(parse_file(path, data) for path, data in files)


def unmatched(case: Case, problems: list[Problem]) -> list[str]:
    """What differs between a case's expectations and its problems."""
    left = list(problems)
    missing = []
    for expected in case.expected:
        match = next((p for p in left if expected.matches(p)), None)
        if match is None:
            missing.append(f"missing {expected}")
        else:
            left.remove(match)
    return missing + [f"unexpected {p}" for p in left]


# --- the corpus -------------------------------------------------------------------------


def test_the_corpus_has_at_least_forty_broken_documents() -> None:
    assert len(bad_cases()) >= 40


@pytest.mark.parametrize("case", bad_cases(), ids=lambda c: c.path)
def test_each_broken_document_alone_gives_exactly_its_problems(case: Case) -> None:
    files = dict(base_fleet())
    files[case.path] = case.data
    # a rollout naming a broken node needs that node's file too
    if b"agent-bad-port" in case.data and case.path.startswith("rollouts/"):
        bad_node = next(c for c in cases() if c.path == "nodes/agent-bad-port.yaml")
        files[bad_node.path] = bad_node.data

    documents = assemble(parse_file(path, data) for path, data in files.items())

    mine = [p for p in documents.problems if p.path == case.path]
    assert unmatched(case, mine) == []


def test_the_whole_corpus_in_one_tree_hides_no_problem(tmp_path: Path) -> None:
    written = write_tree(tmp_path)

    documents = load_directory(tmp_path)

    by_path: dict[str, list[Problem]] = defaultdict(list)
    for problem in documents.problems:
        by_path[problem.path].append(problem)
    differences = [f"{c.path}: {d}" for c in written for d in unmatched(c, by_path.pop(c.path, []))]
    assert differences == []
    assert dict(by_path) == {}  # no problem in a file that is not a case
    # the valid rollout among them still stands, with settings defaults
    assert list(documents.rollouts) == ["good-canary"]
    assert documents.settings == Settings()  # reconciler.yaml is broken: defaults
    assert "batch-size-zero" in documents.invalid_rollouts
    assert "gpu-a1" in documents.fleet.by_name()
    assert "agent-bad-port" not in documents.fleet.by_name()


def test_problems_are_sorted_by_path_then_line(tmp_path: Path) -> None:
    write_tree(tmp_path)
    problems = load_directory(tmp_path).problems
    keys = [(p.path, p.line, p.column) for p in problems]
    assert keys == sorted(keys)


# --- the example repository ----------------------------------------------------------------


def test_the_example_repository_is_clean_and_means_what_it_says() -> None:
    documents = load_directory(EXAMPLE)

    assert documents.problems == ()
    assert documents.invalid_rollouts == {}
    nodes = documents.fleet.by_name()
    assert len(nodes) == 8
    assert [n.name for n in documents.fleet.nodes] == sorted(nodes)
    assert nodes["gpu-b5"].maintenance
    assert nodes["gpu-a1"].label("role") == "canary"
    assert set(documents.rollouts) == {
        "llama-canary",
        "qwen-serving",
        "mistral-lab",
        "embeddings-batch",
        "gemma-serving",
        "phi-serving",
    }
    policies = {spec.on_failure for spec in documents.rollouts.values()}
    assert {"pause", "retry_once", "rollback", "observe"} <= policies
    serving = documents.rollouts["qwen-serving"]
    assert serving.live and serving.pause_after == (1,)
    assert serving.start_at == "2026-12-01T09:00:00Z"
    assert not documents.rollouts["llama-canary"].live
    assert documents.rollouts["mistral-lab"].node_ids == ("gpu-a2", "gpu-a1")


# --- values -------------------------------------------------------------------------------


def test_a_rollout_becomes_a_spec_value_with_everything_it_says() -> None:
    documents = assemble_files(
        node("gpu-a1"),
        node("gpu-a2"),
        rollout(
            "llama",
            "  nodeIds: [gpu-a2, gpu-a1, gpu-a2]\n"
            "  batchSize: 2\n  healthTimeout: 1h30m\n  live: true\n  onFailure: stop\n"
            "  pauseAfter: [1]\n  startAt: 2026-12-01T09:00:00Z\n  includeMaintenance: true\n"
            "  allowOverlap: true\n  paused: true\n  abort: false\n  resumeRequest: r1\n"
            "  skipNodes: [gpu-a1, gpu-a1]\n  rollbackRequest: {id: rb1, nodes: [gpu-a1]}\n",
        ),
    )
    spec = documents.rollouts["llama"]

    assert spec.target == Target("hermes", "ollama", "llama3.1-8b", "default")
    assert spec.node_ids == ("gpu-a2", "gpu-a1")  # order kept, duplicates dropped
    assert spec.selector is None
    assert (spec.batch_size, spec.health_timeout, spec.live) == (2, 5400, True)
    assert spec.on_failure == "stop"
    assert spec.pause_after == (1,)
    assert spec.start_at == "2026-12-01T09:00:00Z"
    assert spec.include_maintenance and spec.allow_overlap and spec.paused and not spec.abort
    assert spec.resume_request == "r1"
    assert spec.skip_nodes == ("gpu-a1",)
    assert spec.rollback_request == RollbackRequest("rb1", ("gpu-a1",))


def test_selectors_and_labels_are_sorted_pairs_and_all_means_every_node() -> None:
    documents = assemble_files(
        node("gpu-a1"),
        rollout(
            "llama",
            "  selector: {zone: lab, role: canary}\n  rollbackRequest: {id: r2, nodes: all}\n",
        ),
    )
    spec = documents.rollouts["llama"]
    assert spec.selector == (("role", "canary"), ("zone", "lab"))
    assert spec.rollback_request == RollbackRequest("r2", None)
    assert documents.fleet.nodes[0].labels == (("role", "canary"), ("zone", "lab"))


def test_settings_defaults_fill_only_what_a_rollout_omits() -> None:
    settings_file = (
        "reconciler.yaml",
        b"apiVersion: reconciler/v1\nkind: Settings\nspec:\n  statusBranch: ops/status\n"
        b"  offlineAfter: 90s\n  defaults: {batchSize: 3, healthTimeout: 10m, onFailure: rollback}\n",
    )
    documents = assemble_files(
        settings_file,
        node("gpu-a1"),
        rollout("plain", "  selector: {role: canary}\n"),
        rollout("explicit", "  selector: {role: canary}\n  batchSize: 1\n  onFailure: pause\n"),
    )

    assert documents.settings == Settings(
        status_branch="ops/status",
        offline_after=90,
        defaults=Defaults(batch_size=3, health_timeout=600, on_failure="rollback"),
    )
    plain = documents.rollouts["plain"]
    assert (plain.batch_size, plain.health_timeout, plain.on_failure) == (3, 600, "rollback")
    explicit = documents.rollouts["explicit"]
    assert (explicit.batch_size, explicit.health_timeout, explicit.on_failure) == (1, 600, "pause")


def test_an_invalid_settings_file_means_defaults_and_a_problem() -> None:
    documents = assemble_files(
        (
            "reconciler.yaml",
            b"apiVersion: reconciler/v1\nkind: Settings\nspec:\n  defaults: {batchSize: 0}\n",
        ),
        node("gpu-a1"),
        rollout("plain", "  selector: {role: canary}\n"),
    )
    assert documents.settings == Settings()
    assert documents.rollouts["plain"].batch_size == 1
    assert [str(p) for p in documents.problems] == [
        "reconciler.yaml:4:25: spec.defaults.batchSize: must be at least 1, got 0"
    ]


def test_a_broken_node_does_not_exist_and_takes_the_rollouts_naming_it_down() -> None:
    documents = assemble_files(
        node("gpu-a1"),
        node("gpu-a2", "  maintenance: maybe\n"),
        rollout("by-name", "  nodeIds: [gpu-a1, gpu-a2]\n"),
        rollout("by-label", "  selector: {role: canary}\n"),
    )
    assert [n.name for n in documents.fleet.nodes] == ["gpu-a1"]
    assert list(documents.rollouts) == ["by-label"]
    (problem,) = documents.invalid_rollouts["by-name"]
    assert str(problem) == (
        'rollouts/by-name.yaml:6:21: spec.nodeIds[1]: node "gpu-a2" cannot be used: '
        "its file nodes/gpu-a2.yaml is invalid; fix that file first"
    )


def test_a_rollout_that_omits_no_default_is_checked_across_files_all_the_same() -> None:
    """batchSize, healthTimeout and onFailure all written: nothing to take
    from the settings, yet nodeIds, after and the eval suites are still
    checked against the other files (and the suites joined in)."""
    given = "  batchSize: 1\n  healthTimeout: 1m\n  onFailure: pause\n"
    suite = (
        "evals/golden.yaml",
        b"apiVersion: reconciler/v1\nkind: EvalSuite\nmetadata: {name: golden}\n"
        b"spec:\n  cases:\n    - {name: capital, prompt: 'Paris is', expect: {contains: France}}\n",
    )
    evals = (
        "  live: true\n  health: {evals: [{name: g, suite: golden, url: 'http://127.0.0.1:1'}]}\n"
    )
    documents = assemble_files(
        node("gpu-a1"),
        suite,
        rollout("unknown", given + "  nodeIds: [gpu-a1, gpu-zz]\n"),
        rollout("evals", given + "  nodeIds: [gpu-a1]\n" + evals),
    )

    (problem,) = documents.invalid_rollouts["unknown"]
    assert 'spec.nodeIds[1]: no node named "gpu-zz"' in str(problem)
    (golden,) = documents.rollouts["evals"].evals
    assert golden.suite is not None and golden.suite.name == "golden"


def test_an_invalid_rollout_is_listed_by_its_file_stem_with_its_problems() -> None:
    documents = assemble_files(
        node("gpu-a1"), ("rollouts/broken.yaml", b"apiVersion: reconciler/v1\nkind: Rollout\n")
    )
    problems = documents.invalid_rollouts["broken"]
    assert {p.field for p in problems} == {"metadata", "spec"}
    assert documents.rollouts == {}


def test_parse_file_is_a_pure_function_of_path_and_bytes() -> None:
    path, data = rollout("llama", "  selector: {role: canary}\n  batchSize: 0\n")
    assert parse_file(path, data) == parse_file(path, data)
    assert parse_file(path, data).problems
    good = parse_file(*rollout("llama", "  selector: {role: canary}\n"))
    assert good.valid and good.rollout is not None and good.name == "llama"


def test_a_parsed_file_can_be_reused_across_assemblies() -> None:
    # the daemon caches parse_file results by blob id and assembles each pass
    parsed = [parse_file(*node("gpu-a1")), parse_file(*rollout("r", "  nodeIds: [gpu-a1]\n"))]
    first = assemble(parsed)
    again = assemble(parsed)
    assert first == again
    assert assemble(parsed[1:]).invalid_rollouts.keys() == {"r"}


@pytest.mark.parametrize(
    ("path", "role"),
    [
        ("reconciler.yaml", "settings"),
        ("reconciler.yml", "misplaced"),
        ("nodes/a.yaml", "node"),
        ("rollouts/a.yaml", "rollout"),
        ("rollouts/a.yml", "misplaced"),
        ("rollouts/a.json", "misplaced"),
        ("nodes/sub/a.yaml", "misplaced"),
        ("rollouts/README.md", "ignored"),
        ("rollouts/.a.yaml", "ignored"),
        ("status/a.yaml", "ignored"),
        ("status/README.md", "ignored"),
        ("deploy/workflow.yaml", "ignored"),
        ("notes.yaml", "stray"),
        ("README.md", "ignored"),
    ],
)
def test_where_files_belong(path: str, role: str) -> None:
    assert classify(path) == role


def test_status_files_and_other_folders_are_not_read(tmp_path: Path) -> None:
    (tmp_path / "status").mkdir()
    (tmp_path / "status" / "x.yaml").write_bytes(b"{{{ not yaml")
    (tmp_path / "deploy").mkdir()
    (tmp_path / "deploy" / "ci.yaml").write_bytes(b"{{{ not yaml")
    assert load_directory(tmp_path).problems == ()


def test_a_symbolic_link_is_a_problem_not_followed(tmp_path: Path) -> None:
    (tmp_path / "nodes").mkdir()
    secret = tmp_path / "secret.txt"
    secret.write_text("password")
    (tmp_path / "nodes" / "gpu-a1.yaml").symlink_to(secret)
    (problem,) = load_directory(tmp_path).problems
    assert problem.path == "nodes/gpu-a1.yaml"
    assert "symbolic link" in problem.message


def test_a_file_over_the_cap_is_read_only_up_to_the_cap(tmp_path: Path) -> None:
    (tmp_path / "rollouts").mkdir()
    (tmp_path / "rollouts" / "big.yaml").write_bytes(b"#" * (3 * 1024 * 1024))
    documents = load_directory(tmp_path)
    assert documents.invalid_rollouts.keys() == {"big"}
    assert "larger than the limit" in documents.problems[0].message


def test_parsed_file_holds_values_only_when_valid() -> None:
    bad = parse_file(*node("gpu-a1", "  extra: 1\n"))
    assert isinstance(bad, ParsedFile)
    assert bad.node is None and not bad.valid
    good = parse_file(*node("gpu-a1"))
    assert good.node is not None and good.valid


def test_parsing_in_worker_processes_gives_the_same_documents(tmp_path: Path) -> None:
    write_tree(tmp_path)
    assert load_directory(tmp_path, workers=2) == load_directory(tmp_path, workers=1)


@pytest.mark.parametrize(
    ("branch", "ok"),
    [
        ("reconciler-status", True),
        ("ops/status", True),
        ("ops..status", False),
        ("status.lock", False),
        ("-status", False),
        ("ops/", False),
        ("has space", False),
    ],
)
def test_status_branch_must_be_a_git_branch_name(branch: str, ok: bool) -> None:
    text = f'apiVersion: reconciler/v1\nkind: Settings\nspec:\n  statusBranch: "{branch}"\n'
    parsed = parse_file("reconciler.yaml", text.encode())
    if ok:
        assert parsed.settings is not None and parsed.settings.status_branch == branch
    else:
        (problem,) = parsed.problems
        assert (problem.line, problem.column, problem.field) == (4, 17, "spec.statusBranch")
        assert "must be a Git branch name" in problem.message


# --- robustness: whatever is committed, parsing reports problems, never raises --------


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_any_bytes_give_a_result_not_an_exception(data: bytes) -> None:
    for path in ("rollouts/x.yaml", "nodes/x.yaml", "reconciler.yaml"):
        parsed = parse_file(path, data)
        assert parsed.valid or parsed.problems or data.strip() == b""


yaml_ish = st.lists(
    st.sampled_from(
        [
            "apiVersion: reconciler/v1\n",
            "kind: Rollout\n",
            "metadata: {name: x}\n",
            "spec:\n",
            "  target: {runtime: a, provider: b, model: c}\n",
            "  selector: {role: canary}\n",
            "  nodeIds: [gpu-a1, 010]\n",
            "  batchSize: [1]\n",
            "  rollbackRequest: {id: r, nodes: [1, all]}\n",
            "  pauseAfter: [1, 1, x]\n",
            "  labels: {a: [1]}\n",
            "  skipNodes: {a: 1}\n",
            "  startAt: 2026-13-45T99:99:99Z\n",
            "  healthTimeout: 0m\n",
            "  target: null\n",
            "- a\n",
            "  ? x\n",
            "    - 1\n",
            "  onFailure: {a: b}\n",
        ]
    ),
    max_size=10,
)


@settings(max_examples=300, deadline=None)
@given(yaml_ish)
def test_mangled_documents_give_problems_with_places_not_exceptions(lines: list[str]) -> None:
    data = "".join(lines).encode()
    documents = assemble([parse_file("rollouts/x.yaml", data), parse_file(*node("gpu-a1"))])
    for problem in documents.problems:
        assert problem.path == "rollouts/x.yaml"
        assert problem.message
    assert ("x" in documents.rollouts) != ("x" in documents.invalid_rollouts)
