"""The statistics of a comparison (docs/health.md): whether a node's
samples are worse than its baseline's, one-sided at the 0.05 level, beyond
a tolerance.

- A quantity (``query``): SciPy's Mann-Whitney U test that the node's
  samples are stochastically higher (``worse: higher``) or lower than the
  pooled baseline's; the node fails when the test is significant and its
  median is worse than the baseline's by more than ``tolerance`` (relative).
- A rate (``errors``/``total``): a one-sided test from SciPy that the node's
  error rate is higher (``rate_p_value``: the two-Poisson E-test up to
  ``E_TEST_MAX_EVENTS`` errors on both sides together, the conditional
  binomial test above); it fails when significant and the rate is higher
  by more than ``tolerance`` (absolute).
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
from typing import Any

LEVEL = 0.05  # one-sided significance level
# The E-test sums over a grid that grows with the counts: a few ms at a few
# hundred errors, tens to hundreds of ms at thousands (a baseline of a
# thousand nodes), where the conditional binomial test costs 0.05 ms.
E_TEST_MAX_EVENTS = 1000

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
    # the samples' smallest, first quartile, third quartile and largest: drawn
    # on the page as a box around the median
    spread: tuple[float, float, float, float] | None = None


@dataclass(frozen=True)
class Judgement:
    verdict: str  # passed | failed | unknown
    detail: str
    canary: Side
    baseline: Side
    change: float | None = None  # worse by: relative for a quantity, absolute for a rate
    p_value: float | None = None


def prepare() -> None:
    """Load SciPy's tests (half a second of CPU): called when the daemon
    starts a soak with comparisons, so the judging pass does not pay it."""
    import scipy.stats  # noqa: F401


@dataclass(frozen=True)
class Pooled:
    """A side's samples, numbers only, sorted, with their median: a
    batch's baseline is pooled once and compared with each of its nodes
    (SciPy ranks a sorted array faster, and takes an array without copying)."""

    values: Any  # a sorted numpy array of float64
    median: float | None

    @property
    def samples(self) -> int:
        return len(self.values)

    def side(self) -> Side:
        """This side as recorded: its median, count and spread."""
        if not len(self.values):
            return Side(0, median=self.median)
        import numpy as np  # see prepare

        q1, q3 = np.quantile(self.values, [0.25, 0.75])
        spread = tuple(float(f"{v:.6g}") for v in (self.values[0], q1, q3, self.values[-1]))
        return Side(self.samples, median=self.median, spread=spread)  # type: ignore[arg-type]


def pool(values: Sequence[float]) -> Pooled:
    import numpy as np  # see prepare

    finite = sorted(v for v in values if math.isfinite(v))
    return Pooled(
        np.asarray(finite, dtype=np.float64), statistics.median(finite) if finite else None
    )


def compare_quantity(
    canary: Sequence[float] | Pooled,
    baseline: Sequence[float] | Pooled,
    *,
    worse: str,
    tolerance: float,
    min_samples: int,
) -> Judgement:
    """A ``query`` comparison; samples that are not numbers (NaN) are left out."""
    return compare_quantities(
        [canary], baseline, worse=worse, tolerance=tolerance, min_samples=min_samples
    )[0]


def compare_quantities(
    canaries: Sequence[Sequence[float] | Pooled],
    baseline: Sequence[float] | Pooled,
    *,
    worse: str,
    tolerance: float,
    min_samples: int,
) -> list[Judgement]:
    """Each node's ``query`` comparison against one baseline: the nodes of a
    batch tested together (``mann_whitney``)."""
    theirs = baseline if isinstance(baseline, Pooled) else pool(baseline)
    base = theirs.side()
    pooled = [c if isinstance(c, Pooled) else pool(c) for c in canaries]
    judged: list[Judgement | None] = []
    tested: list[Pooled] = []
    for ours in pooled:
        mine = ours.side()
        short = _too_few(ours.samples, theirs.samples, min_samples)
        if short:
            judged.append(Judgement(UNKNOWN, short, mine, base))
        elif base.median == 0:
            why = "the baseline's median is 0: a relative change means nothing"
            judged.append(Judgement(UNKNOWN, why, mine, base))
        else:
            judged.append(None)
            tested.append(ours)
    p_values = iter(mann_whitney(tested, theirs, worse=worse))
    return [
        j if j is not None else _quantity_judgement(c, base, next(p_values), worse, tolerance)
        for j, c in zip(judged, pooled, strict=True)
    ]


def _quantity_judgement(
    ours: Pooled, base: Side, p_value: float, worse: str, tolerance: float
) -> Judgement:
    mine = ours.side()
    assert mine.median is not None and base.median is not None
    sign = 1.0 if worse == "higher" else -1.0
    change = sign * (mine.median - base.median) / abs(base.median)
    shown = (
        f"median {mine.median:g} against {base.median:g} ({change:+.1%} worse, "
        f"tolerance {tolerance:.1%}), p = {p_value:.3g}"
    )
    if p_value < LEVEL and change > tolerance:
        return Judgement(FAILED, shown, mine, base, change, p_value)
    return Judgement(PASSED, shown, mine, base, change, p_value)


# A baseline pooled from more samples than this many times a node's is
# tested through that many of its quantiles (see ``baseline_quantiles``).
BASELINE_PER_NODE_SAMPLE = 50
BASELINE_FLOOR = 2000
# Values in one vectorized call: bounds the arrays SciPy builds at once.
CALL_VALUES = 500_000


def baseline_quantiles(baseline: Pooled, samples: int) -> Any:
    """The baseline values a node of ``samples`` samples is tested against:
    all of them, or, when there are more than
    max(``BASELINE_FLOOR``, ``BASELINE_PER_NODE_SAMPLE`` x samples), that
    many of its order statistics evenly spaced, from the least to the
    greatest. The test's cost grows with the baseline; its power, once the
    baseline has many times the node's samples, comes from the node's
    (docs/health.md shows how little the p-value moves)."""
    import numpy as np  # see prepare

    size = max(BASELINE_FLOOR, BASELINE_PER_NODE_SAMPLE * samples)
    if baseline.samples <= size:
        return baseline.values
    picks = np.linspace(0, baseline.samples - 1, size).round().astype(np.intp)
    return baseline.values[picks]


def mann_whitney(canaries: Sequence[Pooled], baseline: Pooled, *, worse: str) -> list[float]:
    """SciPy's one-sided Mann-Whitney U p-value of each node's samples
    against the baseline's: the nodes with the same number of samples in
    one vectorized call (``axis=1``), as a call costs far more than its
    arithmetic at a batch's sizes; ``tests/test_canary_statistics.py``
    proves it equal to a call per node."""
    import numpy as np  # see prepare
    from scipy.stats import mannwhitneyu  # see prepare

    alternative = "greater" if worse == "higher" else "less"
    by_size: dict[int, list[int]] = {}
    for i, canary in enumerate(canaries):
        by_size.setdefault(canary.samples, []).append(i)
    found: dict[int, float] = {}
    for size, members in by_size.items():
        base = baseline_quantiles(baseline, size)
        rows = max(1, CALL_VALUES // (size + len(base)))
        for at in range(0, len(members), rows):
            chunk = members[at : at + rows]
            stacked = np.stack([canaries[i].values for i in chunk])
            result = mannwhitneyu(stacked, base[None, :], alternative=alternative, axis=1)
            found.update(zip(chunk, map(float, np.atleast_1d(result.pvalue)), strict=True))
    return [found[i] for i in range(len(canaries))]


Steps = tuple[Sequence[float], Sequence[float]]  # (errors per step, total per step)


@dataclass(frozen=True)
class Counts:
    """A side of a rate, summed: a batch's baseline is counted once."""

    errors: int
    total: int
    steps: int


def count(errors: Sequence[float], total: Sequence[float]) -> Counts:
    """The errors and total over the steps where both are numbers, rounded
    to whole events."""
    pairs = [(e, t) for e, t in zip(errors, total, strict=False) if math.isfinite(e + t)]
    return Counts(round(sum(e for e, _ in pairs)), round(sum(t for _, t in pairs)), len(pairs))


def compare_rate(
    canary: Steps | Counts,
    baseline: Steps | Counts,
    *,
    tolerance: float,
    min_samples: int,
) -> Judgement:
    """An ``errors``/``total`` comparison: each side is (errors per step,
    total per step), aligned by step (a step without errors is 0, as
    Prometheus leaves out a counter that never moved); the counts are
    summed and rounded to whole events."""
    ours = canary if isinstance(canary, Counts) else count(*canary)
    theirs = baseline if isinstance(baseline, Counts) else count(*baseline)
    mine = _rate_side(ours)
    base = _rate_side(theirs)
    short = _too_few(ours.steps, theirs.steps, min_samples)
    if short:
        return Judgement(UNKNOWN, short, mine, base)
    if ours.total == 0 or theirs.total == 0:
        side = "the node's" if ours.total == 0 else "the baseline's"
        return Judgement(UNKNOWN, f"{side} total is 0: no rate to compare", mine, base)
    assert mine.rate is not None and base.rate is not None
    p_value = rate_p_value(ours.errors, ours.total, theirs.errors, theirs.total)
    change = mine.rate - base.rate
    shown = (
        f"rate {mine.rate:.3%} against {base.rate:.3%} ({change * 100:+.3g} points, "
        f"tolerance {tolerance * 100:.3g} points), p = {p_value:.3g}"
    )
    if p_value < LEVEL and change > tolerance:
        return Judgement(FAILED, shown, mine, base, change, p_value)
    return Judgement(PASSED, shown, mine, base, change, p_value)


def rate_p_value(errors: int, total: int, base_errors: int, base_total: int) -> float:
    """The one-sided p-value that ``errors`` in ``total`` is a higher rate
    than ``base_errors`` in ``base_total``, from SciPy: the two-Poisson
    E-test (``poisson_means_test``) up to ``E_TEST_MAX_EVENTS`` errors on
    both sides together; above, the conditional test of two Poisson rates
    (given all the errors, the node's share of them is binomial with its
    share of the total: ``binomtest``), exact like the E-test and as cheap
    at any count, slightly more conservative."""
    from scipy.stats import binomtest, poisson_means_test  # see compare_quantity

    events = errors + base_errors
    if events <= E_TEST_MAX_EVENTS:
        test = poisson_means_test(errors, total, base_errors, base_total, alternative="greater")
        return float(test.pvalue)
    share = total / (total + base_total)
    return float(binomtest(errors, events, share, alternative="greater").pvalue)


def no_baseline(why: str, canary_samples: int) -> Judgement:
    """Nothing to compare with: inconclusive."""
    return Judgement(UNKNOWN, why, Side(canary_samples), Side(0))


def _rate_side(counts: Counts) -> Side:
    return Side(counts.steps, rate=counts.errors / counts.total if counts.total else None)


def _too_few(ours: int, theirs: int, least: int) -> str:
    if ours >= least and theirs >= least:
        return ""
    return (
        f"too few samples to judge: {ours} from the node and {theirs} from the baseline, "
        f"{least} needed on each side"
    )
