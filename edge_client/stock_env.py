"""The stock MiniWoB++ loop behind the episode loop's `Env` protocol: the baseline of `flywheel bench env` and
of the test that pairs the paths episode by episode (tests/test_env_paths.py).

Each task gets `gymnasium.make("miniwob/<task>-v1")` as it comes, with miniwob's own Chrome options,
reset, step and screenshot; nothing of ours but the action translation (`miniwob_actions.to_miniwob`) and the
Observation / StepResult it is read into. Stock has no task switching, so each task keeps its own browser,
started on the task's first reset (the bench starts them before it times anything: `open`). Its JavaScript
episode limit is miniwob's 10 s.
"""

from __future__ import annotations

import os
import shutil
import time
from typing import Any

import gymnasium
import miniwob
import numpy as np

from edge_client.env import StepResult
from edge_client.miniwob_actions import step_info, to_miniwob
from edge_client.tasks import task_name
from policy.interface import Observation
from schemas import Action


class StockEnv:
    """One stock gymnasium environment per task, each with its browser."""

    def __init__(self) -> None:
        # miniwob finds Chromium through these two (both or neither); Debian's are not where it looks.
        for variable, binary in (("MINIWOB_CHROME_BINARY", "chromium"), ("MINIWOB_CHROMEDRIVER", "chromedriver")):
            found = shutil.which(binary)
            if found is None:
                raise FileNotFoundError(f"{binary} not found on PATH")
            os.environ.setdefault(variable, found)
        gymnasium.register_envs(miniwob)
        self._envs: dict[str, Any] = {}
        self._task = ""
        self._instruction = ""
        self._step = 0

    def open(self, task: str) -> None:
        """Start the task's browser (the first reset of a task does it otherwise)."""
        name = task_name(task)
        if name not in self._envs:
            self._envs[name] = gymnasium.make(f"miniwob/{name}-v1")
            self._envs[name].reset(seed=0)  # gymnasium starts the browser on the first reset

    def reset(self, seed: int | None = None, task: str | None = None) -> Observation:
        if task is not None:
            self._task = task_name(task)
        self.open(self._task)
        raw_obs, info = self._envs[self._task].reset(seed=seed)
        self._step = 0
        self._instruction = raw_obs["utterance"]
        return self._observation(raw_obs, info.get("root_dom"))

    def step(self, action: Action) -> StepResult:
        env = self._envs[self._task]
        t0 = time.perf_counter()
        miniwob_action, invalid = to_miniwob(action, env.unwrapped.action_space_config)
        raw_obs, _scaled_reward, done, _truncated, meta = env.step(miniwob_action)
        self._step += 1
        info = step_info(done, meta, (time.perf_counter() - t0) * 1000.0, invalid)
        # Stock's reward is scaled by the elapsed time; ours (and the tables') is the raw one.
        obs = self._observation(raw_obs, None if done else meta.get("root_dom"))
        return StepResult(obs, info["raw_reward"] if done else 0.0, bool(done), info)

    def close(self) -> None:
        for env in self._envs.values():
            env.close()
        self._envs.clear()

    def __enter__(self) -> StockEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _observation(self, raw_obs: dict[str, Any], dom: Any) -> Observation:
        screenshot = np.asarray(raw_obs["screenshot"], dtype=np.uint8)
        return Observation(self._task, self._instruction, screenshot, dom, self._step)
