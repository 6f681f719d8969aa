"""iterated_search_bc: search_bc in rounds, each round's model exploring for the next (the flywheel; ReST-EM).

gathers: round 1 is search_bc (the start's exploration); in round r > 1 round r-1's model runs the fleet's loop on
         `round_seeds` fresh training seeds a task (K runs a seed on the ladder, the search where all K failed), so
         a task the start rarely solved is explored by a model that solves it more often
trains:  each round a retrain from the start on the demonstrations + each seed's shortest success of every round so
         far, `copies` times: from the base model each time, never the previous round's (ReST-EM, STaR)
costs:   every round's exploration. Each retrain is as long as the twin's, so the twin is search_bc's
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import polars as pl

from learner.algorithms.stages import repeated
from learner.data.teacher_labels import filtered_successes

NAME = "iterated_search_bc"
SUMMARY = "search_bc in rounds, each exploring with the last round's model"
AFTER = "search_bc"


@dataclass(frozen=True)
class IteratedSearchBCSettings:
    rounds: int = 3
    """Rounds of explore -> retrain (the first is search_bc's)."""
    round_seeds: int = 20
    """Fresh training seeds per new task each later round explores."""


SETTINGS = IteratedSearchBCSettings


def train(ctx, settings: IteratedSearchBCSettings):
    trained = ctx.result_of(AFTER)  # round 1
    rows, env_steps, cpu_s = ctx.explored(search=True), trained.env_steps, trained.cpu_s
    for round_ in range(2, settings.rounds + 1):
        first = ctx.first_seed + ctx.config.seeds_per_task + (round_ - 2) * settings.round_seeds
        more, steps = ctx.explore_with(trained, f"{NAME}-round-{round_}", first, settings.round_seeds)
        rows, env_steps = pl.concat([rows, more], how="diagonal_relaxed"), env_steps + steps
        successes = repeated(filtered_successes(rows, ctx.tasks), ctx.copies)
        trained = ctx.retrain(f"{NAME}/round-{round_}", successes, env_steps, steps=trained.steps)
        cpu_s += trained.cpu_s  # every round's retrain is paid for, not the last one's alone
    return replace(trained, cpu_s=round(cpu_s, 1), rows=trained.rows | {"rounds": settings.rounds})
