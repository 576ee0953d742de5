"""``reconciler keys generate --out DIR``: the daemon's Ed25519 key pair.

Writes ``DIR/reconciler`` (OpenSSH private key, unencrypted, mode 0600) and
``DIR/reconciler.pub``; prints the key id (the fingerprint ``ssh-keygen -l``
shows) and what to do with each file.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from reconciler.protocol.signing import generate_key, load_private_key, load_public_key
from reconciler.spec.errors import UsageError

HELP = "create the daemon's signing key pair (OpenSSH Ed25519)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="keys_action", metavar="ACTION")
    generate = sub.add_parser(
        "generate",
        help="write DIR/reconciler and DIR/reconciler.pub",
        description="Write the daemon's Ed25519 key pair: DIR/reconciler (OpenSSH private "
        "key, unencrypted, mode 0600: give it to the daemon, run --key) and "
        "DIR/reconciler.pub (give it to every agent, --trust-key). Prints the key id, the "
        "fingerprint ssh-keygen -l shows.",
    )
    generate.add_argument("--out", required=True, metavar="DIR", help="directory for the key pair")
    show = sub.add_parser(
        "id",
        help="print the key id of a private or public key file",
        description="Print the key id (SHA256 fingerprint) of a private or public key file.",
    )
    show.add_argument("file", metavar="FILE", help="a key file: reconciler or reconciler.pub")


def run(args: argparse.Namespace) -> int:
    if args.keys_action == "generate":
        private_path, public_path = generate_key(Path(args.out))
        key = load_private_key(private_path)
        print(f"key id: {key.key_id}")
        print(f"private key: {private_path} (mode 0600; give it to the daemon: run --key)")
        print(f"public key:  {public_path} (give it to every agent: --trust-key)")
        return 0
    if args.keys_action == "id":
        path = Path(args.file)
        if path.suffix == ".pub":
            print(load_public_key(path).key_id)
        else:
            print(load_private_key(path).key_id)
        return 0
    raise UsageError("say what to do: reconciler keys generate --out DIR")
