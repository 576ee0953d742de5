"""``reconciler plan [--repo PATH] [--base REV] [--head REV] [--format
text|markdown|json|yaml]``: what merging HEAD (or --head) into the base would do,
computed by the engine (``reconciler.text.plan``). Exit 1 when head has invalid
documents.

Reads committed trees (``git.branch``: no checkout, working tree edits do not
count); the statuses come from base's ``status/``, or from the status
branch when ``reconciler.yaml`` names one.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from reconciler.cli.output_format import add_format_argument, structured
from reconciler.cli.remote_options import add_repo_argument, local_repo
from reconciler.git.branch import local_branch
from reconciler.git.revisions import default_base, first_branch_tip, open_repository, resolve
from reconciler.readers.status_reader import read_statuses
from reconciler.spec import documents
from reconciler.spec.paths import SETTINGS_PATH
from reconciler.spec.rollout_status import RolloutStatus
from reconciler.text import plan

HELP = "show what merging a change would do: new rollouts, intents, refused changes"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_repo_argument(parser, "the fleet repository: a working clone or a bare repository")
    parser.add_argument(
        "--base",
        metavar="REV",
        help="what the change merges into (default: the merge-base of HEAD and the current "
        "branch's upstream, else of HEAD and main)",
    )
    parser.add_argument("--head", metavar="REV", default="HEAD", help="the change (default HEAD)")
    add_format_argument(
        parser,
        ("text", "markdown", "json", "yaml"),
        "text for a terminal (default); markdown for a pull-request comment; json or yaml",
    )
    parser.add_argument(
        "--allowed-signers",
        type=Path,
        metavar="FILE",
        help="check the reviewers' approvals of the head commit against this file",
    )
    parser.add_argument(
        "--require-approvals",
        type=int,
        default=0,
        metavar="N",
        help="show how many approvals the head commit still misses (as run --require-approvals)",
    )


def run(args: argparse.Namespace) -> int:
    where = local_repo(args.repo, "plan", "compares commits of a local repository")
    repo = open_repository(where, "pass --repo with a clone or a bare fleet repository")
    head = resolve(repo, args.head)
    base = resolve(repo, args.base) if args.base else default_base(repo, head)
    trees = local_branch(repo, args.repo).reader
    base_tree = plan.Tree(str(base.id), trees.document_files(str(base.id)))
    head_tree = plan.Tree(str(head.id), trees.document_files(str(head.id)))
    statuses = base_statuses(repo, base, args.repo)
    result = plan.make_plan(
        base_tree,
        head_tree,
        statuses,
        now=datetime.now(UTC).replace(microsecond=0),
        author=f"{head.author.name} <{head.author.email}>",
    )
    form = "json" if args.format == "yaml" else args.format
    render = {
        "text": plan.render_text,
        "markdown": plan.render_markdown,
        "json": plan.render_json,
    }[form]
    text = render(result)
    approvals = _approvals(repo, str(head.id), args)
    if approvals is not None:
        text = _with_approvals(text, approvals, form)
    sys.stdout.write(structured(text, args.format))
    return 0 if result.ok else 1


def _approvals(repo: Any, commit: str, args: argparse.Namespace) -> dict[str, Any] | None:
    """The head commit's approvals, present and missing (docs/trust.md), and
    with ``--allowed-signers`` each approval rule that applies to it, judged
    as the daemon judges it (docs/approval-rules.md); None when nothing is
    asked for and its note holds none."""
    from reconciler.git.approval import Approver, load_allowed_signers
    from reconciler.git.approval_notes import read_note, signature_blocks

    note = read_note(repo, commit)
    if args.allowed_signers is None:
        if note is None and not args.require_approvals:
            return None
        blocks, _ = signature_blocks(note or "")
        return {
            "commit": commit,
            "required": args.require_approvals,
            "signatures": len(blocks),
            "checked": False,
        }
    approver = Approver(
        repo, load_allowed_signers(args.allowed_signers), required_approvals=args.require_approvals
    )
    judgement = approver.judgement(commit)
    if note is None and not args.require_approvals and not judgement.rules:
        return None
    found = approver.approvals(commit)
    return {
        "commit": commit,
        "required": args.require_approvals,
        "checked": True,
        "approvedBy": [
            {"principal": a.principal, "keyId": a.key_id, "rules": list(a.rules)}
            for a in judgement.approved_by() or found.counted
        ],
        "missing": max(0, args.require_approvals - len(found.counted)),
        "ignored": list(found.ignored),
        "rules": [
            {
                "name": r.rule,
                "require": r.require,
                "principals": list(r.principals),
                "approvedBy": list(r.counted),
                "missing": max(0, r.require - len(r.counted)),
                "summary": r.summary(),
            }
            for r in judgement.rules
        ],
        "stopsOnly": judgement.stops_only,
        "verified": judgement.ok,
        "summary": judgement.reason if judgement.rules else found.summary(),
    }


def _with_approvals(text: str, approvals: dict[str, Any], form: str) -> str:
    if form == "json":
        record = json.loads(text)
        record["approvals"] = approvals
        return json.dumps(record, indent=2, ensure_ascii=False) + "\n"
    short = approvals["commit"][:12]
    if not approvals["checked"]:
        lines = [
            f"Approvals of {short}: {approvals['signatures']} signature(s) in its note, "
            f"{approvals['required']} required; pass --allowed-signers to check them"
        ]
    else:
        lines = [
            f"Approvals of {short}: {len(approvals['approvedBy'])} counted, "
            f"{approvals['required']} required, {approvals['missing']} missing"
        ]
        lines += [f"  approved by {a['principal']} ({a['keyId']})" for a in approvals["approvedBy"]]
        lines += [f"  ignored: {why}" for why in approvals["ignored"]]
        lines += [
            f"  rule {r['name']}: "
            + (
                f"needs {r['require']} of {', '.join(r['principals'])}; has "
                f"{len(r['approvedBy'])}, {r['missing']} missing"
                if r["missing"]
                else f"approved by {', '.join(r['approvedBy'])}"
            )
            for r in approvals["rules"]
        ]
        if approvals["stopsOnly"]:
            lines.append("  it only sets paused or abort: its signature alone is enough")
    if form == "markdown":
        heading, body = ["", "## Approvals", ""], [f"- {line.strip()}" for line in lines]
    else:
        heading, body = [""], lines
    return text.rstrip("\n") + "\n" + "\n".join(heading + body) + "\n"


def base_statuses(repo: Any, base: Any, location: str) -> dict[str, RolloutStatus]:
    """The statuses at ``base`` (a pygit2 repository and commit), or at the
    status branch's tip when ``reconciler.yaml`` names one."""
    source = local_branch(repo, location)
    commit = str(base.id)
    settings = documents.parse_file(
        SETTINGS_PATH, source.read(commit, SETTINGS_PATH) or b""
    ).settings
    other = settings.status_branch if settings is not None else None
    if other:
        tip = first_branch_tip(repo, (f"refs/heads/{other}", f"refs/remotes/origin/{other}"))
        if tip is None:
            print(
                f"warning: status branch {other!r} not found: planning as if nothing had "
                "a status yet",
                file=sys.stderr,
            )
            return {}
        commit = tip
    snapshot = read_statuses(source, commit)
    for problem in snapshot.problems:
        print(f"warning: {problem}", file=sys.stderr)
    return snapshot.statuses
