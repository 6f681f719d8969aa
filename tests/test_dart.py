"""DART (edge_client.dart): the expert's clicks displaced at a rate near the policy's per-step error, the clean
action kept as the label."""

from __future__ import annotations

import numpy as np
import pytest

from edge_client.dart import NoisyExpert, per_step_noise
from policy.interface import Decision, Observation
from schemas import Action


class Scripted:
    """An expert that clicks (80, 100) on even steps and types on odd ones."""

    version = "expert"

    def act(self, obs: Observation) -> Decision:
        if obs.step % 2:
            return Decision("type it", Action(type="type", text="hello"), expected="text 'hello'")
        return Decision("click it", Action(type="click", x=80, y=100), expected="change", target_box=(70, 90, 90, 110))


def observation(step: int) -> Observation:
    return Observation("click-test", "Click.", np.zeros((210, 160, 3), np.uint8), step=step)


def test_the_noise_fails_an_episode_as_often_as_the_policy_does_within_its_bounds() -> None:
    assert per_step_noise(0.5, 1) == pytest.approx(0.5)
    assert per_step_noise(0.64, 2) == pytest.approx(0.2)  # 1 - 0.8 a step fails 0.36 of two-step episodes
    assert per_step_noise(1.0, 3) == 0.05  # some noise even where the policy never fails
    assert per_step_noise(0.0, 1) == 0.5  # never a coin flip past one half


def test_clicks_are_displaced_at_the_rate_asked_and_typed_text_never() -> None:
    noisy = NoisyExpert(Scripted(), noise=0.5, sigma_px=15.0, rng=np.random.default_rng(0))
    decisions = [noisy.act(observation(step)) for step in range(400)]
    moved = [d for d in decisions[::2] if (d.action.x, d.action.y) != (80, 100)]
    assert 70 <= len(moved) <= 130 and noisy.noised == len(moved)  # about half of 200 clicks
    assert all(d.expected == "" and d.target_box is None for d in moved)  # nothing to verify after a miss
    assert all(0 <= d.action.x <= 159 and 0 <= d.action.y <= 209 for d in moved)
    assert 8 < np.std([d.action.x for d in moved]) < 22  # displaced by about sigma
    assert all(d.action == Action(type="type", text="hello") for d in decisions[1::2])
    clean = NoisyExpert(Scripted(), noise=0.0, sigma_px=15.0, rng=np.random.default_rng(0))
    assert clean.act(observation(0)) == Scripted().act(observation(0))
    with pytest.raises(ValueError, match="noise"):
        NoisyExpert(Scripted(), noise=1.5, sigma_px=15.0, rng=np.random.default_rng(0))
