"""`flywheel bench env`: environment steps per second, and where a step's time goes, three ways.

    stock     miniwob's gymnasium loop as shipped: `gymnasium.make("miniwob/<task>-v1")`, its reset, step and
              screenshot (edge_client.stock_env; one browser per task, as stock cannot switch tasks)
    previous  GuiEnv's previous path: miniwob's reset and step through WebDriver, plus our settle loop
    fast      GuiEnv's fast path: one page-side script per step over DevTools, unpaced frames

Each path runs the same tasks and seeds with the scripted experts and with the model (greedy), through the
episode loop the fleet runs (edge_client.episode), publishing every step as the edge does up to its first hop:
the StepEvent built and encoded (PNG included) and appended to an on-disk spool (Kafka is fed from there, off
the acting thread). With 1 browser a profiler splits each step's time into phases (exclusive: a phase nested in
another counts only in the inner one):

    reset       per episode: the whole reset, its screenshot included
    policy      the policy's think (expert DOM reading or VLA inference)
    act         dispatching the action (previous and stock: miniwob's perform, with our settle loop on previous)
    read        reward/done, utterance and DOM (fast: the one page-side script, which also settles)
    screenshot  capture and decode of the step's screen
    verify      the think -> act -> verify check
    publish     StepEvent + encode + spool append
    env_other   the rest of env.step (the fast path's done check, observation building)

With N browsers, N threads each drive their own browser (and their own model session) over a share of every
task's seeds; only throughput is reported. Browser starts and task switches are not timed: stock starts one
browser per task, ours switches task with a page load. Results: DIR/env_bench.json.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from core.machine import machine
from core.settings import TIER1_TASKS, Settings
from edge_client.episode import Env, EpisodeResult, StepRecord, run_episode
from registry.store import resolve_model

PATHS = ("stock", "previous", "fast")
POLICIES = ("expert", "model")
# Tier 1 and multi-step tasks that click in order, tick, switch tabs, pick an option and type.
WORKLOAD = TIER1_TASKS + ("click-button-sequence", "click-checkboxes", "click-tab", "click-option", "enter-text")
FIRST_SEED = 3_000_000  # of each task's episodes: far from training and evaluation seeds


@dataclass(frozen=True)
class EnvBenchConfig:
    out: Path
    """env_bench.json goes here."""
    workload: tuple[str, ...] = WORKLOAD
    """Tasks, the same for every path and policy."""
    task_seeds: int = 6
    """Episodes per task, seeds 3,000,000 + i (far from training and evaluation seeds), for every path, policy and
    browser count."""
    parallel_browsers: int = 2
    """N of the N-browser runs (1-browser runs always happen)."""
    model: str = "release"
    """The model policy's bundle: a .vla path, a published version, 'latest' or 'release'."""
    paths: tuple[str, ...] = PATHS
    """Which of stock, previous, fast."""
    policies: tuple[str, ...] = POLICIES
    """Which of expert, model."""
    max_steps: int = 10
    """An episode still running after this many steps ends as a failure."""


class Profiler:
    """Time per phase of wrapped methods. Exclusive: a phase's time less that of the phases nested in it;
    except a whole phase (the reset), which keeps all its time and whose nested phases count nowhere else."""

    def __init__(self) -> None:
        self.ms: dict[str, float] = defaultdict(float)
        self.enabled = True
        self._stack: list[list[Any]] = []  # [start, ms of nested phases, whole] per open phase

    def wrap(self, owner: Any, name: str, phase: str, whole: bool = False) -> None:
        original = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.phase(phase, whole):
                return original(*args, **kwargs)

        setattr(owner, name, timed)

    @contextmanager
    def phase(self, phase: str, whole: bool = False) -> Iterator[None]:
        if not self.enabled or any(frame[2] for frame in self._stack):
            yield
            return
        frame = [time.perf_counter(), 0.0, whole]
        self._stack.append(frame)
        try:
            yield
        finally:
            self._stack.pop()
            elapsed = (time.perf_counter() - frame[0]) * 1000.0
            self.ms[phase] += elapsed if whole else elapsed - frame[1]
            if self._stack:
                self._stack[-1][1] += elapsed

    @contextmanager
    def paused(self) -> Iterator[None]:
        self.enabled = False
        try:
            yield
        finally:
            self.enabled = True


def open_env(path: str, task: str, read_dom: bool) -> Env:
    from edge_client.env import EnvConfig, GuiEnv
    from edge_client.stock_env import StockEnv

    if path == "stock":
        env = StockEnv()
        env.open(task)
        return env
    return GuiEnv(task, EnvConfig(path=path, read_dom=read_dom))


def profile_env(env: Any, path: str, task: str, profiler: Profiler) -> None:
    """Wrap the reset and the methods that make up `env`'s step in profiler phases, once per env (stock opens
    a new one per task)."""
    if getattr(env, "_profiled", False):
        return
    env._profiled = True
    profiler.wrap(env, "reset", "reset", whole=True)
    if path == "fast":
        profiler.wrap(env, "_act_fast", "act")
        profiler.wrap(env, "_read_page", "read")
        profiler.wrap(env, "_capture", "screenshot")
        return
    instance = env._envs[task].unwrapped.instance if path == "stock" else env._env.instance
    profiler.wrap(instance, "perform", "act")
    profiler.wrap(instance, "get_metadata", "read")
    profiler.wrap(instance, "get_observation", "read")


@contextmanager
def profiled_screenshots(profiler: Profiler) -> Iterator[None]:
    """miniwob's screenshot (capture + PNG decode + crop) as a phase, for the stock and previous paths."""
    import miniwob.selenium_instance as selenium_instance

    original = selenium_instance.get_screenshot
    profiler.wrap(selenium_instance, "get_screenshot", "screenshot")
    try:
        yield
    finally:
        selenium_instance.get_screenshot = original


def policy_factory(name: str, model: Path) -> Callable[[], Callable[[str], Any]]:
    """A maker of task -> Policy, called once per browser (a model session is not shared across threads)."""
    if name == "expert":
        from edge_client.experts import expert_for

        return lambda: expert_for
    from policy.runtime import load_policy

    def make() -> Callable[[str], Any]:
        policy = load_policy(model, "bench", intra_op_threads=1)
        return lambda _task: policy

    return make


def spool_publisher(spool: Any, task: str, seed: int, version: str,
                    profiler: Profiler | None) -> Callable[[StepRecord], None]:  # fmt: skip
    """The edge's publish up to its first hop: StepEvent, encoded, appended to the on-disk spool."""
    from edge_client.runner import step_event
    from schemas import encode_event

    def publish(record: StepRecord) -> None:
        with profiler.phase("publish") if profiler else nullcontext():
            event = step_event(record, "bench", f"bench-{task}-{seed}", task, seed, version)
            spool.append("steps", event.episode_id.encode(), encode_event(event))

    return publish


def run_path(path: str, policy: str, browsers: int, config: EnvBenchConfig, model: Path, spool_dir: Path) -> dict:
    """Every task's seeds through `browsers` browsers; figures of the timed episodes."""
    from edge_client.spool import Spool

    make_policy = policy_factory(policy, model)
    policies = [make_policy() for _ in range(browsers)]
    spools = [Spool(spool_dir / f"{path}-{policy}-{browsers}-{shard}", max_bytes=1 << 40) for shard in range(browsers)]
    profiler = Profiler() if browsers == 1 else None
    results: list[EpisodeResult] = []
    wall_s = 0.0
    envs: list[Any] = []

    def episodes_of(shard: int, task: str) -> list[EpisodeResult]:
        env, policy_for = envs[shard], policies[shard]
        done = []
        for i in range(shard, config.task_seeds, browsers):
            seed = FIRST_SEED + i
            publish = spool_publisher(spools[shard], task, seed, policy, profiler)
            done.append(run_episode(env, policy_for(task), task, seed, config.max_steps, publish))
        return done

    try:
        with profiled_screenshots(profiler) if profiler and path != "fast" else nullcontext():
            for task in config.workload:
                envs = prepare_envs(envs, path, task, browsers, profiler, read_dom=policy == "expert")
                started = time.perf_counter()
                with ThreadPoolExecutor(browsers) as pool:
                    for done in pool.map(episodes_of, range(browsers), [task] * browsers):
                        results += done
                wall_s += time.perf_counter() - started
    finally:
        for env in envs:
            env.close()
        for spool in spools:
            spool.close()
    return figures(results, wall_s, profiler, browsers)


def prepare_envs(envs: list[Any], path: str, task: str, browsers: int, profiler: Profiler | None,
                 read_dom: bool) -> list[Any]:  # fmt: skip
    """The browsers for `task`, untimed: stock gets new ones (one per task), ours switch page. The fast path
    reads the DOM only for the experts (stock and previous read it always: miniwob's observation has it)."""
    if path == "stock":
        for env in envs:
            env.close()
        envs = [open_env(path, task, read_dom) for _ in range(browsers)]
    elif not envs:
        envs = [open_env(path, task, read_dom) for _ in range(browsers)]
    if profiler is not None:
        profile_env(envs[0], path, task, profiler)
    with profiler.paused() if profiler else nullcontext():
        for env in envs:
            env.reset(seed=0, task=task)  # the page load of a task switch, untimed
    return envs


def figures(results: list[EpisodeResult], wall_s: float, profiler: Profiler | None, browsers: int) -> dict:
    steps = sum(r.steps for r in results)
    out: dict[str, Any] = {
        "browsers": browsers,
        "episodes": len(results),
        "steps": steps,
        "wall_s": round(wall_s, 2),
        "steps_per_s": round(steps / wall_s, 2),
        "episodes_per_s": round(len(results) / wall_s, 2),
        "success_rate": round(sum(r.success for r in results) / len(results), 3),
    }
    if profiler is None:
        return out
    records = [record for r in results for record in r.records]
    env_ms = sum(record.act_ms for record in records)
    inside_step = sum(profiler.ms[p] for p in ("act", "read", "screenshot"))
    per_step = {
        "policy": sum(record.think_ms for record in records),
        "act": profiler.ms["act"],
        "read": profiler.ms["read"],
        "screenshot": profiler.ms["screenshot"],
        "verify": sum(record.verify_ms for record in records),
        "publish": profiler.ms["publish"],
        "env_other": max(0.0, env_ms - inside_step),
    }
    out["breakdown_ms"] = {
        "reset_per_episode": round(profiler.ms["reset"] / len(results), 2),
        **{f"{phase}_per_step": round(ms / steps, 2) for phase, ms in per_step.items()},
    }
    return out


def run_bench(config: EnvBenchConfig, artifacts_dir: Path) -> dict:
    config.out.mkdir(parents=True, exist_ok=True)
    model, version = resolve_model(config.model, artifacts_dir) if "model" in config.policies else (Path(), "")
    report: dict[str, Any] = {"config": {**asdict(config), "out": str(config.out), "model_version": version},
                              "machine": machine(), "paths": {}}  # fmt: skip
    with tempfile.TemporaryDirectory() as spool_dir:
        for path in config.paths:
            for policy in config.policies:
                one = run_path(path, policy, 1, config, model, Path(spool_dir))
                many = run_path(path, policy, config.parallel_browsers, config, model, Path(spool_dir))
                report["paths"].setdefault(path, {})[policy] = {**one, f"browsers_{config.parallel_browsers}": many}
                print(format_line(path, policy, one, many), flush=True)
    report["speedups"] = speedups(report["paths"], config.parallel_browsers)
    (config.out / "env_bench.json").write_text(json.dumps(report, indent=2))
    return report


def speedups(paths: dict, browsers: int) -> dict:
    """steps/s of each path over the previous one and over stock, per policy, at 1 and N browsers."""
    out = {}
    for policy in POLICIES:
        for key, label in ((None, "1_browser"), (f"browsers_{browsers}", f"{browsers}_browsers")):
            rates = {p: (paths[p][policy][key] if key else paths[p][policy])["steps_per_s"]
                     for p in paths if policy in paths[p]}  # fmt: skip
            if "fast" in rates:
                for base in ("previous", "stock"):
                    if base in rates:
                        out[f"{policy}_fast_vs_{base}_{label}"] = round(rates["fast"] / rates[base], 2)
    return out


def format_line(path: str, policy: str, one: dict, many: dict) -> str:
    breakdown = " ".join(f"{k.removesuffix('_per_step').removesuffix('_per_episode')} {v}"
                         for k, v in one.get("breakdown_ms", {}).items())  # fmt: skip
    return (f"{path:9s} {policy:7s} 1 browser: {one['steps_per_s']:6.2f} steps/s {one['episodes_per_s']:6.2f} eps/s "
            f"(success {one['success_rate']:.2f}) | {many['browsers']} browsers: {many['steps_per_s']:6.2f} steps/s "
            f"{many['episodes_per_s']:6.2f} eps/s | ms: {breakdown}")  # fmt: skip


def command(config: EnvBenchConfig, settings: Settings) -> int:
    """`flywheel bench env`: the speedups, and where the JSON went."""
    report = run_bench(config, settings.artifacts_dir)
    print("speedups: " + ", ".join(f"{k} {v}x" for k, v in report["speedups"].items()))
    print(f"wrote {config.out / 'env_bench.json'}")
    return 0
