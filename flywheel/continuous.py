"""`flywheel demo --minutes M`: the flywheel turning by itself, fleet, pipeline and learner side by side.

    edge clients (model policy, sampling, R rollouts per seed) --steps--> faust --> Delta tables
        ^  the scripted experts until a first version arrives                        |
        +---- signed versions over Kafka <-- flywheel learner (SFT -> offline RL -> online RL)

Nobody waits for anybody: the clients never stop for the learner (before the first model they run the
experts, whose episodes are the demonstrations), and the learner trains on whatever has landed. The report
lists every version the learner published with the fleet's success under it (its sampled episodes, as they
ran) and fleet_idle_s, the time within the run when no client was in an episode.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from core.console import say
from core.processes import pin_process
from flywheel.fleet import FleetRun, run_fleet
from flywheel.stack import LocalStack
from lake.queries import episode_stats

FLEET_PREFIX = "f-"
MIN_EPISODES_TO_RANK = 20  # a version the fleet ran less than this is too noisy to compare


def idle_seconds(spans: list[list[float]], start: float, end: float) -> float:
    """Seconds of [start, end] covered by none of the [a, b] spans (the fleet's acting time, all clients)."""
    covered, reach = 0.0, start
    for a, b in sorted(spans):
        a, b = max(a, reach), min(b, end)
        if b > a:
            covered += b - a
            reach = b
    return max(0.0, (end - start) - covered)


def success_rise(versions: list[dict]) -> float | None:
    """Success of the last version minus the first, over the versions the fleet ran enough to rank."""
    ranked = [v for v in versions if v["episodes"] >= MIN_EPISODES_TO_RANK]
    return round(ranked[-1]["success_rate"] - ranked[0]["success_rate"], 3) if len(ranked) >= 2 else None


def split_cpus(cpus: list[int], learner_share: float) -> tuple[set[int] | None, set[int] | None]:
    """(the learner's CPUs, everyone else's): the last `learner_share` of them, at least one, for the learner;
    (None, None) without pinning (a share of 0, or a single CPU)."""
    if learner_share <= 0 or len(cpus) < 2:
        return None, None
    take = min(len(cpus) - 1, max(1, round(learner_share * len(cpus))))
    return set(cpus[-take:]), set(cpus[:-take])


def run_continuous(config, stack: LocalStack) -> dict:
    """Run the fleet and the learner for config.minutes (a flywheel.demo.DemoConfig); returns the report."""
    run_s = 60 * config.minutes
    state_path = stack.settings.data_dir / "learner" / "daemon" / "state.json"  # learner.daemon.DaemonState
    learner_cpus, fleet_cpus = split_cpus(sorted(os.sched_getaffinity(0)), config.learner_cpu_share)
    learner = stack.start("learner", [
        "learner", "--recipe", "demo", "--sft-steps", str(config.sft_steps), "--min-demos", str(config.min_demos),
        "--every-episodes", str(config.every_episodes), "--every-minutes", str(config.every_minutes),
        "--min-new-episodes", str(config.min_new_episodes), "--offline-steps", str(config.offline_steps),
        "--guidance", config.guidance, "--poll-s", "2",
    ], cpus=learner_cpus)  # fmt: skip
    if fleet_cpus:
        for worker in stack.workers:
            pin_process(worker.proc.pid, fleet_cpus)
        say(f"learner on CPUs {sorted(learner_cpus)}; fleet, browsers and worker on {sorted(fleet_cpus)}")
    say(f"fleet: {config.clients} clients for {config.minutes} min (experts until the first version, then "
        f"sampling at temperature {config.temperature}, top-k {config.top_k}, {config.repeats} rollouts per seed); "
        f"learner side by side")  # fmt: skip
    fleet = run_fleet(
        FleetRun(
            name="fleet", prefix=FLEET_PREFIX, clients=config.clients, tasks=config.tasks,
            episodes_per_task=1_000_000, policy="model", seed=0, drain_timeout_s=config.drain_timeout_s,
            edge_args=("--bootstrap-expert", "--temperature", str(config.temperature), "--top-k", str(config.top_k),
                       "--repeats", str(config.repeats), "--stop-after-s", str(run_s)),
            cpus=fleet_cpus,
        ),
        stack, config.out,
    )  # fmt: skip
    if not learner.running():
        raise RuntimeError(f"the learner stopped during the run (exit {learner.proc.returncode}):\n{learner.tail()}")
    learner.stop()  # a stage still training is cut off: only published versions count
    published = json.loads(state_path.read_text())["versions"] if state_path.exists() else []
    end = max((b for _, b in fleet.acting), default=fleet.started_at)
    idle = idle_seconds(fleet.acting, fleet.started_at, end)
    versions = [version_entry(v, stack.settings.tables_dir, fleet.started_at) for v in published]
    greedy = greedy_comparison(published, tuple(config.tasks), config.greedy_episodes, config.clients)
    return {
        "mode": "continuous",
        "run_s": round(end - fleet.started_at, 1),
        "fleet_idle_s": round(idle, 1),
        "fleet_idle_fraction": round(idle / max(1e-9, end - fleet.started_at), 4),
        "versions": versions,
        "success_rise": success_rise(versions),
        "greedy": greedy,
        "bootstrap": episode_stats(stack.settings.tables_dir, FLEET_PREFIX, "expert"),
        "episodes": fleet.episodes,
        "steps_published": fleet.steps_published,
        "steps_in_delta": fleet.steps_in_delta,
        "model_versions_run": fleet.model_versions,
    }


def greedy_comparison(published: list[dict], tasks: tuple[str, ...], episodes: int, browsers: int) -> dict | None:
    """The first and the last published versions, greedy on the same held-out seeds (`episodes` per task): their
    success and the paired difference with its 95 % bootstrap CI. Sampled success can rise by the policy
    sharpening alone; this is the policy the fleet would deploy. None with fewer than two versions."""
    from core.stats import paired_diff_ci
    from flywheel.experiment import EVAL_SEED, evaluate_bundle

    if len(published) < 2 or episodes <= 0:
        return None
    ends = {}
    for which, version in (("first", published[0]), ("last", published[-1])):
        say(f"greedy: {which} version {version['model_version']} on {episodes} held-out seeds per task")
        report = evaluate_bundle(Path(version["bundle"]), version["model_version"], tasks, episodes, browsers)
        ends[which] = {"model_version": version["model_version"], "success_rate": round(report["mean_success_rate"], 4),
                       "success_by_seed": {t: [e == "success" for e in r["termination_by_seed"]]
                                           for t, r in report["tasks"].items()}}  # fmt: skip
    diff, lo, hi = paired_diff_ci(ends["last"]["success_by_seed"], ends["first"]["success_by_seed"])
    return {"first": ends["first"], "last": ends["last"], "diff": round(diff, 4), "ci": [round(lo, 4), round(hi, 4)],
            "episodes_per_task": episodes, "seeds": [EVAL_SEED, EVAL_SEED + episodes - 1]}  # fmt: skip


def version_entry(published: dict, tables_dir: Path, started_at: float) -> dict:
    """One published version, with the fleet's episodes under it."""
    stats = episode_stats(tables_dir, FLEET_PREFIX, published["model_version"])
    return {
        "model_version": published["model_version"],
        "stage": published["stage"],
        "published_at": published["published_at"],
        "published_after_s": round(published["published_at"] - started_at, 1),
        "train_s": published.get("train_s"),
        "episodes": stats["episodes"],
        "success_rate": stats["success_rate"] if stats["episodes"] else None,
        "per_task": stats["per_task"],
    }


def say_summary(report: dict) -> None:
    say(f"fleet: {report['episodes']} episodes, idle {report['fleet_idle_s']} s of {report['run_s']} s "
        f"({100 * report['fleet_idle_fraction']:.1f} %); steps {report['steps_in_delta']}/"
        f"{report['steps_published']} in Delta; experts {report['bootstrap']['episodes']} episodes")  # fmt: skip
    for v in report["versions"]:
        rate = "-" if v["success_rate"] is None else f"{v['success_rate']:.2f}"
        say(f"  {v['model_version']} ({v['stage']}, at {v['published_after_s']} s, trained {v['train_s']} s): "
            f"{v['episodes']} episodes, success {rate}")  # fmt: skip
    say(f"sampled success, last version - first: {report['success_rise']}")
    greedy = report.get("greedy")
    if greedy:
        first, last = greedy["first"], greedy["last"]
        say(f"greedy success on {greedy['episodes_per_task']} held-out seeds per task: {first['model_version']} "
            f"{first['success_rate']:.3f} -> {last['model_version']} {last['success_rate']:.3f}, paired difference "
            f"{greedy['diff']:+.3f} (95 % CI {greedy['ci'][0]:+.3f} .. {greedy['ci'][1]:+.3f})")  # fmt: skip
