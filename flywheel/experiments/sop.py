"""`flywheel experiment sop`: SOP (flywheel.gathering.eval_command.evaluate_sop) against live success over a
curriculum run's checkpoints: does the offline proxy rank models as the environment does?"""

from __future__ import annotations

from pathlib import Path

from core.console import say
from flywheel.gathering.episodes import record_expert_trajectories
from flywheel.gathering.evaluation import EVAL_SEED


def r_squared(xs: list[float], ys: list[float]) -> float:
    """R² of the least-squares line through (xs, ys): 1 - SS_res / SS_tot (0 when ys do not vary)."""
    import numpy as np

    x, y = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    if len(x) < 2 or np.ptp(y) == 0 or np.ptp(x) == 0:
        return 0.0
    slope, intercept = np.polyfit(x, y, 1)
    residual = float(((y - (slope * x + intercept)) ** 2).sum())
    return 1.0 - residual / float(((y - y.mean()) ** 2).sum())


def run_sop_experiment(out: Path, curriculum: Path, episodes: int, seed: int) -> dict:
    """SOP vs live success over every evaluated checkpoint of a curriculum run (OUT/<arm>/model-<k>.vla with
    its eval-<k>.json, on the evaluation seeds): the experts record `episodes` trajectories per task on the
    eval seeds once, each checkpoint replays them. The tasks are the run's RL set (curriculum.json), else
    those its checkpoints were evaluated on; live success is the mean over them. Writes OUT/sop.json and
    OUT/sop.png."""
    import json

    from learner.algorithms.semi_online import sop

    points = []
    for eval_path in sorted(curriculum.glob("*/eval-*.json")):
        bundle = eval_path.with_name(eval_path.name.replace("eval-", "model-").replace(".json", ".vla"))
        entry = json.loads(eval_path.read_text())
        if bundle.exists() and entry.get("seed", EVAL_SEED) == EVAL_SEED:  # not the RL set's selection
            points.append((eval_path, bundle, entry))
    if len(points) < 2:
        raise ValueError(f"{curriculum} holds {len(points)} evaluated checkpoints; run `flywheel experiment "
                         f"curriculum --out {curriculum}` first")  # fmt: skip
    run = curriculum / "curriculum.json"
    rl_set = json.loads(run.read_text()).get("rl_set", {}).get("tasks") if run.exists() else None
    tasks = tuple(rl_set or points[0][2]["tasks"])
    frame = record_expert_trajectories(tasks, episodes, seed)  # once, every checkpoint replays them
    from policy.runtime import VLARuntime

    rows = []
    for eval_path, bundle, entry in points:
        result = sop(VLARuntime(bundle), frame)
        live = sum(entry["tasks"][t] for t in tasks) / len(tasks)
        rows.append({"checkpoint": f"{eval_path.parent.name}/{bundle.stem}", "live_success": live,
                     "sop_success": result["sop_success"], "sop_progress": result["sop_progress"]})  # fmt: skip
        say(f"  {rows[-1]['checkpoint']}: live {live:.3f}, sop success {result['sop_success']:.3f}, "
            f"progress {result['sop_progress']:.3f}")  # fmt: skip
    live = [r["live_success"] for r in rows]
    report = {"checkpoints": rows, "tasks": list(tasks), "trajectories_per_task": episodes,
              "r2_sop_success": round(r_squared([r["sop_success"] for r in rows], live), 4),
              "r2_sop_progress": round(r_squared([r["sop_progress"] for r in rows], live), 4)}  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    (out / "sop.json").write_text(json.dumps(report, indent=2))
    _plot(out / "sop.png", report)
    say(f"R² live vs sop success {report['r2_sop_success']}, vs sop progress {report['r2_sop_progress']} "
        f"over {len(rows)} checkpoints -> {out / 'sop.json'}")  # fmt: skip
    return report


def _plot(path: Path, report: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), dpi=110)
    for ax, key in zip(axes, ("sop_success", "sop_progress"), strict=True):
        xs = [r[key] for r in report["checkpoints"]]
        ys = [r["live_success"] for r in report["checkpoints"]]
        ax.scatter(xs, ys)
        for r, x, y in zip(report["checkpoints"], xs, ys, strict=True):
            ax.annotate(r["checkpoint"], (x, y), fontsize=6, xytext=(2, 2), textcoords="offset points")
        ax.set_xlabel(key.replace("_", " "))
        ax.set_ylabel("live success (mean over tasks)")
        ax.set_title(f"R² {report['r2_' + key]}")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
