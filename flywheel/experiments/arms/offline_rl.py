"""offline_rl: the failures used too. AWR + DPO on the verified successes and the failures beside them.

gathers: search_bc's exploration (the same episodes)
trains:  offline RL from the start (learner.algorithms.offline_rl, its reference): AWR on the demonstrations, each
seed's
         shortest success (`copies` times) and the failed runs of every seed that has a success, weighted by the
         episode's advantage; DPO on (success, failure) pairs of the same seed pushes the failures' actions below
         the success's. The steps are a retrain's on the same rows, so the twin is the same length
costs:   as search_bc
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from learner.algorithms.offline_rl import OfflineRLConfig
from learner.algorithms.stages import StageData, StageRun, repeated, run_stage
from learner.data.teacher_labels import filtered_successes

NAME = "offline_rl"
SUMMARY = "AWR + DPO: successes imitated, the same seeds' failures pushed away"
AFTER = ""


@dataclass(frozen=True)
class OfflineRLSettings:
    dpo_weight: float = 0.5
    """Weight of the DPO term against AWR (learner.algorithms.offline_rl.OfflineRLConfig)."""
    dpo_pairs: int = 4
    """(success, failure) pairs per update."""


def informative_failures(explored: pl.DataFrame) -> pl.DataFrame:
    """The failed runs of the seeds that have a success: each forms a preference pair with it."""
    solved = explored.filter(pl.col("success")).select("task", "seed").unique()
    return explored.filter(~pl.col("success")).join(solved, on=["task", "seed"], how="semi")


SETTINGS = OfflineRLSettings


def train(ctx, settings: OfflineRLSettings):
    explored = ctx.explored(search=True)
    successes = filtered_successes(explored, ctx.tasks)
    kept = explored.filter(pl.col("episode_id").is_in(successes["episode_id"].unique().implode()))
    failures = informative_failures(explored)
    logged = pl.concat([ctx.demos, repeated(kept, ctx.copies), failures], how="diagonal_relaxed")
    steps = ctx.retrain_steps(logged.height - ctx.demos.height)
    run = StageRun("offline_rl", ctx.train_config(steps), ctx.dir(NAME) / "train", reference=ctx.start)
    offline = OfflineRLConfig(dpo_weight=settings.dpo_weight, dpo_pairs=settings.dpo_pairs)
    result = run_stage(run, StageData(logged=logged), offline=offline)
    rows = {"success_rows": kept.height * ctx.copies, "failure_rows": failures.height}
    return ctx.trained(NAME, result, steps, ctx.exploration_env_steps(search=True), rows)
