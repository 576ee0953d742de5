"""Which nodes a rollout covers, in which order, and whether the daemon can
address a node's agent at all. Pure: values in, values out."""

from __future__ import annotations

import re
from functools import lru_cache

from reconciler.spec.model import Fleet, Node, RolloutSpec

# http(s)://host[:port], optionally with a trailing slash; host is a name,
# an IPv4 address or a bracketed IPv6 address.
_AGENT_URL = re.compile(
    r"^https?://(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*"
    r"|\[[0-9A-Fa-f:.]+\])(?::(?:[0-9]{1,5}))?/?$"
)


@lru_cache(maxsize=65536)
def valid_agent_url(url: str) -> bool:
    """True for ``http(s)://host[:port]`` (port 1-65535)."""
    if not isinstance(url, str) or not _AGENT_URL.match(url):
        return False
    tail = url.rstrip("/").rsplit(":", 1)
    if len(tail) == 2 and tail[1].isdigit() and not url.rstrip("/").endswith("]"):
        return 0 < int(tail[1]) < 65536
    return True


def resolve_nodes(spec: RolloutSpec, fleet: Fleet) -> tuple[str, ...]:
    """The rollout's node selection, ordered: a selector's matches by name;
    ``nodeIds`` in the order given, duplicates dropped. Names in ``nodeIds``
    that are not in the fleet are left out (see ``unknown_node_ids``).
    Maintenance nodes are left out unless the rollout includes them."""
    if spec.node_ids is not None:
        by_name = fleet.by_name()
        seen: set[str] = set()
        chosen: list[str] = []
        for name in spec.node_ids:
            node = by_name.get(name)
            if name in seen or node is None or not _eligible(spec, node):
                continue
            seen.add(name)
            chosen.append(name)
        return tuple(chosen)
    wanted = spec.selector or ()
    return tuple(
        sorted(
            node.name
            for node in fleet.nodes
            if _eligible(spec, node) and all(node.label(k) == v for k, v in wanted)
        )
    )


def unknown_node_ids(spec: RolloutSpec, fleet: Fleet) -> tuple[str, ...]:
    """Names in ``nodeIds`` that no node document has."""
    if spec.node_ids is None:
        return ()
    names = {node.name for node in fleet.nodes}
    return tuple(dict.fromkeys(n for n in spec.node_ids if n not in names))


def _eligible(spec: RolloutSpec, node: Node) -> bool:
    return spec.include_maintenance or not node.maintenance
