"""The statistics of a comparison (docs/health.md): whether a node's
samples are worse than its baseline's, one-sided at the 0.05 level, beyond
a tolerance.

- A quantity (``query``): SciPy's Mann-Whitney U test that the node's
  samples are stochastically higher (``worse: higher``) or lower than the
  pooled baseline's; the node fails when the test is significant and its
  median is worse than the baseline's by more than ``tolerance`` (relative).
- A rate (``errors``/``total``): SciPy's two-Poisson E-test that the node's
  error rate is higher; it fails when significant and the rate is higher by
  more than ``tolerance`` (absolute).
- Inconclusive, no evidence either way: fewer than ``minSamples`` on a side,
  no baseline, a total of zero, a baseline median of zero.

Pure: numbers in, a ``Judgement`` out; no IO, no clock. The tests come
from SciPy, never from code of our own.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

LEVEL = 0.05  # one-sided significance level

PASSED = "passed"
FAILED = "failed"
UNKNOWN = "unknown"


@dataclass(frozen=True)
class Side:
    """One side of a comparison, as recorded: the median of a quantity or
    the rate of a count, and the samples it was taken from."""

    samples: int
    median: float | None = None
    rate: float | None = None


@dataclass(frozen=True)
class Judgement:
    verdict: str  # passed | failed | unknown
    detail: str
    canary: Side
    baseline: Side
    change: float | None = None  # worse by: relative for a quantity, absolute for a rate
    p_value: float | None = None


def _finite(values: Sequence[float]) -> list[float]:
    return [v for v in values if math.isfinite(v)]


def compare_quantity(
    canary: Sequence[float],
    baseline: Sequence[float],
    *,
    worse: str,
    tolerance: float,
    min_samples: int,
) -> Judgement:
    """A ``query`` comparison; samples that are not numbers (NaN) are left out."""
    ours, theirs = _finite(canary), _finite(baseline)
    mine = Side(len(ours), median=statistics.median(ours) if ours else None)
    base = Side(len(theirs), median=statistics.median(theirs) if theirs else None)
    short = _too_few(len(ours), len(theirs), min_samples)
    if short:
        return Judgement(UNKNOWN, short, mine, base)
    assert mine.median is not None and base.median is not None
    if base.median == 0:
        return Judgement(
            UNKNOWN, "the baseline's median is 0: a relative change means nothing", mine, base
        )
    # Imported here: SciPy costs half a second to import, paid only by a
    # daemon that judges a comparison.
    from scipy.stats import mannwhitneyu

    alternative = "greater" if worse == "higher" else "less"
    p_value = float(mannwhitneyu(ours, theirs, alternative=alternative).pvalue)
    sign = 1.0 if worse == "higher" else -1.0
    change = sign * (mine.median - base.median) / abs(base.median)
    shown = (
        f"median {mine.median:g} against {base.median:g} ({change:+.1%} worse, "
        f"tolerance {tolerance:.1%}), p = {p_value:.3g}"
    )
    if p_value < LEVEL and change > tolerance:
        return Judgement(FAILED, shown, mine, base, change, p_value)
    return Judgement(PASSED, shown, mine, base, change, p_value)


def compare_rate(
    canary: tuple[Sequence[float], Sequence[float]],
    baseline: tuple[Sequence[float], Sequence[float]],
    *,
    tolerance: float,
    min_samples: int,
) -> Judgement:
    """An ``errors``/``total`` comparison: each side is (errors per step,
    total per step), aligned by step (a step without errors is 0, as
    Prometheus leaves out a counter that never moved); the counts are
    summed and rounded to whole events."""
    ours, theirs = _counts(*canary), _counts(*baseline)
    mine = _rate_side(*ours)
    base = _rate_side(*theirs)
    short = _too_few(ours[2], theirs[2], min_samples)
    if short:
        return Judgement(UNKNOWN, short, mine, base)
    if ours[1] == 0 or theirs[1] == 0:
        side = "the node's" if ours[1] == 0 else "the baseline's"
        return Judgement(UNKNOWN, f"{side} total is 0: no rate to compare", mine, base)
    assert mine.rate is not None and base.rate is not None
    from scipy.stats import poisson_means_test  # see compare_quantity

    p_value = float(
        poisson_means_test(ours[0], ours[1], theirs[0], theirs[1], alternative="greater").pvalue
    )
    change = mine.rate - base.rate
    shown = (
        f"rate {mine.rate:.3%} against {base.rate:.3%} ({change * 100:+.3g} points, "
        f"tolerance {tolerance * 100:.3g} points), p = {p_value:.3g}"
    )
    if p_value < LEVEL and change > tolerance:
        return Judgement(FAILED, shown, mine, base, change, p_value)
    return Judgement(PASSED, shown, mine, base, change, p_value)


def no_baseline(why: str, canary_samples: int) -> Judgement:
    """Nothing to compare with: inconclusive."""
    return Judgement(UNKNOWN, why, Side(canary_samples), Side(0))


def _counts(errors: Sequence[float], total: Sequence[float]) -> tuple[int, int, int]:
    """(errors, total, steps) over the steps where both are numbers."""
    pairs = [(e, t) for e, t in zip(errors, total, strict=False) if math.isfinite(e + t)]
    return (
        round(sum(e for e, _ in pairs)),
        round(sum(t for _, t in pairs)),
        len(pairs),
    )


def _rate_side(errors: int, total: int, steps: int) -> Side:
    return Side(steps, rate=errors / total if total else None)


def _too_few(ours: int, theirs: int, least: int) -> str:
    if ours >= least and theirs >= least:
        return ""
    return (
        f"too few samples to judge: {ours} from the node and {theirs} from the baseline, "
        f"{least} needed on each side"
    )
