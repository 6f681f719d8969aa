"""filtered_bc: the shortest verified success of each seed the start's sampling reached, imitated.

gathers: the start's K runs a seed on the temperature ladder (the exploration's sampled runs; no search)
trains:  a retrain from the start on the demonstrations + those successes, `copies` times (ReST-EM's one round)
costs:   the sampled runs' environment steps
"""

from __future__ import annotations

from learner.algorithms.stages import repeated
from learner.data.teacher_labels import filtered_successes

NAME = "filtered_bc"
SUMMARY = "filtered BC on what sampling alone verified"
AFTER = ""

SETTINGS = None  # none of its own: the learner's new_task_copies gives the copies of each kept success


def train(ctx, settings: None):
    explored = ctx.explored(search=False)  # (rows) the sampled runs, successes and failures
    successes = filtered_successes(explored, ctx.tasks)
    return ctx.retrain(NAME, repeated(successes, ctx.copies), env_steps=ctx.exploration_env_steps(search=False))
