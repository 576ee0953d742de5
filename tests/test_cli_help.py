"""Every verb's ``--help`` reads as plain text for a person: a usage line,
a blank line, a sentence; every option explained; no reStructuredText
markup and no metavar that is only the option's name shouted."""

from __future__ import annotations

import argparse
import re

import pytest

from reconciler.cli import main as cli

VERBS = [*cli.COMMANDS, "keys generate", "keys id", "keys tls"]


def help_text(verb: str, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as stop:
        cli.main([*verb.split(), "--help"])
    assert stop.value.code == 0
    return capsys.readouterr().out


def parser_of(verb: str) -> argparse.ArgumentParser:
    parser = cli.build_parser(verb.split()[0])
    for word in verb.split():
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[word]
    return parser


@pytest.mark.parametrize("verb", VERBS)
def test_help_reads_as_plain_text(verb: str, capsys: pytest.CaptureFixture[str]) -> None:
    text = help_text(verb, capsys)

    assert text.startswith("usage: reconciler ")
    _, _, rest = text.partition("\n\n")
    assert rest and not rest.startswith(("usage", " ")), "a blank line, then the description"
    assert "``" not in text and "`" not in text, "no reStructuredText markup"


@pytest.mark.parametrize("verb", VERBS)
def test_every_option_says_what_it_does(verb: str) -> None:
    for action in parser_of(verb)._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        assert action.help, f"{verb}: {action.option_strings or action.dest} has no help"
        if action.option_strings and action.nargs != 0 and not action.choices:
            shouted = action.dest.upper()
            assert action.metavar not in (None, shouted) or shouted in (
                "NAME",
                "FILE",
                "DIR",
                "REMOTE",
                "BRANCH",
            ), (
                f"{verb}: {action.option_strings[0]} shows {shouted}: give it a metavar "
                "that says what kind of value it takes"
            )


def test_every_verb_is_listed_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    text = capsys.readouterr().out
    for verb in cli.COMMANDS:
        assert re.search(rf"^    {re.escape(verb)}\b", text, re.M), verb
