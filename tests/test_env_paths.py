"""The fast environment path changes speed, not outcomes: paired episode by episode (same task, same seed)
against the stock miniwob gymnasium loop with the experts, and against the previous path with the released
model, greedy. Real headless Chromium throughout."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterable

import numpy as np
import pytest

from core.processes import browser_pids
from core.settings import TIER1_TASKS, TIER2_TASKS
from edge_client.env import EnvConfig, GuiEnv, screen_difference
from edge_client.episode import Env, EpisodeResult, run_episode
from edge_client.experts import expert_for
from edge_client.stock_env import StockEnv
from policy.interface import Policy
from registry.store import RELEASE_DIR
from schemas import Action

pytestmark = pytest.mark.browser

SEEDS_PER_TASK = {**dict.fromkeys(TIER1_TASKS, 5), **dict.fromkeys(TIER2_TASKS, 5)}  # 23 x 5 = 115 pairs (stock)
FIRST_SEED = 7_000  # away from training (small) and evaluation (1,000,000+) seeds


def outcomes(env: Env, policy_for: Callable[[str], Policy], tasks: Iterable[str]) -> list[EpisodeResult]:
    return [
        run_episode(env, policy_for(task), task, FIRST_SEED + i)
        for task in tasks
        for i in range(SEEDS_PER_TASK.get(task, 3))
    ]


def outcome(result: EpisodeResult) -> tuple:
    return (result.task, result.seed, result.raw_reward, result.termination)


def trajectory(result: EpisodeResult) -> tuple:
    """The outcome and every action taken on the way."""
    return (*outcome(result), [r.decision.action for r in result.records])


# Stock hands over the screen while an animation still runs and our fast path waits for it to settle
# (edge_client/env.py). On click-collapsible the expert then clicks Submit where it was, not where the sliding
# section has pushed it, and whether that click lands depends on the machine's timing: stock failed 0 of 9
# seeds on one machine and 7 of 9 on the next (Chromium 156). Its outcome there measures the machine, not the path.
ANIMATED_ON_STOCK = ("click-collapsible",)


def test_the_experts_earn_the_same_rewards_on_the_stock_loop_and_the_fast_path() -> None:
    tasks = [t for t in list(TIER1_TASKS) + list(TIER2_TASKS) if t not in ANIMATED_ON_STOCK]
    stock: list[EpisodeResult] = []
    for task in tasks:  # one stock browser per task: closed before the next, as stock has no task switching
        with StockEnv() as env:
            stock += outcomes(env, expert_for, [task])
    with GuiEnv(tasks[0], EnvConfig(path="fast")) as env:
        fast = outcomes(env, expert_for, tasks)
    assert len(fast) == len(stock) >= 110

    # Rewards, not actions: an expert may click a moving target at other pixels with the same result. A loaded
    # machine can still change a stock outcome, so an episode that disagrees is replayed on stock up to twice;
    # the fast path gets no second chance, and more than a few replays needed means the paths differ.
    disagreeing = [i for i, (f, s) in enumerate(zip(fast, stock, strict=True)) if outcome(f) != outcome(s)]
    assert len(disagreeing) <= 3, [outcome(stock[i]) for i in disagreeing]
    for i in disagreeing:
        task, seed = fast[i].task, fast[i].seed
        with StockEnv() as env:
            replays = [run_episode(env, expert_for(task), task, seed) for _ in range(2)]
        assert outcome(fast[i]) in [outcome(r) for r in replays], (outcome(fast[i]), [outcome(r) for r in replays])
    # The experts succeed on the suite: pairs of failures alone would prove little.
    assert sum(r.success for r in fast) / len(fast) > 0.9


def test_rendering_noise_is_one_level_on_a_few_pixels_and_nothing_more() -> None:
    screen = np.full((210, 160, 3), 245, np.uint8)
    corner = screen.copy()
    corner[[71, 153, 154], [124, 124, 14]] = 246  # the corner pixels seen to flicker
    caret = screen.copy()
    caret[40:52, 60] = 0  # a caret: one column, far more than one level
    shifted = screen.copy()
    shifted[100:140, 20:60] = 246  # a box one level lighter: too many pixels to be noise
    assert screen_difference(screen, screen) is None
    assert screen_difference(screen, corner) is None
    assert screen_difference(screen, caret) == (12, 245)
    assert screen_difference(screen, shifted) == (1600, 1)


def test_the_released_model_acts_alike_on_every_screen_of_the_previous_and_the_fast_path() -> None:
    from policy.runtime import load_policy

    model = load_policy(RELEASE_DIR / "model.vla", "release")
    tasks = list(TIER1_TASKS) + ["click-tab", "enter-text", "click-button-sequence"]
    runs = {}
    for path in ("previous", "fast"):
        with GuiEnv(tasks[0], EnvConfig(path=path)) as env:
            runs[path] = outcomes(env, lambda _task: model, tasks)

    previous, fast = runs["previous"], runs["fast"]
    assert [trajectory(r) for r in fast] == [trajectory(r) for r in previous]
    unlike = [  # the model saw the same pixels at every step, up to the rasteriser's noise
        (a.task, a.seed, k, differing)
        for a, b in zip(previous, fast, strict=True)
        for k, (x, y) in enumerate(zip(a.records, b.records, strict=True))
        if (differing := screen_difference(x.obs.screenshot, y.obs.screenshot)) is not None
    ]
    assert not unlike, unlike
    assert 0 < sum(r.success for r in fast) < len(fast)  # both outcomes occur, so agreement is not trivial


class FieldClicker:
    """Clicks the right end of enter-text's field, types, then clicks there again and again, each time after
    thinking `think_s`: the clicks leave the caret where it is, so only time passes between screens."""

    version = "field-clicker"

    def __init__(self, think_s: float):
        self.think_s = think_s

    def act(self, obs):
        import time

        from policy.interface import Decision
        from schemas import Action

        time.sleep(self.think_s if obs.step >= 2 else 0.0)
        if obs.step == 1:
            return Decision("type", Action(type="type", text="abc"))
        field = next(e for e in _elements(obs.dom) if e.tag.startswith("input"))
        return Decision("click the field", Action(type="click", x=field.left + field.width - 4, y=field.top + 8))


def _elements(root):
    yield root
    for child in root.children:
        yield from _elements(child)


@pytest.mark.parametrize("path", ["previous", "fast"])
def test_a_screen_does_not_depend_on_how_long_the_policy_thought(path: str) -> None:
    # A caret blinks 500 ms on, 500 ms off: 0.6 s of thought used to change what the next screen showed.
    screens = []
    with GuiEnv("enter-text", EnvConfig(path=path)) as env:
        for think_s in (0.0, 0.6):
            result = run_episode(env, FieldClicker(think_s), "enter-text", FIRST_SEED, max_steps=4)
            screens.append([r.result.obs.screenshot for r in result.records])
    assert all(np.array_equal(a, b) for a, b in zip(*screens, strict=True))


@pytest.mark.parametrize("path", ["previous", "fast"])
def test_a_first_screen_does_not_depend_on_where_the_last_episode_left_the_focus(path: str) -> None:
    # enter-password keeps its fields across episodes: the last one focused used to stay ringed on the next
    # episode's first screen.
    with GuiEnv("enter-password", EnvConfig(path=path)) as env:
        fresh = env.reset(seed=FIRST_SEED).screenshot
        obs = env.reset(seed=FIRST_SEED + 1)
        verify_field = [e for e in _elements(obs.dom) if e.tag.startswith("input")][-1]
        env.step(Action(type="click", x=verify_field.left + 10, y=verify_field.top + 8))  # focus it, end there
        again = env.reset(seed=FIRST_SEED).screenshot
    assert screen_difference(fresh, again) is None, screen_difference(fresh, again)


class SocketCutter:
    """The expert, except that while it thinks the page's DevTools websocket drops."""

    version = "expert"

    def __init__(self, env: GuiEnv, task: str):
        self.env, self.expert = env, expert_for(task)

    def act(self, obs):
        self.env._devtools._socket.close()
        return self.expert.act(obs)


def test_a_broken_devtools_connection_loses_at_most_one_episode() -> None:
    with GuiEnv("click-test", EnvConfig(path="fast")) as env:
        assert run_episode(env, expert_for("click-test"), "click-test", FIRST_SEED).success
        env._devtools._socket.close()  # dropped between episodes: the reset reconnects
        after_reset = run_episode(env, expert_for("click-test"), "click-test", FIRST_SEED + 1)
        mid_episode = run_episode(env, SocketCutter(env, "click-test"), "click-test", FIRST_SEED + 2)
        following = run_episode(env, expert_for("click-test"), "click-test", FIRST_SEED + 3)

    assert after_reset.success
    assert mid_episode.termination == "error"  # that step could not be taken: the episode is lost ...
    assert following.success  # ... and the next one runs on a new session to the same browser


def kill_browser(env: GuiEnv) -> list[int]:
    """SIGKILL the chromium under this env's chromedriver, as the chaos run's kill_browser strike does."""
    pids = browser_pids(env.driver.service.process.pid)
    assert pids, "no chromium under the env's chromedriver"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    return pids


class BrowserKiller:
    """The expert, except that while it thinks its browser is killed."""

    version = "expert"

    def __init__(self, env: GuiEnv, task: str):
        self.env, self.expert = env, expert_for(task)

    def act(self, obs):
        kill_browser(self.env)
        return self.expert.act(obs)


@pytest.mark.parametrize("path", ["fast", "previous"])
def test_a_killed_browser_loses_at_most_one_episode_and_the_next_runs_on_a_new_one(path: str) -> None:
    # A killed browser used to end its client on the fast path: the reset's reconnect met a dead DevTools endpoint.
    with GuiEnv("click-test", EnvConfig(path=path)) as env:
        kill_browser(env)  # between episodes: the reset starts a new browser
        after_reset = run_episode(env, expert_for("click-button"), "click-button", FIRST_SEED)
        first = browser_pids(env.driver.service.process.pid)
        mid_episode = run_episode(env, BrowserKiller(env, "click-button"), "click-button", FIRST_SEED + 1)
        following = run_episode(env, expert_for("click-button"), "click-button", FIRST_SEED + 2)
        assert browser_pids(env.driver.service.process.pid) != first  # a new browser

    assert after_reset.success
    assert mid_episode.termination == "error"  # that step could not be taken: the episode is lost ...
    assert following.success and following.task == "click-button"  # ... the next one runs, on the task it asked


def test_an_evaluation_reports_the_same_endings_with_one_browser_or_two() -> None:
    from flywheel.gathering.evaluation import evaluate
    from policy.runtime import load_policy

    def policies():
        model = load_policy(RELEASE_DIR / "model.vla", "release")
        return lambda _task: model

    tasks, config = ["click-button", "click-link", "click-tab", "enter-text"], EnvConfig(read_dom=False)
    one = evaluate(policies(), tasks, 6, seed=FIRST_SEED, env_config=config)
    two = evaluate(policies(), tasks, 6, seed=FIRST_SEED, env_config=config, browsers=2, more_policies=policies)
    assert two["browsers"] == 2
    assert {t: r["termination_by_seed"] for t, r in two["tasks"].items()} == {
        t: r["termination_by_seed"] for t, r in one["tasks"].items()
    }
