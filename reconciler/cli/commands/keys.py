"""``reconciler keys generate --out DIR [--name NAME]``: an Ed25519 key pair,
the daemon's (default name ``reconciler``) or an agent's (``--name agent``).

Writes ``DIR/NAME`` (OpenSSH private key, unencrypted, mode 0600) and
``DIR/NAME.pub``; prints the key id (the fingerprint ``ssh-keygen -l``
shows) and what to do with each file.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from reconciler.protocol.signing import (
    PRIVATE_KEY_NAME,
    generate_key,
    load_private_key,
    load_public_key,
)
from reconciler.protocol.tls import generate_cert
from reconciler.spec.documents import NAME_RE
from reconciler.spec.errors import UsageError

HELP = "create a signing key pair (OpenSSH Ed25519): the daemon's or an agent's"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="keys_action", metavar="ACTION")
    generate = sub.add_parser(
        "generate",
        help="write DIR/NAME and DIR/NAME.pub",
        description="Write an Ed25519 key pair: DIR/NAME (OpenSSH private key, "
        "unencrypted, mode 0600) and DIR/NAME.pub. The daemon's (NAME reconciler, the "
        "default): give the private key to the daemon (run --key) and the public key to "
        "every agent (--trust-key). An agent's (--name agent): the agent signs its answers "
        "with it. Prints the key id, the fingerprint ssh-keygen -l shows.",
    )
    generate.add_argument("--out", required=True, metavar="DIR", help="directory for the key pair")
    generate.add_argument(
        "--name",
        default=PRIVATE_KEY_NAME,
        help="file name of the key (default reconciler; an agent's key: --name agent)",
    )
    tls = sub.add_parser(
        "tls",
        help="write a self-signed DIR/NODE.crt and DIR/NODE.key for an agent's HTTPS",
        description="Writes DIR/NODE.crt and DIR/NODE.key (mode 0600) for "
        "reconciler agent --tls-cert --tls-key, and prints the certificate's SHA-256, "
        "which the node file pins as spec.agentCertSha256.",
    )
    tls.add_argument("--out", required=True, metavar="DIR", help="directory for the pair")
    tls.add_argument("--name", required=True, metavar="NODE", help="the node's name")
    show = sub.add_parser(
        "id",
        help="print the key id of a private or public key file",
        description="Print the key id (SHA256 fingerprint) of a private or public key file.",
    )
    show.add_argument("file", metavar="FILE", help="a key file: reconciler or reconciler.pub")


def run(args: argparse.Namespace) -> int:
    if args.keys_action == "generate":
        if not NAME_RE.fullmatch(args.name):
            raise UsageError(
                f"--name {args.name!r}: use lowercase letters, digits and -, "
                "starting and ending with a letter or digit"
            )
        private_path, public_path = generate_key(Path(args.out), args.name)
        key = load_private_key(private_path)
        print(f"key id: {key.key_id}")
        if args.name == PRIVATE_KEY_NAME:
            print(f"private key: {private_path} (mode 0600; give it to the daemon: run --key)")
            print(f"public key:  {public_path} (give it to every agent: --trust-key)")
        else:
            print(f"private key: {private_path} (mode 0600; give it to the agent: agent --key)")
            print(f"public key:  {public_path} (its line goes into the node file: spec.agentKey)")
        return 0
    if args.keys_action == "tls":
        if not NAME_RE.fullmatch(args.name):
            raise UsageError(f"--name {args.name!r} is not a node name")
        crt, key_path, pin = generate_cert(Path(args.out), args.name)
        # Quoted: the line is pasted into a node file, where a digest of
        # digits only would be read as a number.
        print(f'agentCertSha256: "{pin}"')
        print(f"certificate: {crt} (agent --tls-cert)")
        print(f"private key: {key_path} (mode 0600; agent --tls-key)")
        print(
            f'in nodes/{args.name}.yaml: agent: https://ADDRESS:PORT and agentCertSha256: "{pin}"'
        )
        return 0
    if args.keys_action == "id":
        path = Path(args.file)
        if path.suffix == ".pub":
            print(load_public_key(path).key_id)
        else:
            print(load_private_key(path).key_id)
        return 0
    raise UsageError("say what to do: reconciler keys generate --out DIR")
