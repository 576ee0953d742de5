"""The daemon reads as a frame and its steps: the pass is the fixed list
``PASS_STEPS``, each a method of ``Daemon`` that says what it touches; the
steps' work lives in the modules named for it (reader, inputs, observer,
status_files, gauges). Sizes are held by ``tests/test_house_rules.py``."""

from __future__ import annotations

from reconciler.daemon.loop import PASS_STEPS, Daemon


def test_the_pass_is_the_fixed_list_of_steps_in_order() -> None:
    assert PASS_STEPS == ("read", "verify", "observe", "step", "fleet", "commit", "notify", "send")
    for name in PASS_STEPS:
        step = getattr(Daemon, f"_{name}")
        assert step.__doc__, name  # each says what it touches
