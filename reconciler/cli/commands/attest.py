"""``reconciler attest NAME [--repo PATH_OR_URL] [--branch main] --key FILE
[--out FILE] [--allowed-signers FILE [--require-approvals N]] [--sign-commits]``:
a signed in-toto attestation of a finished rollout.

Writes a DSSE envelope around an in-toto Statement v1 built from the
rollout's committed status (docs/attestations.md), signed by the daemon's
key, to ``--out`` or standard output. Refuses an unfinished rollout, a
status the daemon would not act on under the flags it runs with (the same
flags here: ``daemon.status_provenance``), one whose recorded evidence does
not verify, and one that deployed nothing on signed evidence; exit 1 then,
and nothing is written.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from reconciler.attestations.attestation import AttestationError, attest
from reconciler.cli.completers import complete_with, rollout_names
from reconciler.cli.daemon_policy import add_policy_arguments, looser_than_the_daemon, policy_of
from reconciler.cli.output_format import add_format_argument, structured
from reconciler.cli.remote_options import add_branch_source_arguments
from reconciler.daemon.status_provenance import unacted_reasons
from reconciler.git.branch import open_branch
from reconciler.protocol.signing import load_private_key
from reconciler.spec.errors import ReconcilerError

HELP = "write a signed in-toto attestation of a finished rollout, from its committed status"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    complete_with(parser.add_argument("name", metavar="NAME", help="the rollout"), rollout_names)
    add_branch_source_arguments(parser)
    parser.add_argument(
        "--key",
        type=Path,
        required=True,
        metavar="FILE",
        help="the daemon's private key (reconciler keys generate writes it)",
    )
    parser.add_argument(
        "--out", type=Path, metavar="FILE", help="write the envelope here (default: stdout)"
    )
    add_policy_arguments(parser)
    add_format_argument(
        parser,
        ("json", "yaml"),
        "json: the DSSE envelope as in-toto's tools read it (default); yaml: the same data",
    )
    parser.add_argument(
        "--sign-commits",
        action="store_true",
        help="as the daemon runs with it: the status counts only as a commit signed by --key "
        "(or another daemon key in --allowed-signers) wrote it",
    )


def run(args: argparse.Namespace) -> int:
    key = load_private_key(args.key)
    source = open_branch(args.repo, args.branch, ssh_key=args.ssh_key, known_hosts=args.known_hosts)
    daemon_key = key.public_openssh if args.sign_commits else None
    policy = policy_of(args, source, args.repo or ".", daemon_key)
    looser = looser_than_the_daemon(policy)
    if looser:
        raise AttestationError(
            f"rollout {args.name}: not attested: {looser}",
            "and, if the daemon signs its status commits, --sign-commits",
        )
    unacted = (
        (lambda status, commit: unacted_reasons(source, status, commit, policy))
        if policy.checks_anything
        else None
    )
    envelope = attest(source, args.name, key, unacted)
    text = structured(json.dumps(envelope, indent=2) + "\n", args.format)
    if args.out is None:
        sys.stdout.write(text)
        return 0
    _write(args.out, text)
    print(f"attestation of rollout {args.name} written to {args.out}", file=sys.stderr)
    return 0


def _write(path: Path, text: str) -> None:
    """Whole or not at all: a reader never sees half an envelope."""
    partial = path.with_name(f".{path.name}.partial")
    try:
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, path)
    except OSError as exc:
        raise ReconcilerError(
            f"cannot write {path}: {exc.strerror}", "choose another --out file"
        ) from exc
