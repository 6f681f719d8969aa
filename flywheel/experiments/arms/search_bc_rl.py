"""search_bc_rl: search_bc's model refined by RL on the new tasks, anchored to what it imitated.

gathers: each round, groups of `repeats` sampled rollouts of one (task, training seed), tasks drawn by how often
         their recent groups were informative (learner.algorithms.online_rl.task_weights), until `groups_per_round`
         informative groups (successes and failures alike) or `max_groups_per_round` were tried
trains:  one PPO update a round (learner.algorithms.online_rl, guidance "anchor": the NLL of the demonstrations +
search_bc's
         successes at a fixed weight, so the verified habits are not lost) from search_bc's model, at online_lr
costs:   search_bc's, plus every rollout's environment steps. The twin is search_bc's (its retrain's steps):
         RL updates have no no-fleet twin, without a fleet there are no rollouts
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import polars as pl

from learner.algorithms.online_rl import OnlineRLConfig, task_weights
from learner.algorithms.stages import StageData, StageRun, run_stage, with_extra
from learner.data.teacher_labels import filtered_successes

NAME = "search_bc_rl"
SUMMARY = "search_bc, then PPO on the new tasks anchored to its imitation"
AFTER = "search_bc"


@dataclass(frozen=True)
class SearchBCRLSettings:
    rl_rounds: int = 6
    """PPO updates, one a round."""
    rl_repeats: int = 8
    """Rollouts of one (task, seed): a group."""
    rl_groups_per_round: int = 4
    """A round collects until this many informative groups ..."""
    rl_max_groups_per_round: int = 12
    """... or this many were tried."""
    rl_temperature: float = 1.0
    """The rollouts' sampling temperature, over every token."""


SETTINGS = SearchBCRLSettings


def train(ctx, settings: SearchBCRLSettings):
    bc = ctx.result_of(AFTER)
    anchor = with_extra(ctx.demos, filtered_successes(ctx.explored(search=True), ctx.tasks))
    online = OnlineRLConfig(guidance="anchor")
    checkpoint, env_steps, history = bc.checkpoint, 0, {t: [] for t in ctx.tasks}
    rng = np.random.default_rng([ctx.seed, 7])
    informative_rows, result, rl_cpu_s = 0, None, 0.0
    for _ in range(settings.rl_rounds):
        kept = []
        for _ in range(settings.rl_max_groups_per_round):
            weights = task_weights(history)
            task = ctx.tasks[int(rng.choice(len(weights), p=weights / weights.sum()))]
            rows, steps = ctx.rollouts(checkpoint, task, settings.rl_repeats, settings.rl_temperature)
            env_steps += steps
            informative = rows["success"].n_unique() > 1
            history[task].append(informative)
            kept += [rows] if informative else []
            if len(kept) >= settings.rl_groups_per_round:
                break
        rollouts = pl.concat(kept) if kept else None
        informative_rows += 0 if rollouts is None else rollouts.height
        run = StageRun("online_rl:anchor", ctx.train_config(0, online=True), ctx.dir(NAME) / "online",
                       start=checkpoint, reference=ctx.start, env_steps=env_steps)  # fmt: skip
        result = run_stage(run, StageData(rollouts=rollouts, demos=anchor), online=online)
        checkpoint, rl_cpu_s = str(result.checkpoint_path), rl_cpu_s + result.cpu_s
    rows = {"rl_rounds": settings.rl_rounds, "informative_rows": informative_rows}
    trained = ctx.trained(NAME, result, bc.steps, bc.env_steps + env_steps, rows)
    # Its cost is search_bc's retrain and every round's update, not the last round's alone.
    return replace(trained, cpu_s=round(bc.cpu_s + rl_cpu_s, 1), updates=settings.rl_rounds)
