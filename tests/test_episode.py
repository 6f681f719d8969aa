"""The one episode loop (edge_client.episode) on a scripted fake env: how each kind of ending is decided,
and that the runner's events, the scorer and `evaluate` all see that same ending."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import pytest
from selenium.common.exceptions import WebDriverException

from edge_client.env import StepResult
from edge_client.episode import LOOP_ENDED_REWARD, run_episode
from edge_client.runner import step_publisher
from flywheel.gathering.evaluation import evaluate
from policy.expectations import EXPECT_SUCCESS
from policy.interface import Decision, Observation
from processors.assembly import EpisodeAssembler
from schemas import Action, StepEvent, decode_event, encode_event


def screen(value: int = 0) -> np.ndarray:
    return np.full((210, 160, 3), value, dtype=np.uint8)


def obs(step: int = 0) -> Observation:
    return Observation(task="click-test", instruction="Click the button.", screenshot=screen(), step=step)


def running() -> StepResult:
    return StepResult(obs(), 0.0, False, {"termination": None})


def ended(reward: float, termination: str = "done") -> StepResult:
    return StepResult(obs(), reward, True, {"termination": termination})


@dataclass
class FakeEnv:
    """Plays back `results`, one per step; an exception in the script is raised by that step."""

    results: list[StepResult | Exception]
    resets: list[tuple[int | None, str | None]] = field(default_factory=list)

    def reset(self, seed: int | None = None, task: str | None = None) -> Observation:
        self.resets.append((seed, task))
        self._script = iter(self.results)
        return obs()

    def step(self, action: Action) -> StepResult:
        result = next(self._script)
        if isinstance(result, Exception):
            raise result
        return result


class Clicker:
    version = "expert"

    def act(self, observation: Observation) -> Decision:
        return Decision("The button is in the middle.", Action("click", 80.0, 105.0), EXPECT_SUCCESS)


class Lost:
    version = "expert"

    def act(self, observation: Observation) -> Decision:
        raise LookupError("no button in the DOM")


@pytest.mark.parametrize(
    ("script", "termination", "reward", "steps"),
    [
        ([ended(1.0)], "success", 1.0, 1),
        ([running(), ended(0.4)], "success", 0.4, 2),  # partial reward still ends it well
        ([ended(-1.0)], "failure", -1.0, 1),
        ([running(), ended(-1.0, "timeout")], "timeout", -1.0, 2),
        ([running(), running(), running()], "max_steps", LOOP_ENDED_REWARD, 3),
        ([running(), WebDriverException("renderer hung")], "error", LOOP_ENDED_REWARD, 2),
    ],
)
def test_the_loop_decides_the_ending(script, termination, reward, steps):
    env = FakeEnv(script)
    result = run_episode(env, Clicker(), "miniwob/click-test-v1", seed=5, max_steps=3)
    assert env.resets == [(5, "miniwob/click-test-v1")]
    assert (result.termination, result.raw_reward, result.steps) == (termination, reward, steps)
    assert result.success is (termination == "success")
    assert result.binary_reward == (1.0 if result.success else -1.0)
    assert result.task == "click-test" and result.seed == 5
    *before, final = result.records
    assert final.done and final.termination == termination and final.reward == reward
    assert all(not r.done and r.termination is None and r.reward == 0.0 for r in before)
    assert [r.step for r in result.records] == list(range(steps))


def test_a_policy_that_cannot_read_the_screen_gives_up_without_acting():
    result = run_episode(FakeEnv([]), Lost(), "click-test", seed=0, max_steps=3)
    (final,) = result.records
    assert result.termination == "gave_up" and not result.success and final.result is None
    assert final.decision.action.type == "noop" and final.decision.thought.startswith("Giving up")
    assert final.verify.ok is None


def test_max_steps_must_allow_a_step():
    with pytest.raises(ValueError, match="max_steps"):
        run_episode(FakeEnv([]), Clicker(), "click-test", seed=0, max_steps=0)


@pytest.mark.parametrize(
    "script", [[ended(1.0)], [running(), ended(-1.0, "timeout")], [running(), running()], [WebDriverException("x")]]
)
def test_runner_events_carry_the_loop_ending_to_the_scorer(script, tmp_path):
    published: list[StepEvent] = []
    on_step = step_publisher(published.append, "c0", "c0-click-test-5-0", "click-test", 5, "expert")
    result = run_episode(FakeEnv(script), Clicker(), "click-test", seed=5, max_steps=2, on_step=on_step)

    assert len(published) == result.steps and all(e.seed == 5 for e in published)
    assert [e.termination for e in published] == [None] * (result.steps - 1) + [result.termination]
    assert [e.done for e in published] == [False] * (result.steps - 1) + [True]
    on_the_wire = [decode_event(encode_event(e), expect=StepEvent) for e in published]
    (episode,) = EpisodeAssembler(tmp_path).observe(on_the_wire)
    assert (episode.termination, episode.success, episode.seed) == (result.termination, result.success, 5)
    assert episode.raw_reward == result.raw_reward and episode.steps == result.steps


def test_evaluate_counts_the_loop_endings():
    env = FakeEnv([running(), ended(1.0)])
    report = evaluate(lambda _task: Clicker(), ["click-test"], episodes=2, seed=10, env=env)
    stats = report["tasks"]["click-test"]
    assert stats["success_rate"] == 1.0 and stats["mean_steps"] == 2.0 and stats["terminations"] == {"success": 2}
    assert [seed for seed, _ in env.resets] == [10, 11]

    report = evaluate(lambda _task: Clicker(), ["click-test"], episodes=1, env=FakeEnv([running()]), max_steps=1)
    assert report["mean_success_rate"] == 0.0 and report["tasks"]["click-test"]["terminations"] == {"max_steps": 1}


class SeededEnv(FakeEnv):
    """Succeeds on the runs of a seed listed in `wins` (a seed's runs counted in order)."""

    def __init__(self, wins: dict[int, set[int]]):
        super().__init__([])
        self.wins, self.runs = wins, {}

    def reset(self, seed: int | None = None, task: str | None = None) -> Observation:
        run = self.runs[seed] = self.runs.get(seed, -1) + 1
        self.results = [ended(1.0) if run in self.wins.get(seed, set()) else ended(-1.0)]
        return super().reset(seed, task)


def test_evaluate_with_samples_reports_pass_at_k_beside_the_rate_of_all_runs():
    # Seed 10 succeeds on its 3rd run of 4, seed 11 never, seed 12 on every run.
    env = SeededEnv({10: {2}, 12: {0, 1, 2, 3}})
    report = evaluate(lambda _task: Clicker(), ["click-test"], episodes=3, seed=10, env=env, samples=4)
    stats = report["tasks"]["click-test"]
    assert [seed for seed, _ in env.resets] == [10] * 4 + [11] * 4 + [12] * 4
    assert stats["episodes"] == 12 and stats["success_rate"] == 5 / 12  # pass@1 of the sampled policy
    assert stats["pass_at_k"] == 2 / 3 and stats["pass_by_seed"] == [True, False, True]
    assert stats["successes_by_seed"] == [1, 0, 4]
    assert stats["termination_by_seed"] == ["failure", "failure", "success"]  # each seed's first run
    assert report["mean_pass_at_k"] == 2 / 3 and report["samples"] == 4
    with pytest.raises(ValueError, match="samples"):
        evaluate(lambda _task: Clicker(), ["click-test"], episodes=1, env=env, samples=0)


def test_a_run_that_acts_on_one_unchanged_screen_ends_at_its_stall_budget():
    # The fake env shows the same screen after every step: the 3rd action on it is the last.
    result = run_episode(FakeEnv([running()] * 10), Clicker(), "click-test", 0, max_steps=10, stall_steps=3)
    assert (result.steps, result.termination) == (3, "max_steps")
    assert run_episode(FakeEnv([running()] * 10), Clicker(), "click-test", 0, max_steps=10).steps == 10  # off

    class Changing(FakeEnv):  # a new screen after every step: never stalled
        def step(self, action: Action) -> StepResult:
            super().step(action)
            self.shown = getattr(self, "shown", 0) + 1
            return StepResult(replace(obs(), screenshot=screen(self.shown)), 0.0, False, {"termination": None})

    assert run_episode(Changing([running()] * 10), Clicker(), "click-test", 0, max_steps=10, stall_steps=3).steps == 10
