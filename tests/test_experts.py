"""Scripted experts, the GuiEnv wrapper and evaluate, against real headless Chromium (one browser for all).

The DOM geometry helpers are also tested without a browser on hand-made DOM trees.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from miniwob.dom import DOMElement

from core.settings import TIER1_TASKS, TIER2_TASKS
from edge_client.dom import visible_point
from edge_client.env import GuiEnv
from edge_client.episode import run_episode
from edge_client.experts import UnsupportedTaskError, expert_for, supported_tasks
from edge_client.tasks import task_name
from flywheel.gathering.evaluation import evaluate
from policy.interface import Decision, Observation
from schemas import Action

TIER1 = list(TIER1_TASKS)
TIER2 = list(TIER2_TASKS)
SEEDS = [101, 202, 303]  # away from 0..49, where the 50-episode measurement runs

needs_browser = pytest.mark.browser  # ops/setup.sh installs chromium + chromedriver; a missing one fails loudly


# --- without a browser -------------------------------------------------------------------------


def element(tag: str, box: tuple[float, float, float, float], children: list[dict] | None = None, **extra: Any) -> dict:
    left, top, width, height = box
    raw = {"tag": tag, "left": left, "top": top, "width": width, "height": height, "ref": 0, "children": children or []}
    raw.update(extra)
    return raw


def tree(*children: dict) -> DOMElement:
    """A DOM root holding `children`, with refs numbered in document order like core.getDOMInfo."""
    root = element("body", (0, 0, 160, 210), list(children))
    counter = iter(range(1, 1000))

    def number(raw: dict) -> None:
        raw["ref"] = next(counter)
        for child in raw["children"]:
            number(child)

    number(root)
    return DOMElement(root)


def test_task_name_accepts_gym_ids() -> None:
    assert task_name("miniwob/click-test-v1") == "click-test"
    assert task_name("click-test-2") == "click-test-2"
    assert task_name("miniwob/click-test-2-v1") == "click-test-2"


def test_unoccluded_target_is_clicked_at_its_centre() -> None:
    root = tree(element("button", (10, 60, 40, 20), text="OK"))
    x, y = visible_point(root.children[0], root)
    assert (x, y) in {(29, 69), (30, 70), (29, 70), (30, 69)}


def test_partly_covered_target_is_clicked_on_its_visible_part() -> None:
    # ONE is covered on its right half by TWO, which comes later in the document (painted on top).
    root = tree(element("button", (0, 100, 40, 40), text="ONE"), element("button", (20, 100, 40, 40), text="TWO"))
    one, two = root.children
    x, y = visible_point(one, root)
    assert 0 <= x < 20 and 100 <= y < 140
    # TWO is on top: nothing covers it, so its centre is fine.
    assert visible_point(two, root) in {(39, 119), (40, 120), (39, 120), (40, 119)}


def test_fully_covered_or_offscreen_target_has_no_visible_point() -> None:
    root = tree(
        element("button", (0, 100, 40, 40)), element("div", (0, 90, 60, 60)), element("button", (0, 300, 40, 40))
    )
    assert visible_point(root.children[0], root) is None
    assert visible_point(root.children[2], root) is None


def test_expert_registry() -> None:
    assert set(TIER1) <= set(supported_tasks())
    assert expert_for("miniwob/click-test-v1").version == "expert"
    with pytest.raises(UnsupportedTaskError, match="no scripted expert for 'book-flight'"):
        expert_for("book-flight")


def test_email_inbox_waits_for_the_send_arrow_until_its_image_has_loaded() -> None:
    # The arrow is a CSS `content:` image with no size, so absent from the DOM, until send.png loads: a
    # loaded page under load showed the recipient filled and no arrow (CI, seed 101), and the expert gave up.
    instruction = "Find the email by Maye and forward that email to Lisa."
    recipient = element("input", (40, 30, 100, 14), classes="forward-sender", value="Lisa")
    without_arrow = tree(element("div", (0, 0, 160, 210), [recipient], id="forward"))
    decision = expert_for("email-inbox").act(
        Observation("email-inbox", instruction, np.zeros((210, 160, 3)), without_arrow)
    )
    assert decision.action.type == "noop"
    arrow = element("span", (140, 3, 14, 14), id="send-forward")
    with_arrow = tree(element("div", (0, 0, 160, 210), [arrow, recipient], id="forward"))
    decision = expert_for("email-inbox").act(
        Observation("email-inbox", instruction, np.zeros((210, 160, 3)), with_arrow)
    )
    assert decision.action.type == "click" and 140 <= decision.action.x <= 154 and 3 <= decision.action.y <= 17


# --- with one browser --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def env() -> Iterator[GuiEnv]:
    with GuiEnv("click-test") as gui:
        yield gui


@needs_browser
@pytest.mark.browser
@pytest.mark.parametrize("task", TIER1)
def test_tier1_expert_succeeds(env: GuiEnv, task: str) -> None:
    expert = expert_for(task)
    for seed in SEEDS:
        result = run_episode(env, expert, task, seed, max_steps=3)
        assert result.success, (task, seed, [r.decision.thought for r in result.records], result.termination)
        assert result.steps == 1
        last = result.records[-1]
        assert last.decision.thought and last.decision.expected
        assert last.verify.ok is True
        assert last.verify.observed.startswith("episode ended with reward 1")
        assert_clicks_inside_their_target(result)


@needs_browser
@pytest.mark.browser
@pytest.mark.parametrize("task", TIER2)
def test_tier2_expert_succeeds(env: GuiEnv, task: str) -> None:
    result = run_episode(env, expert_for(task), task, SEEDS[0], max_steps=12)
    assert result.success, (task, [r.decision.thought for r in result.records], result.termination)
    assert_clicks_inside_their_target(result)


def assert_clicks_inside_their_target(result) -> None:
    """Every expert click records its element's box (what semi-online RL matches a model's click against),
    and the click is inside it."""
    for record in result.records:
        action, box = record.decision.action, record.decision.target_box
        if action.type == "click":
            assert box is not None, (result.task, record.decision.thought)
            left, top, right, bottom = box
            assert left <= action.x <= right and top <= action.y <= bottom, (result.task, box, action)


@needs_browser
@pytest.mark.browser
def test_env_observation_and_raised_timer(env: GuiEnv) -> None:
    obs = env.reset(seed=0, task="miniwob/click-button-v1")
    assert env.task == "click-button"
    assert obs.screenshot.shape == (210, 160, 3) and obs.screenshot.dtype == np.uint8
    assert obs.instruction.startswith('Click on the "')
    assert obs.dom is not None and obs.step == 0
    assert env.driver.execute_script("return core.EPISODE_MAX_TIME;") == int(env.config.episode_max_time_s * 1000)


@needs_browser
@pytest.mark.browser
def test_env_wrong_click_fails_and_timeout_is_named(env: GuiEnv) -> None:
    obs = env.reset(seed=0, task="click-test-2")
    button_two = next(e for e in _walk(obs.dom) if e.tag == "button" and e.text == "TWO")
    wrong = env.step(Action(type="click", x=button_two.left + 5, y=button_two.top + 5))
    assert wrong.done and wrong.reward == -1.0 and wrong.info["termination"] == "done"
    assert not wrong.obs.screenshot.any()  # miniwob blanks the screen once the episode is over

    env.reset(seed=1)
    nothing = env.step(Action(type="noop"))
    assert not nothing.done and nothing.reward == 0.0 and nothing.info["termination"] is None
    env.driver.execute_script("core.endEpisode(-1, false, 'timed out');")  # what the JS timer does when it fires
    late = env.step(Action(type="noop"))
    assert late.done and late.info["termination"] == "timeout"


@needs_browser
@pytest.mark.browser
def test_the_loop_names_real_failures_timeouts_and_max_steps(env: GuiEnv) -> None:
    class Scripted:
        version = "expert"

        def __init__(self, act: Callable[[Observation], Decision]):
            self.act = act

    def wrong_click(obs: Observation) -> Decision:
        two = next(e for e in _walk(obs.dom) if e.tag == "button" and e.text == "TWO")
        return Decision("Click TWO.", Action(type="click", x=two.left + 5, y=two.top + 5))

    def timer_fires(obs: Observation) -> Decision:
        env.driver.execute_script("core.endEpisode(-1, false, 'timed out');")  # what the JS timer does
        return Decision("Wait.", Action(type="noop"))

    def wait(obs: Observation) -> Decision:
        return Decision("Wait.", Action(type="noop"))

    for act, termination in ((wrong_click, "failure"), (timer_fires, "timeout"), (wait, "max_steps")):
        result = run_episode(env, Scripted(act), "click-test-2", 0, max_steps=2)
        assert result.termination == termination and not result.success and result.raw_reward == -1.0


@needs_browser
@pytest.mark.browser
def test_env_refuses_unknown_keys_as_a_wasted_step(env: GuiEnv) -> None:
    env.reset(seed=0, task="enter-text")
    result = env.step(Action(type="key", key="<NoSuchKey>"))
    assert not result.done
    assert "not one of miniwob's allowed keys" in result.info["invalid_action"]


@needs_browser
@pytest.mark.browser
def test_evaluate_reports_per_task_and_mean(env: GuiEnv) -> None:
    seen: list[tuple[str, int]] = []
    report = evaluate(
        expert_for,
        ["click-test", "miniwob/focus-text-v1"],
        episodes=2,
        seed=500,
        progress=lambda task, i, result: seen.append((task, i)),
        env=env,
    )
    assert report["model_version"] == "expert"
    assert set(report["tasks"]) == {"click-test", "focus-text"}
    for stats in report["tasks"].values():
        assert stats["episodes"] == 2
        assert stats["success_rate"] == 1.0
        assert stats["mean_steps"] == 1.0
    assert report["mean_success_rate"] == 1.0
    assert seen == [("click-test", 0), ("click-test", 1), ("focus-text", 0), ("focus-text", 1)]


def _walk(root: DOMElement) -> Iterator[DOMElement]:
    yield root
    for child in root.children:
        yield from _walk(child)
