"""The daemon reads as a frame and its steps: the pass is the fixed list
``PASS_STEPS``, each a method of ``Daemon`` that says what it touches; the
steps' work lives in the modules named for it (reader, inputs, observer,
status_files, gauges). Sizes are held by ``tests/test_house_rules.py``;
that the steps' modules do not import each other, by ``lint-imports``."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

from reconciler.daemon import loop
from reconciler.daemon.loop import PASS_STEPS, Daemon, FleetDecided, Stepped
from reconciler.daemon.soft_state import SoftState
from tests.kit.documents import rollout_yaml
from tests.kit.fleets import FleetKit


def test_the_pass_is_the_fixed_list_of_steps_in_order() -> None:
    assert PASS_STEPS == ("read", "verify", "observe", "step", "fleet", "commit", "notify", "send")
    for name in PASS_STEPS:
        step = getattr(Daemon, f"_{name}")
        assert step.__doc__, name  # each says what it touches


def test_each_step_names_what_it_reads_and_returns_values() -> None:
    """No record carries values from one step to the next: each step's
    parameters are the values it reads, by name, and what it makes comes
    back as a value (frozen when it is a record)."""
    assert not hasattr(loop, "_Pass")
    reads = {
        name: [p for p in inspect.signature(getattr(Daemon, f"_{name}")).parameters][1:]
        for name in PASS_STEPS
    }
    assert reads == {
        "read": [],
        "verify": ["tip"],
        "observe": ["snapshot", "delta", "inputs"],
        "step": ["snapshot", "built", "seen"],
        "fleet": ["snapshot", "merged"],
        "commit": ["snapshot", "delta", "stepped", "decided"],
        "notify": ["snapshot", "stepped", "fleet", "commit"],
        "send": ["snapshot", "stepped", "seen"],
    }
    for made in (Stepped, FleetDecided):
        assert dataclasses.fields(made) and made.__dataclass_params__.frozen  # type: ignore[attr-defined]


def test_the_soft_state_is_one_record_handed_to_its_owners(tmp_path: Path) -> None:
    """Each part of the soft state is the very object its owner holds, and
    forgetting the caches builds a new reader and observer on the same
    parts: the tip acted on and the rest are kept."""
    kit = FleetKit.create(tmp_path, {"n1": {"role": "web"}})
    try:
        soft = SoftState()
        daemon = kit.daemon(soft=soft)
        kit.push({"rollouts/web.yaml": rollout_yaml("web", selector={"role": "web"})})
        outcome = daemon.run_pass()
        assert outcome.commit is not None and soft.reading.seen_tip == outcome.commit
        reader, observer = daemon.reader, daemon.observer

        daemon._forget_caches()

        assert daemon.reader is not reader and daemon.observer is not observer
        assert daemon.reader.memory is soft.reading
        assert daemon.observer.memory is soft.agents
        assert daemon.observer.answers is soft.answers
        assert daemon.observer.canary.watches is soft.soaks.watches
        assert daemon.fleet_watch.memory is soft.sweeps
        assert soft.reading.seen_tip == outcome.commit
        assert daemon.run_pass().tip == outcome.commit  # acted on, not refused
    finally:
        kit.close()
