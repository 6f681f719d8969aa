"""Run a policy on MiniWoB++ tasks and report success per task.

One browser serves every task and episode (switching task is a page load). An episode succeeds
when it ends with raw reward > 0; its binary reward is +1 then and -1 otherwise (failure, JS
timeout, or running out of steps). Episode i of every task uses seed `seed + i`.

Partial-reward tasks (click-checkboxes and a few held-out ones) end with raw reward in (0, 1) when
more was right than wrong; `full_success_rate` (raw reward >= 1) is reported beside the rate so
that such half-successes are visible.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from selenium.common.exceptions import WebDriverException

from edge_client.env import EnvConfig, GuiEnv, StepResult, task_name
from edge_client.policy import Decision, Observation, Policy
from edge_client.verify import verify_step
from schemas import Verify

Progress = Callable[[str, int, "EpisodeResult"], None]  # (task, episode index, result)


@dataclass(frozen=True)
class StepRecord:
    """One think -> act -> verify step: the screen acted on, the decision, and what followed."""

    obs: Observation
    decision: Decision
    result: StepResult
    verify: Verify
    inference_ms: float


@dataclass(frozen=True)
class EpisodeResult:
    task: str
    seed: int
    steps: int
    raw_reward: float
    termination: str  # "done" | "timeout" | "max_steps" | "error"
    wall_s: float
    records: list[StepRecord] = field(default_factory=list)

    @property
    def success(self) -> bool:
        return self.termination == "done" and self.raw_reward > 0

    @property
    def binary_reward(self) -> float:
        return 1.0 if self.success else -1.0


def run_episode(
    env: GuiEnv,
    policy: Policy,
    task: str,
    seed: int,
    max_steps: int = 10,
    on_step: Callable[[StepRecord], None] | None = None,
) -> EpisodeResult:
    """Reset `env` to (task, seed) and let `policy` act until the episode ends or max_steps run out."""
    t0 = time.perf_counter()
    obs = env.reset(seed=seed, task=task)
    records: list[StepRecord] = []
    raw_reward, termination = 0.0, "max_steps"
    for _ in range(max_steps):
        t_think = time.perf_counter()
        decision = policy.act(obs)
        inference_ms = (time.perf_counter() - t_think) * 1000.0
        try:
            result = env.step(decision.action)
        except WebDriverException:
            # The browser broke (crash, hung renderer): the episode is lost, the next reset restarts it.
            termination = "error"
            break
        check = verify_step(obs.screenshot, result.obs.screenshot, decision.action, decision.expected, result)
        record = StepRecord(obs, decision, result, check, inference_ms)
        records.append(record)
        if on_step is not None:
            on_step(record)
        obs = result.obs
        if result.done:
            raw_reward, termination = result.reward, result.info["termination"] or "done"
            break
    wall_s = time.perf_counter() - t0
    return EpisodeResult(task_name(task), seed, len(records), raw_reward, termination, wall_s, records)


def summarise(results: list[EpisodeResult]) -> dict[str, float | int | dict[str, int]]:
    n = len(results)
    return {
        "episodes": n,
        "success_rate": sum(r.success for r in results) / n if n else 0.0,
        "full_success_rate": sum(r.success and r.raw_reward >= 1.0 for r in results) / n if n else 0.0,
        "mean_binary_reward": sum(r.binary_reward for r in results) / n if n else 0.0,
        "mean_steps": sum(r.steps for r in results) / n if n else 0.0,
        "mean_episode_s": sum(r.wall_s for r in results) / n if n else 0.0,
        "terminations": dict(Counter(r.termination for r in results)),
    }


def evaluate(
    policy_for_task: Callable[[str], Policy],
    tasks: Iterable[str],
    episodes: int,
    seed: int = 0,
    progress: Progress | None = None,
    max_steps: int = 10,
    env_config: EnvConfig | None = None,
    env: GuiEnv | None = None,
) -> dict:
    """Success per task over `episodes` seeded episodes each, and the unweighted mean over tasks.

    Returns {"model_version", "tasks": {task: {"episodes", "success_rate", "mean_steps", ...}},
    "mean_success_rate"}. Pass `env` to reuse a browser you already have (it is not closed then).
    """
    names = [task_name(t) for t in tasks]
    if not names:
        raise ValueError("no tasks to evaluate")
    own_env = env is None
    env = env or GuiEnv(names[0], env_config)
    versions: list[str] = []
    per_task: dict[str, dict] = {}
    try:
        for task in names:
            policy = policy_for_task(task)
            if policy.version not in versions:
                versions.append(policy.version)
            results = []
            for i in range(episodes):
                result = run_episode(env, policy, task, seed + i, max_steps)
                if progress is not None:
                    progress(task, i, result)
                # Keep the numbers, not the screenshots: 16 tasks x 50 episodes of records is ~0.5 GB.
                results.append(replace(result, records=[]))
            per_task[task] = summarise(results)
    finally:
        if own_env:
            env.close()
    rates = [s["success_rate"] for s in per_task.values()]
    return {
        "model_version": ",".join(versions),
        "tasks": per_task,
        "mean_success_rate": sum(rates) / len(rates),
    }
