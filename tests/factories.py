"""Small builders of valid events for tests."""

from __future__ import annotations

import time

import msgspec
import numpy as np

from schemas import Action, StepEvent, Verify, new_event_id


def step_event(
    episode_id: str = "c0-click-test-7-0", step: int = 0, done: bool = True, reward: float = 0.9, **overrides
):
    """A v2 step. Unless overridden, a final step ends as the edge loop would end it on that reward. The fields left
    at their default are listed, with why, in tests/test_step_contract.py."""
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
        termination=("success" if reward > 0 else "failure") if done else None,
        seed=7,
    )
    fields.update(overrides)
    return StepEvent(**fields)


# --- schema version 1, frozen as it was written: logs hold such bytes, and they must keep decoding ----------


class StepEventV1(msgspec.Struct, frozen=True, tag_field="kind", tag="step"):
    event_id: str
    client_id: str
    produced_at: float
    episode_id: str
    step: int
    task: str
    instruction: str
    screenshot: bytes
    thought: str
    action: Action
    model_version: str
    verify: Verify
    reward: float
    done: bool
    behaviour_logprob: float | None = None
    inference_ms: float = 0.0
    env_ms: float = 0.0
    visual_tokens_total: int = 0
    visual_tokens_kept: int = 0
    screenshot_ref: str = ""
    schema_version: int = 1


class EpisodeEventV1(msgspec.Struct, frozen=True, tag_field="kind", tag="episode"):
    event_id: str
    client_id: str
    produced_at: float
    episode_id: str
    task: str
    seed: int  # -1: not parseable from the episode id
    steps: int
    raw_reward: float
    binary_reward: float
    success: bool
    termination: str  # the v1 scorer wrote "done" | "failed" | "timeout"
    model_version: str
    policy: str
    first_produced_at: float = 0.0
    completion: float = 0.0
    step_efficiency: float = 0.0
    verification: float = 0.0
    score: float = 0.0
    schema_version: int = 1


def v1_step_bytes(step: StepEvent) -> bytes:
    """`step` as a v1 client encoded it: the same fields, without termination and seed."""
    fields = {name: getattr(step, name) for name in StepEventV1.__struct_fields__ if name != "schema_version"}
    return msgspec.msgpack.encode(StepEventV1(**fields))


def box_screen(seed: int) -> tuple[np.ndarray, tuple[int, int, int, int]]:
    """A white screen with one 30 px blue box at a seeded place, and the box (x0, y0, x1, y1): a synthetic
    click task for the learner's tests (no browser)."""
    rng = np.random.default_rng(seed)
    image = np.full((210, 160, 3), 255, dtype=np.uint8)
    y, x = int(rng.integers(60, 170)), int(rng.integers(10, 120))
    image[y : y + 30, x : x + 30] = (30, 80, 200)
    return image, (x, y, x + 30, y + 30)


def two_box_screen(seed: int) -> tuple[np.ndarray, list[tuple[int, int, int, int]]]:
    """A white screen with a red and a blue 30 px box at seeded places that do not overlap, and their boxes
    (red first): a synthetic two-step task ("click red, then blue") whose screen never changes."""
    rng = np.random.default_rng(seed)
    image = np.full((210, 160, 3), 255, dtype=np.uint8)
    red_x, blue_x = (10, 90) if rng.random() < 0.5 else (90, 10)
    boxes = []
    for x, colour in ((red_x, (210, 40, 40)), (blue_x, (30, 80, 200))):
        x, y = x + int(rng.integers(0, 30)), int(rng.integers(60, 170))
        image[y : y + 30, x : x + 30] = colour
        boxes.append((x, y, x + 30, y + 30))
    return image, boxes
