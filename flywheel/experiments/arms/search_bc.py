"""search_bc: filtered BC on what the fleet's exploration verified, the search's finds included.

gathers: the start's exploration as the fleet runs it: K runs a seed on the ladder, then, where all K failed, the
         search from the first failure (the policy's other likely actions and the screen's elements at its failing
         steps, the policy finishing each branch)
trains:  a retrain from the start on the demonstrations + each seed's shortest success, `copies` times
costs:   the sampled runs' and the search's environment steps (its failed branches included)
"""

from __future__ import annotations

from learner.algorithms.stages import repeated
from learner.data.teacher_labels import filtered_successes

NAME = "search_bc"
SUMMARY = "filtered BC on what sampling and the search verified"
AFTER = ""

SETTINGS = None  # none of its own: the learner's new_task_copies gives the copies of each kept success


def train(ctx, settings: None):
    successes = filtered_successes(ctx.explored(search=True), ctx.tasks)
    return ctx.retrain(NAME, repeated(successes, ctx.copies), env_steps=ctx.exploration_env_steps(search=True))
