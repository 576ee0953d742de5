"""Which nodes a rollout covers, and in which order. Pure: values in,
values out. (Whether a node's agent can be addressed at all is
``spec.agent_url``, the one rule the document checks share.)"""

from __future__ import annotations

from reconciler.spec.model import Fleet, Node, RolloutSpec


def select_nodes(spec: RolloutSpec, fleet: Fleet) -> tuple[str, ...]:
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
        sorted(node.name for node in fleet.nodes if _eligible(spec, node) and node.matches(wanted))
    )


def unknown_node_ids(spec: RolloutSpec, fleet: Fleet) -> tuple[str, ...]:
    """Names in ``nodeIds`` that no node document has."""
    if spec.node_ids is None:
        return ()
    names = {node.name for node in fleet.nodes}
    return tuple(dict.fromkeys(n for n in spec.node_ids if n not in names))


def maintenance_node_ids(spec: RolloutSpec, fleet: Fleet) -> tuple[str, ...]:
    """Names in ``nodeIds`` that ``select_nodes`` leaves out because the node
    is in maintenance (and the rollout does not include maintenance nodes)."""
    if spec.node_ids is None or spec.include_maintenance:
        return ()
    by_name = fleet.by_name()
    return tuple(
        dict.fromkeys(
            n for n in spec.node_ids if (node := by_name.get(n)) is not None and node.maintenance
        )
    )


def _eligible(spec: RolloutSpec, node: Node) -> bool:
    return spec.include_maintenance or not node.maintenance
