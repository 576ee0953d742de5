"""Every broken document of the validation corpus (tests/corpus) committed
into a live repository next to good rollouts."""

from __future__ import annotations

from pathlib import Path

from . import scenarios


def test_the_corpus_next_to_good_rollouts_is_reported_per_file_and_the_good_ones_complete(
    tmp_path: Path,
) -> None:
    result = scenarios.bad_input_scenario(tmp_path)

    assert result.ok, result.explain()
    assert result.bad_inputs >= 60
