"""Small builders of valid events for tests."""

from __future__ import annotations

import time

from schemas import Action, StepEvent, Verify, new_event_id


def step_event(
    episode_id: str = "c0-click-test-7-0", step: int = 0, done: bool = True, reward: float = 0.9, **overrides
):
    fields = dict(
        event_id=new_event_id(),
        client_id=episode_id.split("-")[0],
        produced_at=time.time(),
        episode_id=episode_id,
        step=step,
        task="click-test",
        instruction="Click the button.",
        screenshot=b"\x89PNG fake",
        thought="The button is in the middle.",
        action=Action("click", 80.0, 105.0),
        model_version="expert",
        verify=Verify("episode ends with success", "screen changed near the click", True),
        reward=reward,
        done=done,
    )
    fields.update(overrides)
    return StepEvent(**fields)
