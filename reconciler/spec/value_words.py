"""How a problem message shows a value a person wrote, and the word they
may have meant. Must not: decide whether a value is valid."""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable
from typing import Any


def show(value: Any) -> str:
    if isinstance(value, str):
        text = json.dumps(value, ensure_ascii=False)
        return text if len(text) <= 70 else text[:66] + '..."'
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return str(value)


def did_you_mean(word: str, choices: Iterable[str]) -> str | None:
    options = list(choices)
    by_lower = {c.lower(): c for c in options}
    if word.lower() in by_lower:
        return by_lower[word.lower()]
    close = difflib.get_close_matches(word.lower(), list(by_lower), n=1, cutoff=0.6)
    return by_lower[close[0]] if close else None
