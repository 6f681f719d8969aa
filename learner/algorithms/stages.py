"""The one dispatcher of the curriculum's stages: the learner daemon (learner.daemon.loop) and the experiment
(flywheel.experiments.arms) both train every stage through `run_stage`, so a stage means one thing in both.

    sft                 imitation of the demonstrations (learner.algorithms.sft)
    offline_rl          AWR + DPO on the logged successes and failures (learner.algorithms.offline_rl)
    online_rl:<g>       one PPO update on fresh (+ replayed) rollouts, guidance g: none, refkl or databc
                        (learner.algorithms.online_rl)
    semi_online[:views] one semi-online update on expert trajectories (learner.algorithms.semi_online)
    dagger              SFT from the SFT model (the reference), at the SFT rate, on the demonstrations + every
                        teacher label so far (learner.data.teacher_labels.teacher_rows): DAgger's retrain on the
                        aggregate
    self_imitation      the same, on the demonstrations + the fleet's verified successes (greedy or top-k drawn)
                        (both: + filtered BC's rows on the tasks nobody demonstrated, StageData.new_task_rows)

A stage continues the run in its directory (each stage's run is resumable), else starts from `start`, a
checkpoint, or a fresh model of `recipe` (SFT only). Every result carries `diagnostics` (for SFT and offline
RL: the KL to the model the call started from and to the reference, and the entropy, on the call's last batch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import polars as pl
import torch

from learner.algorithms.offline_rl import OfflineRLConfig, train_offline_rl
from learner.algorithms.online_rl import OnlineRLConfig, ppo_update
from learner.algorithms.policy_logprobs import grammar_masks, token_logprobs
from learner.algorithms.rl_losses import entropy_over_support, kl_to_reference
from learner.algorithms.semi_online import SemiOnlineConfig, semi_online_update
from learner.algorithms.sft import train_vla
from learner.algorithms.training_run import VLAResult, open_run
from learner.data.dataset import VLADataset
from learner.data.tables import SFT_COLUMNS
from learner.data.teacher_labels import LABEL_COLUMNS, label_count
from learner.model.checkpoints import CHECKPOINT_NAME, load_vla
from learner.recipe import VLARecipe, VLATrainConfig
from policy.pruning import keep_count

STAGES = ("sft", "offline_rl", "online_rl", "semi_online", "dagger", "self_imitation")


@dataclass(frozen=True)
class StageRun:
    """What to train and where."""

    stage: str  # a STAGES name, with its variant after ':' (online_rl:refkl, semi_online:views)
    train: VLATrainConfig
    out_dir: Path  # the stage's run directory (resumes from its checkpoint)
    start: str = ""  # the checkpoint to start from ("": a fresh model of `recipe`, SFT only)
    reference: str = ""  # the SFT model: DPO's, RefKL's and the diagnostics' reference
    stop_at: int | None = None  # SFT / offline RL: checkpoint and return after this step
    env_steps: int = 0  # online RL: environment steps the online stage took before these rollouts (beta's clock)
    seed: int = 0  # semi-online rollouts' sampling
    recipe: VLARecipe | None = None  # a fresh SFT model's architecture, pruning and vocabulary


@dataclass(frozen=True)
class StageData:
    """What a stage reads (each stage reads its own fields)."""

    demos: pl.DataFrame | None = None  # SFT_COLUMNS: SFT, and DataBC's demonstrations
    logged: pl.DataFrame | None = None  # + ROLLOUT_COLUMNS, score, success, weight: offline RL
    rollouts: pl.DataFrame | None = None  # + task, seed, success (verify_ok): online RL
    trajectories: pl.DataFrame | None = None  # TRAJECTORY_COLUMNS: semi-online RL
    extra: pl.DataFrame | None = None  # dagger: teacher_rows; self_imitation: verified_successes (with the demos)
    new_task_rows: pl.DataFrame | None = None  # dagger, self_imitation: filtered_successes on the new tasks
    cursor: int = 0  # semi-online: the trajectory to start from


def run_stage(
    run: StageRun,
    data: StageData,
    online: OnlineRLConfig | None = None,
    offline: OfflineRLConfig | None = None,
    semi: SemiOnlineConfig | None = None,
) -> VLAResult:
    kind, _, variant = run.stage.partition(":")
    if kind not in STAGES:
        raise ValueError(f"unknown stage {run.stage!r}; the stages are {', '.join(STAGES)}")
    resumed = run.out_dir / CHECKPOINT_NAME
    before_path = resumed if resumed.exists() else (run.start or run.reference)  # where this call starts
    if kind == "sft":
        recipe = replace(run.recipe or VLARecipe(), train=run.train)
        before = load_vla(before_path)[0] if before_path else None
        result = train_vla(data.demos, recipe, run.out_dir, init_checkpoint=run.start or None, stop_at=run.stop_at)
        return with_drift(result, data.demos, before, run.reference)
    if kind in ("dagger", "self_imitation"):
        # Retrained from the SFT model each time, never the drifting policy fine-tuned further (STaR, ReST-EM).
        frame = with_extra(with_extra(data.demos, data.extra), data.new_task_rows)
        recipe = replace(run.recipe or VLARecipe(), train=run.train)
        result = train_vla(frame, recipe, run.out_dir, init_checkpoint=run.reference, stop_at=run.stop_at)
        height = lambda rows: 0 if rows is None else rows.height  # noqa: E731
        rows = {"demo_rows": data.demos.height, "extra_rows": height(data.extra),
                "new_task_rows": height(data.new_task_rows),
                "teacher_labels": label_count(data.extra) if kind == "dagger" else 0}  # fmt: skip
        drift = with_drift(result, frame, load_vla(run.reference)[0], run.reference)
        return replace(drift, diagnostics=drift.diagnostics | rows)
    if kind == "offline_rl":
        before = load_vla(before_path)[0]
        result = train_offline_rl(data.logged, run.train, offline or OfflineRLConfig(), run.reference, run.out_dir,
                                  stop_at=run.stop_at)  # fmt: skip
        return with_drift(result, data.logged, before, run.reference)
    if kind == "online_rl":
        online = online or OnlineRLConfig()
        rl = replace(online, guidance=variant or online.guidance)
        if data.rollouts is None or data.rollouts.is_empty():
            # No informative group yet: the model stays as it is (the stage's run is opened and closed).
            unchanged = open_run(run.out_dir, run.train, lambda: load_vla(run.start))
            return replace(unchanged.finish(unchanged.start_step, []), diagnostics={"informative_rows": 0})
        return ppo_update(data.rollouts, run.train, rl, run.start, run.reference, run.out_dir, data.demos,
                          env_steps=run.env_steps)  # fmt: skip
    semi = semi or SemiOnlineConfig()
    if variant == "views" and not semi.view_shift_px:
        raise ValueError("semi_online:views needs a SemiOnlineConfig with views (view_shift_px > 0)")
    result, stats = semi_online_update(data.trajectories, run.train, semi, run.start, run.reference, run.out_dir,
                                       seed=run.seed, cursor=data.cursor)  # fmt: skip
    return replace(result, diagnostics=result.diagnostics | stats)


def retrain_steps(least: int, passes: float, rows: int, batch_size: int) -> int:
    """A retrain's optimizer steps: `least`, or `passes` passes over its `rows` if that is more (a
    fixed count spreads over more rows every round, under one pass once the fleet's rows pile up)."""
    return max(least, math.ceil(passes * rows / batch_size))


def with_extra(demos: pl.DataFrame, extra: pl.DataFrame | None) -> pl.DataFrame:
    """The demonstrations and the extra rows as one SFT frame (the columns SFT reads; missing ones null)."""
    if extra is None or extra.is_empty():
        return demos
    keep = [c for c in LABEL_COLUMNS if c in demos.columns]
    return pl.concat([demos.select(keep), extra.select([c for c in LABEL_COLUMNS if c in extra.columns])],
                     how="diagonal_relaxed")  # fmt: skip


def with_replay(demos: pl.DataFrame, replay: pl.DataFrame) -> pl.DataFrame:
    """The demonstrations and a replayed demonstration set (a trained start's own mix) as one SFT frame, the
    replay's episodes renamed so that no history crosses from one set into the other."""
    keep = [c for c in (*SFT_COLUMNS, "target_box") if c in demos.columns and c in replay.columns]
    replay = replay.with_columns(pl.format("replay-{}", "episode_id").alias("episode_id"))
    return pl.concat([demos.select(keep), replay.select(keep)], how="diagonal_relaxed")


def repeated(rows: pl.DataFrame | None, times: int) -> pl.DataFrame | None:
    """`times` copies of `rows`, each copy its own episodes (a row's history stays within its copy): weighs a
    few rows against the larger frame they are sampled with."""
    if rows is None or times <= 1:
        return rows
    copy = lambda k: pl.format("{}~{}", "episode_id", pl.lit(k)).alias("episode_id")  # noqa: E731
    return pl.concat([rows.with_columns(copy(k)) for k in range(times)])


@torch.no_grad()
def with_drift(result: VLAResult, frame: pl.DataFrame, before, reference: str, rows: int = 32) -> VLAResult:
    """The result with diagnostics of how far the call moved the policy, on `rows` of its data (seeded): KL
    to the model it started from (`before`, None: a fresh model) and to the reference, and the entropy."""
    model = result.model
    data = VLADataset(frame, result.tokenizer, model.cfg, result.pruning)
    idx = np.random.default_rng(0).integers(0, len(data), size=min(rows, len(data)))
    batch = data.batch(idx)
    masks = grammar_masks(result.tokenizer, batch["labels"], model.cfg.max_thought_tokens)
    keep = keep_count(model.cfg.num_patches, result.pruning.keep_ratio)
    scored = token_logprobs(model, batch, masks, keep)
    out = {"entropy": round(entropy_over_support(scored.logp_all, scored.mask).item(), 4),
           "loss": round(float(np.mean(result.losses)), 4) if result.losses else None}  # fmt: skip
    for name, other in (("kl_old", before), ("kl_sft", load_vla(reference)[0] if reference else None)):
        if other is not None:
            other.eval()
            out[name] = round(kl_to_reference(scored.logp_all, token_logprobs(other, batch, masks, keep).logp_all,
                                              scored.mask).item(), 5)  # fmt: skip
    return replace(result, diagnostics=result.diagnostics | out)
