"""`flywheel experiment explore`: what the fleet's exploration finds on the tasks nobody demonstrated, per task.

The fleet's own loop on each task and seed (edge_client.runner): K runs of the seed on the temperature ladder
(edge_client.exploration), then, where all K failed, the search from the first of them (edge_client.search, with
the screen's elements). Per task: the seeds where sampling found a success (pass@K), where the search found one
after it failed, and the environment steps each spent: the successes filtered BC can learn from, and their price.
Training seeds only (below EVAL_SEED; the search refuses evaluation seeds).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from core.console import say
from core.settings import EVAL_SEED, NEW_TASKS, Settings
from edge_client.runner import EdgeConfig


def explore_fleet() -> EdgeConfig:
    """The fleet's exploration settings, as the main job runs them."""
    return EdgeConfig(client_id="explore", policy="model", tasks=(), new_tasks=NEW_TASKS, seed=500_000)


@dataclass(frozen=True)
class ExploreConfig:
    out: Path
    """explore.json goes here."""
    model: str = "release"
    """Model file, version id, 'latest' or 'release'."""
    seeds: int = 10
    """Seeds per task (from fleet.seed on)."""
    fleet: EdgeConfig = field(default_factory=explore_fleet)
    """The exploration's settings: the new tasks, K runs a seed, the ladder, the search's steps."""


# EdgeConfig's settings that do not shape the exploration (the rest are flags of `flywheel experiment explore`).
NOT_EXPLORE_FLAGS = tuple(f"fleet.{name}" for name in (
    "client_id", "tasks", "episodes_per_task", "policy", "repeats", "seeds_per_visit", "channel", "wait_for_model_s",
    "bootstrap_expert", "temperature", "top_k", "metrics_port", "summary_path", "stop_after_s", "spool_timeout_s",
    "spool_max_bytes", "ledger_path", "teacher",
))  # fmt: skip


def run_explore(config: ExploreConfig, settings: Settings) -> dict:
    from edge_client.env import EnvConfig, GuiEnv
    from edge_client.exploration import NewTaskSampler
    from edge_client.runner import RunSummary, exploration, explore_seed
    from policy.runtime import load_policy
    from registry.store import resolve_model

    fleet = config.fleet
    if fleet.seed + config.seeds > EVAL_SEED:
        raise ValueError(
            f"seeds {fleet.seed}.. reach the evaluation seeds ({EVAL_SEED}..): the search never runs there"
        )
    path, version = resolve_model(config.model, settings.artifacts_dir)
    base = exploration(fleet)
    policy = load_policy(path, version, intra_op_threads=fleet.intra_op_threads, sampling=base)
    sampler, k = NewTaskSampler(fleet.new_task_temperature, fleet.new_task_min_temperature), fleet.new_task_repeats
    tasks: dict[str, dict] = {}
    started, run = time.monotonic(), 0
    with GuiEnv(fleet.new_tasks[0], EnvConfig(read_dom=False)) as env:
        for task in fleet.new_tasks:
            entry = tasks[task] = {"seeds": config.seeds, "sampled_pass": 0, "sampled_successes": 0, "search_pass": 0,
                                   "env_steps_sampled": 0}  # fmt: skip
            searches = RunSummary(fleet.client_id)  # this task's searches, counted as the fleet counts them
            for seed in range(fleet.seed, fleet.seed + config.seeds):
                group, found = explore_seed(env, policy, sampler, base, fleet, searches, task, seed, run)
                run += len(group)
                entry["env_steps_sampled"] += sum(r.steps for r in group)
                entry["sampled_successes"] += sum(r.success for r in group)
                entry["sampled_pass"] += any(r.success for r in group)
                entry["search_pass"] += bool(found)
            entry |= {"searched": searches.search["searches"], "env_steps_search": searches.search["env_steps"]}
            entry |= {"pass_at_k": entry["sampled_pass"] / config.seeds,
                      "sampled_pass_at_1": entry["sampled_successes"] / (config.seeds * k),
                      "pass_with_search": (entry["sampled_pass"] + entry["search_pass"]) / config.seeds}  # fmt: skip
            say(f"{task}: pass@{k} {entry['pass_at_k']:.2f}, with the search {entry['pass_with_search']:.2f} "
                f"({entry['env_steps_sampled']} + {entry['env_steps_search']} env steps)")  # fmt: skip
    mean = lambda key: sum(e[key] for e in tasks.values()) / len(tasks)  # noqa: E731
    report = {"model_version": version, "samples": k, "seeds": [fleet.seed, fleet.seed + config.seeds - 1],
              "ladder": [fleet.new_task_min_temperature, fleet.new_task_temperature],
              "search_steps": fleet.new_task_search_steps, "tasks": tasks,
              "mean_pass_at_k": mean("pass_at_k"), "mean_pass_with_search": mean("pass_with_search"),
              "wall_s": round(time.monotonic() - started, 1)}  # fmt: skip
    config.out.mkdir(parents=True, exist_ok=True)
    (config.out / "explore.json").write_text(json.dumps(report, indent=2))
    print(f"{'task':20s} {'pass@' + str(k):>8s} {'+search':>8s} {'steps':>12s}")
    for task, e in tasks.items():
        print(f"{task:20s} {e['pass_at_k']:8.2f} {e['pass_with_search']:8.2f} "
              f"{e['env_steps_sampled']:6d}+{e['env_steps_search']:<5d}")  # fmt: skip
    print(f"{'mean':20s} {report['mean_pass_at_k']:8.2f} {report['mean_pass_with_search']:8.2f}")
    return report
