"""The repository explains itself: nothing tracked refers to a document the
repository does not hold, every relative link in the README and ``docs/``
resolves (file and heading), the README stays short, and the pages that
restate the code (the pass steps, the command line) say what the code says.

Links and headings are read as GitHub renders them: code blocks and code
spans are not Markdown, and a heading's anchor is its GitHub slug."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from reconciler.cli.main import COMMANDS, build_parser
from reconciler.daemon.loop import PASS_STEPS

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = ROOT / "README.md"
SELF = "tests/test_docs.py"
README_MAX_LINES = 500
# Spelt in two pieces so that this file does not name it itself.
MISSING_DESIGN_NOTE = "DESIGN" + ".md"

FENCE = re.compile(r"^ {0,3}(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
# A path ending in .md, not part of a longer path or a URL.
# A YAML key ending in sha256 whose value is a plain scalar, not quoted.
UNQUOTED_DIGEST = re.compile(r"(?i)\b\w*sha256\s*:[ \t]+(?![\"'\s#])\S")
MD_MENTION = re.compile(r"(?<![\w/.:-])((?:[\w.-]+/)*[\w-]+\.md)\b")
# A fleet repository's own files (status/README.md is its dashboard):
# paths in the repository a user keeps, not in this one.
FLEET_REPOSITORY_DIRS = ("status/", "rollouts/", "nodes/")
# Files that are named but never meant to be here, each with why.
NOT_DOCUMENTS = {
    ("example-repo/deploy/github-workflow.yaml", "plan.md"): "the file the CI job writes",
    ("tests/test_approval.py", "nodes.md"): "a file the test commits into a fleet repository",
}


def tracked_text_files() -> Iterator[tuple[str, str]]:
    """(path, text) of every tracked file that is UTF-8 text."""
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True
    ).stdout.decode()
    for name in sorted(filter(None, listed.split("\0"))):
        path = ROOT / name
        if not path.is_file() or path.is_symlink():
            continue
        try:
            yield name, path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue


def prose_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, line) of Markdown outside fenced code blocks, with code
    spans blanked out."""
    fence: str | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        opening = FENCE.match(line)
        if fence is None and opening:
            fence = opening.group(1)
        elif fence is not None and line.lstrip().startswith(fence):
            fence = None
        elif fence is None:
            yield number, CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)


def code_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, line) of Markdown inside fenced code blocks."""
    fence: str | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        opening = FENCE.match(line)
        if fence is None and opening:
            fence = opening.group(1)
        elif fence is not None and line.lstrip().startswith(fence):
            fence = None
        elif fence is not None:
            yield number, line


def unquoted_digests(name: str, lines: Iterable[tuple[int, str]]) -> list[str]:
    """Lines that give a ``sha256`` (or ``...Sha256``) field a plain
    scalar: a digest of digits only is read as a number, so write it in
    quotes."""
    return [
        f"{name}:{number}: {line.strip()}" for number, line in lines if UNQUOTED_DIGEST.search(line)
    ]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped,
    spaces to hyphens (code marks and link syntax count as punctuation)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file, repeats numbered as GitHub does."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    fence: str | None = None
    for line in path.read_text(encoding="utf-8").splitlines():
        opening = FENCE.match(line)
        if fence is None and opening:
            fence = opening.group(1)
            continue
        if fence is not None:
            if line.lstrip().startswith(fence):
                fence = None
            continue
        match = HEADING.match(line)
        if match:
            base = slug(match.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def is_external(target: str) -> bool:
    return bool(re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I)) or target.startswith("//")


def broken_links(name: str, text: str, root: Path = ROOT) -> list[str]:
    """Relative links in Markdown file ``name`` (under ``root``) whose file or
    heading is missing."""
    problems: list[str] = []
    here = (root / name).parent
    for number, line in prose_lines(text):
        for match in LINK.finditer(line):
            target = match.group(1)
            if is_external(target):
                continue
            file_part, _, anchor = target.partition("#")
            path = (here / file_part).resolve() if file_part else root / name
            where = f"{name}:{number}: {target}"
            if not path.exists():
                problems.append(f"{where}: no such file")
            elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                problems.append(f"{where}: {path.name} has no heading with anchor #{anchor}")
    return problems


def missing_mentions(name: str, text: str, root: Path = ROOT) -> list[str]:
    """``*.md`` paths that file ``name`` (under ``root``) mentions and the
    repository lacks, and any mention of the design note it never held."""
    problems: list[str] = []
    here = (root / name).parent
    for number, line in enumerate(text.splitlines(), start=1):
        if MISSING_DESIGN_NOTE in line:
            problems.append(f"{name}:{number}: names {MISSING_DESIGN_NOTE}, which is not here")
        for match in MD_MENTION.finditer(line):
            mention = match.group(1)
            if (
                mention.startswith(FLEET_REPOSITORY_DIRS)
                or mention == MISSING_DESIGN_NOTE
                or (name, mention) in NOT_DOCUMENTS
            ):
                continue
            if not ((root / mention).exists() or (here / mention).exists()):
                problems.append(f"{name}:{number}: {mention} is not in the repository")
    return problems


def markdown_pages() -> list[Path]:
    return [README, ROOT / "CHANGELOG.md", *sorted(DOCS.glob("*.md"))]


def test_no_tracked_file_refers_to_a_document_the_repository_lacks() -> None:
    problems: list[str] = []
    for name, text in tracked_text_files():
        if name == SELF:
            continue  # names missing documents on purpose, as fixtures
        problems += missing_mentions(name, text)
        if name.endswith(".md"):
            problems += broken_links(name, text)

    assert not problems, "references that lead nowhere:\n" + "\n".join(problems)


def test_every_relative_link_in_the_readme_and_docs_resolves() -> None:
    problems: list[str] = []
    for page in markdown_pages():
        name = str(page.relative_to(ROOT))
        problems += broken_links(name, page.read_text(encoding="utf-8"))

    assert DOCS.is_dir() and len(markdown_pages()) > 1
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_the_readme_is_short() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")

    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines (at most {README_MAX_LINES}): move detail into docs/"
    )


def test_the_pass_steps_in_the_contributors_guide_are_the_code_s() -> None:
    text = (DOCS / "architecture.md").read_text(encoding="utf-8")
    section = text.split("## The reconcile pass", 1)[1].split("\n## ", 1)[0]
    listed = tuple(re.findall(r"(?m)^\d+\. \*\*`(\w+)`\*\*", section))

    assert listed == PASS_STEPS, (
        f"docs/architecture.md lists the pass steps {listed}; "
        f"reconciler/daemon/loop.py runs {PASS_STEPS}"
    )


def test_the_command_line_page_names_every_verb_and_flag() -> None:
    text = (DOCS / "cli.md").read_text(encoding="utf-8")
    headings = {m.group(2) for m in map(HEADING.match, text.splitlines()) if m}
    subparsers = next(
        a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    )
    missing = [verb for verb in COMMANDS if verb not in headings]
    for verb, parser in subparsers.choices.items():
        flags = [o for a in parser._actions for o in a.option_strings if o.startswith("--")]
        missing += [f"{verb} {flag}" for flag in flags if f"`{flag}" not in text]

    assert not missing, f"docs/cli.md does not describe: {', '.join(missing)}"


def test_every_digest_in_an_example_is_quoted() -> None:
    problems: list[str] = []
    for page in markdown_pages():
        name = str(page.relative_to(ROOT))
        problems += unquoted_digests(name, code_lines(page.read_text(encoding="utf-8")))
    for path in sorted((ROOT / "example-repo").rglob("*.y*ml")):
        lines = enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        problems += unquoted_digests(str(path.relative_to(ROOT)), lines)

    assert not problems, "write each digest in quotes:\n" + "\n".join(problems)


def undocumented_fields(page: str, schema: dict[str, Any]) -> list[str]:
    """The fields of a document's ``spec`` that ``page`` has no table row for
    (a row starting ``| `spec.FIELD``), and the fields of an object field (or
    of a list's entries) that its row does not name."""
    rows = [line for line in page.splitlines() if line.startswith("| `spec.")]
    missing = []
    for field, rule in schema["properties"]["spec"]["properties"].items():
        row = " ".join(r for r in rows if re.match(rf"\| `spec\.{field}[`.\[]", r))
        if not row:
            missing.append(f"spec.{field}")
            continue
        inner = rule.get("properties") or rule.get("items", {}).get("properties", {})
        missing += [f"spec.{field}.{name}" for name in inner if name not in row]
    return missing


def test_the_configuration_page_names_every_field_of_every_document() -> None:
    page = (DOCS / "configuration.md").read_text(encoding="utf-8")
    missing = []
    for kind in ("settings", "node", "rollout"):
        schema = json.loads((ROOT / "schemas" / f"{kind}.schema.json").read_text())
        missing += [f"{kind}: {field}" for field in undocumented_fields(page, schema)]

    assert not missing, f"docs/configuration.md does not describe: {', '.join(missing)}"


def test_the_checks_find_what_they_look_for(tmp_path: Path) -> None:
    """Each rule fails on a tree that breaks it, and passes what is fine."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "b.md").write_text(
        "# B\n\n## A `code` heading, here\n\n## Twice\n## Twice\n"
    )
    page = (
        "[ok](b.md#a-code-heading-here) [ok](b.md#twice-1) [up](../docs) [web](https://x.invalid)\n"
        "[gone](b.md#nowhere) [file](missing.md) [self](#title)\n"
        "```\n[in code](not-checked.md)\n```\n`[in a span](not-checked.md)`\n# Title\n"
    )
    (tmp_path / "docs" / "a.md").write_text(page)

    problems = broken_links("docs/a.md", page, root=tmp_path)
    assert [p.split(": ")[1] for p in problems] == ["b.md#nowhere", "missing.md"]
    assert anchors(tmp_path / "docs" / "b.md") == {"b", "a-code-heading-here", "twice", "twice-1"}
    mentions = "see docs/b.md, docs/nothing.md, status/README.md and " + MISSING_DESIGN_NOTE
    assert missing_mentions("x.py", mentions, root=tmp_path) == [
        f"x.py:1: names {MISSING_DESIGN_NOTE}, which is not here",
        "x.py:1: docs/nothing.md is not in the repository",
    ]
    schema = {
        "properties": {
            "spec": {"properties": {"a": {}, "b": {"properties": {"c": {}, "d": {}}}, "e": {}}}
        }
    }
    assert undocumented_fields("| `spec.a` | x |\n| `spec.b` | `{c}` |\n", schema) == [
        "spec.b.d",
        "spec.e",
    ]
    example = '```yaml\nsha256: 0123\nagentCertSha256: "ab"\n```\nsha256: 1 in prose\n'
    assert unquoted_digests("a.md", code_lines(example)) == ["a.md:2: sha256: 0123"]
