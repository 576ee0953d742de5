"""The engine's indexed node selection picks exactly what the plain rules
of DESIGN.md section 2 pick (``selection.resolve_nodes``), on random fleets."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.engine import selection
from reconciler.engine.step import resolve_nodes
from reconciler.spec.model import Fleet, Node, RolloutSpec, Target

NAMES = [f"n{i}" for i in range(12)]
LABELS = st.dictionaries(
    st.sampled_from(["role", "zone", "gpu"]), st.sampled_from(["a", "b"]), max_size=3
)


@st.composite
def fleets(draw: st.DrawFn) -> Fleet:
    names = draw(st.lists(st.sampled_from(NAMES), unique=True, max_size=10))
    nodes = tuple(
        Node(
            name=name,
            agent="http://127.0.0.1:8710",
            labels=tuple(sorted(draw(LABELS).items())),
            maintenance=draw(st.booleans()),
        )
        for name in names
    )
    return Fleet(nodes)


@st.composite
def specs(draw: st.DrawFn) -> RolloutSpec:
    by_ids = draw(st.booleans())
    return RolloutSpec(
        name="r",
        target=Target("hermes", "ollama", "m"),
        selector=None if by_ids else tuple(sorted(draw(LABELS).items())),
        node_ids=tuple(draw(st.lists(st.sampled_from(NAMES), max_size=8))) if by_ids else None,
        include_maintenance=draw(st.booleans()),
    )


@given(fleets(), specs())
@settings(max_examples=400, deadline=None)
def test_the_indexed_selection_equals_the_plain_rules(fleet: Fleet, spec: RolloutSpec) -> None:
    assert resolve_nodes(spec, fleet) == selection.resolve_nodes(spec, fleet)
