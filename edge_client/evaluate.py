"""Run a policy on MiniWoB++ tasks and report success per task.

One browser serves every task and episode (switching task is a page load). Episodes run in the
fleet's own loop (edge_client.episode), so success here means what it means in the tables: termination
"success", the env ending the episode with raw reward > 0; its binary reward is +1 then and -1 otherwise.
Episode i of every task uses seed `seed + i`.

Partial-reward tasks (click-checkboxes and a few held-out ones) end with raw reward in (0, 1) when
more was right than wrong; `full_success_rate` (raw reward >= 1) is reported beside the rate so
that such half-successes are visible.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import replace

from edge_client.env import EnvConfig, GuiEnv, task_name
from edge_client.episode import EpisodeResult, run_episode
from policy.interface import Policy

Progress = Callable[[str, int, EpisodeResult], None]  # (task, episode index, result)


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
