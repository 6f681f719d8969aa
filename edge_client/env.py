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

Two paths, the same outcomes (`EnvConfig.path`; tests/test_env_paths.py pairs them episode by episode):

* "previous": miniwob's own reset and step, ~10 WebDriver round trips per step (act, settle, reward and done,
  utterance, DOM, screenshot), each ~3.5 ms through chromedriver, and a screenshot that waits ~34 ms for the
  headless compositor's next frame at 60 Hz.
* "fast" (the default): Chromium without its frame-rate limit and in miniwob's own 500 px wide window (a
  screenshot ~8-10 ms), and per step one page-side script over the page's DevTools websocket
  (edge_client.devtools) that settles, reads reward and done, and returns the utterance and DOM; a click is
  the three `Input.dispatchMouseEvent`s chromedriver itself would send. Typing, keys and scrolls still go
  through WebDriver's actions (their key tables and wheel timing are chromedriver's), as do page loads.
  `flywheel bench env` measures both beside the stock gymnasium loop (docs/results.md).
"""

from __future__ import annotations

import base64
import logging
import shutil
import time
import urllib.parse
from dataclasses import dataclass, field
from functools import partial
from string import Template
from typing import Any, Literal

import numpy as np
from miniwob.action import ActionSpaceConfig, ActionTypes
from miniwob.constants import TASK_HEIGHT, TASK_WIDTH, UTTERANCE_MAX_LENGTH
from miniwob.dom import DOMElement
from miniwob.environment import MiniWoBEnvironment
from miniwob.fields import get_field_extractor
from miniwob.reward import get_raw_reward
from miniwob.screenshot import get_screenshot, pil_to_numpy_array
from miniwob.selenium_actions import execute_action_on_chromedriver, execute_move_coords
from miniwob.selenium_instance import DEFAULT_BASE_URL, SeleniumInstance
from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chrome.service import Service as ChromeService
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.wait import WebDriverWait

from edge_client.devtools import DevTools
from edge_client.miniwob_actions import step_info, to_miniwob
from edge_client.page_scripts import (
    ANIMATING_JS,
    BLUR_JS,
    DOM_JS,
    DONE_JS,
    PAGE_HELPERS,
    POINTER_REST,
    READ_JS,
    RESET_JS,
    SETTLE_MAX_S,
    SETTLE_POLL_S,
    STEADY_CARET_JS,
)
from edge_client.tasks import task_name
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

# The fast path's browser: no 60 Hz frame pacing (a screenshot waits for a fresh compositor frame: ~34 ms
# paced, ~8 ms unpaced; an idle page draws no frames either way) and miniwob's own window width (500 px) with
# room for the 210 px task (the viewport is the window less 143 px here): fewer pixels to draw and encode.
FAST_CHROME_ARGS: tuple[str, ...] = CHROME_ARGS + (
    "disable-frame-rate-limit",
    "disable-gpu-vsync",
    "window-size=500,400",
)

# Chromium's software rasteriser anti-aliases a rounded corner one level apart from one load to the next (on
# click-dialog's first screen, 5 corner pixels of the dialog at 245 vs 246 in 1 of 5 loads): two screens that
# differ by no more than that show the same thing.
RASTER_NOISE_LEVELS = 1
RASTER_NOISE_PIXELS = 16


def screen_difference(a: np.ndarray, b: np.ndarray) -> tuple[int, int] | None:
    """None when two screenshots agree up to the rasteriser's noise; else (pixels that differ, the largest
    difference in any channel)."""
    differing = int((a != b).any(axis=-1).sum())
    largest = int(np.abs(a.astype(np.int16) - b.astype(np.int16)).max()) if differing else 0
    if largest <= RASTER_NOISE_LEVELS and differing <= RASTER_NOISE_PIXELS:
        return None
    return differing, largest


TASK_SHAPE = (TASK_HEIGHT, TASK_WIDTH, 3)  # (210, 160, 3): screenshots are rows x columns x RGB


@dataclass(frozen=True)
class EnvConfig:
    """How GuiEnv runs the browser."""

    path: Literal["fast", "previous"] = "fast"
    """'fast' (one page-side script per step over DevTools, unpaced frames) or 'previous' (miniwob's own
    reset and step through WebDriver, as before the fast path; kept to compare against)."""
    episode_max_time_s: float = 120.0
    """JavaScript episode limit (miniwob's default is 10 s). A task whose page sets more keeps its own."""
    chrome_binary: str | None = None
    """Chromium executable; None: `chromium` (then `chromium-browser`, `google-chrome`) on PATH."""
    chromedriver: str | None = None
    """Chromedriver executable; None: `chromedriver` on PATH."""
    chrome_args: tuple[str, ...] | None = None
    """Command-line switches (without the leading dashes); None: FAST_CHROME_ARGS on the fast path,
    CHROME_ARGS on the previous one."""
    wait_ms: float = 0.0
    """Pause after every action before the screenshot (jQuery animations are awaited anyway)."""
    read_dom: bool = True
    """Fast path: read the DOM into each observation (the scripted experts read it; a model never does)."""
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


def chrome_args(config: EnvConfig) -> tuple[str, ...]:
    if config.chrome_args is not None:
        return config.chrome_args
    return FAST_CHROME_ARGS if config.path == "fast" else CHROME_ARGS


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
        for arg in chrome_args(self.config):
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
        self.driver.execute_script(STEADY_CARET_JS)
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
            if not self.driver.execute_script(ANIMATING_JS):
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
        self._devtools: DevTools | None = None  # the fast path's session, opened on first use
        helpers = Template(PAGE_HELPERS).substitute(read_dom="true" if self.config.read_dom else "false")
        self._read_js = READ_JS.substitute(helpers=helpers, settle_ms=int(SETTLE_MAX_S * 1000),
                                            poll_ms=int(SETTLE_POLL_S * 1000))  # fmt: skip
        self._reset_js = partial(RESET_JS.substitute, helpers=helpers, blur=BLUR_JS)
        self._page_loaded = True  # a page whose first episode has not started yet (see _reset_fast)
        self._start_time = 0.0

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
        self._page_loaded = True
        # A browser restarted after a crash (_hard_reset_instance) must open this task, not the first one.
        self._env.subdomain = name
        self._env.instance_kwargs["subdomain"] = name
        self.task = name

    def reset(self, seed: int | None = None, task: str | None = None) -> Observation:
        """Start an episode. A reset starts it anew, so a failure here is retried: once on a new DevTools session
        (the socket dropped), then once on a new browser (the browser is gone: crashed, killed, out of memory)."""
        for remedy in ("reconnect", "restart the browser", None):
            try:
                raw_obs, info = self._reset_once(seed, task)
                break
            except WebDriverException as err:  # DevToolsError is one
                if remedy is None:
                    raise
                log.warning("reset of %s failed (%s); %s", task or self.task, str(err).strip()[:200], remedy)
                if remedy == "restart the browser":
                    self._restart_browser()  # closes the DevTools session too
                else:
                    self._close_devtools()
        self._step = 0
        self._instruction = raw_obs["utterance"]
        return self._observation(raw_obs, info)

    def _reset_once(self, seed: int | None, task: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
        if self._env.instance.died:
            self._restart_browser()
        if task is not None:
            self.set_task(task)
        if self.config.path == "fast":
            return self._reset_fast(seed)
        # core.startEpisodeReal() (called by reset) reads EPISODE_MAX_TIME when it arms the timer.
        self._env.instance.raise_episode_time()
        execute_move_coords(*POINTER_REST, self.driver)
        self.driver.execute_script(BLUR_JS)
        return self._env.reset(seed=seed)

    def _restart_browser(self) -> None:
        log.warning("starting a new browser")
        self._close_devtools()
        self._env._hard_reset_instance()  # opens the task set last (set_task records it for this)
        self._page_loaded = True

    def step(self, action: Action) -> StepResult:
        t0 = time.perf_counter()
        miniwob_action, invalid = to_miniwob(action, self._env.action_space_config)
        if action.type == "noop":
            time.sleep(self.config.noop_wait_s)
        if self.config.path == "fast":
            # A failed DevTools call raises (a WebDriverException): the episode loop ends the episode as it
            # does for a broken browser, and the next reset reconnects.
            raw_obs, reward, done, meta = self._step_fast(miniwob_action)
        else:
            raw_obs, reward, done, _truncated, meta = self._env.step(miniwob_action)
        env_ms = (time.perf_counter() - t0) * 1000.0
        self._step += 1
        info = step_info(done, meta, env_ms, invalid)
        return StepResult(self._observation(raw_obs, meta, done), float(reward), done, info)

    def read_dom(self) -> DOMElement | None:
        """The DOM of the screen now on the page (None once the episode ended): what a teacher labels. An env that
        does not read the DOM at each step (read_dom=False, a model's) reads it here only when asked."""
        if self.config.path == "fast":
            dom = self._read_page(DOM_JS)
        else:
            dom = self.driver.execute_script(f"return {DOM_JS};")
        return None if dom is None else DOMElement(dom)

    def close(self) -> None:
        self._close_devtools()
        self._env.close()

    def __enter__(self) -> GuiEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the fast path --------------------------------------------------------------------------

    def _page(self) -> DevTools:
        if self._devtools is None:
            self._devtools = DevTools.for_page(self.driver.capabilities["goog:chromeOptions"]["debuggerAddress"])
        return self._devtools

    def _close_devtools(self) -> None:
        if self._devtools is not None:
            self._devtools.close()
            self._devtools = None

    def _reset_fast(self, seed: int | None) -> tuple[dict[str, Any], dict[str, Any]]:
        """miniwob's reset in one page-side call, then the screenshot.

        The first episode on a freshly loaded page is started twice: a page fetches the images its episode
        shows (email-inbox's icons are CSS content) only once they are shown, and they have no size until
        then; the previous path's round trips gave them time by chance, the warm-up start gives it always.
        """
        seed_js = "" if seed is None else f"Math.seedrandom({seed!r});"
        script = partial(self._reset_js, max_ms=int(self.config.episode_max_time_s * 1000), seed=seed_js)
        self._move_pointer(*POINTER_REST)
        if self._page_loaded:
            self._read_page(script(warm_up="true"))
            self._page_loaded = False
        page = self._read_page(script(warm_up="false"))
        if page is None:
            raise RuntimeError(f"{self.task} did not become ready after reset")
        self._start_time = time.time()
        return self._raw_observation(page), {"root_dom": _dom(page), **page["meta"]}

    def _step_fast(self, miniwob_action: dict[str, Any]) -> tuple[dict[str, Any], float, bool, dict[str, Any]]:
        """miniwob's step: act (unless the episode already ended), settle, read reward and done, observe."""
        if not self._page().evaluate(DONE_JS):
            self._act_fast(miniwob_action)
        page = self._read_page(self._read_js)
        meta = {**page["meta"], "elapsed": max(0.0, time.time() - self._start_time)}
        if meta["done"]:
            raw_obs = {"utterance": "", "screenshot": np.zeros(TASK_SHAPE, dtype=np.uint8)}
        else:
            raw_obs = self._raw_observation(page)
            meta["root_dom"] = _dom(page)
        return raw_obs, get_raw_reward(meta), bool(meta["done"]), meta

    def _act_fast(self, miniwob_action: dict[str, Any]) -> None:
        """A click as the three mouse events chromedriver sends for it (coordinates truncated as it does);
        any other action through WebDriver, as miniwob performs it."""
        config: ActionSpaceConfig = self._env.action_space_config
        kind = config.action_types[miniwob_action["action_type"]]
        if kind == ActionTypes.NONE:
            return
        if kind != ActionTypes.CLICK_COORDS:
            execute_action_on_chromedriver(miniwob_action, [], config, self.driver)
            return
        left, top = config.compute_raw_coords(miniwob_action)
        pointer = _pointer(left, top)
        pressed = dict(type="mousePressed", button="left", buttons=0, clickCount=1, force=0.5, **pointer)
        released = dict(type="mouseReleased", button="left", buttons=1, clickCount=1, force=0.0, **pointer)
        events = (_moved(pointer), pressed, released)
        self._page().call_all(*(("Input.dispatchMouseEvent", event) for event in events))

    def _move_pointer(self, x: float, y: float) -> None:
        self._page().call("Input.dispatchMouseEvent", **_moved(_pointer(x, y)))

    def _read_page(self, script: str) -> Any:
        return self._page().evaluate(script)

    def _raw_observation(self, page: dict[str, Any]) -> dict[str, Any]:
        utterance = page["utterance"]
        if isinstance(utterance, dict):  # tasks that list their fields return {utterance, fields}
            utterance = utterance["utterance"]
        return {"utterance": utterance[:UTTERANCE_MAX_LENGTH], "screenshot": self._capture()}

    def _capture(self) -> np.ndarray:
        """(210, 160, 3) uint8: the task area of a CDP screenshot, cropped and converted as miniwob does."""
        # optimizeForSpeed: a faster zlib setting for the PNG, the same pixels (lossless either way).
        png = self._page().call("Page.captureScreenshot", format="png", optimizeForSpeed=True)["data"]
        png = base64.b64decode(png)
        instance = self._env.instance
        image = get_screenshot(_PngSource(png), instance.inner_width, instance.inner_height, TASK_WIDTH, TASK_HEIGHT)
        return pil_to_numpy_array(image)

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


def _pointer(x: float, y: float) -> dict[str, Any]:
    """The pointer fields of chromedriver's mouse events (coordinates truncated as it does)."""
    return {"x": int(x), "y": int(y), "modifiers": 0, "pointerType": "mouse", "tangentialPressure": 0.0, "tiltX": 0,
            "tiltY": 0, "twist": 0}  # fmt: skip


def _moved(pointer: dict[str, Any]) -> dict[str, Any]:
    return dict(type="mouseMoved", button="none", buttons=0, clickCount=0, force=0.0, **pointer)


def _dom(page: dict[str, Any]) -> DOMElement | None:
    return None if page.get("dom") is None else DOMElement(page["dom"])


class _PngSource:
    """What miniwob's get_screenshot reads from a driver, for a PNG captured over DevTools."""

    def __init__(self, png: bytes):
        self._png = png

    def get_screenshot_as_png(self) -> bytes:
        return self._png
