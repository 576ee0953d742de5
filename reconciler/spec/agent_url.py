"""The one rule for a node's agent address (``spec.agent``): the document
checks, the engine's dispatch check and the agent client all accept the same
URLs, so a node that validates is a node the daemon sends jobs to.

The rule: ``http://`` or ``https://``, a host (a name, which may hold ``_``,
an IPv4 address or a bracketed IPv6 address), if given a port from 1 to
65535, and if given a path prefix (jobs go to ``AGENT/v1/nodes/NAME/jobs``);
no user name, query, fragment or spaces. Pure."""

from __future__ import annotations

import re
from functools import lru_cache

SHAPE = "http(s)://host[:port][/path]"

_AGENT_URL = re.compile(
    r"^https?://(\[[0-9A-Fa-f:.]+\]|[^\s/?#@:\[\]]+)(?::([0-9]{1,5}))?(/[^\s?#]*)?$"
)


@lru_cache(maxsize=65536)
def is_usable_agent_url(url: str) -> bool:
    """True when ``url`` follows the rule above."""
    match = _AGENT_URL.match(url)
    if match is None:
        return False
    port = match.group(2)
    return port is None or 0 < int(port) < 65536
