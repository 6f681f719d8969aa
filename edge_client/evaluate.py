"""Run a policy on MiniWoB++ tasks and report success per task.

One browser serves every task and episode (switching task is a page load), or N browsers in threads
share the episodes (`browsers`). Episodes run in the
fleet's own loop (edge_client.episode), so success here means what it means in the tables: termination
"success", the env ending the episode with raw reward > 0; its binary reward is +1 then and -1 otherwise.
Episode i of every task uses seed `seed + i`.

With `samples` K > 1 every seed runs K times (a sampling policy: each run draws its own actions) and each task also
reports `pass_at_k`, the fraction of seeds where any of the K runs succeeded, beside `success_rate`, the fraction of
all runs (pass@1 of the sampled policy): what sampling can reach against what one draw reaches (Yue et al. 2025).

Partial-reward tasks (click-checkboxes and a few held-out ones) end with raw reward in (0, 1) when
more was right than wrong; `full_success_rate` (raw reward >= 1) is reported beside the rate so
that such half-successes are visible.
"""

from __future__ import annotations

import queue
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
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
    episodes: int | Mapping[str, int],
    seed: int = 0,
    progress: Progress | None = None,
    max_steps: int = 10,
    env_config: EnvConfig | None = None,
    env: GuiEnv | None = None,
    browsers: int = 1,
    more_policies: Callable[[], Callable[[str], Policy]] | None = None,
    samples: int = 1,
) -> dict:
    """Success per task over `episodes` seeded episodes each (or `episodes[task]`), and the unweighted mean over
    tasks.

    Returns {"model_version", "tasks": {task: {"episodes", "success_rate", "mean_steps", ..., "termination_by_seed"}},
    "mean_success_rate", "browsers", "wall_s", "episodes_per_s"}. Pass `env` to reuse a browser you already
    have (it is not closed then). With `browsers` > 1 each browser runs in its own thread and takes the next
    (task, seed) as it frees up; `more_policies` makes each extra browser its own task -> Policy (a model
    session is not shared between threads). An episode's outcome depends on its task and seed, not on the
    browser that ran it or the episode before (the pointer rests outside the task area at every start):
    tests/test_env_paths.py compares 1 and 2 browsers.
    """
    names = [task_name(t) for t in tasks]
    if not names:
        raise ValueError("no tasks to evaluate")
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    if browsers < 1 or (browsers > 1 and (more_policies is None or env is not None)):
        raise ValueError("browsers > 1 needs more_policies (one task -> Policy per browser) and no shared env")
    by_name = {task_name(t): n for t, n in episodes.items()} if isinstance(episodes, Mapping) else {}
    count = {task: by_name[task] if by_name else episodes for task in names}
    work = queue.SimpleQueue()
    for task in names:
        for i in range(count[task]):
            for k in range(samples):
                work.put((task, i, k))
    results: dict[tuple[str, int, int], EpisodeResult] = {}
    versions: list[str] = []

    def run_browser(index: int) -> None:
        policy_for = policy_for_task if index == 0 else more_policies()
        own = env is None
        browser = env or GuiEnv(names[0], env_config)
        try:
            while True:
                try:
                    task, i, k = work.get_nowait()
                except queue.Empty:
                    return
                policy = policy_for(task)
                if policy.version not in versions:
                    versions.append(policy.version)
                result = run_episode(browser, policy, task, seed + i, max_steps)
                if progress is not None and k == samples - 1:
                    progress(task, i, result)
                # Keep the numbers, not the screenshots: 16 tasks x 50 episodes of records is ~0.5 GB.
                results[task, i, k] = replace(result, records=[])
        finally:
            if own:
                browser.close()

    started = time.perf_counter()
    with ThreadPoolExecutor(browsers) as pool:
        list(pool.map(run_browser, range(browsers)))  # list(): a browser's exception is raised here
    wall_s = time.perf_counter() - started
    per_task = {}
    for task in names:
        runs = [[results[task, i, k] for k in range(samples)] for i in range(count[task])]  # (seeds, samples)
        # Each seed's ending (its first run's), for paired comparisons (two models or two paths on the same seeds).
        per_task[task] = summarise([r for seed in runs for r in seed]) | {
            "termination_by_seed": [seed[0].termination for seed in runs]}  # fmt: skip
        if samples > 1:
            passed = [any(r.success for r in seed) for seed in runs]
            per_task[task] |= {"samples": samples, "pass_at_k": sum(passed) / len(passed) if passed else 0.0,
                               "pass_by_seed": passed, "successes_by_seed": [sum(r.success for r in seed)
                                                                             for seed in runs]}  # fmt: skip
    rates = [s["success_rate"] for s in per_task.values()]
    mean_pass = {"samples": samples, "mean_pass_at_k": sum(s["pass_at_k"] for s in per_task.values()) / len(rates)
                 } if samples > 1 else {}  # fmt: skip
    return {
        "model_version": ",".join(versions),
        "tasks": per_task,
        "mean_success_rate": sum(rates) / len(rates),
        **mean_pass,
        "browsers": browsers,
        "wall_s": round(wall_s, 2),
        "episodes_per_s": round(len(results) / wall_s, 3) if wall_s > 0 else 0.0,
    }
