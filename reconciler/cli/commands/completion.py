"""``reconciler completion bash|zsh|fish``: print the shell code that
completes ``reconciler``'s verbs and flags, to be sourced by the shell.

The script comes from argcomplete; it runs ``reconciler`` itself with
argcomplete's environment, and ``cli.main`` answers that from the full
parser of every verb. This module only prints the script.
"""

from __future__ import annotations

import argparse
import sys

HELP = "print the shell code that completes reconciler's verbs and flags (bash, zsh, fish)"

SHELLS = ("bash", "zsh", "fish")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "shell",
        choices=SHELLS,
        help='the shell to complete in; e.g. in ~/.bashrc: eval "$(reconciler completion bash)"',
    )


def run(args: argparse.Namespace) -> int:
    import argcomplete

    sys.stdout.write(argcomplete.shellcode(["reconciler"], shell=args.shell))
    return 0
