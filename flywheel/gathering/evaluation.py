"""Every evaluation of a policy goes through here: a policy run in the GUI environment, greedily on held-out seeds.

* `evaluate_bundle` / `evaluate_model`: greedy success per task on seeds EVAL_SEED.. (`evaluate` below, as
  at the edge: onnxruntime, parallel browsers), with each seed's outcome for paired comparisons;
* `greedy_success`: one version greedy on the held-out seeds, each seed's outcome kept; `paired_difference` any two
  of them on the same seeds, with its CI; `paired_by_group` the same within each group of tasks; `pass_at_k` a
  version sampled K times a seed;
* `versus`: two reports on the same seeds, per scope (the `flywheel eval --baseline` comparison; the command
  itself, with SOP, is flywheel.gathering.eval_command).

`evaluate`, the engine under them all: run a policy on MiniWoB++ tasks and report success per task.

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

import json
import queue
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from core.console import say
from core.settings import EVAL_SEED, TIER1_TASKS, TIER2_TASKS
from core.stats import paired_diff_ci
from edge_client.env import EnvConfig, GuiEnv
from edge_client.episode import EpisodeResult, run_episode
from edge_client.tasks import task_name
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


def evaluate_bundle(bundle: Path, version: str, tasks: tuple[str, ...], episodes: int | dict[str, int],
                    browsers: int = 1, seed: int = EVAL_SEED, temperature: float = 0.0,
                    samples: int = 1) -> dict:  # fmt: skip
    """A model bundle run by onnxruntime, as at the edge, on seeds seed.. (evaluate's report): greedily,
    or `samples` times a seed at `temperature` over every token (each browser's sampler seeded by its index)."""
    import itertools

    from policy.runtime import VLAPolicy
    from policy.sampling import Sampling

    browser = itertools.count()

    def policies():  # one model session per browser
        policy = VLAPolicy(bundle, version, sampling=Sampling(temperature, seed=seed + next(browser)))
        return lambda _task: policy

    return evaluate(policies(), tasks, episodes, seed=seed, env_config=EnvConfig(read_dom=False), browsers=browsers,
                    more_policies=policies, samples=samples)  # fmt: skip


def evaluate_model(model, tok, pruning, meta: dict, tasks: tuple[str, ...], episodes: int | dict[str, int], out: Path,
                   browsers: int = 1, seed: int = EVAL_SEED) -> dict:  # fmt: skip
    """Export `model` to OUT/model-<step>.vla, evaluate it greedily on seeds seed.. (the held-out seeds unless
    told otherwise; `episodes` per task, or a count for each), write OUT/eval-<step>.json.

    `meta`: the entry's arm, step, group, data and training figures; the evaluation adds the rest, with each
    task's `success_by_seed` (episode i on seed + i) for paired comparisons."""
    from learner.model.export import export_bundle

    step = meta["step"]
    bundle = export_bundle(model, tok, pruning, out / f"model-{step}.vla")
    t0 = time.monotonic()
    report = evaluate_bundle(bundle, f"{meta['arm']}@{step}", tasks, episodes, browsers, seed)
    entry = {
        **meta, "bundle_mb": round(bundle.stat().st_size / 1e6, 2), "eval_wall_s": round(time.monotonic() - t0, 1),
        "episodes_per_task": episodes, "tasks": {t: r["success_rate"] for t, r in report["tasks"].items()},
        "episodes_per_s": report["episodes_per_s"], "browsers": browsers, "seed": seed,
        "mean": report["mean_success_rate"],
        "success_by_seed": {t: [end == "success" for end in r["termination_by_seed"]]
                            for t, r in report["tasks"].items()},
    }  # fmt: skip
    (out / f"eval-{step}.json").write_text(json.dumps(entry, indent=2))
    say(f"arm {meta['arm']} @ {step}: mean {entry['mean']:.3f}")
    return entry


def greedy_success(version: dict, tasks: tuple[str, ...], episodes: int, browsers: int) -> dict:
    """A model bundle ({"model_version", "bundle"}) greedy on `episodes` held-out seeds per task: its mean success,
    each task's, and each seed's outcome (for paired comparisons)."""
    report = evaluate_bundle(Path(version["bundle"]), version["model_version"], tasks, episodes, browsers)
    return {"model_version": version["model_version"], "success_rate": round(report["mean_success_rate"], 4),
            "per_task": {t: round(r["success_rate"], 4) for t, r in report["tasks"].items()},
            "success_by_seed": {t: [e == "success" for e in r["termination_by_seed"]]
                                for t, r in report["tasks"].items()}}  # fmt: skip


def pass_at_k(version: dict, tasks: tuple[str, ...], seeds: int, samples: int, temperature: float,
              browsers: int) -> dict:  # fmt: skip
    """A model bundle ({"model_version", "bundle"}) sampled `samples` (K) times on each of `seeds` held-out seeds per
    task at `temperature` over every token: per task pass@K (any run succeeded) and the sampled pass@1 (all runs),
    with each seed's pass for paired comparisons."""
    report = evaluate_bundle(Path(version["bundle"]), version["model_version"], tasks, seeds, browsers,
                             temperature=temperature, samples=samples)  # fmt: skip
    return {"model_version": version["model_version"], "samples": samples, "temperature": temperature,
            "seeds": seeds, "pass_at_k": {t: round(r["pass_at_k"], 4) for t, r in report["tasks"].items()},
            "sampled_pass_at_1": {t: round(r["success_rate"], 4) for t, r in report["tasks"].items()},
            "pass_by_seed": {t: r["pass_by_seed"] for t, r in report["tasks"].items()}}  # fmt: skip


def paired_by_group(after: dict, before: dict, groups: dict[str, tuple[str, ...]], outcomes: str = "success_by_seed"
                    ) -> dict:  # fmt: skip
    """after - before (two results with per-seed `outcomes` on the same seeds; where one ran more, the seeds both
    ran) within each group of tasks: both means over the group's tasks (unweighted) and the paired difference with
    its 95 % bootstrap CI."""
    out = {}
    for group, tasks in groups.items():
        present = [t for t in tasks if t in after[outcomes] and t in before[outcomes]]
        if not present:
            continue
        n = {t: min(len(after[outcomes][t]), len(before[outcomes][t])) for t in present}  # the seeds both ran
        a, b = ({t: side[outcomes][t][: n[t]] for t in present} for side in (after, before))
        diff, lo, hi = paired_diff_ci(a, b)
        mean = lambda side: round(sum(sum(v) / len(v) for v in side.values()) / len(side), 4)  # noqa: E731
        out[group] = {"after": mean(a), "before": mean(b), "diff": round(diff, 4), "ci": [round(lo, 4), round(hi, 4)],
                      "tasks": len(present)}  # fmt: skip
    return out


def paired_difference(after: dict, before: dict) -> dict:
    """after - before, two greedy_success results on the same seeds: the difference with its 95 % bootstrap CI."""
    diff, lo, hi = paired_diff_ci(after["success_by_seed"], before["success_by_seed"])
    episodes = min(len(seeds) for seeds in after["success_by_seed"].values())
    return {"diff": round(diff, 4), "ci": [round(lo, 4), round(hi, 4)], "episodes_per_task": episodes,
            "seeds": [EVAL_SEED, EVAL_SEED + episodes - 1]}  # fmt: skip


def versus(model: dict, baseline: dict) -> dict:
    """model - baseline, two `evaluate` reports on the same seeds: the paired difference of mean
    success with its 95 % bootstrap CI over all tasks, over each tier's tasks present, and per task."""

    def outcomes(report: dict) -> dict[str, list[bool]]:
        return {t: [end == "success" for end in r["termination_by_seed"]] for t, r in report["tasks"].items()}

    after, before = outcomes(model), outcomes(baseline)
    scopes = {"all": list(after), "tier1": [t for t in after if t in TIER1_TASKS],
              "tier2": [t for t in after if t in TIER2_TASKS], **{t: [t] for t in after}}  # fmt: skip
    out = {}
    for scope, tasks in scopes.items():
        if tasks:
            diff, lo, hi = paired_diff_ci({t: after[t] for t in tasks}, {t: before[t] for t in tasks})
            out[scope] = {"diff": round(diff, 4), "ci": [round(lo, 4), round(hi, 4)], "tasks": len(tasks)}
    return out
