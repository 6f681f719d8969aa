"""`flywheel eval`: a model (or the experts) on every task's seeds, greedy, with an optional baseline on the same
seeds (flywheel.gathering.evaluation.versus) and SOP, the model replaying the experts' trajectories."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from core.console import say
from core.settings import EVAL_SEED, TIER1_TASKS, Settings
from flywheel.gathering.episodes import record_expert_trajectories
from flywheel.gathering.evaluation import versus


# evaluate() takes plain arguments; the command's settings (which policy to load, where the report goes) are here.
@dataclass(frozen=True)
class EvalConfig:
    """`flywheel eval`: which policy, on which tasks and seeds."""

    out: Path
    """eval.json goes here."""
    model: str = "release"
    """Model file, version id, 'latest' (the newest published) or 'release' (the committed VLA)."""
    policy: Literal["model", "expert"] = "model"
    """'model' (the one --model names) or 'expert' (the scripted DOM experts)."""
    tasks: tuple[str, ...] = TIER1_TASKS
    """MiniWoB++ task ids and/or 'tier1', 'tier2', 'suite'."""
    episodes: int = 50
    """Episodes per task."""
    first_seed: int = EVAL_SEED
    """Seed of each task's first episode: held-out seeds, far above the training runs' (an edge client's --seed)."""
    threads: int = 1
    """Intra-op threads of the model."""
    keep_ratio_override: float | None = None
    """VLA: a visual-token keep ratio instead of the bundle's own (None: the bundle's)."""
    browsers: int = 1
    """Browsers in parallel (threads, one model session each); the report is the same for any number."""
    env_path: Literal["fast", "previous"] = "fast"
    """Environment path: 'fast' or 'previous' (miniwob's own reset and step, to compare; same outcomes)."""
    baseline: str = ""
    """A second model (as --model names one) run on the same tasks and seeds: eval.json gains `baseline` and
    `vs_baseline`, model - baseline paired on those seeds with its 95 % CI, over all tasks, per tier and per task."""
    samples: int = 1
    """Runs of each seed (K): with a temperature, eval.json gains each task's pass_at_k (any of the K succeeded) beside
    its success_rate (all runs: pass@1 of the sampled policy)."""
    temperature: float = 0.0
    """Sampling temperature of every action token (0: greedy; the thought stays greedy, policy.sampling)."""
    top_k: int = 0
    """With a temperature: sample among the k likeliest allowed tokens (0: all)."""
    sop: bool = False
    """Also SOP (semi-online performance): the experts record their trajectories on the same tasks and seeds
    and the model replays each until its first mismatch: sop_progress and sop_success per task and mean."""


def evaluate_sop(bundle: str | Path, tasks: tuple[str, ...], episodes: int, seed: int,
                 keep_ratio: float | None = None) -> dict:  # fmt: skip
    """{"tasks": {task: {"sop_progress", "sop_success", "trajectories"}}, "sop_progress", "sop_success"}."""
    from learner.algorithms.semi_online import sop
    from policy.runtime import VLARuntime

    return sop(VLARuntime(bundle, keep_ratio=keep_ratio), record_expert_trajectories(tasks, episodes, seed))


def check_eval_config(config: EvalConfig) -> None:
    """Refuses, before anything starts, settings that cannot mean what they say."""
    if config.samples < 1 or config.temperature < 0 or config.top_k < 0:
        raise ValueError("--samples must be >= 1, --temperature and --top-k >= 0")
    if config.samples > 1 and (config.policy != "model" or config.temperature == 0):
        raise ValueError("--samples K runs each seed K times: it needs --policy model and a --temperature > 0 (a "
                         "greedy policy or a scripted expert replays the same episode)")  # fmt: skip
    if config.temperature > 0 and (config.baseline or config.sop):
        raise ValueError("--baseline and --sop compare greedy policies: leave --temperature at 0")


def run_eval(config: EvalConfig, settings: Settings) -> dict:
    """`flywheel eval`: the policy on every task's seeds, greedy (or sampled K times a seed); OUT/eval.json, printed
    per task."""
    import itertools

    from edge_client.env import EnvConfig
    from flywheel.gathering.evaluation import evaluate
    from policy.sampling import Sampling

    check_eval_config(config)

    if config.policy == "expert":
        from edge_client.experts import expert_for

        def policies():
            return expert_for
    else:
        from policy.runtime import load_policy
        from registry.store import resolve_model

        path, version = resolve_model(config.model, settings.artifacts_dir)
        browser = itertools.count()  # each browser's sampler its own seed, the same in every rerun

        def policies():
            sampling = Sampling(config.temperature, config.top_k, seed=config.first_seed + next(browser))
            model = load_policy(path, version, intra_op_threads=config.threads, keep_ratio=config.keep_ratio_override,
                                sampling=sampling)  # fmt: skip
            return lambda _task: model

    def progress(task, index, result) -> None:
        if (index + 1) % 10 == 0 or index + 1 == config.episodes:
            print(f"  {task}: {index + 1}/{config.episodes}", file=sys.stderr, flush=True)

    report = evaluate(policies(), config.tasks, config.episodes, seed=config.first_seed, progress=progress,
                      env_config=EnvConfig(path=config.env_path, read_dom=config.policy == "expert"),
                      browsers=config.browsers, more_policies=policies, samples=config.samples)  # fmt: skip
    report["env_path"] = config.env_path
    report["sampling"] = {"temperature": config.temperature, "top_k": config.top_k, "samples": config.samples}
    if config.baseline:
        from policy.runtime import load_policy
        from registry.store import resolve_model

        base_path, base_version = resolve_model(config.baseline, settings.artifacts_dir)

        def baseline_policies():
            model = load_policy(
                base_path, base_version, intra_op_threads=config.threads, keep_ratio=config.keep_ratio_override
            )
            return lambda _task: model

        say(f"baseline {base_version} on the same seeds")
        baseline = evaluate(baseline_policies(), config.tasks, config.episodes, seed=config.first_seed,
                            env_config=EnvConfig(path=config.env_path, read_dom=False), browsers=config.browsers,
                            more_policies=baseline_policies)  # fmt: skip
        report["baseline"] = {"model_version": base_version, **baseline}
        report["vs_baseline"] = versus(report, baseline)
    if config.sop:
        if config.policy != "model":
            raise SystemExit("--sop measures a model against the experts: it needs --policy model")
        sop = evaluate_sop(path, config.tasks, config.episodes, config.first_seed, config.keep_ratio_override)
        for task, entry in report["tasks"].items():
            entry.update({k: v for k, v in sop["tasks"].get(task, {}).items()})
        report["sop_progress"], report["sop_success"] = sop["sop_progress"], sop["sop_success"]
    out = config.out
    out.mkdir(parents=True, exist_ok=True)
    (out / "eval.json").write_text(json.dumps(report, indent=2))
    k = config.samples
    for task, entry in report["tasks"].items():
        passed = f"  pass@{k} {entry['pass_at_k']:.3f}" if k > 1 else ""
        print(f"{task:24s} {entry['success_rate']:.3f}{passed}  ({entry['episodes']} episodes)")
    print(f"{'mean':24s} {report['mean_success_rate']:.3f}" + (f"  pass@{k} {report['mean_pass_at_k']:.3f}"
                                                                 if k > 1 else ""))  # fmt: skip
    speed = f"{report['episodes_per_s']:.2f} episodes/s, {report['wall_s']:.0f} s"
    print(f"{speed} with {config.browsers} browser(s) on the {config.env_path} path")
    if config.sop:
        print(f"{'sop':24s} progress {report['sop_progress']:.3f}, success {report['sop_success']:.3f}")
    for scope, entry in report.get("vs_baseline", {}).items():
        print(f"vs baseline {scope:20s} {entry['diff']:+.3f} [{entry['ci'][0]:+.3f}, {entry['ci'][1]:+.3f}]")
    return report
