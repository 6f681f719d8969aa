"""`flywheel demo`: the flywheel on this machine, turn by turn or continuously.

Turns (the default): turn 1, the fleet runs the scripted experts; their steps flow Kafka -> faust -> Delta;
the learner trains the first model by SFT and publishes it. Each later turn: the fleet runs the newest model
(received over Kafka, checked, hot-swapped), and the learner trains on everything so far.

`--minutes M`: continuous instead, the flywheel turning by itself, fleet, pipeline and learner side by side:

    edge clients (model policy, sampling, R rollouts per seed) --steps--> faust --> Delta tables
        ^  the scripted experts until a first version arrives                        |
        +---- signed versions over Kafka <-- flywheel learner (SFT -> offline RL -> online RL)

Nobody waits for anybody: the clients never stop for the learner (before the first model they run the
experts, whose episodes are the demonstrations), and the learner trains on whatever has landed. The report
lists every version the learner published with the fleet's success under it (its sampled episodes, as they
ran), fleet_idle_s (the time within the run when no client was in an episode) and the first and the last
versions' greedy success on the same held-out seeds (flywheel.run.continuous has the figures), and, with --twin,
the last version's no-fleet twin on those seeds: its retrain again on the demonstrations alone (learner.daemon.twin).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from core.console import jsonable, say
from core.machine import machine
from core.processes import Child, pin_process
from core.settings import Settings
from flywheel.admin.observe import demo_observability
from flywheel.gathering.evaluation import (
    greedy_success,
    paired_by_group,
    paired_difference,
    pass_at_k,
)
from flywheel.run.audit import audit_kept_successes
from flywheel.run.config import DemoConfig, fleet_client, learner_args, twin_args, worker_args
from flywheel.run.continuous import FLEET_PREFIX, idle_seconds, say_summary, split_cpus, success_rise, version_entry
from flywheel.run.fleet import FleetResult, FleetRun, run_fleet
from flywheel.run.plots import write_plots
from flywheel.run.stack import LocalStack, local_stack
from lake.queries import episode_stats, supervision_on
from registry.store import fetch_verified, resolve_model


def run_demo(config: DemoConfig, settings: Settings) -> dict:
    if config.machines and not settings.data_is_remote:
        raise ValueError("--machines: the machines share no directory, so the tables and models must be on an "
                         "object store: set FLYWHEEL_DATA_DIR=s3://bucket/prefix")  # fmt: skip
    config = replace(config, out=config.out.resolve())  # children may run in working dirs of their own
    config.out.mkdir(parents=True, exist_ok=True)
    logs = config.out / "logs"
    report: dict = {"turns": [], "config": jsonable(asdict(config))}
    started = time.monotonic()
    with (
        demo_observability(config.out, config.prometheus, config.prometheus_port) as obs,
        # Its own topics and tables, so runs never read each other's events or models.
        local_stack(
            settings,
            logs,
            run="demo",
            data_dir=config.out / "data",
            env=obs.env,
            machines=config.out / "machines" if config.machines else None,
            worker_args=worker_args(config.worker),
        ) as stack,  # fmt: skip
    ):
        settings = stack.settings
        report["data_dir"] = str(settings.data_dir)
        for _ in range(config.workers - 1):
            stack.start_worker(*worker_args(config.worker))
        say(f"data under {settings.data_dir}, logs under {logs.resolve()}")
        say(f"kafka ready at {settings.bootstrap}")
        if obs.url:
            say(f"prometheus at {obs.url} (every process, 1 s scrapes); live summary: "
                f"FLYWHEEL_DATA_DIR={settings.data_dir} FLYWHEEL_TOPIC_PREFIX={settings.topic_prefix} "
                f"flywheel status --prometheus {obs.url}")  # fmt: skip
        if config.minutes > 0:
            report |= run_continuous(config, stack)
        for turn in range(1, config.turns + 1 if config.minutes <= 0 else 1):
            report["turns"].append(run_turn(turn, config, stack))
            _write(config.out / "report.json", report, started)
        stack.close()  # the metrics window ends with the run's processes, not after a broker shutdown too
        report["observability"] = obs.report()
        for path in write_plots(config.out, report, settings.tables_dir, obs.query_range):
            say(f"plot: {path.resolve()}")
    if obs.url:
        say(f"this run's metrics, browsable later: prometheus --config.file={obs.workdir / 'prometheus.yml'} "
            f"--storage.tsdb.path={obs.workdir / 'data'}  (then open http://localhost:9090)")  # fmt: skip
    report["wall_s"] = round(time.monotonic() - started, 1)
    _write(config.out / "report.json", report, started)
    say(f"report: {(config.out / 'report.json').resolve()}")
    if config.minutes > 0:
        say_summary(report)
    for entry in report["turns"]:
        say(
            f"turn {entry['turn']}: fleet ran {entry['model_version']}, {entry['episodes']} episodes, "
            f"success {entry['success_rate']:.2f}, steps {entry['steps_in_delta']}/{entry['steps_published']} "
            f"in Delta, published {entry['published_version']}"
        )
    return report


def run_continuous(config: DemoConfig, stack: LocalStack) -> dict:
    """Run the fleet and the learner side by side for config.minutes; returns the report."""
    run_s = 60 * config.minutes
    state_path = stack.settings_of("learner").learner_dir / "daemon" / "state.json"  # learner.daemon.loop.DaemonState
    learner_cpus, fleet_cpus = split_cpus(sorted(os.sched_getaffinity(0)), config.learner_cpu_share)
    learner = stack.start("learner", learner_args(config), cpus=learner_cpus, role="learner")
    if fleet_cpus:
        for worker in stack.workers:
            pin_process(worker.proc.pid, fleet_cpus)
        say(f"learner on CPUs {sorted(learner_cpus)}; fleet, browsers and worker on {sorted(fleet_cpus)}")
    client = fleet_client(config, run_s)
    say(f"fleet: {config.clients} clients for {config.minutes} min (experts until the first version, then "
        f"sampling at temperature {client.temperature}, top-k {client.top_k}, {client.repeats} rollouts per seed); "
        f"learner side by side")  # fmt: skip
    fleet = run_fleet(
        FleetRun(
            name="fleet", prefix=FLEET_PREFIX, clients=config.clients, tasks=client.tasks,
            episodes_per_task=client.episodes_per_task, policy=client.policy, seed=0, max_steps=client.max_steps,
            drain_timeout_s=config.drain_timeout_s, edge=client, cpus=fleet_cpus,
        ),
        stack, config.out,
    )  # fmt: skip
    if not learner.running():
        raise RuntimeError(f"the learner stopped during the run (exit {learner.proc.returncode}):\n{learner.tail()}")
    learner_deadline = time.monotonic() + config.finish_stage_s  # counted from the fleet's end
    tasks = config.fleet.tasks + config.fleet.new_tasks
    evaluate = config.greedy_episodes > 0
    if fleet_cpus:  # the evaluations and their browsers stay off the learner's CPUs while it finishes its stage
        pin_process(os.getpid(), fleet_cpus)
    # The first version is known: evaluate it while the learner finishes the version it is training on the fleet's
    # last data (the fleet's last minutes would otherwise reach no version).
    published = read_versions(state_path)
    first = bundle_of(published[0], stack) if published and evaluate else None
    if first:
        say(f"greedy: first version {first['model_version']} on {config.greedy_episodes} held-out seeds per task, "
            f"while the learner finishes its stage (up to {config.finish_stage_s:.0f} s)")  # fmt: skip
    first_ends = greedy_success(first, tasks, config.greedy_episodes, config.clients) if first else None
    passes = {"first": pass_at_k_of(config, first)} if first else {}
    finish_stage(learner, state_path, learner_deadline)
    learner.stop()  # a stage still training now is cut off: only published versions count
    published = read_versions(state_path)
    end = max((b for _, b in fleet.acting), default=fleet.started_at)
    idle = idle_seconds(fleet.acting, fleet.started_at, end)
    versions = [version_entry(v, stack.settings.tables_dir, fleet.started_at) for v in published]
    twin_run = start_twin(config, stack, published, learner_cpus)  # before the evaluation below, overlapping it
    greedy = None  # the policy the fleet would deploy, greedy: sampled success can rise by sharpening alone
    last = None
    if len(published) >= 2 and first_ends:
        # The bundles as the fleet receives them: from the model store, digest-checked (on a machine of its own,
        # the learner's working files are not this process's to read).
        last = bundle_of(published[-1], stack)
        say(f"greedy: last version {last['model_version']} on {config.greedy_episodes} held-out seeds per task")
        last_ends = greedy_success(last, tasks, config.greedy_episodes, config.clients)
        greedy = {"first": first_ends, "last": last_ends, **paired_difference(last_ends, first_ends)}
        greedy["by_group"] = paired_by_group(greedy["last"], greedy["first"], task_groups(config))
        passes["last"] = pass_at_k_of(config, last)
    twin, last_vs_twin, twin_version = finish_twin(config, twin_run, greedy)
    if last_vs_twin is not None:
        last_vs_twin["by_group"] = paired_by_group(greedy["last"], twin, task_groups(config))
        passes["twin"] = pass_at_k_of(config, twin_version)
    new_tasks = new_task_report(config, stack, fleet, greedy, twin, passes)
    if new_tasks is not None:
        new_tasks["search"] = fleet.search
        new_tasks["cost"] = point_cost(new_tasks, versions, len(learner_cpus or ()) or os.cpu_count() or 1)
    return {
        # What the fleet learned where nobody demonstrated, first: the reason it exists.
        "new_tasks": new_tasks,
        "mode": "continuous",
        "machine": machine(),  # a wall-clock run: what it trained depends on the CPU (docs/history/teacher.md)
        "fleet_prefix": FLEET_PREFIX,
        "run_s": round(end - fleet.started_at, 1),
        "fleet_idle_s": round(idle, 1),
        "fleet_idle_fraction": round(idle / max(1e-9, end - fleet.started_at), 4),
        "versions": versions,
        "success_rise": success_rise(versions),
        "greedy": greedy,
        # The gain the fleet's rows bought: the last version against its retrain on the demonstrations alone.
        "twin": twin,
        "last_vs_twin": last_vs_twin,
        # What the gain cost: the teacher's calls (each a paid call in a deployment) and the fleet's env steps.
        "cost": {
            "teacher": fleet.teacher,
            "env_steps": fleet.steps_published,
            "teacher_labels_per_point": per_point(fleet.teacher["labels"], greedy),
            "teacher_labels_per_point_over_twin": per_point(fleet.teacher["labels"], last_vs_twin),  # what they bought
        },
        "bootstrap": episode_stats(stack.settings.tables_dir, FLEET_PREFIX, "expert"),
        "episodes": fleet.episodes,
        "steps_published": fleet.steps_published,
        "steps_in_delta": fleet.steps_in_delta,
        "model_versions_run": fleet.model_versions,
    }


TWIN_SUMMARY = "twin.json"  # under --out: the twin's training summary (learner.daemon.twin)


@dataclass
class TwinRun:
    """The last version's no-fleet twin (learner.daemon.twin): its training under way, or why it has none."""

    of: str  # the version it is the twin of
    child: Child | None = None  # `flywheel twin`, on the learner's machine (the SFT checkpoint is there)
    why_none: dict = field(default_factory=dict)  # the report's `twin` when there is no child


def start_twin(config: DemoConfig, stack: LocalStack, published: list[dict], cpus: set[int] | None) -> TwinRun | None:
    """Start training the last version's twin, its retrain again on the demonstrations alone, on the learner's `cpus`
    as the learner trained (the evaluation keeps the others); None: not asked for. A version rises over the first
    SFT partly on the demonstrations that landed after the SFT polled; only the version against its twin credits
    the fleet."""
    if not (published and config.twin and config.greedy_episodes > 0):
        return None
    last = published[-1]
    of = last["model_version"]
    if last["stage"] == "sft":  # nothing to retrain: the twin is the version itself
        why = "the last version is the first SFT, on the demonstrations alone: its twin is itself (last - twin 0)"
        return TwinRun(of, why_none={"same_as_last": True, "why": why})
    if config.learner.curriculum != "supervised":
        why = "no retrain from SFT to repeat: the rl curriculum learns from the fleet's rollouts alone"
        return TwinRun(of, why_none={"why": why})
    say(f"twin: {of}'s retrain again, on the demonstrations alone")
    args = twin_args(config, of, config.out / TWIN_SUMMARY)
    return TwinRun(of, stack.start("twin", args, cpus=cpus, role="learner", machine="learner"))


def finish_twin(config: DemoConfig, run: TwinRun | None, greedy: dict | None
                ) -> tuple[dict | None, dict | None, dict | None]:  # fmt: skip
    """(twin, last_vs_twin, its bundle): the twin greedy on the seeds `greedy` ran (it did: a twin is trained only of
    a retrain, so of a second version or later), and the last version minus it, paired."""
    if run is None or run.child is None:
        return ({"of": run.of, **run.why_none} if run else None), None, None
    code = run.child.wait()
    run.child.stop()
    if code != 0:  # the run's figures stand without it: say so in the report rather than lose them
        say(f"twin: failed (exit {code}); see {run.child.log_path}")
        return {"of": run.of, "error": f"exit {code}", "log_tail": run.child.tail()}, None, None
    twin = json.loads((config.out / TWIN_SUMMARY).read_text())
    bundle = fetch_verified(twin["artifact_uri"], twin["sha256"])  # from the store, as the fleet's versions come
    version = {"model_version": twin["model_version"], "bundle": str(bundle)}
    # On the new tasks only, where it is the control that counts (the suite's change is last - first); on the suite
    # where the run has no new task. Its evaluation is a third of the main job's end.
    tasks = config.fleet.new_tasks or config.fleet.tasks
    say(f"greedy: the twin {twin['model_version']} on {config.greedy_episodes} held-out seeds per task of {tasks}")
    ends = greedy_success(version, tasks, config.greedy_episodes, config.clients)
    return twin | ends, paired_difference(greedy["last"], ends), version


def task_groups(config: DemoConfig) -> dict[str, tuple[str, ...]]:
    """The run's tasks by kind: the demonstrated ones it runs, and the new ones (nobody demonstrated)."""
    return {"suite": config.fleet.tasks, "new": config.fleet.new_tasks}


def read_versions(state_path: Path) -> list[dict]:
    """The versions the learner daemon has published, in order (learner.daemon.loop.DaemonState)."""
    return json.loads(state_path.read_text())["versions"] if state_path.exists() else []


def bundle_of(version: dict, stack: LocalStack) -> dict:
    """A published version with its bundle as the fleet receives it: from the model store, digest-checked."""
    return {**version, "bundle": str(resolve_model(version["model_version"], stack.settings.artifacts_dir)[0])}


def finish_stage(learner: Child, state_path: Path, deadline: float) -> None:
    """Wait, until `deadline` (monotonic), while the learner daemon trains a stage it will publish."""
    while time.monotonic() < deadline and learner.running():
        in_progress = json.loads(state_path.read_text()).get("in_progress") if state_path.exists() else None
        if not in_progress:
            return
        time.sleep(2.0)
    say("the learner's stage in progress is cut off at the deadline")


def pass_at_k_of(config: DemoConfig, version: dict | None) -> dict | None:
    """pass@K of a version on the new tasks (None: no version, no new task, or pass@K off)."""
    if version is None or not config.fleet.new_tasks or config.pass_at_k < 2:
        return None
    say(f"pass@{config.pass_at_k}: {version['model_version']} on {config.pass_at_k_seeds} held-out seeds per new "
        f"task, at temperature {config.pass_at_k_temperature}")  # fmt: skip
    return pass_at_k(version, config.fleet.new_tasks, config.pass_at_k_seeds, config.pass_at_k,
                     config.pass_at_k_temperature, config.clients)  # fmt: skip


def new_task_report(config: DemoConfig, stack: LocalStack, fleet: FleetResult, greedy: dict | None,
                    twin: dict | None, passes: dict[str, dict | None]) -> dict | None:  # fmt: skip
    """What the fleet learned on the tasks nobody demonstrated: per task, greedy success of the first and last
    versions and of the twin (the same retrains without the fleet's rows), pass@K of each, last - twin and
    last - first paired with their CIs; the fleet's episodes and env steps there; and, from the tables, the proof
    that nothing but the fleet's verified endings taught them (0 expert steps, 0 labels, 0 target boxes)."""
    new = config.fleet.new_tasks
    if not new:
        return None
    report: dict = {"tasks": list(new), "supervision": supervision_on(stack.settings.tables_dir, new),
                    "fleet": {t: fleet.per_task.get(t) for t in new}}  # fmt: skip
    report["supervised_anywhere"] = sum(
        counts[k]
        for counts in report["supervision"].values()
        for k in ("expert_steps", "teacher_labels", "target_boxes", "demo_rows")
    )
    if config.audit > 0:
        say(f"audit: up to {config.audit} kept successes on the new tasks replayed with the DOM read")
        report["audit"] = audit_kept_successes(stack.settings.tables_dir, new, config.audit)
    if greedy is None:
        return report
    per_task = lambda result: {t: result["per_task"][t] for t in new if t in result.get("per_task", {})}  # noqa: E731
    report["greedy"] = {"first": per_task(greedy["first"]), "last": per_task(greedy["last"]),
                        "last_vs_first": greedy["by_group"].get("new")}  # fmt: skip
    if twin is not None and "per_task" in twin:
        report["greedy"]["twin"] = per_task(twin)
        report["greedy"]["last_vs_twin"] = paired_by_group(greedy["last"], twin, {"new": new}).get("new")
        report["greedy"]["last_vs_twin_per_task"] = paired_by_group(greedy["last"], twin, {t: (t,) for t in new})
    report["pass_at_k"] = {which: p for which, p in passes.items() if p is not None}
    first_passes = report["pass_at_k"].get("first")
    if first_passes:  # does the learned policy, in one try, beat the first version searching K tries at test time?
        report["last_vs_first_best_of_k"] = {
            "samples": first_passes["samples"], "seeds": first_passes["seeds"],
            **paired_by_group({"success_by_seed": greedy["last"]["success_by_seed"]},
                              {"success_by_seed": first_passes["pass_by_seed"]}, {"new": new})["new"]}  # fmt: skip
    return report


def point_cost(new_tasks: dict, versions: list[dict], learner_cpus: int) -> dict:
    """What a point (0.01) of the new tasks' last - twin cost: the fleet's env steps on them (the steps in the tables,
    and the searches' branches that found nothing, which reach no table), and the learner's CPU-seconds (its
    versions' training time on its CPUs; the first SFT included)."""
    search = new_tasks.get("search") or {}
    unpublished = search.get("env_steps", 0) - search.get("published_steps", 0)
    env_steps = sum(c["steps"] for c in new_tasks["supervision"].values()) + unpublished
    cpu_s = round(learner_cpus * sum(v.get("train_s") or 0.0 for v in versions), 1)
    gain = 100 * ((new_tasks.get("greedy") or {}).get("last_vs_twin") or {}).get("diff", 0.0)
    return {"env_steps": env_steps, "learner_cpu_s": cpu_s,
            "env_steps_per_point": round(env_steps / gain, 1) if gain > 0 else None,
            "learner_cpu_s_per_point": round(cpu_s / gain, 1) if gain > 0 else None}  # fmt: skip


def per_point(labels: int, paired: dict | None) -> float | None:
    """Teacher labels spent per point (0.01) of greedy success gained, a paired comparison's (first to last version,
    or twin to last; None: no gain)."""
    gain = 100 * paired["diff"] if paired else 0.0
    return round(labels / gain, 1) if gain > 0 else None


def run_turn(turn: int, config: DemoConfig, stack: LocalStack) -> dict:
    policy = "expert" if turn == 1 else "model"
    say(f"turn {turn}: {config.clients} clients run the {policy} policy on {len(config.fleet.tasks)} tasks")
    fleet = run_fleet(
        FleetRun(
            name=f"turn{turn}",
            prefix=f"t{turn}-",
            clients=config.clients,
            tasks=config.fleet.tasks,
            episodes_per_task=config.fleet.episodes_per_task,
            policy=policy,
            seed=turn * 10_000,
            max_steps=config.fleet.max_steps,
            drain_timeout_s=config.drain_timeout_s,
        ),
        stack, config.out,
    )  # fmt: skip
    say(
        f"turn {turn}: {fleet.steps_in_delta} steps, {fleet.episodes} episodes in Delta, "
        f"success {fleet.success_rate:.2f}"
    )

    steps = config.learner.sft_steps if turn == 1 else config.finetune_steps
    say(f"turn {turn}: learner trains by SFT for {steps} steps on everything so far")
    learn_started = time.monotonic()
    learner_summary = config.out / f"turn{turn}-learner.json"
    learner = stack.start(f"turn{turn}-learner", ["sft", "--steps", str(steps), "--summary", str(learner_summary)],
                          role="learner")  # fmt: skip
    code = learner.wait()
    learner.stop()
    if code != 0:
        raise RuntimeError(f"learner failed (exit {code}):\n{learner.tail()}")
    learned = json.loads(learner_summary.read_text())
    say(
        f"turn {turn}: published {learned['version']} (loss {learned['first_loss']:.3f} -> {learned['final_loss']:.3f})"
    )
    return {
        "turn": turn,
        "model_version": ",".join(fleet.model_versions),
        "published_version": learned["version"],
        "episodes": fleet.episodes,
        "steps_published": fleet.steps_published,
        "steps_in_delta": fleet.steps_in_delta,
        "success_rate": fleet.success_rate,
        "per_task": fleet.per_task,
        "learner": learned,
        "fleet_wall_s": fleet.wall_s,
        "learner_wall_s": round(time.monotonic() - learn_started, 1),
    }


def _write(path: Path, report: dict, started: float) -> None:
    report["elapsed_s"] = round(time.monotonic() - started, 1)
    path.write_text(json.dumps(report, indent=2))
