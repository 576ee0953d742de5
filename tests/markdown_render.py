"""A real GFM renderer for tests: markdown-it-py with GitHub's extensions
(tables, strikethrough, bare-URL autolinks), as a forge renders our Markdown."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from markdown_it import MarkdownIt
from markdown_it.token import Token

GFM = MarkdownIt("gfm-like")

# Token types that mean the text did more than stay text.
CONSTRUCTS = frozenset(
    {
        "link_open",
        "image",
        "em_open",
        "strong_open",
        "s_open",
        "code_inline",
        "html_inline",
        "html_block",
        "fence",
        "code_block",
        "heading_open",
        "blockquote_open",
        "bullet_list_open",
        "ordered_list_open",
        "hr",
        "table_open",
        "td_open",
        "th_open",
        "tr_open",
    }
)


def tokens(markdown: str) -> Iterator[Token]:
    for token in GFM.parse(markdown):
        yield token
        yield from token.children or ()


def constructs(markdown: str) -> Counter[str]:
    """How many of each construct the Markdown renders."""
    return Counter(t.type for t in tokens(markdown) if t.type in CONSTRUCTS)


def plain_text(markdown: str) -> str:
    """The text a reader sees, without markup."""
    parts: list[str] = []
    for token in tokens(markdown):
        if token.type in ("text", "code_inline"):
            parts.append(token.content)
        elif token.type in ("softbreak", "hardbreak"):
            parts.append(" ")
    return "".join(parts)
