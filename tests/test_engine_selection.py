"""The engine's indexed node selection picks exactly what the plain rules
of docs/configuration.md pick (``selection.select_nodes``), on random fleets."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.engine import selection
from reconciler.engine.step import select_nodes_by_index
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
    assert select_nodes_by_index(spec, fleet) == selection.select_nodes(spec, fleet)


def _start(spec: RolloutSpec, fleet: Fleet) -> str:
    from datetime import UTC, datetime

    from reconciler.engine.step import RolloutInput, step_fleet
    from reconciler.protocol.observations import Observations
    from reconciler.spec.model import Settings

    inp = RolloutInput(
        name="r",
        spec=spec,
        file_present=True,
        problems=(),
        status=None,
        spec_commit="c" * 40,
        first_seen_commit="c" * 40,
        queue_key=0,
    )
    step = step_fleet([inp], fleet, Settings(), Observations(), datetime(2026, 12, 1, tzinfo=UTC))
    return step.statuses["r"].message


def test_a_node_id_in_maintenance_is_named_in_the_status() -> None:
    fleet = Fleet(
        (
            Node(name="gpu-b1", agent="http://127.0.0.1:8710"),
            Node(name="gpu-b5", agent="http://127.0.0.1:8710", maintenance=True),
        )
    )
    spec = RolloutSpec(
        name="r", target=Target("hermes", "ollama", "m"), node_ids=("gpu-b1", "gpu-b5")
    )

    assert _start(spec, fleet) == (
        "1 node in 1 batch of 1, dry-run, onFailure pause; left out of nodeIds: gpu-b5 "
        "(in maintenance; set includeMaintenance: true to include it)"
    )
    only = RolloutSpec(name="r", target=Target("hermes", "ollama", "m"), node_ids=("gpu-b5",))
    assert _start(only, fleet).endswith(
        "left out of nodeIds: gpu-b5 (in maintenance; set includeMaintenance: true to include it)"
    )
    assert (
        selection.maintenance_node_ids(
            RolloutSpec(
                name="r",
                target=Target("h", "p", "m"),
                node_ids=("gpu-b5",),
                include_maintenance=True,
            ),
            fleet,
        )
        == ()
    )
