"""How far testing a large baseline through its quantiles moves the
Mann-Whitney p-value (docs/health.md): a node's samples against a baseline
of 1,000 nodes' samples, all of them and the quantiles the daemon tests
(``canary_statistics.baseline_quantiles``), for a few sample counts and
shifts, over fixed seeds; and the CPU of a 1,000-node batch both ways.

    .venv/bin/python bench/baseline_quantiles.py
"""

from __future__ import annotations

import time

import numpy as np
from scipy.stats import mannwhitneyu

from reconciler.statistics import canary_statistics as stats

SEEDS = 20


def main() -> None:
    stats.prepare()
    print(
        "| node's samples | baseline's | tested | shift | median p, all | median p, quantiles | largest change in p |"
    )
    print("|---|---|---|---|---|---|---|")
    for n in (15, 60, 300):
        for shift in (1.0, 1.005, 1.01, 1.03):
            full, thin, moved = [], [], []
            for seed in range(SEEDS):
                rng = np.random.default_rng(seed)
                baseline = stats.pool(list(rng.normal(0.1, 0.01, 1000 * n)))
                canary = np.sort(rng.normal(0.1 * shift, 0.01, n))
                tested = stats.baseline_quantiles(baseline, n)
                p_all = float(mannwhitneyu(canary, baseline.values, alternative="greater").pvalue)
                p_thin = float(mannwhitneyu(canary, tested, alternative="greater").pvalue)
                full.append(p_all)
                thin.append(p_thin)
                moved.append(abs(p_thin - p_all))
            print(
                f"| {n} | {1000 * n:,} | {len(tested):,} | {shift:g} | {np.median(full):.4f} "
                f"| {np.median(thin):.4f} | {max(moved):.4f} |"
            )
    rng = np.random.default_rng(1)
    baseline = stats.pool(list(rng.normal(0.1, 0.01, 15_000)))
    canaries = [stats.pool(list(rng.normal(0.1, 0.01, 15))) for _ in range(1000)]
    for label, base in (
        ("all 15,000", baseline.values),
        ("2,000 quantiles", stats.baseline_quantiles(baseline, 15)),
    ):
        began = time.process_time()
        for c in canaries:
            mannwhitneyu(c.values, base, alternative="greater")
        one_by_one = time.process_time() - began
        began = time.process_time()
        stacked = np.stack([c.values for c in canaries])
        mannwhitneyu(stacked, base[None, :], alternative="greater", axis=1)
        together = time.process_time() - began
        print(
            f"1,000 nodes of 15 samples against {label}: a call each {one_by_one:.3f} s CPU, one call {together:.3f} s"
        )


if __name__ == "__main__":
    main()
