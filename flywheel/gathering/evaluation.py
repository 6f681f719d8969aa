"""Every evaluation of a policy goes through here: a policy run in the GUI environment, greedily on held-out seeds.

* `evaluate_bundle` / `evaluate_model`: greedy success per task on seeds EVAL_SEED.. (edge_client.evaluate, as
  at the edge: onnxruntime, parallel browsers), with each seed's outcome for paired comparisons;
* `greedy_success`: one version greedy on the held-out seeds, each seed's outcome kept; `paired_difference` any two
  of them on the same seeds, with its CI; `paired_by_group` the same within each group of tasks; `pass_at_k` a
  version sampled K times a seed;
* `versus`: two reports on the same seeds, per scope (the `flywheel eval --baseline` comparison; the command
  itself, with SOP, is flywheel.experiments.eval_command).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from core.console import say
from core.settings import EVAL_SEED, TIER1_TASKS, TIER2_TASKS
from core.stats import paired_diff_ci


def evaluate_bundle(bundle: Path, version: str, tasks: tuple[str, ...], episodes: int | dict[str, int],
                    browsers: int = 1, seed: int = EVAL_SEED, temperature: float = 0.0,
                    samples: int = 1) -> dict:  # fmt: skip
    """A model bundle run by onnxruntime, as at the edge, on seeds seed.. (edge_client.evaluate's report): greedily,
    or `samples` times a seed at `temperature` over every token (each browser's sampler seeded by its index)."""
    import itertools

    from edge_client.env import EnvConfig
    from edge_client.evaluate import evaluate
    from policy.runtime import VLAPolicy
    from policy.sampling import Sampling

    browser = itertools.count()

    def policies():  # one model session per browser
        policy = VLAPolicy(bundle, version, sampling=Sampling(temperature, seed=seed + next(browser)))
        return lambda _task: policy

    return evaluate(policies(), tasks, episodes, seed=seed, env_config=EnvConfig(read_dom=False), browsers=browsers,
                    more_policies=policies, samples=samples)  # fmt: skip


def evaluate_model(model, tok, pruning, meta: dict, tasks: tuple[str, ...], episodes: int | dict[str, int], out: Path,
                   browsers: int = 1, seed: int = EVAL_SEED) -> dict:  # fmt: skip
    """Export `model` to OUT/model-<step>.vla, evaluate it greedily on seeds seed.. (the held-out seeds unless
    told otherwise; `episodes` per task, or a count for each), write OUT/eval-<step>.json.

    `meta`: the entry's arm, step, group, data and training figures; the evaluation adds the rest, with each
    task's `success_by_seed` (episode i on seed + i) for paired comparisons."""
    from learner.model.export import export_bundle

    step = meta["step"]
    bundle = export_bundle(model, tok, pruning, out / f"model-{step}.vla")
    t0 = time.monotonic()
    report = evaluate_bundle(bundle, f"{meta['arm']}@{step}", tasks, episodes, browsers, seed)
    entry = {
        **meta, "bundle_mb": round(bundle.stat().st_size / 1e6, 2), "eval_wall_s": round(time.monotonic() - t0, 1),
        "episodes_per_task": episodes, "tasks": {t: r["success_rate"] for t, r in report["tasks"].items()},
        "episodes_per_s": report["episodes_per_s"], "browsers": browsers, "seed": seed,
        "mean": report["mean_success_rate"],
        "success_by_seed": {t: [end == "success" for end in r["termination_by_seed"]]
                            for t, r in report["tasks"].items()},
    }  # fmt: skip
    (out / f"eval-{step}.json").write_text(json.dumps(entry, indent=2))
    say(f"arm {meta['arm']} @ {step}: mean {entry['mean']:.3f}")
    return entry


def greedy_success(version: dict, tasks: tuple[str, ...], episodes: int, browsers: int) -> dict:
    """A model bundle ({"model_version", "bundle"}) greedy on `episodes` held-out seeds per task: its mean success,
    each task's, and each seed's outcome (for paired comparisons)."""
    report = evaluate_bundle(Path(version["bundle"]), version["model_version"], tasks, episodes, browsers)
    return {"model_version": version["model_version"], "success_rate": round(report["mean_success_rate"], 4),
            "per_task": {t: round(r["success_rate"], 4) for t, r in report["tasks"].items()},
            "success_by_seed": {t: [e == "success" for e in r["termination_by_seed"]]
                                for t, r in report["tasks"].items()}}  # fmt: skip


def pass_at_k(version: dict, tasks: tuple[str, ...], seeds: int, samples: int, temperature: float,
              browsers: int) -> dict:  # fmt: skip
    """A model bundle ({"model_version", "bundle"}) sampled `samples` (K) times on each of `seeds` held-out seeds per
    task at `temperature` over every token: per task pass@K (any run succeeded) and the sampled pass@1 (all runs),
    with each seed's pass for paired comparisons."""
    report = evaluate_bundle(Path(version["bundle"]), version["model_version"], tasks, seeds, browsers,
                             temperature=temperature, samples=samples)  # fmt: skip
    return {"model_version": version["model_version"], "samples": samples, "temperature": temperature,
            "seeds": seeds, "pass_at_k": {t: round(r["pass_at_k"], 4) for t, r in report["tasks"].items()},
            "sampled_pass_at_1": {t: round(r["success_rate"], 4) for t, r in report["tasks"].items()},
            "pass_by_seed": {t: r["pass_by_seed"] for t, r in report["tasks"].items()}}  # fmt: skip


def paired_by_group(after: dict, before: dict, groups: dict[str, tuple[str, ...]], outcomes: str = "success_by_seed"
                    ) -> dict:  # fmt: skip
    """after - before (two results with per-seed `outcomes` on the same seeds; where one ran more, the seeds both
    ran) within each group of tasks: both means over the group's tasks (unweighted) and the paired difference with
    its 95 % bootstrap CI."""
    out = {}
    for group, tasks in groups.items():
        present = [t for t in tasks if t in after[outcomes] and t in before[outcomes]]
        if not present:
            continue
        n = {t: min(len(after[outcomes][t]), len(before[outcomes][t])) for t in present}  # the seeds both ran
        a, b = ({t: side[outcomes][t][: n[t]] for t in present} for side in (after, before))
        diff, lo, hi = paired_diff_ci(a, b)
        mean = lambda side: round(sum(sum(v) / len(v) for v in side.values()) / len(side), 4)  # noqa: E731
        out[group] = {"after": mean(a), "before": mean(b), "diff": round(diff, 4), "ci": [round(lo, 4), round(hi, 4)],
                      "tasks": len(present)}  # fmt: skip
    return out


def paired_difference(after: dict, before: dict) -> dict:
    """after - before, two greedy_success results on the same seeds: the difference with its 95 % bootstrap CI."""
    diff, lo, hi = paired_diff_ci(after["success_by_seed"], before["success_by_seed"])
    episodes = min(len(seeds) for seeds in after["success_by_seed"].values())
    return {"diff": round(diff, 4), "ci": [round(lo, 4), round(hi, 4)], "episodes_per_task": episodes,
            "seeds": [EVAL_SEED, EVAL_SEED + episodes - 1]}  # fmt: skip


def versus(model: dict, baseline: dict) -> dict:
    """model - baseline, two edge_client.evaluate reports on the same seeds: the paired difference of mean
    success with its 95 % bootstrap CI over all tasks, over each tier's tasks present, and per task."""

    def outcomes(report: dict) -> dict[str, list[bool]]:
        return {t: [end == "success" for end in r["termination_by_seed"]] for t, r in report["tasks"].items()}

    after, before = outcomes(model), outcomes(baseline)
    scopes = {"all": list(after), "tier1": [t for t in after if t in TIER1_TASKS],
              "tier2": [t for t in after if t in TIER2_TASKS], **{t: [t] for t in after}}  # fmt: skip
    out = {}
    for scope, tasks in scopes.items():
        if tasks:
            diff, lo, hi = paired_diff_ci({t: after[t] for t in tasks}, {t: before[t] for t in tasks})
            out[scope] = {"diff": round(diff, 4), "ci": [round(lo, 4), round(hi, 4)], "tasks": len(tasks)}
    return out
