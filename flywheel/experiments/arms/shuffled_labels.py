"""shuffled_labels: the control. search_bc's retrain on the same episodes with their success labels shuffled.

gathers: search_bc's exploration (the same episodes)
trains:  each task's episodes' success labels permuted among them (as many "successes" as were verified, on
         random episodes), then search_bc's recipe: each seed's shortest "success", `copies` times
costs:   as search_bc
If it lands near the twin, what search_bc gains is the labels' doing, not more rows of the new tasks' screens.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from learner.algorithms.stages import repeated
from learner.data.teacher_labels import filtered_successes

NAME = "shuffled_labels"
SUMMARY = "control: search_bc's episodes, success labels shuffled within each task"
AFTER = ""

SETTINGS = None  # none of its own: the learner's new_task_copies gives the copies of each kept success


def shuffled_success(rows: pl.DataFrame, seed: int) -> pl.DataFrame:
    """`rows` with each task's episode-level success labels permuted among its episodes (seeded)."""
    episodes = rows.unique("episode_id", keep="first", maintain_order=True).select("episode_id", "task", "success")
    rng = np.random.default_rng(seed)
    parts = []
    for task_episodes in episodes.partition_by("task", maintain_order=True):
        labels = task_episodes["success"].to_numpy()
        parts.append(task_episodes.with_columns(pl.Series("success", rng.permutation(labels))))
    return rows.drop("success").join(pl.concat(parts).drop("task"), on="episode_id", how="left")


def train(ctx, settings: None):
    explored = shuffled_success(ctx.explored(search=True), ctx.seed)
    successes = filtered_successes(explored, ctx.tasks)
    return ctx.retrain(NAME, repeated(successes, ctx.copies), env_steps=ctx.exploration_env_steps(search=True))
