"""``reconciler fleet [--repo PATH_OR_URL] [--branch main] [-o text|json|yaml]``:
every node's fleet state from the committed ``status/fleet.yaml`` (docs/operating.md): what each runtime runs, what it should run, and since when a
node is offline or drifted.

Read like ``status``: the committed tree of the status branch, from a bare
repository, a working clone or a remote; nothing asks the agents.
"""

from __future__ import annotations

import argparse
import json
import sys

from reconciler.cli.output_format import add_format_argument, structured
from reconciler.cli.remote_options import add_branch_source_arguments
from reconciler.git.branch import open_branch
from reconciler.readers.fleet_reader import read_branch_fleet
from reconciler.spec.safe_yaml import YamlProblem
from reconciler.text.fleet_text import render_fleet_json, render_fleet_text

HELP = "every node's fleet state (ok, offline, drift, unverified) from status/fleet.yaml"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_branch_source_arguments(parser)
    add_format_argument(
        parser,
        ("text", "json", "yaml"),
        "text for a terminal (default), or the fleet status record as json or yaml",
    )


def run(args: argparse.Namespace) -> int:
    source = open_branch(args.repo, args.branch, ssh_key=args.ssh_key, known_hosts=args.known_hosts)
    try:
        _, fleet = read_branch_fleet(source)
    except (ValueError, YamlProblem) as exc:
        reason = exc.problem if isinstance(exc, YamlProblem) else exc
        print(f"reconciler fleet: {reason}", file=sys.stderr)
        print("  the daemon replaces it after its next sweep", file=sys.stderr)
        return 1
    if fleet is None:
        if args.format != "text":
            empty = json.dumps({"kind": "FleetStatus", "nodes": None}) + "\n"
            sys.stdout.write(structured(empty, args.format))
        else:
            print(
                "no fleet status yet: the daemon writes status/fleet.yaml after its first sweep "
                "(every spec.fleetCheck.interval of reconciler.yaml, default 1m; 0s turns it off)"
            )
        return 0
    if args.format == "text":
        sys.stdout.write(render_fleet_text(fleet))
    else:
        sys.stdout.write(structured(render_fleet_json(fleet), args.format))
    return 0
