"""Text from agents and people, made safe for the Markdown we write.

Every Markdown writer (``status/README.md``, ``plan --format markdown``)
passes untrusted text (an agent's error, a hold message, a model name, a
label value, a resumeRequest) through ``text`` before it goes into a line,
a list item or a table cell. A forge renders the result as exactly those
characters: no link, emphasis, code span, HTML, autolink or entity.

How: every ASCII punctuation character that can open, close or take part
in a construct gets a backslash. CommonMark lets any ASCII punctuation be
escaped and renders the escaped character as itself, so nothing of the text
can open or close a construct; ``\\|`` is also what a GFM table cell needs,
and ``\\:``, ``\\.`` and ``\\@`` break GFM's bare-URL, ``www.`` and e-mail
autolinks (``\\#``, ``\\@`` and ``\\$`` a forge's references, mentions and
math). Left as they are, so names and sentences stay readable: ``( ) ! ? -
+ , / ; = % ' " { } ^``, which start nothing once ``[`` and ``<`` are escaped,
except at the start of a line (a list item), where they are escaped too.
Whitespace (newlines too) becomes one space,
so the text stays in its line or cell. Code spans are not used for such
text: inside them escapes show literally, and a backtick in the text could
close them.

Inside raw HTML (a ``<summary>`` line) Markdown is not parsed; ``html``
escapes for that place.

Must not: read anything, or decide what is shown.
"""

from __future__ import annotations

import html as _html
import re

# The ASCII punctuation that can open, close or take part in a construct.
_PUNCTUATION = re.compile(r"([#$&*.:<>@\[\\\]_`|~])")
# A list item's start: "- ", "+ ", "1) " (``.`` is escaped anyway).
_LIST_START = re.compile(r"^([-+]|[0-9]+\))")


def text(value: str) -> str:
    """``value`` as Markdown that renders as that text, on one line."""
    escaped = _PUNCTUATION.sub(r"\\\1", " ".join(value.split()))
    return _LIST_START.sub(lambda m: m.group(1)[:-1] + "\\" + m.group(1)[-1], escaped)


def html(value: str) -> str:
    """``value`` as text inside a raw HTML element, on one line."""
    return _html.escape(" ".join(value.split()), quote=True)


def clip(value: str, limit: int) -> str:
    """The first ``limit`` characters of ``value`` (whitespace collapsed),
    ending in ``…`` when cut; clip before escaping, so an escape is never
    cut in half."""
    value = " ".join(value.split())
    return value if len(value) <= limit else value[: limit - 1].rstrip() + "…"
