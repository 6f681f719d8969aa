"""`flywheel bench learner`: samples/s of each learner update, FLOPs per sample and the share of this CPU's
fp32 ceiling it reaches, per recipe and thread count, side by side in one run.

    sft          one SFT step (learner.algorithms.sft.train_vla): forward, loss, backward, AdamW (a click-map recipe's
                 full step: encoder, map and decoder)
    sft_clicks   one SFT step on click steps alone: a click-map recipe's map-only step (encoder and map, no
                 decoder pass: VLATrainConfig.map_only_fraction), any other recipe's full step on those steps
    offline_rl   one offline RL step (learner.algorithms.offline_rl): AWR on a batch + trajectory DPO with its reference
    ppo          one PPO update over a batch of rollouts (learner.algorithms.online_rl.ppo_update, RefKL: with the
                 reference model's forward)
    semi_online  one semi-online round (learner.algorithms.semi_online): the model's rollouts over expert trajectories
    in
                 onnxruntime, then its PPO update

Data (untimed, made once): expert demonstrations on the `workload` through the fast environment path, a short SFT
per recipe, and that model's sampled rollouts (GRPO groups), all as the rows the pipeline would write.
Timing: each update runs `warmup` steps, then `timed_steps` timed steps in a fresh call that resumes from the
warm-up's checkpoint (model, optimizer and sampler as they were), so what is timed is training alone (the
dataset decode and model load happen before a run's clock starts). SFT is also split into phases (data,
forward, backward, optimizer) by wrapping those calls.

FLOPs per sample are counted by torch.utils.flop_counter (matmuls, convolutions, attention; forward and
backward; the reference forward in ppo) over exactly the timed steps, replayed from a copy of the warmed-up
run; semi_online's training is a RefKL PPO update (its figure), its rollouts are onnxruntime's, not counted.
The fp32 ceiling is measured on this machine: a 2048 x 2048 fp32 matmul at the same thread count (what the BLAS
reaches here), with the theoretical peak from the CPU's vector width and clock beside it.
Results: DIR/learner_bench.json.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from core.machine import machine
from core.settings import Settings
from flywheel.bench.env import WORKLOAD, Profiler
from flywheel.gathering.episodes import run_episodes

UPDATES = ("sft", "sft_clicks", "offline_rl", "ppo", "semi_online")


@dataclass(frozen=True)
class LearnerBenchConfig:
    out: Path
    """learner_bench.json goes here."""
    recipes: str = "demo,release_pointer,release"
    """Comma-separated recipes (learner.recipe.VLARecipe: names in configs/ or paths); 'release-patch' is the
    first release's patch-encoder recipe (release/manifest.json), the one trained at 49 samples/s; 'release_pointer'
    the reading + pointer recipe the click map replaced."""
    thread_counts: str = "1,2"
    """Comma-separated torch thread counts, each timed."""
    updates: str = ",".join(UPDATES)
    """Comma-separated updates to time (of sft, offline_rl, ppo, semi_online)."""
    workload: tuple[str, ...] = WORKLOAD
    """Tasks of the demonstrations and rollouts (the env bench's)."""
    demos_per_task: int = 20
    """Expert demonstrations per task."""
    timed_steps: int = 12
    """Timed optimizer steps of sft and offline_rl (ppo and semi_online: one update or round each)."""
    warmup: int = 3
    """Untimed steps (or one untimed update) before each timed run."""
    seed: int = 0
    """Seeds the demonstrations, the short SFT and the rollouts' sampling."""
    step_variants: str = "eager,bf16"
    """The SFT step of each recipe also run these ways on the same batches, from the same weights: 'eager'
    (as trained today), 'bf16' (autocast to bfloat16, AMX where the CPU has it), 'compile' (torch.compile;
    minutes of compilation first)."""


@dataclass
class BenchData:
    demos: Any  # pl.DataFrame: expert demonstrations
    rollouts: Any  # pl.DataFrame: the short SFT's sampled rollouts, GRPO groups
    sft_checkpoint: Path
    recipe: Any  # VLARecipe


def collect_demos(tasks: tuple[str, ...], per_task: int, seed: int):
    from edge_client.env import GuiEnv
    from edge_client.experts import expert_for

    with GuiEnv(tasks[0]) as env:
        demos, _ = run_episodes(env, expert_for, tasks, range(seed, seed + per_task), 1, "expert", "demo", 10)
    return demos


def prepare(recipe_name: str, demos, config: LearnerBenchConfig, work: Path) -> BenchData:
    """A short SFT of the recipe on the demonstrations, and its sampled rollouts (4 per seed, 2 seeds a task)."""
    from edge_client.env import EnvConfig, GuiEnv
    from learner.algorithms.sft import train_vla
    from learner.model.export import export_bundle
    from policy.runtime import VLAPolicy
    from policy.sampling import Sampling

    recipe = load_recipe(recipe_name)
    train = replace(recipe.train, steps=30, warmup_steps=5, checkpoint_every=0, snapshot_every=0)
    sft = train_vla(demos, replace(recipe, train=train), work / "sft")
    bundle = export_bundle(sft.model, sft.tokenizer, sft.pruning, work / "sft.vla")
    policy = VLAPolicy(bundle, "bench-sft", sampling=Sampling(1.0, 5, seed=config.seed))
    with GuiEnv(config.workload[0], EnvConfig(read_dom=False)) as env:
        rollouts, _ = run_episodes(env, lambda _task: policy, config.workload, range(500_000, 500_002), 4, "bench-sft",
                                   "rollout", 10)  # fmt: skip
    return BenchData(demos, rollouts, sft.checkpoint_path, recipe)


def load_recipe(name: str):
    from learner.recipe import VLARecipe

    if name != "release-patch":
        return VLARecipe.load(name, progress_bar=False)
    from registry.store import RELEASE_DIR

    raw = json.loads((RELEASE_DIR / "manifest.json").read_text())["config"]
    return VLARecipe.from_dict(raw, progress_bar=False)


def update_runner(update: str, data: BenchData, train, out: Path) -> Callable[[int], tuple[Any, dict]]:
    """steps -> (the VLAResult of running `update` up to that many steps, its extra figures)."""
    import polars as pl

    from learner.algorithms.offline_rl import OfflineRLConfig, train_offline_rl
    from learner.algorithms.online_rl import OnlineRLConfig, ppo_update
    from learner.algorithms.semi_online import SemiOnlineConfig, semi_online_update
    from learner.algorithms.sft import train_vla

    sft = str(data.sft_checkpoint)
    if update == "sft":  # the full step: no map-only steps, whatever the recipe's share of them
        recipe = replace(data.recipe, train=replace(train, map_only_fraction=0.0))
        return lambda stop: (train_vla(data.demos, recipe, out, init_checkpoint=sft, stop_at=stop), {})
    if update == "sft_clicks":  # every step map-only on a click-map recipe (a full step on any other)
        recipe = replace(data.recipe, train=replace(train, map_only_fraction=1.0))
        clicks = data.demos.filter(pl.col("action_type") == "click")
        return lambda stop: (train_vla(clicks, recipe, out, init_checkpoint=sft, stop_at=stop), {})
    if update == "offline_rl":
        logged = pl.concat([data.demos, data.rollouts])
        return lambda stop: (train_offline_rl(logged, train, OfflineRLConfig(), sft, out, stop_at=stop), {})
    if update == "ppo":
        # Every step of the update timed: the target-KL stop is a training choice, not a cost.
        rl = OnlineRLConfig(guidance="refkl", target_kl=0.0)
        return lambda _stop: (ppo_update(data.rollouts, train, rl, sft, sft, out), {})
    if update == "semi_online":
        # Multi-step trajectories: a round over one-step ones would be a handful of one-step rollouts.
        steps = data.demos.group_by("episode_id").len().filter(pl.col("len") > 1)["episode_id"].to_list()[:16]
        trajectories = data.demos.filter(pl.col("episode_id").is_in(steps))
        return lambda _stop: semi_online_update(trajectories, train, SemiOnlineConfig(top_k=5), sft, sft, out)
    raise ValueError(f"unknown update {update!r}; the updates are {', '.join(UPDATES)}")


def time_update(update: str, data: BenchData, threads: int, config: LearnerBenchConfig, work: Path) -> dict:
    """samples/s of `steps` steps of `update` after `warmup` untimed ones, and the FLOPs of exactly those steps:
    counted on a copy of the warmed-up run, whose seeded sampler draws the same batches and keep ratios."""
    from torch.utils.flop_counter import FlopCounterMode

    train = replace(data.recipe.train, num_threads=threads, steps=100_000, warmup_steps=10, checkpoint_every=0,
                    snapshot_every=0, progress_bar=False)  # fmt: skip
    out, counted = work / f"{update}-{threads}", work / f"{update}-{threads}-flops"
    update_runner(update, data, train, out)(config.warmup)  # untimed; leaves a checkpoint to resume from
    shutil.copytree(out, counted)
    profiler = Profiler()
    with phases(profiler) if update.startswith("sft") else nullcontext():
        started = time.perf_counter()
        result, extra = update_runner(update, data, train, out)(config.warmup + config.timed_steps)
        wall = time.perf_counter() - started
    flops = None
    if update != "semi_online":  # its ONNX export cannot run under the counter; its update is a ppo one
        counter = FlopCounterMode(display=False)
        with counter:
            update_runner(update, data, train, counted)(config.warmup + config.timed_steps)
        flops = counter.get_total_flops()
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(counted, ignore_errors=True)
    samples = len(result.losses) * train.batch_size
    # A semi-online round is its rollouts and its update: its rate is over the whole round.
    rate = samples / wall if update == "semi_online" else result.samples_per_s
    figures = {"samples_per_s": round(rate, 2), "optimizer_steps": len(result.losses), "samples": samples,
               "wall_s": round(wall, 2), "train_wall_s": round(result.wall_s, 2),
               "final_loss": round(result.losses[-1], 4) if result.losses else None,
               "gflop_per_sample": round(flops / samples / 1e9, 4) if flops and samples else None}  # fmt: skip
    if "rollout_steps" in extra:  # a semi-online round: its simulated rollouts, and what survived its filter
        figures |= {"rollout_steps_per_s": round(extra["rollout_steps"] / wall, 2), **extra}
    if update.startswith("sft") and result.losses:
        figures["phases_ms_per_step"] = {k: round(v / len(result.losses), 2) for k, v in profiler.ms.items()}
    return figures


@contextmanager
def phases(profiler: Profiler):
    """An SFT step's phases: the batch (data), the model's forward, the loss, backward and the AdamW step."""
    import torch

    from learner.algorithms import sft
    from learner.data import dataset
    from learner.model import vla

    wrapped = [(dataset.VLADataset, "batch", "data"), (vla.VLA, "forward", "forward"), (sft, "sft_loss", "loss"),
               (torch.Tensor, "backward", "backward"), (torch.optim.AdamW, "step", "optimizer")]  # fmt: skip
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in wrapped]
    for owner, name, phase in wrapped:
        profiler.wrap(owner, name, phase)
    try:
        yield
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)


def sft_step_variants(data: BenchData, threads: int, variants: list[str], steps: int) -> dict:
    """samples/s of the recipe's SFT step done `variants` ways: the same batches (one keep ratio, the recipe's
    first), the same starting weights, `steps` timed steps after 2 untimed; and each way's loss at the end."""
    import numpy as np
    import torch

    from learner.algorithms.sft import sft_loss
    from learner.data.dataset import VLADataset
    from learner.model.checkpoints import load_vla
    from policy.pruning import keep_count

    torch.set_num_threads(threads)
    model, tok, pruning = load_vla(data.sft_checkpoint)
    dataset = VLADataset(data.demos, tok, model.cfg, pruning)
    rng = np.random.default_rng(0)
    batches = [dataset.batch(rng.integers(0, len(dataset), size=data.recipe.train.batch_size))
               for _ in range(steps + 2)]  # fmt: skip
    keep = keep_count(model.cfg.num_patches, data.recipe.train.keep_ratios[0])
    out = {}
    for variant in variants:
        net, _, _ = load_vla(data.sft_checkpoint)
        net.train()
        optimizer = torch.optim.AdamW(net.parameters(), lr=data.recipe.train.lr)
        forward = torch.compile(net, dynamic=True) if variant == "compile" else net
        bf16 = variant == "bf16"
        autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if bf16 else nullcontext
        started, losses = time.perf_counter(), []
        for i, batch in enumerate(batches):
            if i == 2:  # after the untimed steps (and compilation)
                warm_s, started = time.perf_counter() - started, time.perf_counter()
            with autocast():
                logits, relevance, click_map = forward(batch["image"], batch["prior"], batch["instruction_ids"],
                                                       batch["instruction_chars"], batch["text_ids"], keep)  # fmt: skip
                click_map = click_map.float() if click_map is not None else None
                total, _, _ = sft_loss(net, logits.float(), relevance.float(), click_map, batch, data.recipe.train)
            optimizer.zero_grad(set_to_none=True)
            total.backward()
            optimizer.step()
            losses.append(total.item())
        wall = time.perf_counter() - started
        out[variant] = {"samples_per_s": round(steps * data.recipe.train.batch_size / wall, 2),
                        "untimed_s": round(warm_s, 1), "final_loss": round(losses[-1], 4)}  # fmt: skip
        print(f"  sft step, {variant:8s} {threads} thread(s): {out[variant]['samples_per_s']:8.2f} samples/s, "
              f"loss after {len(losses)} steps {out[variant]['final_loss']}", flush=True)  # fmt: skip
    return out


def run_bench(config: LearnerBenchConfig) -> dict:
    import torch

    from learner.model.ceiling import fp32_ceiling

    config.out.mkdir(parents=True, exist_ok=True)
    threads = [int(t) for t in config.thread_counts.split(",") if t]
    report: dict[str, Any] = {
        "config": {**asdict(config), "out": str(config.out)},
        "machine": {
            **machine(),
            "torch": torch.__version__,
            "mkldnn": torch.backends.mkldnn.is_available(),
            "blas": torch.backends.mkl.is_available() and "mkl" or "other",
        },  # fmt: skip
        "ceilings": {str(t): fp32_ceiling(t) for t in threads},
        "recipes": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        demos = collect_demos(config.workload, config.demos_per_task, config.seed)
        report["demos"] = {"episodes": demos["episode_id"].n_unique(), "steps": demos.height}
        for name in [r for r in config.recipes.split(",") if r]:
            data = prepare(name, demos, config, work / name)
            entry: dict[str, Any] = {"batch_size": data.recipe.train.batch_size, "updates": {}}
            for update in [u for u in config.updates.split(",") if u]:
                entry["updates"][update] = {}
                for t in threads:
                    figures = time_update(update, data, t, config, work / name)
                    if figures["gflop_per_sample"] is None and update == "semi_online":
                        # Its training is a RefKL PPO update (rollouts in onnxruntime, which torch does not count).
                        ppo = entry["updates"].get("ppo", {}).get(str(t), {})
                        figures["gflop_per_sample"] = ppo.get("gflop_per_sample")
                    achieved = (figures["gflop_per_sample"] or 0.0) * figures["samples_per_s"]
                    ceiling = report["ceilings"][str(t)]
                    figures |= {"gflops": round(achieved, 2),
                                "of_matmul_ceiling": round(achieved / ceiling["matmul_gflops"], 3),
                                "of_theoretical_peak": round(achieved / ceiling["theoretical_gflops"], 3)
                                if ceiling["theoretical_gflops"] else None}  # fmt: skip
                    entry["updates"][update][str(t)] = figures
                    print(format_line(name, update, t, figures), flush=True)
            entry["recipe_sft_samples_per_s"] = recipe_rate(data.recipe.train.map_only_fraction, entry["updates"])
            variants = [v for v in config.step_variants.split(",") if v]
            if variants:
                entry["sft_step_variants"] = {str(t): sft_step_variants(data, t, variants, config.timed_steps)
                                              for t in threads}  # fmt: skip
            report["recipes"][name] = entry
            (config.out / "learner_bench.json").write_text(json.dumps(report, indent=2))
    (config.out / "learner_bench.json").write_text(json.dumps(report, indent=2))
    return report


def recipe_rate(map_only_fraction: float, updates: dict) -> dict:
    """Samples/s of the recipe's SFT as it trains, per thread count: its map-only share of steps at the sft_clicks
    rate, the rest at the full step's (the harmonic mix); only where both were timed."""
    full, clicks, f = updates.get("sft", {}), updates.get("sft_clicks", {}), map_only_fraction
    return {t: round(1 / ((1 - f) / r["samples_per_s"] + (f / clicks[t]["samples_per_s"] if f else 0.0)), 2)
            for t, r in full.items() if not f or t in clicks}  # fmt: skip


def format_line(recipe: str, update: str, threads: int, figures: dict) -> str:
    line = (f"{recipe:14s} {update:12s} {threads} thread(s): {figures['samples_per_s']:8.2f} samples/s "
            f"{figures['gflop_per_sample']:7.3f} GFLOP/sample {figures['gflops']:7.2f} GFLOP/s "
            f"({100 * figures['of_matmul_ceiling']:.1f}% of the matmul ceiling)")  # fmt: skip
    if "rollout_steps_per_s" in figures:
        line += f" | rollouts {figures['rollout_steps_per_s']} steps/s, {figures['trained_steps']} trained"
    if "phases_ms_per_step" in figures:
        line += " | ms/step: " + " ".join(f"{k} {v}" for k, v in figures["phases_ms_per_step"].items())
    return line


def command(config: LearnerBenchConfig, settings: Settings) -> int:
    """`flywheel bench learner`."""
    run_bench(config)
    print(f"wrote {config.out / 'learner_bench.json'}")
    return 0
