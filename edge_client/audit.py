"""The audit of the successes filtered BC keeps on the tasks nobody demonstrated: each replayed, with the DOM read.

A success there is whatever the environment's reward said; an accidental one (a click that landed on nothing on
the way, a reward a timing fluke gave) would teach its wrong step as a habit. The audit replays a sample of the
kept episodes on their own seeds, action for action, reading the DOM as it goes, and counts:

    reproduced        the replay ends in success again (not a fluke of timing)
    steps_on_nothing  clicks whose point lies on no element but the page's own containers (the task area, the
                      instruction): steps filtered BC would imitate that did nothing a checker could see

It reports; it never trains. What it reads of the DOM goes into the report and nowhere else: the learner has
finished (the main job audits after its run) and nothing the audit writes is a table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from edge_client.dom import walk
from edge_client.env import GuiEnv
from policy.interface import Decision, Observation
from policy.screen import POSITIONAL_TYPES
from schemas import Action

CONTAINERS = ("wrap", "area", "query")  # MiniWoB++'s page: the whole task, its area, the instruction


@dataclass(frozen=True)
class Audit:
    task: str
    seed: int
    reproduced: bool
    steps: int
    steps_on_nothing: int


class Replay:
    """A policy that takes `actions` in order (then gives up), recording for each click whether the DOM of the
    screen it acted on had an element under the point."""

    version = "audit"

    def __init__(self, env: GuiEnv, actions: Sequence[Action]):
        self.env, self.actions, self.on_nothing = env, list(actions), 0

    def act(self, obs: Observation) -> Decision:
        if obs.step >= len(self.actions):
            raise LookupError("the kept episode ended here")  # the loop ends it as gave_up
        action = self.actions[obs.step]
        if action.type in POSITIONAL_TYPES and not element_under(self.env.read_dom(), action.x, action.y):
            self.on_nothing += 1
        return Decision("", action)


def element_under(root, x: float, y: float) -> bool:
    """Whether an element other than the page's containers lies under (x, y) in the DOM `root` (None: the episode
    had ended, nothing to press)."""
    if root is None:
        return False
    return any(el.left <= x <= el.right and el.top <= y <= el.bottom and el.id not in CONTAINERS
               for el in walk(root) if el is not root)  # fmt: skip


def audit_episode(env: GuiEnv, task: str, seed: int, actions: Sequence[Action]) -> Audit:
    """Replays one kept success on its seed (`env` must read the DOM), counting its clicks on nothing."""
    from edge_client.episode import run_episode

    replay = Replay(env, actions)
    result = run_episode(env, replay, task, seed, max_steps=len(actions))
    return Audit(task, seed, result.success, len(actions), replay.on_nothing)
