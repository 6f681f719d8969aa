"""Confidence intervals for success rates measured on seeded episodes, and percentiles of timings (numpy only).

A figure here is the unweighted mean over tasks of each task's success rate (as the tiers are reported), and
its uncertainty comes from the finite seeds: a stratified bootstrap resamples each task's episodes (with
replacement, within the task) and recomputes the mean. Two models evaluated on the same seeds are compared
paired: both are resampled at the same seed indices, so the seeds' shared difficulty cancels in the
difference (a much narrower interval than two independent ones).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

Outcomes = Mapping[str, Sequence[bool]]  # task -> success of episode i (on seed first + i)


def _resampled_means(outcomes: Sequence[np.ndarray], indices: Sequence[np.ndarray]) -> np.ndarray:
    """(R,) the mean over tasks of each resample's per-task rate; outcomes[k] (n_k,), indices[k] (R, n_k)."""
    return np.mean([o[i].mean(axis=1) for o, i in zip(outcomes, indices, strict=True)], axis=0)


def _indices(sizes: Sequence[int], resamples: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, n, size=(resamples, n)) for n in sizes]


def mean_ci(outcomes: Outcomes, level: float = 0.95, resamples: int = 2000,
            seed: int = 0) -> tuple[float, float, float]:  # fmt: skip
    """(mean over tasks of the success rate, CI low, CI high): percentile bootstrap, seeds resampled per task."""
    arrays = [np.asarray(v, dtype=float) for v in outcomes.values()]
    if not arrays or any(len(a) == 0 for a in arrays):
        raise ValueError("every task needs at least one episode")
    means = _resampled_means(arrays, _indices([len(a) for a in arrays], resamples, seed))
    tail = 100 * (1 - level) / 2
    point = float(np.mean([a.mean() for a in arrays]))
    return point, float(np.percentile(means, tail)), float(np.percentile(means, 100 - tail))


def paired_diff_ci(after: Outcomes, before: Outcomes, level: float = 0.95, resamples: int = 2000,
                   seed: int = 0) -> tuple[float, float, float]:  # fmt: skip
    """(mean(after) - mean(before), CI low, CI high) over the tasks both measured, on the seeds both ran (the
    first n of each task's): the two resampled at the same seed indices."""
    tasks = [t for t in after if t in before]
    if not tasks:
        raise ValueError("the two evaluations share no task")
    sizes = [min(len(after[t]), len(before[t])) for t in tasks]
    a = [np.asarray(after[t][:n], dtype=float) for t, n in zip(tasks, sizes, strict=True)]
    b = [np.asarray(before[t][:n], dtype=float) for t, n in zip(tasks, sizes, strict=True)]
    indices = _indices(sizes, resamples, seed)
    diffs = _resampled_means(a, indices) - _resampled_means(b, indices)
    tail = 100 * (1 - level) / 2
    point = float(np.mean([x.mean() for x in a]) - np.mean([y.mean() for y in b]))
    return point, float(np.percentile(diffs, tail)), float(np.percentile(diffs, 100 - tail))


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


# Two-sided 97.5 % quantiles of Student's t by degrees of freedom (the CI over a few training seeds).
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}


def seeds_mean_ci(values: list[float]) -> dict:
    """The mean of a figure over runs with different training seeds and its 95 % t interval (the run-to-run
    spread; None with fewer than two runs): {"mean", "ci", "n"}."""
    n = len(values)
    mean = float(np.mean(values)) if values else float("nan")
    if n < 2:
        return {"mean": round(mean, 4), "ci": None, "n": n}
    half = T_975.get(n - 1, 1.96) * float(np.std(values, ddof=1)) / n**0.5
    return {"mean": round(mean, 4), "ci": [round(mean - half, 4), round(mean + half, 4)], "n": n}
