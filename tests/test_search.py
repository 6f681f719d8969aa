"""Search from the policy's own failures (edge_client.search): branches replay the failed prefix, try the policy's
other likely actions, and keep the real successes; evaluation seeds are never searched."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from edge_client.env import EnvConfig, GuiEnv
from edge_client.episode import EpisodeResult, StepRecord, run_episode
from edge_client.experts import expert_for
from edge_client.search import Branch, SearchBudget, continue_by_teacher, failing_steps, search_failure
from flywheel.gathering.episodes import label_rows
from policy.elements import element_centres
from policy.interface import Decision, Observation
from policy.runtime import load_policy
from registry.store import RELEASE_DIR
from schemas import Action, Verify

TRAINING_SEED = 7_000  # below the evaluation seeds (1,000,000+)


class Recorder:
    """A policy that clicks (9, 9) and records what it was told."""

    version = "recorder"

    def __init__(self):
        self.remembered: list[tuple[int, Action]] = []

    def act(self, obs: Observation) -> Decision:
        return Decision("own", Action(type="click", x=9, y=9))

    def remember(self, obs: Observation, action: Action) -> None:
        self.remembered.append((obs.step, action))


def observation(step: int) -> Observation:
    return Observation("click-test", "Click the button.", np.zeros((210, 160, 3), np.uint8), step=step)


def test_a_branch_replays_its_prefix_lets_the_teacher_finish_within_its_calls_then_the_policy() -> None:
    policy, teacher = Recorder(), Recorder()
    teacher.act = lambda obs: Decision("teacher", Action(type="click", x=5, y=5))
    prefix = [Decision("first", Action(type="click", x=1, y=1)), Decision("second", Action(type="click", x=2, y=2))]
    branch = Branch(prefix, policy, teacher, teacher_calls=1)
    decisions = [branch.act(observation(step)) for step in range(4)]
    assert [(d.action.x, d.action.y) for d in decisions] == [(1, 1), (2, 2), (5, 5), (9, 9)]
    assert [d.thought for d in decisions] == ["first", "second", "teacher", "own"]  # forced steps keep theirs
    assert branch.calls == 1 and len(branch.screens) == 2
    # The policy was told every action it did not choose, so its history is the branch's when it acts.
    assert policy.remembered == [(0, prefix[0].action), (1, prefix[1].action), (2, Action(type="click", x=5, y=5))]


@pytest.mark.browser
def test_the_search_finds_real_successes_from_the_released_models_failures_on_its_own() -> None:
    model = load_policy(RELEASE_DIR / "model.vla", "release")
    budget = SearchBudget(candidates=4, branch_steps=1, simulations=4, env_steps=30)
    with GuiEnv("click-link", EnvConfig(read_dom=False)) as env:
        failures = []
        for seed in range(TRAINING_SEED, TRAINING_SEED + 40):
            result = run_episode(env, model, "click-link", seed)
            if not result.success:
                failures.append(result)
            if len(failures) == 4:
                break
        assert len(failures) == 4  # the release fails click-link about 4 seeds in 10
        searched = [search_failure(env, model, failed, budget, seed=0) for failed in failures]
        with pytest.raises(ValueError, match="evaluation seed"):
            search_failure(env, model, replace(failures[0], seed=1_000_000), budget)

    found = [(failed, s) for failed, s in zip(failures, searched, strict=True) if s.successes]
    assert found, [s.stopped for s in searched]  # the policy's own second choices solve some of its failures
    for failed, search in found:
        success = search.successes[0]
        assert success.success and (success.task, success.seed) == (failed.task, failed.seed)
        assert success.records[0].decision.action != failed.records[0].decision.action  # another first click
    for search in searched:  # within the budget, and no replay disagreed with the failed episode's screens
        assert search.simulations <= budget.simulations and search.env_steps <= budget.env_steps
        assert search.stopped != "nondeterministic" and search.teacher_calls == 0
        assert search.targets_from == [0] * len(search.successes)  # the policy's own successes: imitated whole


@pytest.mark.browser
def test_the_teacher_finishes_a_branch_within_its_calls_and_the_policy_after() -> None:
    # enter-password, a multi-step task the release often fails: branched at its failing step, the expert (which
    # reads the DOM) finishes the episode from there for at most 12 actions a search.
    model = load_policy(RELEASE_DIR / "model.vla", "release")
    budget = SearchBudget(candidates=2, branch_steps=1, simulations=2, env_steps=40, teacher_calls=12)
    with GuiEnv("enter-password", EnvConfig(read_dom=True)) as env:
        failed = next(
            r for seed in range(TRAINING_SEED, TRAINING_SEED + 20)
            if not (r := run_episode(env, model, "enter-password", seed)).success
        )  # fmt: skip
        search = search_failure(env, model, failed, budget, teacher=expert_for("enter-password"), max_steps=20)
        # The teacher's own trajectory from the failure's first step (labels whose history is the teacher's).
        continued = continue_by_teacher(env, model, failed, 1, expert_for("enter-password"), max_steps=20)
        with pytest.raises(ValueError, match="evaluation seed"):
            continue_by_teacher(env, model, replace(failed, seed=1_000_000), 1, expert_for("enter-password"))
    assert 0 < search.teacher_calls <= budget.teacher_calls
    assert search.stopped != "nondeterministic"
    assert search.successes, (failing_steps(failed), search)
    # The teacher finished every success: its steps are the targets, the policy's prefix and candidate context.
    branched_at = failing_steps(failed)[0]
    assert search.targets_from == [branched_at + 1] * len(search.successes)
    # With a teacher to finish, a noop is no candidate (the teacher would solve the failing screen behind it).
    assert all(s.records[branched_at].decision.action.type != "noop" for s in search.successes)
    rows = label_rows(search.successes[0], "found", "release", search.targets_from[0])
    assert rows["train"].to_list() == [step > branched_at for step in rows["step"]]
    assert continued is not None and continued.success  # the replayed step matched, then the expert solved it
    assert continued.records[0].decision == failed.records[0].decision  # the policy's own first step, replayed
    assert all(r.decision.logprob is None for r in continued.records[1:])  # then the expert's (no model logprob)


def record(step: int, screen: np.ndarray, ok: bool) -> StepRecord:
    obs = Observation("count-sides", "Press the button.", screen, step=step)
    return StepRecord(step, obs, Decision("", Action(type="click", x=1, y=1)), Verify(ok=ok), 0.0, None, 1.0)


def test_a_policy_stuck_on_one_screen_is_branched_where_it_first_saw_it():
    stuck, changed = np.zeros((210, 160, 3), np.uint8), np.full((210, 160, 3), 255, np.uint8)
    records = [record(i, stuck, ok=False) for i in range(4)] + [record(4, changed, ok=False), record(5, stuck, False)]
    failed = EpisodeResult("count-sides", 7, 6, -1.0, "max_steps", 1.0, records)
    assert failing_steps(failed) == [0, 4]  # step 5 and 3, 2, 1 showed step 0's screen: branched at 0
    verified = [record(0, stuck, ok=True), record(1, changed, ok=False)]
    assert failing_steps(EpisodeResult("count-sides", 7, 2, -1.0, "failure", 1.0, verified)) == [1]


def test_the_screens_elements_are_read_from_its_pixels_one_centre_each():
    screen = np.full((210, 160, 3), 255, np.uint8)
    screen[:50] = (255, 255, 0)  # a banner: a region, offered last
    for left in (20, 45, 70):  # three framed buttons 5 px apart, each with a label inside its frame
        screen[170:190, left : left + 20] = 0
        screen[172:188, left + 2 : left + 18] = 255
        screen[178:182, left + 8 : left + 12] = 0
    screen[100:120, 60:100] = 90  # a shape
    assert element_centres(screen) == [(80.0, 110.0), (30.0, 180.0), (55.0, 180.0), (80.0, 180.0), (80.0, 25.0)]
    assert element_centres(np.full((210, 160, 3), 255, np.uint8)) == []  # a blank screen has nothing to press
