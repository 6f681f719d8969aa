"""The teacher in the loop at the edge (edge_client.teacher): which screens it is asked about, what it may
spend, that the DOM is read only when a label is due, and that its label travels on the step event."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from edge_client.env import StepResult
from edge_client.episode import run_episode
from edge_client.runner import step_event
from edge_client.teacher import Teacher, TeacherConfig
from policy.interface import Decision, Observation
from processors.table_rows import step_row
from schemas import Action, Verify, decode_event, encode_event

DOM = object()  # what the fake env's read_dom returns: the teacher checks it got it


def screen(value: int) -> np.ndarray:
    return np.full((210, 160, 3), value, dtype=np.uint8)


@dataclass
class FakeEnv:
    """An episode of `length` steps whose screens are 0, 1, 2, ...; `ok` is each step's verify outcome."""

    length: int = 3
    dom_reads: int = 0

    def reset(self, seed: int | None = None, task: str | None = None) -> Observation:
        self._step, self._task = 0, task or "click-test"
        return Observation(task=self._task, instruction="Click.", screenshot=screen(0), step=0)

    def step(self, action: Action) -> StepResult:
        self._step += 1
        done = self._step >= self.length
        nxt = Observation(task=self._task, instruction="Click.", screenshot=screen(self._step), step=self._step)
        return StepResult(nxt, 1.0 if done else 0.0, done, {"termination": None})

    def read_dom(self):
        self.dom_reads += 1
        return DOM


@dataclass
class Model:
    """A model policy whose action has probability `p`."""

    p: float = 0.9
    version: str = "v1"

    def act(self, obs: Observation) -> Decision:
        return Decision(thought="Click.", action=Action("click", 10.0, 10.0), logprob=float(np.log(self.p)))


@dataclass
class DomTeacher:
    """A teacher policy that needs the DOM, as the experts do."""

    version: str = "expert"
    calls: int = 0

    def act(self, obs: Observation) -> Decision:
        assert obs.dom is DOM, "the teacher was asked without the DOM"
        self.calls += 1
        return Decision(thought="Click the button.", action=Action("click", 80.0, 100.0), target_box=(70, 90, 90, 110))


def teacher(budget: int = 10, **config) -> tuple[Teacher, DomTeacher]:
    oracle = DomTeacher()
    return Teacher(TeacherConfig(teacher_budget=budget, **config), lambda _task: oracle), oracle


def test_no_label_is_due_on_a_confident_policy_of_a_task_it_solves_and_the_dom_is_never_read():
    env, (asks, oracle) = FakeEnv(), teacher(teacher_ask=("uncertain", "failing_task"))
    for _ in range(8):  # the task's recent success becomes 1.0: no longer failing
        run_episode(env, Model(p=0.9), "click-test", 0, teacher=asks)
    reads, calls = env.dom_reads, oracle.calls
    result = run_episode(env, Model(p=0.9), "click-test", 1, teacher=asks)
    assert result.success
    assert [r.teacher for r in result.records] == [None, None, None]
    assert (env.dom_reads, oracle.calls) == (reads, calls)  # nothing read, nothing asked


def test_an_uncertain_step_is_labelled_from_the_screen_it_was_chosen_on():
    env, (asks, oracle) = FakeEnv(), teacher(teacher_ask=("uncertain",))
    result = run_episode(env, Model(p=0.2), "click-test", 0, teacher=asks)
    assert [r.teacher_reason for r in result.records] == ["uncertain"] * 3
    assert all(r.teacher.action == Action("click", 80.0, 100.0) for r in result.records)
    assert env.dom_reads == 3 and oracle.calls == 3 and asks.labels == {"uncertain": 3}


def test_the_per_episode_budget_bounds_the_calls_and_counts_what_it_refused():
    env, (asks, oracle) = FakeEnv(length=5), teacher(budget=2, teacher_ask=("uncertain",))
    result = run_episode(env, Model(p=0.2), "click-test", 0, teacher=asks)
    assert [r.teacher is not None for r in result.records] == [True, True, False, False, False]
    assert oracle.calls == 2 and env.dom_reads == 2 and asks.skipped == {"budget_episode": 3}


def test_the_hourly_budget_is_a_sliding_hour():
    now = [0.0]
    oracle = DomTeacher()
    asks = Teacher(TeacherConfig(teacher_budget=10, teacher_per_hour=4, teacher_ask=("uncertain",)),
                   lambda _task: oracle, clock=lambda: now[0])  # fmt: skip
    env = FakeEnv(length=3)
    run_episode(env, Model(p=0.2), "click-test", 0, teacher=asks)  # 3 labels at t = 0
    now[0] = 1800.0
    run_episode(FakeEnv(length=3), Model(p=0.2), "click-other", 0, teacher=asks)  # 1 more, then the hour is full
    assert oracle.calls == 4 and asks.skipped == {"budget_hour": 2}
    now[0] = 3601.0  # the first three left the window
    run_episode(FakeEnv(length=3), Model(p=0.2), "click-third", 0, teacher=asks)
    assert oracle.calls == 7


def test_a_screen_labelled_before_gets_its_label_again_without_a_call():
    env, (asks, oracle) = FakeEnv(), teacher(teacher_ask=("uncertain",))
    run_episode(env, Model(p=0.2), "click-test", 0, teacher=asks)
    again = run_episode(env, Model(p=0.2), "click-test", 0, teacher=asks)  # the same screens: a group's repeat
    assert all(r.teacher is not None for r in again.records)
    assert oracle.calls == 3 and asks.reused == 3 and env.dom_reads == 3


def test_a_failed_verify_makes_the_next_screen_worth_a_label():
    asks, _ = teacher(teacher_ask=("verify_failed",))
    decision = Model().act(Observation("t", "i", screen(0)))
    assert asks.reason(decision, previous_ok=False) == "verify_failed"
    assert asks.reason(decision, previous_ok=True) is None and asks.reason(decision, previous_ok=None) is None


def test_a_failing_task_is_asked_about_until_it_is_solved():
    asks, _ = teacher(teacher_ask=("failing_task",), teacher_failing_below=0.75, teacher_window=4)
    decision = Model().act(Observation("t", "i", screen(0)))
    asks.begin_episode("t")
    assert asks.reason(decision, None) == "failing_task"  # never seen: failing
    for success in (True, True, True, False):
        asks.end_episode("t", success)
    asks.begin_episode("t")
    assert asks.reason(decision, None) is None  # 3 of the last 4: not below 0.75
    asks.end_episode("t", False)
    asks.begin_episode("t")
    assert asks.reason(decision, None) == "failing_task"  # 2 of the last 4


def test_a_teacher_that_cannot_read_the_screen_gives_no_label_and_the_call_counts():
    class Stumped:
        version = "expert"

        def act(self, obs):
            raise LookupError("no button in the DOM")

    asks = Teacher(TeacherConfig(teacher_budget=1, teacher_ask=("uncertain",)), lambda _task: Stumped())
    result = run_episode(FakeEnv(length=2), Model(p=0.2), "click-test", 0, teacher=asks)
    assert [r.teacher for r in result.records] == [None, None]
    assert asks.skipped == {"no_label": 1, "budget_episode": 1} and asks.labels == {}


def test_unknown_reasons_are_refused_by_name():
    with pytest.raises(ValueError, match="sometimes"):
        TeacherConfig(teacher_budget=1, teacher_ask=("uncertain", "sometimes"))


def test_the_label_travels_on_the_step_event_and_lands_in_its_row():
    env, (asks, _) = FakeEnv(length=1), teacher(teacher_ask=("uncertain",))
    record = run_episode(env, Model(p=0.2), "click-test", 0, teacher=asks).records[0]
    event = decode_event(encode_event(step_event(record, "c0", "e0", "click-test", 0, "v1")))
    assert event.teacher_action == Action("click", 80.0, 100.0) and event.teacher_reason == "uncertain"
    assert event.teacher_thought == "Click the button." and event.teacher_box == (70.0, 90.0, 90.0, 110.0)
    row = step_row(event, 0, 0)
    assert (row["teacher_action_type"], row["teacher_action_x"], row["teacher_box"]) == (
        "click",
        80.0,
        [70.0, 90.0, 90.0, 110.0],
    )
    unlabelled = step_row(step_event(record.__class__(0, record.obs, record.decision, Verify(), 0.0, None, 1.0),
                                     "c0", "e0", "click-test", 0, "v1"), 0, 0)  # fmt: skip
    assert unlabelled["teacher_action_type"] is None and unlabelled["teacher_action_x"] is None
