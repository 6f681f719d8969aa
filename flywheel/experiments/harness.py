"""`flywheel experiment`: methods that learn the tasks nobody demonstrated, each a module, side by side.

    the harness (here)      the start (a trained model: the release), the suite's expert demonstrations (what every
                            retrain replays, so the suite keeps its level), per training seed the start's exploration
                            of the new tasks as the fleet runs it (edge_client.runner.explore_seed: K runs a seed on
                            the temperature ladder, the search where all K failed; training seeds only), the no-fleet
                            twin (the same retrain from the start on the demonstrations alone, one per training seed
                            and length), every evaluation, the start's test-time best-of-K, the paired CIs, resume
    an arm (its module)     what it trains on and how: flywheel/experiments/arms/<name>.py, registered in ARMS

Every model is evaluated greedily on the same held-out seeds: eval_episodes a new task, suite_episodes a suite task.
Per training seed an arm is paired with its twin and with the start on those seeds (95 % bootstrap CIs); over the
training seeds, the mean of the per-seed differences with a t interval (the run-to-run spread). The start's
best-of-K (K samples a seed, success if any: search at test time, with the verify signal) on the first
best_of_k_seeds is compared with each arm's greedy success at the budget-matched K: the K whose extra test-time
environment steps on the evaluation's seeds equal what the arm's exploration spent.

Resumes unit by unit: OUT/shared/ (demonstrations, the start's evaluations), OUT/seed-<s>/explore/ (the start's
exploration, a parquet per task; a later model's in OUT/seed-<s>/<its name>/), OUT/seed-<s>/<arm>/ (trained.json and
its evaluation; an arm found without trained.json trains again from scratch), OUT/seed-<s>/twin-<steps>/;
OUT/arms.json is rewritten after each unit.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import polars as pl

from core.console import say
from core.settings import EVAL_SEED, NEW_TASKS, SUITE_TASKS
from core.stats import mean_ci, seeds_mean_ci
from edge_client.runner import EdgeConfig
from flywheel.experiments.arms import (
    filtered_bc,
    iterated_search_bc,
    offline_rl,
    search_bc,
    search_bc_rl,
    shuffled_labels,
)
from flywheel.experiments.arms_report import paired, pass_at, point_cost, print_report, summary
from flywheel.gathering.episodes import episode_rows, run_episodes, sampling_policy, to_frame
from flywheel.gathering.evaluation import evaluate_bundle, evaluate_model
from learner.daemon.daemon_config import DaemonConfig
from registry.store import RELEASE_DIR

# In the order they run: the arms that build on search_bc's model follow it, the most telling first.
ARMS = {arm.NAME: arm for arm in (search_bc, iterated_search_bc, filtered_bc, offline_rl, search_bc_rl,
                                  shuffled_labels)}  # fmt: skip
EXPLORE_SEED = 500_000  # training seed s explores seeds EXPLORE_SEED + s * SEED_STRIDE ..
SEED_STRIDE = 10_000


def arms_fleet() -> EdgeConfig:
    """The exploration: the main job's fleet on the new tasks (K runs a seed on the ladder, the search)."""
    return EdgeConfig(client_id="arms", policy="model", tasks=(), new_tasks=NEW_TASKS)


def arms_learner() -> DaemonConfig:
    """The retrains: the main job's learner (the release recipe at rl_lr, 4 copies of each kept success) from the
    release itself, the first version every arm and twin starts from and is compared with; every retrain 400 steps
    whatever its rows (retrain_passes 0), so every arm trains as long as the one twin of its training seed."""
    return DaemonConfig(recipe="release", start_from=str(RELEASE_DIR / "model.pt"), retrain_steps=400,
                        retrain_passes=0.0, new_tasks=NEW_TASKS)  # fmt: skip


@dataclass(frozen=True)
class ArmSettings:
    """The settings of each arm that has its own (its module's SETTINGS)."""

    offline_rl: offline_rl.OfflineRLSettings = field(default_factory=offline_rl.OfflineRLSettings)
    search_bc_rl: search_bc_rl.SearchBCRLSettings = field(default_factory=search_bc_rl.SearchBCRLSettings)
    iterated_search_bc: iterated_search_bc.IteratedSearchBCSettings = field(
        default_factory=iterated_search_bc.IteratedSearchBCSettings
    )


@dataclass(frozen=True)
class ArmsConfig:
    out: Path
    """Everything of the run; arms.json is its report."""
    arms: tuple[str, ...] = tuple(ARMS)
    """The arms to run, in order (an arm runs after the one it starts from)."""
    training_seeds: int = 3
    """Training seeds: each its own exploration seeds, sampling and batches; every arm and twin once per seed."""
    demos_per_task: int = 20
    """Expert demonstrations per suite task (seeds 0..): what every retrain and twin replays."""
    seeds_per_task: int = 40
    """Training seeds explored per new task and training seed (the fleet's loop there costs ~1-3 s a seed)."""
    eval_episodes: int = 200
    """Held-out seeds per new task (EVAL_SEED..), greedy, for every model."""
    suite_episodes: int = 20
    """Held-out seeds per suite task, greedy, for every model (forgetting; 0: not evaluated)."""
    best_of_k: int = 4
    """K of the start's test-time best-of-K ..."""
    best_of_k_seeds: int = 50
    """... on the first this many held-out seeds per new task ..."""
    best_of_k_temperature: float = 1.0
    """... sampling at this temperature over every token."""
    eval_browsers: int = 2
    """Browsers each evaluation runs in (the figures do not depend on it)."""
    fleet: EdgeConfig = field(default_factory=arms_fleet)
    """The exploration: the new tasks, K runs a seed, the ladder, the search's steps."""
    learner: DaemonConfig = field(default_factory=arms_learner)
    """The start (start_from) and the retrains and twins: recipe, rl_lr, online_lr, retrain_steps and _passes,
    new_task_copies."""
    settings: ArmSettings = field(default_factory=ArmSettings)
    """Each arm's own settings."""


# Settings of the tree that are no flags of `flywheel experiment`: the fleet's and the learner's that do not
# shape an arm (clients, channels, publishing cadence, the other curricula).
NOT_ARMS_FLAGS = tuple(f"fleet.{name}" for name in (
    "client_id", "tasks", "episodes_per_task", "policy", "repeats", "seeds_per_visit", "channel", "wait_for_model_s",
    "bootstrap_expert", "temperature", "top_k", "metrics_port", "summary_path", "stop_after_s", "spool_timeout_s",
    "spool_max_bytes", "ledger_path", "teacher", "seed",
)) + tuple(f"learner.{name}" for name in (
    "sft_steps", "min_demos", "every_episodes", "every_minutes", "min_new_episodes", "poll_s",
    "offline_steps", "guidance", "replay_versions", "curriculum", "rl_updates_per_retrain", "self_imitation_top_k",
    "new_tasks", "max_versions", "stop_after_s",
))  # fmt: skip


def parse_arms(text: str) -> tuple[str, ...]:
    """An --arms flag: registered arms, each after the arm it starts from (argparse refuses anything else)."""
    arms = tuple(a for a in text.split(",") if a)
    try:
        check_arms(arms)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return arms


def check_arms(arms: tuple[str, ...]) -> None:
    unknown = [a for a in arms if a not in ARMS]
    if unknown or not arms:
        raise ValueError(f"unknown arms {unknown}; the arms are {', '.join(ARMS)}")
    for arm in arms:
        after = ARMS[arm].AFTER
        if after and (after not in arms or arms.index(after) > arms.index(arm)):
            raise ValueError(f"arm {arm} starts from {after}'s model: run {after} before it")


def check_arms_config(config: ArmsConfig) -> None:
    """Refuses a bad run before anything starts (ValueError naming what is wrong)."""
    check_arms(config.arms)
    if min(config.training_seeds, config.seeds_per_task, config.eval_episodes, config.best_of_k) < 1:
        raise ValueError("training_seeds, seeds_per_task, eval_episodes and best_of_k must be >= 1")
    later = config.settings.iterated_search_bc
    per_training_seed = config.seeds_per_task + (later.rounds - 1) * later.round_seeds + 1_000  # + RL's rollouts
    if EXPLORE_SEED + config.training_seeds * SEED_STRIDE > EVAL_SEED or per_training_seed > SEED_STRIDE:
        raise ValueError("the training seeds' exploration would reach the evaluation seeds")
    if not Path(config.learner.start_from).is_file():
        raise ValueError(f"start_from: no model at {config.learner.start_from!r}")


@dataclass(frozen=True)
class Trained:
    """An arm's model on one training seed, and what it cost."""

    checkpoint: str
    steps: int  # the retrain's optimizer steps: its twin's
    env_steps: int  # environment steps of its data: exploration, rollouts
    cpu_s: float  # learner CPU-seconds
    rows: dict  # what it trained on
    updates: int = 0  # RL updates after the retrain (no twin: without a fleet there are no rollouts)


class ArmContext:
    """What an arm's module gets of the harness on one training seed."""

    def __init__(self, config: ArmsConfig, shared: Shared, seed: int):
        from learner.recipe import VLARecipe

        self.config, self.shared, self.seed = config, shared, seed
        self.tasks: tuple[str, ...] = config.fleet.new_tasks
        self.copies = config.learner.new_task_copies  # each kept success's copies in a retrain
        self.start, self.demos = config.learner.start_from, shared.demos
        self.recipe = VLARecipe.load(config.learner.recipe, progress_bar=False)
        self.seed_dir = config.out / f"seed-{seed}"
        self.results: dict[str, Trained] = {}
        self._policy, self._policy_of, self._rollouts = None, "", {}

    def dir(self, arm: str) -> Path:
        return self.seed_dir / arm

    @property
    def first_seed(self) -> int:
        """The first training seed this training seed explores (the start's exploration; later ones follow it)."""
        return EXPLORE_SEED + self.seed * SEED_STRIDE

    def explored(self, search: bool, name: str = "explore") -> pl.DataFrame:
        """(rows) every episode of an exploration (the start's by default), successes and failures; search=False:
        the sampled runs alone (column found_by: "sampled" or "search")."""
        rows = pl.concat([pl.read_parquet(p) for p in sorted((self.seed_dir / name).glob("*.parquet"))],
                         how="diagonal_relaxed")  # fmt: skip
        return rows if search else rows.filter(pl.col("found_by") == "sampled")

    def exploration_env_steps(self, search: bool, name: str = "explore") -> int:
        counts = json.loads((self.seed_dir / name / "explore.json").read_text())["tasks"].values()
        return sum(c["env_steps_sampled"] + (c["env_steps_search"] if search else 0) for c in counts)

    def explore_with(self, trained: Trained, name: str, first: int, seeds: int) -> tuple[pl.DataFrame, int]:
        """`trained`'s model explores the new tasks as the fleet would, on training seeds first.. (`seeds` a task),
        kept in OUT/seed-<s>/<name>/ (resumable, outside any arm's directory): (its rows, its env steps)."""
        from learner.model.checkpoints import load_vla
        from learner.model.export import export_bundle

        bundle = self.seed_dir / name / "model.vla"
        if not bundle.exists():
            bundle.parent.mkdir(parents=True, exist_ok=True)
            export_bundle(*load_vla(trained.checkpoint), bundle)
        explore(self, name, bundle, name, first, seeds)
        return self.explored(True, name), self.exploration_env_steps(True, name)

    def train_config(self, steps: int, online: bool = False):
        """The training of a retrain of `steps` (the learner daemon's: rl_lr, short warm-up, a checkpoint at the
        end), or of online RL updates (online_lr, a long schedule each update slices)."""
        from learner.daemon.loop import rl_train_config

        train = rl_train_config(self.recipe, self.config.learner)
        train = replace(train, seed=train.seed + self.seed)
        if online:
            return replace(train, lr=self.config.learner.online_lr, steps=100_000, checkpoint_every=0)
        return replace(train, steps=steps, checkpoint_every=steps)

    def retrain_steps(self, extra_rows: int) -> int:
        from learner.algorithms.stages import retrain_steps

        learner = self.config.learner
        rows = self.demos.height + extra_rows
        return retrain_steps(learner.retrain_steps, learner.retrain_passes, rows, self.recipe.train.batch_size)

    def retrain(self, arm: str, extra: pl.DataFrame | None, env_steps: int, steps: int = 0) -> Trained:
        """The learner's retrain from the start on the demonstrations + `extra`, built as the daemon builds every
        retrain and its no-fleet twin (learner.daemon.loop.retrain_run), for the learner's steps on those rows (or
        `steps`); its batches seeded by the training seed."""
        from learner.algorithms.stages import StageData, run_stage
        from learner.daemon.loop import retrain_run

        steps = steps or self.retrain_steps(0 if extra is None else extra.height)
        run = retrain_run(
            "self_imitation", self.recipe, self.config.learner, self.start, self.dir(arm) / "train", steps
        )
        run = replace(run, train=replace(run.train, seed=run.train.seed + self.seed, checkpoint_every=steps))
        result = run_stage(run, StageData(demos=self.demos, extra=extra))
        return self.trained(arm, result, steps, env_steps, {"extra_rows": 0 if extra is None else extra.height})

    def trained(self, arm: str, result, steps: int, env_steps: int, rows: dict) -> Trained:
        return Trained(str(result.checkpoint_path), steps, env_steps, round(result.cpu_s, 1),
                       rows | {"demo_rows": self.demos.height})  # fmt: skip

    def result_of(self, arm: str) -> Trained:
        return self.results[arm]

    def rollouts(self, checkpoint: str, task: str, repeats: int, temperature: float) -> tuple[pl.DataFrame, int]:
        """`repeats` runs of `checkpoint`'s model on the next fresh training seed of `task` (after the exploration's),
        sampling over every token: (rows, env steps)."""
        from learner.model.checkpoints import load_vla
        from policy.sampling import Sampling

        if self._policy_of != checkpoint:  # a new model: exported once, run by onnxruntime as at the edge
            self._policy = sampling_policy(*load_vla(checkpoint), "rollouts", self.seed_dir / "rollouts.vla",
                                           temperature, 0, 0)  # fmt: skip
            self._policy_of = checkpoint
        self._rollouts[task] = self._rollouts.get(task, 0) + 1
        offset = self.config.seeds_per_task + self._rollouts[task]
        self._policy.sampling = Sampling(temperature, 0, seed=self.seed * SEED_STRIDE + offset)
        seed = self.first_seed + offset
        return run_episodes(self.shared.env, lambda _t: self._policy, [task], [seed], repeats, "rollouts", "rollouts",
                            self.config.fleet.max_steps)  # fmt: skip


class Shared:
    """The browser, the demonstrations and the start's evaluations every arm is compared with (OUT/shared/)."""

    def __init__(self, config: ArmsConfig, env):
        from edge_client.experts import expert_for

        self.config, self.env, self.dir = config, env, config.out / "shared"
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / "demos.parquet"
        if not path.exists():
            say(f"demonstrations: {config.demos_per_task} per task on {len(SUITE_TASKS)} suite tasks")
            demos, steps = run_episodes(env, expert_for, SUITE_TASKS, range(config.demos_per_task), 1, "expert", "demo",
                                        config.fleet.max_steps)  # fmt: skip
            demos.write_parquet(path)
            (self.dir / "demos.json").write_text(json.dumps({"env_steps": steps}))
        self.demos = pl.read_parquet(path).filter(pl.col("success"))

    def episodes(self) -> dict[str, int]:
        config = self.config
        suite = {t: config.suite_episodes for t in SUITE_TASKS} if config.suite_episodes else {}
        return {t: config.eval_episodes for t in config.fleet.new_tasks} | suite

    def evaluate(self, checkpoint: str, label: str, out: Path) -> dict:
        """A model greedy on the evaluation's seeds (OUT/.../eval-<label>.json, reused when there)."""
        from learner.model.checkpoints import load_vla

        path = out / f"eval-{label}.json"
        if path.exists():
            return json.loads(path.read_text())
        model, tok, pruning = load_vla(checkpoint)
        meta = {"arm": label, "step": label, "parameters": model.num_parameters()}
        episodes = self.episodes()
        return evaluate_model(model, tok, pruning, meta, tuple(episodes), episodes, out, self.config.eval_browsers)

    def best_of_k(self) -> dict:
        """The start sampled K times on each of the first best_of_k_seeds held-out seeds per new task: per task and
        seed its successes of K (pass@k for every k <= K) and the mean steps an episode."""
        path = self.dir / "best-of-k.json"
        if path.exists():
            return json.loads(path.read_text())
        config = self.config
        report = evaluate_bundle(self.dir / "model-start.vla", "start", config.fleet.new_tasks, config.best_of_k_seeds,
                                 config.eval_browsers, temperature=config.best_of_k_temperature,
                                 samples=config.best_of_k)  # fmt: skip
        entry = {"samples": config.best_of_k, "temperature": config.best_of_k_temperature,
                 "successes_by_seed": {t: r["successes_by_seed"] for t, r in report["tasks"].items()},
                 "mean_steps": {t: r["mean_steps"] for t, r in report["tasks"].items()}}  # fmt: skip
        path.write_text(json.dumps(entry, indent=2))
        return entry


def explore(ctx: ArmContext, name: str, bundle: Path, version: str, first: int, seeds: int) -> None:
    """A model's exploration of every new task on this training seed, as the fleet runs it, on seeds first.. (`seeds`
    a task): OUT/seed-<s>/<name>/, a parquet per task (every run and every success the search found, as rows) and
    explore.json (what each task's exploration found and cost); a task explored already is not again."""
    from edge_client.env import EnvConfig, GuiEnv
    from edge_client.exploration import NewTaskSampler
    from edge_client.runner import RunSummary, exploration, explore_seed
    from policy.runtime import load_policy

    out, fleet = ctx.seed_dir / name, replace(ctx.config.fleet, client_id=f"arms-{ctx.seed}-{name}")
    out.mkdir(parents=True, exist_ok=True)
    report_path = out / "explore.json"
    report = json.loads(report_path.read_text()) if report_path.exists() else {"tasks": {}}
    base = replace(exploration(fleet), seed=ctx.seed)
    policy = load_policy(bundle, version, intra_op_threads=fleet.intra_op_threads, sampling=base)
    sampler = NewTaskSampler(fleet.new_task_temperature, fleet.new_task_min_temperature)
    with GuiEnv(fleet.new_tasks[0], EnvConfig(read_dom=False)) as env:
        for task in fleet.new_tasks:
            if task in report["tasks"]:
                continue
            started, summary, rows, run, sampled = time.monotonic(), RunSummary(fleet.client_id), [], 0, 0
            for seed in range(first, first + seeds):
                group, found = explore_seed(env, policy, sampler, base, fleet, summary, task, seed, run)
                for i, result in enumerate(group + found):
                    kind = "sampled" if i < len(group) else "search"
                    for row in episode_rows(result, f"{name}-{ctx.seed}-{task}-{seed}-{i}", version):
                        rows.append(row | {"found_by": kind})
                run, sampled = run + len(group), sampled + sum(r.steps for r in group)
            frame = to_frame(rows).with_columns(pl.Series("found_by", [r["found_by"] for r in rows]))
            frame.write_parquet(out / f"{task}.parquet")
            episodes = frame.unique("episode_id")
            report["tasks"][task] = {
                "seeds": seeds, "first_seed": first, "env_steps_sampled": sampled,
                "env_steps_search": summary.search["env_steps"], "searches": summary.search["searches"],
                "sampled_successes": episodes.filter((pl.col("found_by") == "sampled") & pl.col("success")).height,
                "seeds_with_success": episodes.filter(pl.col("success"))["seed"].n_unique(),
                "seeds_with_sampled_success": episodes.filter((pl.col("found_by") == "sampled")
                                                              & pl.col("success"))["seed"].n_unique(),
                "wall_s": round(time.monotonic() - started, 1)}  # fmt: skip
            report_path.write_text(json.dumps(report, indent=2))
            say(f"seed {ctx.seed} {name} {task}: {report['tasks'][task]}")


def run_arm(ctx: ArmContext, arm: str) -> Trained:
    """Train `arm` on this training seed (or read what it trained) and evaluate it."""
    out = ctx.dir(arm)
    path = out / "trained.json"
    if path.exists():
        trained = Trained(**json.loads(path.read_text()))
    else:
        shutil.rmtree(out, ignore_errors=True)  # an interrupted arm trains again from scratch
        out.mkdir(parents=True)
        say(f"seed {ctx.seed} arm {arm}: {ARMS[arm].SUMMARY}")
        trained = ARMS[arm].train(ctx, getattr(ctx.config.settings, arm, None))
        path.write_text(json.dumps(asdict(trained), indent=2))
    ctx.results[arm] = trained
    ctx.shared.evaluate(trained.checkpoint, arm, out)
    return trained


def run_twin(ctx: ArmContext, steps: int) -> dict:
    """The no-fleet twin of a retrain of `steps`: the same retrain from the start on the demonstrations alone."""
    name = f"twin-{steps}"
    path = ctx.dir(name) / "trained.json"
    if not path.exists():
        shutil.rmtree(ctx.dir(name), ignore_errors=True)
        say(f"seed {ctx.seed} twin: {steps} steps from the start on the demonstrations alone")
        trained = ctx.retrain(name, None, 0, steps=steps)
        path.write_text(json.dumps(asdict(trained), indent=2))
    trained = Trained(**json.loads(path.read_text()))
    return ctx.shared.evaluate(trained.checkpoint, name, ctx.dir(name))


def run_arms(config: ArmsConfig) -> dict:
    from edge_client.env import GuiEnv
    from learner.model.checkpoints import load_vla
    from learner.model.export import export_bundle

    check_arms_config(config)
    config.out.mkdir(parents=True, exist_ok=True)
    env = GuiEnv(SUITE_TASKS[0])
    try:
        shared = Shared(config, env)
        if not (shared.dir / "model-start.vla").exists():
            export_bundle(*load_vla(config.learner.start_from), shared.dir / "model-start.vla")
        shared.evaluate(config.learner.start_from, "start", shared.dir)
        shared.best_of_k()
        write_report(config, shared)
        for seed in range(config.training_seeds):
            ctx = ArmContext(config, shared, seed)
            explore(ctx, "explore", shared.dir / "model-start.vla", "start", ctx.first_seed, config.seeds_per_task)
            for arm in config.arms:
                trained = run_arm(ctx, arm)
                run_twin(ctx, trained.steps)
                write_report(config, shared)
    finally:
        env.close()
    report = write_report(config, shared)
    print_report(report)
    return report


def write_report(config: ArmsConfig, shared: Shared) -> dict:
    """OUT/arms.json from every unit done so far."""
    new = config.fleet.new_tasks
    start = json.loads((shared.dir / "eval-start.json").read_text())
    best = shared.best_of_k()
    new_of = lambda entry: {t: entry["success_by_seed"][t] for t in new}  # noqa: E731
    suite_of = lambda entry: {t: v for t, v in entry["success_by_seed"].items() if t not in new}  # noqa: E731
    k_max = best["samples"]
    best_by_k = {k: {t: [pass_at(c, k_max, k) for c in best["successes_by_seed"][t]] for t in new}
                 for k in range(1, k_max + 1)}  # fmt: skip
    steps_a_pass = sum(best["mean_steps"][t] * config.eval_episodes for t in new)  # a greedy pass over the eval seeds
    report = {"config": json.loads(json.dumps(asdict(config), default=str)), "start": summary(start, new),
              "start_best_of_k": {k: round(mean_ci(v)[0], 4) for k, v in best_by_k.items()}, "arms": {}}  # fmt: skip
    for arm in config.arms:
        seeds = {}
        for seed in range(config.training_seeds):
            out = config.out / f"seed-{seed}" / arm
            if not (out / f"eval-{arm}.json").exists():
                continue
            trained = json.loads((out / "trained.json").read_text())
            twin_path = config.out / f"seed-{seed}" / f"twin-{trained['steps']}" / f"eval-twin-{trained['steps']}.json"
            entry = json.loads((out / f"eval-{arm}.json").read_text())
            figures = summary(entry, new) | {k: trained[k] for k in ("steps", "env_steps", "cpu_s", "rows", "updates")}
            figures["vs_start"] = paired(new_of(entry), new_of(start))
            # The start's best-of-K at the K whose extra test-time steps match what this arm's data cost.
            k = max(1, min(k_max, 1 + int(trained["env_steps"] / steps_a_pass)))
            mine = {t: entry["success_by_seed"][t][: config.best_of_k_seeds] for t in new}
            figures["vs_start_best_of_k"] = {"k": k, **paired(mine, best_by_k[k])}
            if twin_path.exists():
                twin = json.loads(twin_path.read_text())
                figures["twin"] = summary(twin, new)
                figures["vs_twin"] = paired(new_of(entry), new_of(twin))
                figures["a_point_costs"] = point_cost(figures["vs_twin"], trained["env_steps"], trained["cpu_s"])
                if config.suite_episodes:
                    figures["suite_vs_twin"] = paired(suite_of(entry), suite_of(twin))
            if config.suite_episodes:
                figures["suite_vs_start"] = paired(suite_of(entry), suite_of(start))
            seeds[str(seed)] = figures
        over = {key: seeds_mean_ci([s[key]["diff"] for s in seeds.values() if key in s])
                for key in ("vs_twin", "vs_start", "vs_start_best_of_k", "suite_vs_twin")
                if any(key in s for s in seeds.values())}  # fmt: skip
        report["arms"][arm] = {"summary": ARMS[arm].SUMMARY, "seeds": seeds, "over_seeds": over}
    path = config.out / "arms.json"
    path.write_text(json.dumps(report, indent=2))
    return report
