"""The continuous demo's figures: the fleet's idle time, the success of each version it ran, the CPU split.

`flywheel demo --minutes M` (flywheel.run.demo) runs the loop; these read what it leaves (the fleet's acting
spans, the learner's published versions, the episodes in Delta).
"""

from __future__ import annotations

from core.console import say
from core.object_store import Location
from lake.queries import episode_stats

FLEET_PREFIX = "f-"  # the fleet's client ids and episode ids start with it
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


def version_entry(published: dict, tables_dir: Location, started_at: float) -> dict:
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
    teacher = report.get("cost", {}).get("teacher")
    if teacher:
        say(f"teacher: {teacher['labels']} labels {teacher['labels_by_reason']}, {teacher['reused']} reused without a "
            f"call, skipped {teacher['skipped']}; {report['cost']['env_steps']} env steps")  # fmt: skip
    greedy = report.get("greedy")
    if greedy:
        first, last = greedy["first"], greedy["last"]
        for group, paired in greedy.get("by_group", {}).items():
            say(f"greedy success on {greedy['episodes_per_task']} held-out seeds per task, {group} tasks: "
                f"{first['model_version']} {paired['before']:.3f} -> {last['model_version']} {paired['after']:.3f}, "
                f"paired difference {paired['diff']:+.3f} (95 % CI {paired['ci'][0]:+.3f} .. "
                f"{paired['ci'][1]:+.3f})")  # fmt: skip
    twin, paired = report.get("twin"), report.get("last_vs_twin")
    if paired:
        say(f"no-fleet twin ({twin['stage']} on the {twin['samples']} demonstration rows alone, {twin['steps']} steps "
            f"from {twin['start']}), what the fleet's rows bought:")  # fmt: skip
        for group, by in paired.get("by_group", {}).items():
            say(f"  {group} tasks: twin {by['before']:.3f}, last - twin {by['diff']:+.3f} (95 % CI {by['ci'][0]:+.3f} "
                f".. {by['ci'][1]:+.3f})")  # fmt: skip
    elif twin:
        say(f"no-fleet twin of {twin['of']}: {twin.get('why') or twin.get('error')}")
    say_new_tasks(report.get("new_tasks"))


def say_new_tasks(new: dict | None) -> None:
    """The tasks nobody demonstrated: what the tables hold there, then each version's greedy success and pass@K."""
    if not new:
        return
    say(f"new tasks (nobody demonstrated; expert steps, labels, target boxes and demonstration rows on them in the "
        f"tables: {new['supervised_anywhere']}):")  # fmt: skip
    greedy, passes = new.get("greedy") or {}, new.get("pass_at_k") or {}
    for task in new["tasks"]:
        counts = new["supervision"][task]
        cells = [f"{which} {greedy[which][task]:.2f}" for which in ("first", "last", "twin") if which in greedy]
        cells += [f"pass@{p['samples']} {which} {p['pass_at_k'][task]:.2f}" for which, p in passes.items()]
        say(
            f"  {task:20s} fleet {counts['successes']}/{counts['episodes']} episodes verified; greedy "
            + ", ".join(cells)
        )
    for name in ("last_vs_twin", "last_vs_first"):
        paired = greedy.get(name)
        if paired:
            say(f"  new tasks' mean greedy, {name.replace('_vs_', ' - ')}: {paired['after']:.3f} - "
                f"{paired['before']:.3f} = {paired['diff']:+.3f} (95 % CI {paired['ci'][0]:+.3f} .. "
                f"{paired['ci'][1]:+.3f})")  # fmt: skip
    cost = new.get("cost")
    if cost:
        say(f"  a point of last - twin cost {cost['env_steps_per_point']} env steps and "
            f"{cost['learner_cpu_s_per_point']} learner CPU-seconds ({cost['env_steps']} and {cost['learner_cpu_s']} "
            f"in all)")  # fmt: skip
    best = new.get("last_vs_first_best_of_k")
    if best:
        say(f"  the last version greedy - the first's best of {best['samples']} at test time (oracle verifier, "
            f"{best['seeds']} seeds a task): {best['after']:.3f} - {best['before']:.3f} = {best['diff']:+.3f} "
            f"(95 % CI {best['ci'][0]:+.3f} .. {best['ci'][1]:+.3f}); the fleet spent "
            f"{(cost or {}).get('env_steps')} env steps on these tasks")  # fmt: skip
