"""Recovery-rich demonstrations (DART, Laskey et al. 2017): the expert acts with noise, and every
state it reaches is labelled with its clean action.

A demonstration without mistakes never shows the states a policy reaches after one, so the policy never learns
to recover from them. DART injects noise into the expert's own actions, at about the rate the policy errs, and
trains on the clean action at every state the noisy expert visited: the near-misses and what to do after them.

    at each step:  clean = expert(obs)
                   with probability p (per task: near the policy's per-step error rate) the click is displaced
                   by N(0, sigma_px^2) in x and y, clipped to the screen
                   the executed action goes into the history; the clean one is the label

Only positional actions are noised (a click that lands beside its element, the policy's usual error); typed
text and keys are taken as the expert gives them. The expert here is the DOM expert, so every step is one
call to it (in a deployment, a teacher call each).
"""

from __future__ import annotations

from dataclasses import replace

import msgspec
import numpy as np

from policy.interface import Decision, Observation, Policy
from policy.screen import POSITIONAL_TYPES, SCREEN_H, SCREEN_W


def per_step_noise(episode_success: float, steps_per_episode: float, low: float = 0.05, high: float = 0.5) -> float:
    """The per-step error rate that fails an episode of `steps_per_episode` steps as often as the policy does:
    1 - success^(1 / steps), clipped to [low, high] (some noise even where the policy rarely fails)."""
    steps = max(steps_per_episode, 1.0)
    rate = 1.0 - max(episode_success, 0.0) ** (1.0 / steps)
    return float(np.clip(rate, low, high))


class NoisyExpert:
    """`expert` with its clicks displaced, with probability `noise`, by N(0, sigma_px^2) px; `clean` holds the
    expert's own decision of the last step (the label, read by the episode's teacher)."""

    version = "expert"

    def __init__(self, expert: Policy, noise: float, sigma_px: float, rng: np.random.Generator):
        if not 0.0 <= noise <= 1.0 or sigma_px < 0:
            raise ValueError(f"noise must be in [0, 1] and sigma_px >= 0, got {noise} and {sigma_px}")
        self.expert, self.noise, self.sigma_px, self.rng = expert, noise, sigma_px, rng
        self.noised = 0  # steps whose executed action was displaced

    def act(self, obs: Observation) -> Decision:
        clean = self.expert.act(obs)
        action = clean.action
        if action.type not in POSITIONAL_TYPES or self.rng.random() >= self.noise:
            return clean
        dx, dy = self.rng.normal(0.0, self.sigma_px, size=2)
        x = float(np.clip(round(action.x + dx), 0, SCREEN_W - 1))
        y = float(np.clip(round(action.y + dy), 0, SCREEN_H - 1))
        self.noised += 1
        # What the screen should show is unknown after a displaced click: no expectation to verify.
        return replace(clean, action=msgspec.structs.replace(action, x=x, y=y), expected="", target_box=None)
