"""One episode of think -> act -> verify: the loop that the fleet runner and `flywheel eval` share.

It is the one place that decides how an episode ends (`schemas.Termination`) and so whether it
succeeded: only "success" does, which is the env ending the episode with raw reward > 0. The final
step record carries the termination and the terminal reward (the env's, or LOOP_ENDED_REWARD when
the loop ended the episode itself), and the runner publishes both on the final StepEvent, so
downstream (scoring, eval summaries) reads the outcome instead of re-deriving it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from selenium.common.exceptions import WebDriverException

from edge_client.env import StepResult, screen_difference
from edge_client.tasks import task_name
from edge_client.teacher import Teacher
from edge_client.verify import verify_step
from policy.interface import Decision, Observation, Policy
from schemas import Action, Termination, Verify

log = logging.getLogger(__name__)

LOOP_ENDED_REWARD = -1.0  # terminal reward of an episode the env did not end: as bad as a failure


class Env(Protocol):
    """What the loop needs of edge_client.env.GuiEnv (unit tests pass a fake)."""

    def reset(self, seed: int | None = None, task: str | None = None) -> Observation: ...

    def step(self, action: Action) -> StepResult: ...

    def read_dom(self) -> Any: ...  # the DOM of the screen now shown, for a teacher (only when one is asked)


@dataclass(frozen=True)
class StepRecord:
    """One think -> act -> verify step as the loop saw it."""

    step: int
    obs: Observation  # the screen the action was chosen on
    decision: Decision
    verify: Verify
    reward: float  # 0 while the episode runs, the terminal reward on the final step
    termination: Termination | None  # set on the final step only
    think_ms: float
    act_ms: float = 0.0
    verify_ms: float = 0.0
    result: StepResult | None = None  # None when the env was not stepped (gave_up) or failed (error)
    teacher: Decision | None = None  # the teacher's label of `obs` (edge_client.teacher), None: not asked
    teacher_reason: str = ""  # why it was asked
    teacher_ms: float = 0.0  # the DOM read and the teacher's call

    @property
    def done(self) -> bool:
        return self.termination is not None


@dataclass(frozen=True)
class EpisodeResult:
    task: str
    seed: int
    steps: int
    raw_reward: float  # the final step's reward
    termination: Termination
    wall_s: float
    records: list[StepRecord] = field(default_factory=list)

    @property
    def success(self) -> bool:
        return self.termination == "success"

    @property
    def binary_reward(self) -> float:
        return 1.0 if self.success else -1.0


def ending(result: StepResult, last: bool) -> tuple[Termination | None, float]:
    """(termination, reward) after a step the env took; (None, reward) while the episode goes on."""
    if result.done:
        if result.info.get("termination") == "timeout":
            return "timeout", result.reward
        return ("success" if result.reward > 0 else "failure"), result.reward
    if last:
        return "max_steps", LOOP_ENDED_REWARD
    return None, result.reward


def run_episode(
    env: Env,
    policy: Policy,
    task: str,
    seed: int,
    max_steps: int = 10,
    on_step: Callable[[StepRecord], None] | None = None,
    teacher: Teacher | None = None,
    stall_steps: int = 0,
) -> EpisodeResult:
    """Reset `env` to (task, seed) and let `policy` act until the episode ends; `on_step` sees each step
    as soon as it is recorded (the runner publishes it there). `teacher`: labels the screens its rule picks.
    `stall_steps` N > 0: the N-th action in a row on one unchanged screen is the last (the episode ends as
    max_steps: its step budget spent where nothing it did showed); 0: only max_steps ends it."""
    if max_steps < 1 or stall_steps < 0:
        raise ValueError(f"max_steps must be >= 1 and stall_steps >= 0, got {max_steps}, {stall_steps}")
    t0 = time.perf_counter()
    obs = env.reset(seed=seed, task=task)
    if teacher is not None:
        teacher.begin_episode(task_name(task))
    records: list[StepRecord] = []
    for step in range(max_steps):
        previous_ok = records[-1].verify.ok if records else None
        last = step == max_steps - 1 or stalled(records, obs, stall_steps)
        record = _step(env, policy, obs, step, last, teacher, previous_ok)
        records.append(record)
        if on_step is not None:
            on_step(record)
        if record.done:
            break
        assert record.result is not None  # only a final record lacks the env's result
        obs = record.result.obs
    final = records[-1]
    assert final.termination is not None  # the last allowed step always ends the episode
    wall_s = time.perf_counter() - t0
    if teacher is not None:
        teacher.end_episode(task_name(task), final.termination == "success")
    return EpisodeResult(task_name(task), seed, len(records), final.reward, final.termination, wall_s, records)


def stalled(records: list[StepRecord], obs: Observation, stall_steps: int) -> bool:
    """Whether acting on `obs` would be the `stall_steps`-th action in a row on the same screen."""
    if stall_steps < 1 or len(records) < stall_steps - 1:
        return False
    return all(
        screen_difference(r.obs.screenshot, obs.screenshot) is None for r in records[len(records) - stall_steps + 1 :]
    )


def _step(env: Env, policy: Policy, obs: Observation, step: int, last: bool, teacher: Teacher | None = None,
          previous_ok: bool | None = None) -> StepRecord:  # fmt: skip
    started = time.perf_counter()
    try:
        decision = policy.act(obs)  # think
    except LookupError as err:
        # A scripted expert met a screen it cannot read (e.g. a widget missing from the DOM snapshot):
        # the episode ends here, recorded as such, and the caller goes on with the next one.
        log.warning("step %d of %s: %s gave up: %s", step, obs.task, policy.version, err)
        decision = Decision(thought=f"Giving up: {err}.", action=Action(type="noop"))
        return _ended_by_loop(step, obs, decision, "gave_up", _ms_since(started))
    think_ms = _ms_since(started)
    label, why, teacher_ms = _ask_teacher(env, teacher, obs, decision, previous_ok)
    started += teacher_ms / 1000  # the teacher's time is neither thinking nor acting
    try:
        result = env.step(decision.action)  # act
    except WebDriverException as err:
        # The browser broke (crash, hung renderer): this episode is lost, the next reset restarts it.
        log.warning("step %d of %s: browser failed: %s", step, obs.task, err)
        return _ended_by_loop(step, obs, decision, "error", think_ms, _ms_since(started) - think_ms)
    act_ms = _ms_since(started) - think_ms
    check = verify_step(obs.screenshot, result.obs.screenshot, decision.action, decision.expected, result)
    termination, reward = ending(result, last)
    verify_ms = _ms_since(started) - think_ms - act_ms
    return StepRecord(step, obs, decision, check, reward, termination, think_ms, act_ms, verify_ms, result, label,
                      why, teacher_ms)  # fmt: skip


def _ask_teacher(env: Env, teacher: Teacher | None, obs: Observation, decision: Decision,
                 previous_ok: bool | None) -> tuple[Decision | None, str, float]:  # fmt: skip
    """(the teacher's label of `obs`, why it was asked, ms spent): the DOM is read only when a label is due, from
    the screen the policy chose on (the action has not run yet)."""
    why = teacher.reason(decision, previous_ok) if teacher is not None else None
    if why is None:
        return None, "", 0.0
    if (known := teacher.known(obs)) is not None:  # labelled before: the same label, no call
        return teacher.reuse(known), why, 0.0
    if not teacher.affordable():
        return None, "", 0.0
    started = time.perf_counter()
    try:
        dom = obs.dom if obs.dom is not None else env.read_dom()
    except WebDriverException as err:  # the browser broke: no label; the step that follows ends the episode
        log.warning("teacher: the screen could not be read: %s", str(err).strip()[:200])
        dom = None
    label = teacher.label(replace(obs, dom=dom), why) if dom is not None else None
    return label, (why if label is not None else ""), _ms_since(started)


def _ended_by_loop(
    step: int, obs: Observation, decision: Decision, termination: Termination, think_ms: float, act_ms: float = 0.0
) -> StepRecord:
    """The final record of an episode the env had no say in ending: nothing to verify."""
    check = Verify(expected=decision.expected, observed=f"episode ended by the loop: {termination}", ok=None)
    return StepRecord(step, obs, decision, check, LOOP_ENDED_REWARD, termination, think_ms, act_ms)


def _ms_since(started: float) -> float:
    return (time.perf_counter() - started) * 1000.0
