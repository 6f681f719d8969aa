"""Every evaluation of a policy goes through here: a policy run in the GUI environment, greedily on held-out seeds.

* `evaluate_bundle` / `evaluate_model`: greedy success per task on seeds EVAL_SEED.. (edge_client.evaluate, as
  at the edge: onnxruntime, parallel browsers), with each seed's outcome for paired comparisons;
* `compare_versions`: two versions on the same seeds, the paired difference with its CI (`greedy_success` one
  version, `paired_difference` any two of them);
* `evaluate_sop`: SOP, the model replaying the experts' trajectories until its first mismatch;
* `run_eval`: the `flywheel eval` command (a model or the experts);
* `run_episodes`: the episodes behind the rest of the experiments (demonstrations, the logged fleet, online
  rounds, SOP's expert trajectories), recorded as the pipeline would write and score them.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import polars as pl

from core.console import say
from core.settings import EVAL_SEED, TIER1_TASKS, TIER2_TASKS, Settings
from core.stats import paired_diff_ci


# evaluate() takes plain arguments; the command's settings (which policy to load, where the report goes) are here.
@dataclass(frozen=True)
class EvalConfig:
    """`flywheel eval`: which policy, on which tasks and seeds."""

    out: Path
    """eval.json goes here."""
    model: str = "latest"
    """Model file, version id, 'latest' or 'release' (the committed VLA)."""
    policy: Literal["model", "expert"] = "model"
    """'model' (the one --model names) or 'expert' (the scripted DOM experts)."""
    tasks: tuple[str, ...] = TIER1_TASKS
    """MiniWoB++ task ids and/or 'tier1', 'tier2', 'suite'."""
    episodes: int = 50
    """Episodes per task."""
    seed: int = EVAL_SEED
    """Seed of each task's first episode (training runs use small seeds)."""
    threads: int = 1
    """Intra-op threads of the model."""
    keep_ratio: float | None = None
    """VLA: visual-token keep ratio (None: the bundle's)."""
    browsers: int = 1
    """Browsers in parallel (threads, one model session each); the report is the same for any number."""
    env_path: Literal["fast", "previous"] = "fast"
    """Environment path: 'fast' or 'previous' (miniwob's own reset and step, to compare; same outcomes)."""
    baseline: str = ""
    """A second model (as --model names one) run on the same tasks and seeds: eval.json gains `baseline` and
    `vs_baseline`, model - baseline paired on those seeds with its 95 % CI, over all tasks, per tier and per task."""
    sop: bool = False
    """Also SOP (semi-online performance): the experts record their trajectories on the same tasks and seeds
    and the model replays each until its first mismatch: sop_progress and sop_success per task and mean."""


def evaluate_bundle(bundle: Path, version: str, tasks: tuple[str, ...], episodes: int | dict[str, int],
                    browsers: int = 1, seed: int = EVAL_SEED) -> dict:  # fmt: skip
    """A model bundle run greedily by onnxruntime, as at the edge, on seeds seed.. (edge_client.evaluate's report)."""
    from edge_client.env import EnvConfig
    from edge_client.evaluate import evaluate
    from policy.runtime import VLAPolicy

    def policies():  # one model session per browser
        policy = VLAPolicy(bundle, version)
        return lambda _task: policy

    return evaluate(policies(), tasks, episodes, seed=seed, env_config=EnvConfig(read_dom=False), browsers=browsers,
                    more_policies=policies)  # fmt: skip


def evaluate_model(model, tok, pruning, meta: dict, tasks: tuple[str, ...], episodes: int | dict[str, int], out: Path,
                   browsers: int = 1, seed: int = EVAL_SEED) -> dict:  # fmt: skip
    """Export `model` to OUT/model-<step>.vla, evaluate it greedily on seeds seed.. (the held-out seeds unless
    told otherwise; `episodes` per task, or a count for each), write OUT/eval-<step>.json.

    `meta`: the entry's arm, step, group, data and training figures; the evaluation adds the rest, with each
    task's `success_by_seed` (episode i on seed + i) for paired comparisons."""
    from learner.vla_export import export_bundle

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


def compare_versions(first: dict, last: dict, tasks: tuple[str, ...], episodes: int, browsers: int) -> dict:
    """Two published versions ({"model_version", "bundle"}), greedy on the same held-out seeds (`episodes` per
    task): their success and the paired difference last - first with its 95 % bootstrap CI."""
    ends = {}
    for which, version in (("first", first), ("last", last)):
        say(f"greedy: {which} version {version['model_version']} on {episodes} held-out seeds per task")
        ends[which] = greedy_success(version, tasks, episodes, browsers)
    return {"first": ends["first"], "last": ends["last"], **paired_difference(ends["last"], ends["first"])}


def greedy_success(version: dict, tasks: tuple[str, ...], episodes: int, browsers: int) -> dict:
    """A model bundle ({"model_version", "bundle"}) greedy on `episodes` held-out seeds per task: its mean success,
    each task's, and each seed's outcome (for paired comparisons)."""
    report = evaluate_bundle(Path(version["bundle"]), version["model_version"], tasks, episodes, browsers)
    return {"model_version": version["model_version"], "success_rate": round(report["mean_success_rate"], 4),
            "per_task": {t: round(r["success_rate"], 4) for t, r in report["tasks"].items()},
            "success_by_seed": {t: [e == "success" for e in r["termination_by_seed"]]
                                for t, r in report["tasks"].items()}}  # fmt: skip


def paired_difference(after: dict, before: dict) -> dict:
    """after - before, two greedy_success results on the same seeds: the difference with its 95 % bootstrap CI."""
    diff, lo, hi = paired_diff_ci(after["success_by_seed"], before["success_by_seed"])
    episodes = min(len(seeds) for seeds in after["success_by_seed"].values())
    return {"diff": round(diff, 4), "ci": [round(lo, 4), round(hi, 4)], "episodes_per_task": episodes,
            "seeds": [EVAL_SEED, EVAL_SEED + episodes - 1]}  # fmt: skip


def expert_trajectories(env, tasks: tuple[str, ...], episodes: int, seed: int, max_steps: int = 12) -> pl.DataFrame:
    """The experts' successful episodes on seeds seed .. seed + episodes - 1 of every task, as step rows
    (learner.semi_online.TRAJECTORY_COLUMNS): the screens, actions and element boxes a model is matched on."""
    from edge_client.env import task_name
    from edge_client.experts import expert_for

    frames = []
    for task in tasks:
        frame, _ = run_episodes(env, expert_for, [task_name(task)], range(seed, seed + episodes), 1, "expert",
                                "sop", max_steps)  # fmt: skip
        frames.append(frame.filter(pl.col("success")))
    return pl.concat(frames)


def record_expert_trajectories(tasks: tuple[str, ...], episodes: int, seed: int) -> pl.DataFrame:
    """expert_trajectories in a browser of its own (opened and closed here): what SOP replays."""
    from edge_client.env import GuiEnv

    env = GuiEnv(tasks[0])
    try:
        say(f"sop: the experts record {episodes} trajectories per task on {len(tasks)} tasks")
        return expert_trajectories(env, tasks, episodes, seed)
    finally:
        env.close()


def evaluate_sop(bundle: str | Path, tasks: tuple[str, ...], episodes: int, seed: int,
                 keep_ratio: float | None = None) -> dict:  # fmt: skip
    """{"tasks": {task: {"sop_progress", "sop_success", "trajectories"}}, "sop_progress", "sop_success"}."""
    from learner.semi_online import sop
    from policy.runtime import VLARuntime

    return sop(VLARuntime(bundle, keep_ratio=keep_ratio), record_expert_trajectories(tasks, episodes, seed))


def run_eval(config: EvalConfig, settings: Settings) -> dict:
    """`flywheel eval`: the policy on every task's seeds, greedy; OUT/eval.json, printed per task."""
    from edge_client.env import EnvConfig
    from edge_client.evaluate import evaluate

    if config.policy == "expert":
        from edge_client.experts import expert_for

        def policies():
            return expert_for
    else:
        from policy.runtime import load_policy
        from registry.store import resolve_model

        path, version = resolve_model(config.model, settings.artifacts_dir)

        def policies():
            model = load_policy(path, version, intra_op_threads=config.threads, keep_ratio=config.keep_ratio)
            return lambda _task: model

    def progress(task, index, result) -> None:
        if (index + 1) % 10 == 0 or index + 1 == config.episodes:
            print(f"  {task}: {index + 1}/{config.episodes}", file=sys.stderr, flush=True)

    report = evaluate(policies(), config.tasks, config.episodes, seed=config.seed, progress=progress,
                      env_config=EnvConfig(path=config.env_path, read_dom=config.policy == "expert"),
                      browsers=config.browsers,
                      more_policies=policies)  # fmt: skip
    report["env_path"] = config.env_path
    if config.baseline:
        from policy.runtime import load_policy
        from registry.store import resolve_model

        base_path, base_version = resolve_model(config.baseline, settings.artifacts_dir)

        def baseline_policies():
            model = load_policy(base_path, base_version, intra_op_threads=config.threads, keep_ratio=config.keep_ratio)
            return lambda _task: model

        say(f"baseline {base_version} on the same seeds")
        baseline = evaluate(baseline_policies(), config.tasks, config.episodes, seed=config.seed,
                            env_config=EnvConfig(path=config.env_path, read_dom=False), browsers=config.browsers,
                            more_policies=baseline_policies)  # fmt: skip
        report["baseline"] = {"model_version": base_version, **baseline}
        report["vs_baseline"] = versus(report, baseline)
    if config.sop:
        if config.policy != "model":
            raise SystemExit("--sop measures a model against the experts: it needs --policy model")
        sop = evaluate_sop(path, config.tasks, config.episodes, config.seed, config.keep_ratio)
        for task, entry in report["tasks"].items():
            entry.update({k: v for k, v in sop["tasks"].get(task, {}).items()})
        report["sop_progress"], report["sop_success"] = sop["sop_progress"], sop["sop_success"]
    out = config.out
    out.mkdir(parents=True, exist_ok=True)
    (out / "eval.json").write_text(json.dumps(report, indent=2))
    for task, entry in report["tasks"].items():
        print(f"{task:24s} {entry['success_rate']:.3f}  ({entry['episodes']} episodes)")
    print(f"{'mean':24s} {report['mean_success_rate']:.3f}")
    speed = f"{report['episodes_per_s']:.2f} episodes/s, {report['wall_s']:.0f} s"
    print(f"{speed} with {config.browsers} browser(s) on the {config.env_path} path")
    if config.sop:
        print(f"{'sop':24s} progress {report['sop_progress']:.3f}, success {report['sop_success']:.3f}")
    for scope, entry in report.get("vs_baseline", {}).items():
        print(f"vs baseline {scope:20s} {entry['diff']:+.3f} [{entry['ci'][0]:+.3f}, {entry['ci'][1]:+.3f}]")
    return report


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


# The experiments' episodes as rows, as the pipeline would write and score them (processors.table_rows, scoring).
COLUMNS = ["episode_id", "step", "task", "instruction", "screenshot", "thought", "action_type", "x", "y",
           "text", "key", "tokens", "token_logprobs", "seed", "model_version", "purpose", "weight", "score",
           "success", "target_box", "verify_ok", "temperature", "top_k", "teacher_action_type",
           "teacher_action_x", "teacher_action_y", "teacher_action_text", "teacher_action_key", "teacher_thought",
           "teacher_box"]  # fmt: skip


def episode_rows(result, episode_id: str, version: str) -> list[dict]:
    """The rows (COLUMNS) of one episode run by edge_client.episode, as the pipeline would write and score them."""
    from edge_client.runner import step_event
    from processors.scoring import EpisodeProgress, score_episode
    from processors.table_rows import step_row

    events = [step_event(r, "curriculum", episode_id, result.task, result.seed, version) for r in result.records]
    progress = EpisodeProgress()
    for event in events:
        progress.add(event)
    scored = score_episode(events[-1], progress)
    purpose = "demo" if version == "expert" else ("success" if scored.success else "failure")
    extra = {"purpose": purpose, "weight": 1.0, "score": scored.score, "success": scored.success}
    return [{k: v for k, v in step_row(e, 0, 0).items() if k in COLUMNS} | extra for e in events]


def to_frame(rows: list[dict]) -> pl.DataFrame:
    from learner.training_tables import ROLLOUT_TYPES

    types = ROLLOUT_TYPES | {"target_box": pl.List(pl.Float32), "verify_ok": pl.Boolean, "x": pl.Float64,
                             "y": pl.Float64, "score": pl.Float64, "weight": pl.Float64, "temperature": pl.Float64,
                             "top_k": pl.Int32, "teacher_action_type": pl.String, "teacher_action_x": pl.Float64,
                             "teacher_action_y": pl.Float64, "teacher_action_text": pl.String,
                             "teacher_action_key": pl.String, "teacher_thought": pl.String,
                             "teacher_box": pl.List(pl.Float32)}  # fmt: skip
    return pl.DataFrame(rows, schema_overrides=types, infer_schema_length=None).select(COLUMNS)


def run_episodes(env, policy_for, tasks, seeds, repeats: int, version: str, tag: str, max_steps: int, teacher=None):
    """(rows frame, env steps): every task x seed x repeat through the fleet's loop; `teacher` (edge_client.teacher)
    labels the screens its rule picks, as at the edge."""
    from edge_client.episode import run_episode

    rows, env_steps = [], 0
    for task in tasks:
        for seed in seeds:
            for r in range(repeats):
                result = run_episode(env, policy_for(task), task, seed, max_steps, teacher=teacher)
                env_steps += result.steps
                rows += episode_rows(result, f"{tag}-{task}-{seed}-{r}", version)
    return to_frame(rows), env_steps


def sampling_policy(model, tok, pruning, version: str, bundle: Path, temperature: float, top_k: int, seed: int):
    """The model exported to `bundle` and run by onnxruntime as at the edge, sampling."""
    from learner.vla_export import export_bundle
    from policy.runtime import VLAPolicy
    from policy.sampling import Sampling

    export_bundle(model, tok, pruning, bundle)
    return VLAPolicy(bundle, version, sampling=Sampling(temperature, top_k, seed=seed))
