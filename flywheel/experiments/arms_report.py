"""The figures of `flywheel experiment`'s report (OUT/arms.json): an evaluation's summary, a paired difference with
its CI, the unbiased pass@k, and the table it prints."""

from __future__ import annotations

import math

from core.stats import mean_ci, paired_diff_ci


def pass_at(successes: int, samples: int, k: int) -> float:
    """Unbiased pass@k from `successes` of `samples` runs (Chen et al. 2021): 1 - C(n - c, k) / C(n, k)."""
    return 1.0 - math.comb(samples - successes, k) / math.comb(samples, k)


def summary(entry: dict, new: tuple[str, ...]) -> dict:
    """An evaluation's new-task mean (95 % CI), per new task, and the suite's mean."""
    by_seed = entry["success_by_seed"]
    mean, lo, hi = mean_ci({t: by_seed[t] for t in new})
    suite = [sum(v) / len(v) for t, v in by_seed.items() if t not in new]
    return {"new_mean": round(mean, 4), "new_ci": [round(lo, 4), round(hi, 4)],
            "per_task": {t: round(sum(by_seed[t]) / len(by_seed[t]), 4) for t in new},
            "suite_mean": round(sum(suite) / len(suite), 4) if suite else None}  # fmt: skip


def paired(after: dict, before: dict) -> dict:
    diff, lo, hi = paired_diff_ci(after, before)
    return {"diff": round(diff, 4), "ci": [round(lo, 4), round(hi, 4)]}


def point_cost(gain: dict, env_steps: int, cpu_s: float) -> dict | None:
    """What one point (0.01) of new-task success over the twin cost: environment steps of the arm's data and the
    learner's CPU-seconds. None where the gain (`paired`'s diff and CI) is not above 0: no point was bought."""
    diff, (low, _high) = gain["diff"], gain["ci"]
    if low <= 0:
        return None
    return {"env_steps": round(env_steps / (100 * diff)), "learner_cpu_s": round(cpu_s / (100 * diff), 1)}


def print_report(report: dict) -> None:
    start = report["start"]
    print(f"start: new tasks {start['new_mean']} {start['new_ci']}, suite {start['suite_mean']}; "
          f"best-of-K {report['start_best_of_k']}")  # fmt: skip
    print(f"{'arm':16s} {'seeds':>5s} {'new':>7s} {'- twin':>24s} {'- start':>24s} {'- best-of-k':>24s}")
    for arm, entry in report["arms"].items():
        seeds, over = entry["seeds"], entry["over_seeds"]
        mean = sum(s["new_mean"] for s in seeds.values()) / len(seeds) if seeds else float("nan")
        cells = [f"{over[k]['mean']:+.3f} {over[k]['ci']}" if k in over else "-"
                 for k in ("vs_twin", "vs_start", "vs_start_best_of_k")]  # fmt: skip
        print(f"{arm:16s} {len(seeds):5d} {mean:7.3f} " + " ".join(f"{c:>24s}" for c in cells))
