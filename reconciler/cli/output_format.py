"""``-o``/``--format``, the same on every verb that prints in more than one
form, and ``yaml``: the json a verb prints, as YAML. Verbs render json once;
YAML is made from that text here, so the two can never hold different data."""

from __future__ import annotations

import argparse
import io
import json
from collections.abc import Sequence


def add_format_argument(parser: argparse.ArgumentParser, choices: Sequence[str], help: str) -> None:
    """``-o FORMAT``/``--format FORMAT`` with ``choices`` (text first, the default)."""
    parser.add_argument("-o", "--format", choices=tuple(choices), default=choices[0], help=help)


def json_as_yaml(text: str) -> str:
    """``text`` (one JSON document) as YAML: a safe dump, block style, keys in
    the json's order."""
    from ruamel.yaml import YAML

    yaml = YAML(typ="safe", pure=True)
    yaml.default_flow_style = False
    yaml.sort_base_mapping_type_on_output = False  # type: ignore[assignment]
    yaml.allow_unicode = True
    out = io.StringIO()
    yaml.dump(json.loads(text), out)
    return out.getvalue()


def structured(text: str, fmt: str) -> str:
    """``text`` (json) in ``fmt``: unchanged for json, as YAML for yaml."""
    return json_as_yaml(text) if fmt == "yaml" else text
