"""The statistics of a comparison: pinned against SciPy on fixed samples,
and, with hypothesis over fixed seeds, a shifted distribution fails far more
often than the 0.05 level allows while an identical one fails rarely."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from reconciler.statistics.canary_statistics import (
    E_TEST_MAX_EVENTS,
    FAILED,
    LEVEL,
    PASSED,
    UNKNOWN,
    baseline_quantiles,
    compare_quantities,
    compare_quantity,
    compare_rate,
    pool,
    rate_p_value,
)

BASELINE = [0.101, 0.098, 0.103, 0.097, 0.1, 0.102, 0.099, 0.104, 0.096, 0.1, 0.101, 0.098]
SLOWER = [v * 1.3 for v in BASELINE[:10]]


def test_a_canary_30_percent_slower_fails_with_scipys_p_value_and_both_medians() -> None:
    judged = compare_quantity(SLOWER, BASELINE, worse="higher", tolerance=0.1, min_samples=10)

    expected = stats.mannwhitneyu(SLOWER, BASELINE, alternative="greater").pvalue
    assert judged.verdict == FAILED
    assert judged.p_value == pytest.approx(float(expected)) and judged.p_value < LEVEL
    assert judged.canary.median == pytest.approx(float(np.median(SLOWER)))
    assert judged.baseline.median == pytest.approx(float(np.median(BASELINE)))
    assert (judged.canary.samples, judged.baseline.samples) == (10, 12)
    assert judged.change == pytest.approx(np.median(SLOWER) / np.median(BASELINE) - 1)


def test_each_side_records_the_spread_of_its_samples_for_the_page_s_plot() -> None:
    judged = compare_quantity(SLOWER, BASELINE, worse="higher", tolerance=0.1, min_samples=10)

    for side, values in ((judged.canary, SLOWER), (judged.baseline, BASELINE)):
        q1, q3 = np.quantile(values, [0.25, 0.75])
        assert side.spread == pytest.approx((min(values), q1, q3, max(values)), rel=1e-5)
        assert side.spread[1] <= side.median <= side.spread[2]  # type: ignore[index,operator]


def test_a_canary_3_percent_slower_passes_a_10_percent_tolerance_though_significant() -> None:
    slower = [v * 1.03 for v in BASELINE]
    judged = compare_quantity(slower, BASELINE, worse="higher", tolerance=0.1, min_samples=10)

    assert judged.p_value is not None and judged.p_value < LEVEL
    assert judged.verdict == PASSED
    assert judged.change == pytest.approx(0.03)


def test_worse_lower_turns_the_test_around() -> None:
    faster = [v * 0.7 for v in BASELINE]

    lower = compare_quantity(faster, BASELINE, worse="lower", tolerance=0.1, min_samples=10)
    higher = compare_quantity(faster, BASELINE, worse="higher", tolerance=0.1, min_samples=10)

    expected = stats.mannwhitneyu(faster, BASELINE, alternative="less").pvalue
    assert lower.verdict == FAILED and lower.p_value == pytest.approx(float(expected))
    assert lower.change == pytest.approx(0.3)
    assert higher.verdict == PASSED and higher.change == pytest.approx(-0.3)


def test_an_error_rate_from_a_tenth_of_a_percent_to_two_percent_fails() -> None:
    total = [1000.0] * 10
    judged = compare_rate(
        ([20.0] * 10, total), ([1.0] * 10, total), tolerance=0.005, min_samples=10
    )

    expected = stats.poisson_means_test(200, 10000, 10, 10000, alternative="greater").pvalue
    assert judged.verdict == FAILED
    assert judged.p_value == pytest.approx(float(expected)) and judged.p_value < LEVEL
    assert (judged.canary.rate, judged.baseline.rate) == (0.02, 0.001)
    assert judged.change == pytest.approx(0.019)


def test_a_large_baseline_is_judged_with_the_conditional_binomial_test() -> None:
    # A batch of 1,000 nodes' baseline: 15 steps of 1,000 requests and one
    # error each, 15,000 errors pooled; the node has 2% errors.
    total = [1000.0] * 15
    judged = compare_rate(
        ([20.0] * 15, total), ([1000.0] * 15, [1_000_000.0] * 15), tolerance=0.005, min_samples=10
    )

    share = 15_000 / (15_000 + 15_000_000)
    expected = stats.binomtest(300, 15_300, share, alternative="greater").pvalue
    assert judged.verdict == FAILED
    assert judged.p_value == pytest.approx(float(expected)) and judged.p_value < LEVEL
    assert (judged.canary.rate, judged.baseline.rate) == (0.02, 0.001)


@pytest.mark.parametrize(
    ("counts", "test"),
    [
        ((200, 10_000, 10, 10_000), "e-test"),
        ((15, 15_000, 985, 1_500_000), "e-test"),  # E_TEST_MAX_EVENTS exactly
        ((15, 15_000, 986, 1_500_000), "binomial"),
        ((15, 15_000, 15_000, 15_000_000), "binomial"),
        ((30, 15_000, 15_000, 15_000_000), "binomial"),
        ((900, 10_000, 900, 10_000), "binomial"),
    ],
)
def test_the_rate_test_is_the_e_test_up_to_a_thousand_errors_and_binomial_above(
    counts: tuple[int, int, int, int], test: str
) -> None:
    k1, n1, k2, n2 = counts
    assert (k1 + k2 <= E_TEST_MAX_EVENTS) == (test == "e-test")
    if test == "e-test":
        expected = stats.poisson_means_test(k1, n1, k2, n2, alternative="greater").pvalue
    else:
        expected = stats.binomtest(k1, k1 + k2, n1 / (n1 + n2), alternative="greater").pvalue
    assert rate_p_value(*counts) == pytest.approx(float(expected))


def test_the_two_rate_tests_agree_where_they_meet() -> None:
    # Either side of the switch, the two tests tell the same: no evidence
    # of a higher rate at equal rates, strong evidence at double the rate.
    for k1, k2 in ((500, 500), (1000, 500)):
        e = stats.poisson_means_test(k1, 100_000, k2, 100_000, alternative="greater").pvalue
        b = stats.binomtest(k1, k1 + k2, 0.5, alternative="greater").pvalue
        assert (e < LEVEL) == (b < LEVEL)
        assert b == pytest.approx(e, abs=0.02)


def test_a_pooled_baseline_judges_as_its_samples_do() -> None:
    pooled = pool([*BASELINE, float("nan")])
    once = compare_quantity(SLOWER, pooled, worse="higher", tolerance=0.1, min_samples=10)
    each = compare_quantity(SLOWER, BASELINE, worse="higher", tolerance=0.1, min_samples=10)

    assert pooled.samples == len(BASELINE) and pooled.median == float(np.median(BASELINE))
    assert once == each


@settings(derandomize=True, max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), worse=st.sampled_from(["higher", "lower"]))
def test_a_batch_tested_together_is_judged_as_each_node_alone_by_scipy(
    seed: int, worse: str
) -> None:
    # Nodes of different sample counts (one too short to judge), values
    # rounded so that ties occur, against one baseline.
    rng = np.random.default_rng(seed)
    baseline = list(np.round(rng.normal(0.1, 0.01, 300), 3))
    canaries = [
        list(np.round(rng.normal(0.1 * rng.uniform(0.8, 1.3), 0.01, n), 3))
        for n in ([12] * 5 + [15] * 4 + [4])
    ]
    together = compare_quantities(canaries, baseline, worse=worse, tolerance=0.05, min_samples=10)
    alternative = "greater" if worse == "higher" else "less"

    for canary, judged in zip(canaries, together, strict=True):
        if len(canary) < 10:
            assert judged.verdict == UNKNOWN
            continue
        alone = stats.mannwhitneyu(canary, baseline, alternative=alternative).pvalue
        assert judged.p_value == pytest.approx(float(alone), rel=1e-12, abs=1e-300)
        assert judged == compare_quantity(
            canary, baseline, worse=worse, tolerance=0.05, min_samples=10
        )


@settings(derandomize=True, max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), factor=st.floats(0.97, 1.1), n=st.integers(10, 60))
def test_a_large_baseline_tested_through_its_quantiles_gives_the_p_value_of_all_of_it(
    seed: int, factor: float, n: int
) -> None:
    rng = np.random.default_rng(seed)
    baseline = pool(list(rng.normal(0.1, 0.01, 1000 * n)))
    canary = np.sort(rng.normal(0.1 * factor, 0.01, n))
    quantiles = baseline_quantiles(baseline, n)

    full = stats.mannwhitneyu(canary, baseline.values, alternative="greater").pvalue
    thinned = compare_quantity(
        list(canary), baseline, worse="higher", tolerance=0.0, min_samples=10
    ).p_value
    assert len(quantiles) == max(2000, 50 * n) < baseline.samples
    assert quantiles[0] == baseline.values[0] and quantiles[-1] == baseline.values[-1]
    # The normal approximation's z moves by under 1.5%: the p-value within
    # a few tenths of a point near the level, and within 0.02 anywhere.
    z_full, z_thinned = stats.norm.isf(full), stats.norm.isf(thinned)
    assert abs(z_thinned - z_full) <= 0.015 * abs(z_full) + 0.02
    assert thinned == pytest.approx(full, abs=0.02)


def test_an_error_rate_within_the_tolerance_passes() -> None:
    total = [1000.0] * 10
    judged = compare_rate(([3.0] * 10, total), ([1.0] * 10, total), tolerance=0.005, min_samples=3)

    assert judged.p_value is not None and judged.p_value < LEVEL
    assert judged.verdict == PASSED and judged.change == pytest.approx(0.002)


@pytest.mark.parametrize(
    ("canary", "baseline", "why"),
    [
        (SLOWER[:9], BASELINE, "too few samples to judge: 9 from the node and 12"),
        (SLOWER, BASELINE[:4], "too few samples to judge: 10 from the node and 4"),
        (SLOWER + [float("nan")] * 5, BASELINE[:9], "10 from the node and 9"),
        (SLOWER, [0.0] * 12, "the baseline's median is 0"),
    ],
)
def test_a_quantity_without_enough_to_judge_is_unknown(
    canary: list[float], baseline: list[float], why: str
) -> None:
    judged = compare_quantity(canary, baseline, worse="higher", tolerance=0.1, min_samples=10)
    assert judged.verdict == UNKNOWN and why in judged.detail
    assert judged.p_value is None


def test_a_rate_with_a_total_of_zero_or_too_few_steps_is_unknown() -> None:
    zero = compare_rate(
        ([0.0] * 10, [0.0] * 10), ([1.0] * 10, [9.0] * 10), tolerance=0.01, min_samples=3
    )
    short = compare_rate(
        ([1.0] * 2, [9.0] * 2), ([1.0] * 10, [9.0] * 10), tolerance=0.01, min_samples=3
    )

    assert zero.verdict == UNKNOWN and "the node's total is 0" in zero.detail
    assert short.verdict == UNKNOWN and "2 from the node and 10" in short.detail


TRIALS = 200


def failures_of_quantity(seed: int, factor: float, n: int) -> float:
    rng = np.random.default_rng(seed)
    failed = 0
    for _ in range(TRIALS):
        baseline = rng.normal(0.1, 0.01, n)
        canary = rng.normal(0.1 * factor, 0.01 * factor, n)
        judged = compare_quantity(
            list(canary), list(baseline), worse="higher", tolerance=0.01, min_samples=n
        )
        failed += judged.verdict == FAILED
    return failed / TRIALS


@settings(derandomize=True, max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(10, 40))
def test_an_identical_distribution_fails_no_more_often_than_the_level(seed: int, n: int) -> None:
    # 0.05 and three standard errors of 200 trials: a test at a looser
    # level (0.1), or one that ignores the direction, goes over it.
    assert failures_of_quantity(seed, 1.0, n) <= LEVEL + 3 * (LEVEL * (1 - LEVEL) / TRIALS) ** 0.5


@settings(derandomize=True, max_examples=10, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(10, 40),
    factor=st.floats(1.2, 2.0),
)
def test_a_shifted_distribution_fails_far_more_often_than_the_level(
    seed: int, n: int, factor: float
) -> None:
    assert failures_of_quantity(seed, factor, n) >= 0.5


def failures_of_rate(seed: int, before: float, after: float) -> float:
    rng = np.random.default_rng(seed)
    total = [1000.0] * 10
    failed = 0
    for _ in range(TRIALS):
        ours = [float(e) for e in rng.binomial(1000, after, 10)]
        theirs = [float(e) for e in rng.binomial(1000, before, 10)]
        judged = compare_rate((ours, total), (theirs, total), tolerance=0.0001, min_samples=10)
        failed += judged.verdict == FAILED
    return failed / TRIALS


@settings(derandomize=True, max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), rate=st.floats(0.001, 0.05))
def test_an_unchanged_error_rate_fails_rarely_and_a_doubled_one_mostly(
    seed: int, rate: float
) -> None:
    bound = LEVEL + 3 * (LEVEL * (1 - LEVEL) / TRIALS) ** 0.5
    assert failures_of_rate(seed, rate, rate) <= bound
    assert failures_of_rate(seed, rate, rate * 3) >= 0.5
