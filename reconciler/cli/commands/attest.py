"""``reconciler attest NAME [--repo PATH_OR_URL] [--branch main] --key FILE
[--out FILE]``: a signed in-toto attestation of a finished rollout.

Writes a DSSE envelope around an in-toto Statement v1 built from the
rollout's committed status (docs/attestations.md), signed by the daemon's
key, to ``--out`` or standard output. Refuses an unfinished rollout, one
whose recorded evidence does not verify, and one that deployed nothing on
signed evidence; exit 1 then, and nothing is written.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from reconciler.cli.completers import complete_with, rollout_names
from reconciler.cli.remote_options import add_branch_source_arguments
from reconciler.git.branch import open_branch
from reconciler.protocol.signing import load_private_key
from reconciler.spec.errors import ReconcilerError
from reconciler.views.attestation import attest

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


def run(args: argparse.Namespace) -> int:
    key = load_private_key(args.key)
    source = open_branch(args.repo, args.branch, ssh_key=args.ssh_key, known_hosts=args.known_hosts)
    envelope = attest(source, args.name, key)
    text = json.dumps(envelope, indent=2) + "\n"
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
