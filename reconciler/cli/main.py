"""``reconciler VERB``: one module per verb under ``reconciler.cli.commands``.

Each command module exposes ``HELP`` (one line; ``HELP_BY_VERB`` when it
serves several verbs), ``add_arguments(parser)`` (or
``add_arguments_for(verb, parser)``) and ``run(args) -> int``. Errors from the ``ReconcilerError`` family are
caught here, once, and become a message on stderr and a stable exit code:
0 success, 1 the command's own failure, 2 usage error. A command whose log
is JSON (``--log-format json``) says its last words as a JSON line too.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from collections.abc import Sequence

from reconciler import __version__
from reconciler.protocol.log_lines import log_line, now_text
from reconciler.spec.errors import ReconcilerError, redact_url

# verb -> module under reconciler.cli.commands; imported only when used, so
# `reconciler validate` never pays for httpx or pygit2.
COMMANDS: dict[str, str] = {
    "run": "run",
    "agent": "agent",
    "sim-fleet": "sim_fleet",
    "validate": "validate",
    "plan": "plan",
    "status": "status",
    "fleet": "fleet",
    "pause": "intents",
    "resume": "intents",
    "abort": "intents",
    "rollback": "rollback",
    "skip": "skip",
    "freeze": "freeze",
    "unfreeze": "freeze",
    "backups": "backups",
    "verify": "verify",
    "approve": "approve",
    "attest": "attest",
    "keys": "keys",
    "init": "init",
    "demo": "demo",
    "completion": "completion",
}


class _Parser(argparse.ArgumentParser):
    json_errors = False

    def error(self, message: str) -> None:  # type: ignore[override]
        if self.json_errors:
            text = f"{self.prog}: {message}"
            print(
                log_line("json", now_text(), "error", "usage", text, {"exitCode": 2}),
                file=sys.stderr,
            )
            raise SystemExit(2)
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


class _JsonParser(_Parser):
    """For a command asked to log JSON: a usage error is one JSON line too."""

    json_errors = True


def asks_json_log(argv: Sequence[str]) -> bool:
    """``--log-format json`` on the command line, read before parsing it."""
    pairs = zip(argv, [*argv[1:], ""], strict=True)
    return any(a == "--log-format=json" or (a, b) == ("--log-format", "json") for a, b in pairs)


def build_parser(verb: str | None = None, *, json_errors: bool = False) -> argparse.ArgumentParser:
    kind = _JsonParser if json_errors else _Parser
    parser = kind(prog="reconciler", description="Git as the control plane for fleet rollouts.")
    parser.add_argument("--version", action="version", version=f"reconciler {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=kind)
    names = [verb] if verb in COMMANDS else list(COMMANDS)
    for name in names:
        try:
            module = importlib.import_module(f"reconciler.cli.commands.{COMMANDS[name]}")
        except ModuleNotFoundError as exc:
            if exc.name == f"reconciler.cli.commands.{COMMANDS[name]}":
                continue
            raise
        helps = getattr(module, "HELP_BY_VERB", {})
        text = helps.get(name, module.HELP)
        command = sub.add_parser(name, help=text, description=text)
        if hasattr(module, "add_arguments_for"):
            module.add_arguments_for(name, command)
        else:
            module.add_arguments(command)
        command.set_defaults(_run=module.run)
    return parser


def complete() -> None:
    """Answer the shell's completion request (argcomplete's protocol:
    ``_ARGCOMPLETE``, ``COMP_LINE``, ``COMP_POINT``) and exit: from the named
    verb's parser once the line names one, else from every verb's."""
    import argcomplete

    line = os.environ.get("COMP_LINE", "")
    point = int(os.environ.get("COMP_POINT", len(line)) or len(line))
    argcomplete.autocomplete(build_parser(completed_verb(line[:point])))
    raise SystemExit(0)  # autocomplete exits itself; this only when it declined


def completed_verb(line: str) -> str | None:
    """The verb a command line being completed already names in full (a
    word followed by more), or None while the verb itself is typed."""
    words = line.split()
    done = words[1:] if line[-1:].isspace() else words[1:-1]
    return next((w for w in done if not w.startswith("-")), None)


def main(argv: Sequence[str] | None = None) -> int:
    if "_ARGCOMPLETE" in os.environ:
        complete()
    argv = list(sys.argv[1:] if argv is None else argv)
    verb = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(verb, json_errors=asks_json_log(argv))
    args = parser.parse_args(argv)
    if not getattr(args, "verb", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        code = int(args._run(args))
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # The reader went away (`| head -1`): it had all it wanted. Point
        # stdout at /dev/null so the flush at exit does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except ReconcilerError as exc:
        if _json_log(args):
            _fatal_line(args, exc.message, hint=exc.hint, exitCode=exc.exit_code)
            return exc.exit_code
        print(f"reconciler {args.verb}: {exc.message}", file=sys.stderr)
        if exc.hint:
            print(f"  {exc.hint}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if not _json_log(args):
            raise  # the traceback, as Python prints it
        # A log read by machines gets the traceback as a field of a JSON line.
        trace = "".join(traceback.format_exception(exc))
        _fatal_line(args, f"{type(exc).__name__}: {exc}", traceback=trace, exitCode=1)
        return 1


def _json_log(args: argparse.Namespace) -> bool:
    """Whether the command writes its log as JSON lines (``run``, ``agent``):
    then every line it writes, its last words included, must parse."""
    return getattr(args, "log_format", "text") == "json"


def _fatal_line(args: argparse.Namespace, message: str, **fields: object) -> None:
    text = redact_url(f"reconciler {args.verb}: {message}")
    line = log_line("json", now_text(), "error", "fatal", text, fields)
    print(redact_url(line), file=sys.stderr, flush=True)
