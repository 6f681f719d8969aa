"""Small builders of valid events for tests."""

from __future__ import annotations

import time

import msgspec
import numpy as np

from lake.tables import EPISODES, STEPS, TRAINING_SAMPLES
from policy.screen import encode_png
from processors.curation import Curated
from processors.delta_sink import DeltaSink, Record
from processors.table_rows import episode_row, sample_rows, step_row
from schemas import Action, EpisodeEvent, StepEvent, Verify, new_event_id


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


class TablesLog:
    """Writes one-step episodes into the run's Delta tables as the pipeline would (its rows, its sinks)."""

    def __init__(self, tables_dir):
        self.sinks = {t: DeltaSink(tables_dir, t) for t in (STEPS, EPISODES, TRAINING_SAMPLES)}
        self.offset = 0

    def episode(self, name: str, seed: int, action: Action, success: bool, version: str, tokens=(), logprobs=(),
                teacher: Action | None = None):  # fmt: skip
        image, _ = box_screen(seed)
        now = time.time()
        step = StepEvent(event_id=f"s-{name}", client_id="c0", produced_at=now, episode_id=name, step=0,
                         task="click-box", instruction="Click the box.", screenshot=encode_png(image),
                         thought="Click the box.", action=action, model_version=version, verify=Verify(),
                         reward=1.0 if success else -1.0, done=True, seed=seed, tokens=tuple(tokens),
                         token_logprobs=tuple(logprobs), termination="success" if success else "failure",
                         teacher_action=teacher, teacher_thought="Click the box." if teacher else "",
                         teacher_reason="uncertain" if teacher else "", temperature=1.0 if tokens else 0.0,
                         top_k=5 if tokens else 0)  # fmt: skip
        episode = EpisodeEvent(event_id=f"e-{name}", client_id="c0", produced_at=now, episode_id=name,
                               task="click-box", seed=seed, steps=1, raw_reward=step.reward,
                               binary_reward=1.0 if success else -1.0, success=success,
                               termination=step.termination, model_version=version, score=1.0 if success else 0.15,
                               policy="expert" if version == "expert" else "model")  # fmt: skip
        purpose = "demo" if version == "expert" else ("success" if success else "failure")
        at = self.offset
        self.offset += 1
        self.sinks[STEPS].write([Record("steps", 0, at, [step_row(step, 0, at)])])
        self.sinks[EPISODES].write([Record("episodes", 0, at, [episode_row(episode, 0, at)])])
        rows = sample_rows(episode, Curated(purpose, 1.0, "test"), 0, at)
        self.sinks[TRAINING_SAMPLES].write([Record("episodes", 0, at, rows)])
