"""`flywheel experiment`: arms trained on the same demonstrations, evaluated side by side.

One JSON file (configs/experiment_*.json) names the demonstrations (a release recipe's collections, collected
or reused exactly as `flywheel release` does), the tasks whose steps are trained on and evaluated, a base
recipe (learner.recipe.VLARecipe) and the arms: each arm overrides model/train settings, may train on a
fraction of the demonstration episodes, and is evaluated at one or more step counts of its run.

    {"demonstrations_from": "configs/vla_release.json", "demonstrations_work": "runs/release",
     "tasks": "tier1", "base": {recipe}, "arms": [{"name": "patch"},
     {"name": "reading", "model": {"encoder": "reading"}, "train": {...}, "fraction": 0.5, "eval_at": [250, 500]}]}

Everything resumes: an arm's training is checkpointed (learner.algorithms.training_run) and each evaluation is kept in
WORK/<arm>/eval-<step>.json, so a re-run only does what is missing. Evaluations at intermediate steps are
snapshots of one cosine schedule (the learning rate has not annealed there). Writes WORK/results.json,
WORK/table.md and WORK/curves.png (success vs training steps, and vs demonstration episodes).
"""

from __future__ import annotations

import glob
import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import polars as pl

from core.console import say
from core.settings import parse_tasks
from flywheel.gathering.evaluation import EVAL_SEED, evaluate_model

DIAGNOSE_EPISODES = 40


@dataclass(frozen=True)
class ExperimentConfig:
    config: Path = Path("configs/experiment_vision.json")
    """The experiment: demonstrations, tasks, base recipe and arms."""
    work: Path = Path("runs/experiment-vision")
    """Checkpoints, bundles, evaluations and the results go here."""
    arms: str = ""
    """Comma-separated arm names to run (empty: all); the table still shows every arm already evaluated."""
    episodes: int = 50
    """Evaluation episodes per task (50 or more for a reported figure)."""
    checkpoints: str = ""
    """A glob of training checkpoints (e.g. 'runs/release/train/snapshots/*.pt'): instead of training arms,
    evaluate each on the experiment's tasks, the steps curve of a run that already happened
    (WORK/checkpoints/, table.md, curves.png)."""
    browsers: int = 1
    """Browsers each evaluation runs in parallel (flywheel.gathering.evaluation; the figures do not depend on it)."""
    diagnose: str = ""
    """A task: instead of training, report for every arm trained to its last step how often, on that task's
    first 40 eval seeds, the encoder's relevance ranks the expert's target patch first / in its top 5, and
    how often the decoded click lands in that patch (where reading fails: finding, or pointing)."""


def merged(base: dict, arm: dict) -> dict:
    """The base recipe with the arm's "model" and "train" sections laid over it."""
    recipe = json.loads(json.dumps(base))
    for section in ("model", "train", "pruning"):
        recipe[section] = {**recipe.get(section, {}), **arm.get(section, {})}
    return recipe


def episode_subset(frame: pl.DataFrame, fraction: float, seed: int) -> pl.DataFrame:
    """The steps of a seeded random `fraction` of the frame's episodes, per task (every task keeps its share)."""
    if fraction >= 1.0:
        return frame
    rng = np.random.default_rng(seed)
    chosen: list[str] = []
    for task in sorted(frame["task"].unique().to_list()):
        episodes = sorted(frame.filter(pl.col("task") == task)["episode_id"].unique().to_list())
        take = max(1, round(fraction * len(episodes)))
        chosen += [episodes[i] for i in rng.choice(len(episodes), size=take, replace=False)]
    return frame.filter(pl.col("episode_id").is_in(chosen))


def run_arm(
    arm: dict, base: dict, frame: pl.DataFrame, tasks: tuple[str, ...], work: Path, episodes: int, browsers: int = 1
) -> list[dict]:
    """Train one arm up to each of its eval_at steps and evaluate there; returns its evaluations in step order."""
    from learner.algorithms.sft import train_vla
    from learner.recipe import VLARecipe

    recipe = VLARecipe.from_dict(merged(base, arm))
    fraction = float(arm.get("fraction", 1.0))
    data = episode_subset(frame, fraction, recipe.train.seed)
    out = work / arm["name"]
    results = []
    for step in sorted(arm.get("eval_at", [recipe.train.steps])):
        eval_path = out / f"eval-{step}.json"
        if eval_path.exists():
            results.append(json.loads(eval_path.read_text()))
            continue
        say(f"arm {arm['name']}: training to step {step} on {data.height} steps "
            f"({data['episode_id'].n_unique()} episodes)")  # fmt: skip
        result = train_vla(data, replace(recipe, train=replace(recipe.train, log_every=50)), out / "train",
                           stop_at=step, progress=_report)  # fmt: skip
        timing_path = out / "training.json"
        timing = json.loads(timing_path.read_text()) if timing_path.exists() else {"wall_s": 0.0, "cpu_s": 0.0}
        timing = {
            "wall_s": timing["wall_s"] + result.wall_s,
            "cpu_s": timing["cpu_s"] + result.cpu_s,
            "parameters": result.num_parameters,
            "last_loss": result.losses[-1] if result.losses else None,
        }
        timing_path.write_text(json.dumps(timing))
        meta = {"arm": arm["name"], "step": step, "fraction": fraction, "group": arm.get("group", arm["name"]),
                "demo_episodes": data["episode_id"].n_unique(), "demo_steps": data.height,
                "batch_size": recipe.train.batch_size, "train_wall_s": round(timing["wall_s"], 1),
                "train_cpu_s": round(timing["cpu_s"], 1), "parameters": timing["parameters"]}  # fmt: skip
        entry = evaluate_model(result.model, result.tokenizer, result.pruning, meta, tasks, episodes, out, browsers)
        results.append(entry)
    return results


def evaluate_checkpoints(pattern: str, tasks: tuple[str, ...], episodes: int, work: Path,
                         browsers: int = 1) -> list[dict]:  # fmt: skip
    """The steps curve of a run that already happened: each training checkpoint matching `pattern` (e.g. a
    release's snapshots) evaluated like an arm, into WORK/checkpoints/eval-<step>.json (resumable)."""
    import torch

    from learner.model.checkpoints import load_vla

    out = work / "checkpoints"
    out.mkdir(parents=True, exist_ok=True)
    by_step = {}
    for path in sorted(Path(p) for p in glob.glob(pattern)):
        by_step[int(torch.load(path, map_location="cpu", weights_only=True)["step"])] = path
    if not by_step:
        raise ValueError(f"no checkpoints match {pattern!r}")
    entries = []
    for step, path in sorted(by_step.items()):
        done = out / f"eval-{step}.json"
        if done.exists():
            entries.append(json.loads(done.read_text()))
            continue
        model, tok, pruning = load_vla(path)
        meta = {"arm": "checkpoints", "step": step, "fraction": 1.0, "group": "checkpoints", "checkpoint": str(path),
                "demo_episodes": 0, "demo_steps": 0, "train_wall_s": 0.0, "train_cpu_s": 0.0,
                "parameters": model.num_parameters()}  # fmt: skip
        entries.append(evaluate_model(model, tok, pruning, meta, tasks, episodes, out, browsers))
    return entries


def _report(p) -> None:  # learner.algorithms.training_run.VLAProgress
    say(f"  step {p.step}/{p.total_steps} loss {p.loss:.3f} (tokens {p.token_nll:.3f}, target patch "
        f"{p.relevance_nll:.2f}) {p.samples_per_s:.1f} samples/s")  # fmt: skip


def table(entries: list[dict]) -> str:
    """Markdown: one row per (arm, step), a column per task, the mean, and what the row cost."""
    tasks = list(entries[0]["tasks"]) if entries else []
    short = [t.removeprefix("miniwob/").removesuffix("-v1") for t in tasks]
    lines = ["| arm | step | demo episodes | " + " | ".join(short) + " | **mean** | train wall | params |",
             "|---" * (len(tasks) + 6) + "|"]  # fmt: skip
    for e in entries:
        cells = " | ".join(f"{e['tasks'][t]:.2f}" for t in tasks)
        # A finished run's checkpoints (--checkpoints) know neither their data nor their training time.
        episodes = e["demo_episodes"] or "-"
        wall = f"{e['train_wall_s'] / 60:.1f} min" if e["train_wall_s"] else "-"
        lines.append(f"| {e['arm']} | {e['step']} | {episodes} | {cells} | **{e['mean']:.3f}** | {wall} | "
                     f"{e['parameters'] / 1e6:.2f} M |")  # fmt: skip
    return "\n".join(lines)


def plot_curves(path: Path, entries: list[dict]) -> None:
    """Mean success vs training steps (a line per arm) and vs demonstration episodes (a line per group)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_step, by_data) = plt.subplots(1, 2, figsize=(11, 4))
    for arm in dict.fromkeys(e["arm"] for e in entries):
        points = sorted((e["step"], e["mean"]) for e in entries if e["arm"] == arm)
        by_step.plot(*zip(*points, strict=True), marker="o", label=arm)
    for group in dict.fromkeys(e["group"] for e in entries):
        final = {}
        for e in entries:
            if e["group"] == group and e["step"] >= final.get(e["arm"], {"step": -1})["step"]:
                final[e["arm"]] = e
        points = sorted((e["demo_episodes"], e["mean"]) for e in final.values())
        if len(points) > 1:
            by_data.plot(*zip(*points, strict=True), marker="o", label=group)
    for ax, xlabel in ((by_step, "training steps"), (by_data, "demonstration episodes")):
        ax.set_xlabel(xlabel)
        ax.set_ylabel("mean success")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def pointing_diagnostic(arm_dir: Path, task: str, episodes: int) -> dict:
    """Relevance top-1 / top-5 hit rate of the target patch and decoded-click-in-target-patch rate (see diagnose)."""
    import torch

    from edge_client.env import GuiEnv
    from edge_client.experts import expert_for
    from learner.model.checkpoints import CHECKPOINT_NAME, load_vla
    from learner.model.vla import target_patch_index
    from policy.runtime import VLARuntime
    from policy.screen import screenshot_to_chw
    from policy.tokens import char_ids

    model, tok, _ = load_vla(arm_dir / "train" / CHECKPOINT_NAME)
    last = max(int(p.stem.split("-")[1]) for p in arm_dir.glob("model-*.vla"))
    runtime = VLARuntime(arm_dir / f"model-{last}.vla")
    cfg, first, top5, clicked = model.cfg, 0, 0, 0
    with GuiEnv(task) as env:
        for i in range(episodes):
            obs = env.reset(seed=EVAL_SEED + i, task=task)
            target = expert_for(task).act(obs).action
            patch = target_patch_index(target.x, target.y, cfg.patch_px)
            instruction = tok.instruction_ids(obs.instruction, cfg.max_instruction_tokens)
            with torch.inference_mode():
                chars = torch.tensor([char_ids(obs.instruction, cfg.max_instruction_chars)])
                image = torch.from_numpy(screenshot_to_chw(obs.screenshot)[None])
                encoded = model.encode(image, torch.tensor([instruction or [0]]), chars)
            ranked = encoded.relevance[0].topk(5).indices.tolist()
            first, top5 = first + (ranked[0] == patch), top5 + (patch in ranked)
            action = tok.parse(runtime.step(obs.screenshot, obs.instruction, None)[0].ids).action
            clicked += action.type == "click" and target_patch_index(action.x, action.y, cfg.patch_px) == patch
    return {"arm": arm_dir.name, "step": last, "task": task, "episodes": episodes, "relevance_top1": first / episodes,
            "relevance_top5": top5 / episodes, "click_in_target_patch": clicked / episodes}  # fmt: skip


def run_experiment(config: ExperimentConfig, demonstrations: Callable[[dict, Path], pl.DataFrame]) -> list[dict]:
    """`demonstrations(recipe, work)`: the demonstration steps a release recipe names, collected into work (or
    reused) exactly as `flywheel release` does (flywheel.run.release.recipe_demonstrations)."""
    spec = json.loads(config.config.read_text())
    if config.diagnose:
        arms = [config.work / a["name"] for a in spec["arms"] if any((config.work / a["name"]).glob("model-*.vla"))]
        found = [pointing_diagnostic(arm, config.diagnose, DIAGNOSE_EPISODES) for arm in arms]
        (config.work / f"diagnose-{config.diagnose}.json").write_text(json.dumps(found, indent=2))
        for d in found:
            print(
                f"{d['arm']:32s} @ {d['step']}: relevance top-1 {d['relevance_top1']:.2f}, top-5 "
                f"{d['relevance_top5']:.2f}; decoded click in the target patch {d['click_in_target_patch']:.2f}"
            )
        return found
    if config.checkpoints:
        entries = evaluate_checkpoints(config.checkpoints, parse_tasks(spec["tasks"]), config.episodes, config.work,
                                       config.browsers)  # fmt: skip
        (config.work / "checkpoints" / "results.json").write_text(json.dumps({"results": entries}, indent=2))
        (config.work / "checkpoints" / "table.md").write_text(table(entries) + "\n")
        plot_curves(config.work / "checkpoints" / "curves.png", entries)
        print(table(entries))
        return entries
    source = json.loads(Path(spec["demonstrations_from"]).read_text())
    tasks = parse_tasks(spec["tasks"])
    frame = demonstrations(source, Path(spec["demonstrations_work"])).filter(pl.col("task").is_in(list(tasks)))
    if frame.is_empty():
        raise ValueError(f"no demonstration steps of {tasks} in {spec['demonstrations_work']}")
    wanted = {a for a in config.arms.split(",") if a}
    unknown = wanted - {a["name"] for a in spec["arms"]}
    if unknown:
        raise ValueError(f"no arms named {sorted(unknown)} in {config.config}")
    entries: list[dict] = []
    for arm in spec["arms"]:
        if not wanted or arm["name"] in wanted:
            entries += run_arm(arm, spec["base"], frame, tasks, config.work, config.episodes, config.browsers)
        else:  # not run now: its finished evaluations still belong in the table
            entries += [json.loads(p.read_text()) for p in sorted((config.work / arm["name"]).glob("eval-*.json"))]
    entries.sort(key=lambda e: ([a["name"] for a in spec["arms"]].index(e["arm"]), e["step"]))
    config.work.mkdir(parents=True, exist_ok=True)
    (config.work / "results.json").write_text(json.dumps({"config": spec, "results": entries}, indent=2))
    (config.work / "table.md").write_text(table(entries) + "\n")
    plot_curves(config.work / "curves.png", entries)
    print(table(entries))
    return entries
