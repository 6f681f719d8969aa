"""One MiniWoB++ task in one headless Chromium, speaking our Action / Observation types.

`GuiEnv` wraps miniwob's gymnasium environment (`MiniWoBEnvironment`) and changes three things:

* Chrome options. miniwob builds them inside `SeleniumInstance.create_driver` with only
  `headless, disable-gpu, no-sandbox`; running as root on a small shared box also needs
  `disable-dev-shm-usage` (a small /dev/shm crashes Chromium with "DevToolsActivePort") and the
  background services switched off. `_Instance` overrides `create_driver` with our option list.
* The 10 s JavaScript episode timer (`core.EPISODE_MAX_TIME`, read by `core.startEpisodeReal()` when an
  episode starts). It is raised before every reset so that model inference speed does not decide
  success. Tasks that set a longer limit in their page keep it.
* Task switching. A browser start costs ~1-2 s and ~175 MiB; switching task is one page load
  (`driver.get` of the task's HTML, ~0.1-0.3 s), so one browser serves every (non-flight) task.

Reward: miniwob's reward is terminal; we report the *raw* reward (`WOB_RAW_REWARD_GLOBAL`, in [-1, 1],
not scaled by elapsed time). A step that did not end the episode has reward 0.
"""

from __future__ import annotations

import logging
import shutil
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from miniwob.action import ActionSpaceConfig, ActionTypes
from miniwob.constants import DEFAULT_SCROLL_AMOUNT, TASK_HEIGHT, TASK_WIDTH
from miniwob.environment import MiniWoBEnvironment
from miniwob.fields import get_field_extractor
from miniwob.reward import get_raw_reward
from miniwob.selenium_instance import DEFAULT_BASE_URL, SeleniumInstance
from selenium import webdriver
from selenium.webdriver.chrome.service import Service as ChromeService
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.wait import WebDriverWait

from policy.interface import Observation
from schemas import Action

log = logging.getLogger(__name__)

# Headless Chromium as root on a shared 2-core box. Each flag is here for a reason:
CHROME_ARGS: tuple[str, ...] = (
    "headless=new",
    "no-sandbox",  # root cannot use the setuid/namespace sandbox
    "disable-dev-shm-usage",  # small /dev/shm in containers -> DevToolsActivePort crashes
    "disable-gpu",  # no GPU; avoids the GPU process probing for one
    "disable-background-networking",  # no network here: no update/safe-browsing pings
    "disable-component-update",
    "disable-extensions",
    "disable-default-apps",
    "disable-sync",
    "no-first-run",
    "no-default-browser-check",
    "mute-audio",
    "disable-features=Translate,OptimizationHints,MediaRouter",
    "force-device-scale-factor=1",  # 1 CSS px = 1 screenshot px, so DOM boxes match the image
)

SETTLE_MAX_S = 2.0
SETTLE_POLL_S = 0.02
# True while a jQuery (or jQuery UI) animation runs on the page; pages without jQuery never animate this way.
_ANIMATING_JS = "return !!(window.jQuery && jQuery.fn && jQuery(':animated').length);"

TASK_SHAPE = (TASK_HEIGHT, TASK_WIDTH, 3)  # (210, 160, 3): screenshots are rows x columns x RGB


@dataclass(frozen=True)
class EnvConfig:
    """How GuiEnv runs the browser."""

    episode_max_time_s: float = 120.0
    """JavaScript episode limit (miniwob's default is 10 s). A task whose page sets more keeps its own."""
    chrome_binary: str | None = None
    """Chromium executable; None: `chromium` (then `chromium-browser`, `google-chrome`) on PATH."""
    chromedriver: str | None = None
    """Chromedriver executable; None: `chromedriver` on PATH."""
    chrome_args: tuple[str, ...] = CHROME_ARGS
    """Command-line switches (without the leading dashes)."""
    wait_ms: float = 0.0
    """Pause after every action before the screenshot (jQuery animations are awaited anyway)."""
    noop_wait_s: float = 0.5
    """A "noop" action waits this long: the agent's way to let timers fire (e.g. autocomplete's 300 ms)."""
    base_url: str = DEFAULT_BASE_URL
    """Where the task HTML lives; the default is the copy inside the miniwob package."""


@dataclass(frozen=True)
class StepResult:
    obs: Observation
    reward: float  # raw miniwob reward: 0 until done, then in [-1, 1]
    done: bool
    info: dict[str, Any] = field(default_factory=dict)  # termination, reason, env_ms, ...


def task_name(task: str) -> str:
    """'miniwob/click-test-v1' or 'click-test' -> 'click-test'."""
    name = task.removeprefix("miniwob/")
    head, sep, version = name.rpartition("-v")
    return head if sep and version.isdigit() else name


def _find_executable(explicit: str | None, candidates: tuple[str, ...]) -> str:
    for name in (explicit, *candidates) if explicit else candidates:
        path = shutil.which(name) if name else None
        if path:
            return path
    raise FileNotFoundError(f"none of {[explicit] if explicit else list(candidates)} found on PATH")


class _Instance(SeleniumInstance):
    """miniwob's Selenium instance with our Chrome options and cheap task switching."""

    def __init__(self, *args: Any, config: EnvConfig, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.config = config

    def create_driver(self) -> None:
        # Same steps as miniwob's create_driver (headless branch), with our options and executables.
        options = webdriver.ChromeOptions()
        for arg in self.config.chrome_args:
            options.add_argument(arg)
        options.binary_location = _find_executable(
            self.config.chrome_binary, ("chromium", "chromium-browser", "google-chrome")
        )
        service = ChromeService(executable_path=_find_executable(self.config.chromedriver, ("chromedriver",)))
        self.driver = webdriver.Chrome(service=service, options=options)
        self.driver.implicitly_wait(5)
        self._load_page()

    def _load_page(self) -> None:
        self.driver.get(self.url)
        # The "START" cover becomes clickable once core.js has run: the page is ready for an episode.
        WebDriverWait(self.driver, 10).until(EC.element_to_be_clickable((By.ID, self.SYNC_SCREEN_ID)))
        self.inner_width, self.inner_height = self.driver.execute_script(
            "return [window.innerWidth, window.innerHeight];"
        )

    def switch_task(self, subdomain: str) -> None:
        self.url = urllib.parse.urljoin(self.config.base_url, f"{subdomain}.html")
        self.field_extractor = get_field_extractor(subdomain)
        self.cached_fields = []
        self._load_page()

    def perform(self, action: Any, action_space_config: ActionSpaceConfig) -> None:
        super().perform(action, action_space_config)
        self._settle()

    def _settle(self) -> None:
        """Wait (up to SETTLE_MAX_S) for jQuery animations to finish, so the observation shows where
        things end up: e.g. click-collapsible slides its section open and moves the Submit button."""
        deadline = time.perf_counter() + SETTLE_MAX_S
        while time.perf_counter() < deadline:
            if not self.driver.execute_script(_ANIMATING_JS):
                return
            time.sleep(SETTLE_POLL_S)

    def raise_episode_time(self) -> None:
        ms = int(self.config.episode_max_time_s * 1000)
        self.driver.execute_script(f"core.EPISODE_MAX_TIME = Math.max(core.EPISODE_MAX_TIME, {ms});")


class _MiniWoB(MiniWoBEnvironment):
    """MiniWoBEnvironment whose instance is an `_Instance`."""

    def __init__(self, subdomain: str, config: EnvConfig):
        self._config = config  # read by _hard_reset_instance, which the base __init__ calls
        super().__init__(
            subdomain=subdomain,
            base_url=config.base_url,
            reward_processor=get_raw_reward,
            wait_ms=config.wait_ms,
        )

    def _hard_reset_instance(self) -> None:
        if getattr(self, "instance", None):
            self.instance.close()
        self.instance = _Instance(index=0, config=self._config, **self.instance_kwargs)
        self.instance.start()  # not threaded: start() is create_driver()


class GuiEnv:
    """One browser, any number of episodes of any (non-flight) MiniWoB++ task.

    >>> env = GuiEnv("click-test")
    >>> obs = env.reset(seed=0)
    >>> result = env.step(Action(type="click", x=80, y=105))
    >>> env.close()
    """

    def __init__(self, task: str, config: EnvConfig | None = None):
        self.config = config or EnvConfig()
        self.task = task_name(task)
        if self.task.startswith("flight."):
            raise ValueError("FlightWoB tasks (other window size and HTTP server) are not supported")
        self._env = _MiniWoB(self.task, self.config)
        self._step = 0
        self._instruction = ""

    @property
    def driver(self) -> webdriver.Chrome:
        return self._env.instance.driver

    def set_task(self, task: str) -> None:
        """Switch the browser to another task: one page load, not a new browser."""
        name = task_name(task)
        if name == self.task:
            return
        if name.startswith("flight."):
            raise ValueError("FlightWoB tasks are not supported")
        self._env.instance.switch_task(name)
        # A browser restarted after a crash (_hard_reset_instance) must open this task, not the first one.
        self._env.subdomain = name
        self._env.instance_kwargs["subdomain"] = name
        self.task = name

    def reset(self, seed: int | None = None, task: str | None = None) -> Observation:
        if task is not None:
            self.set_task(task)
        if self._env.instance.died:
            log.warning("browser died; starting a new one")
            self._env._hard_reset_instance()
        # core.startEpisodeReal() (called by reset) reads EPISODE_MAX_TIME when it arms the timer.
        self._env.instance.raise_episode_time()
        raw_obs, info = self._env.reset(seed=seed)
        self._step = 0
        self._instruction = raw_obs["utterance"]
        return self._observation(raw_obs, info)

    def step(self, action: Action) -> StepResult:
        t0 = time.perf_counter()
        try:
            miniwob_action, invalid = self._to_miniwob(action), None
        except ValueError as exc:
            # A model may emit a key miniwob cannot press: that step is wasted (a no-op), not a crash.
            miniwob_action, invalid = self._noop(), str(exc)
        if action.type == "noop":
            time.sleep(self.config.noop_wait_s)
        raw_obs, reward, done, _truncated, meta = self._env.step(miniwob_action)
        env_ms = (time.perf_counter() - t0) * 1000.0
        self._step += 1
        reason = meta.get("reason")
        info = {
            "termination": _termination(done, reason),
            "reason": None if reason is None else str(reason),
            "raw_reward": float(meta.get("raw_reward", 0.0)),
            "env_reward": float(meta.get("env_reward", 0.0)),
            "elapsed_s": float(meta.get("elapsed", 0.0)),
            "env_ms": env_ms,
            "invalid_action": invalid,
        }
        return StepResult(self._observation(raw_obs, meta, done), float(reward), done, info)

    def close(self) -> None:
        self._env.close()

    def __enter__(self) -> GuiEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- helpers -------------------------------------------------------------------------------

    def _observation(self, raw_obs: dict[str, Any], info: dict[str, Any], done: bool = False) -> Observation:
        # After the episode ends miniwob returns an all-black screenshot and an empty utterance; we
        # keep the episode's instruction so that the last observation still says what the task was.
        screenshot = np.asarray(raw_obs["screenshot"], dtype=np.uint8)
        assert screenshot.shape == TASK_SHAPE, screenshot.shape
        return Observation(
            task=self.task,
            instruction=self._instruction,
            screenshot=screenshot,
            dom=None if done else info.get("root_dom"),
            step=self._step,
        )

    def _to_miniwob(self, action: Action) -> dict[str, Any]:
        config: ActionSpaceConfig = self._env.action_space_config
        # Selenium refuses pointer moves outside the viewport; keep clicks inside the task area.
        coords = np.array(
            [min(max(action.x, 0.0), TASK_WIDTH - 1.0), min(max(action.y, 0.0), TASK_HEIGHT - 1.0)],
            dtype=np.float32,
        )
        if action.type == "click":
            return {"action_type": config.action_types.index(ActionTypes.CLICK_COORDS), "coords": coords}
        if action.type == "type":
            return {"action_type": config.action_types.index(ActionTypes.TYPE_TEXT), "text": action.text}
        if action.type == "key":
            key = _key_index(config, action.key)
            return {"action_type": config.action_types.index(ActionTypes.PRESS_KEY), "key": key}
        if action.type == "scroll":
            kind = ActionTypes.SCROLL_DOWN_COORDS if action.scroll_dy >= 0 else ActionTypes.SCROLL_UP_COORDS
            # One shared config: the amount of this scroll is set on it just before the step.
            config.scroll_amount = int(round(abs(action.scroll_dy))) or DEFAULT_SCROLL_AMOUNT
            return {"action_type": config.action_types.index(kind), "coords": coords}
        return self._noop()

    def _noop(self) -> dict[str, Any]:
        return {"action_type": self._env.action_space_config.action_types.index(ActionTypes.NONE)}


def _key_index(config: ActionSpaceConfig, key: str) -> int:
    """Index of `key` in miniwob's allowed keys; accepts 'Enter' for '<Enter>'."""
    for candidate in (key, f"<{key}>"):
        if candidate in config.allowed_keys:
            return list(config.allowed_keys).index(candidate)
    raise ValueError(f"key {key!r} is not one of miniwob's allowed keys (e.g. '<Enter>', 'a', 'C-a')")


def _termination(done: bool, reason: Any) -> str | None:
    """None while the episode runs; 'timeout' when the JS timer ended it; otherwise 'done'."""
    if not done:
        return None
    return "timeout" if reason == "timed out" else "done"
