"""Bootstrap intervals of success rates (core.stats): coverage, pairing, and the errors a caller can make."""

from __future__ import annotations

import numpy as np
import pytest

from core.stats import mean_ci, paired_diff_ci


def test_the_interval_covers_the_true_rate_about_95_percent_of_the_time():
    rng = np.random.default_rng(0)
    true = {"a": 0.3, "b": 0.7}
    covered = 0
    for trial in range(200):
        outcomes = {t: (rng.random(100) < p).tolist() for t, p in true.items()}
        _, lo, hi = mean_ci(outcomes, resamples=500, seed=trial)
        covered += lo <= 0.5 <= hi
    assert 0.88 <= covered / 200 <= 0.99


def test_the_point_is_the_unweighted_mean_over_tasks():
    mean, lo, hi = mean_ci({"a": [True] * 10, "b": [False] * 30 + [True] * 10})
    assert mean == pytest.approx((1.0 + 0.25) / 2) and lo <= mean <= hi


def test_pairing_on_shared_seeds_narrows_the_interval_of_a_difference():
    """Two models that differ on 10 of 100 seeds, where the seeds' difficulty dominates: the paired interval
    excludes 0, an unpaired one (each mean's own CI) overlaps."""
    rng = np.random.default_rng(1)
    before = (rng.random(100) < 0.5).tolist()
    after = list(before)
    flips = [i for i, b in enumerate(before) if not b][:10]
    for i in flips:
        after[i] = True
    diff, lo, hi = paired_diff_ci({"t": after}, {"t": before})
    assert diff == pytest.approx(0.10) and lo > 0
    _, a_lo, _ = mean_ci({"t": after})
    _, _, b_hi = mean_ci({"t": before})
    assert a_lo < b_hi  # unpaired, the two intervals overlap


def test_a_paired_difference_uses_the_shared_tasks_and_seeds_only():
    diff, _, _ = paired_diff_ci({"t": [True, True, True], "only": [True]}, {"t": [False, True]})
    assert diff == pytest.approx(0.5)  # t on its first 2 seeds: 1.0 vs 0.5; "only" ignored
    with pytest.raises(ValueError, match="no task"):
        paired_diff_ci({"a": [True]}, {"b": [True]})
    with pytest.raises(ValueError, match="at least one episode"):
        mean_ci({"a": []})


def test_an_eval_against_its_baseline_is_paired_per_tier_and_per_task():
    from flywheel.gathering.evaluation import versus

    def report(ends: dict[str, str]) -> dict:
        return {"tasks": {task: {"termination_by_seed": list(seeds)} for task, seeds in ends.items()}}

    half = ["success"] * 5 + ["failure"] * 5
    model, baseline = (
        report({"click-test": ["success"] * 10, "enter-text": half}),
        report({"click-test": half, "enter-text": half}),
    )
    found = versus(model, baseline)
    assert found["click-test"]["diff"] == 0.5 and found["enter-text"]["diff"] == 0.0
    assert found["all"]["diff"] == 0.25 and found["tier1"]["tasks"] == found["tier2"]["tasks"] == 1
    assert found["all"]["ci"][0] > 0  # the same seeds: every resample of click-test gains
