"""`flywheel experiment curriculum`: the curriculum's arms at the same budget, seeded, side by side.

    shared:  expert demonstrations -> SFT (the demo recipe) -> a logged fleet: the SFT model's sampled
             rollouts on training seeds, R per seed (successes and failures: the offline stage's data,
             recorded when an arm with an offline stage first runs)
    per arm: its stages after SFT, in rounds, until its budget (wall minutes of training and rollouts,
             evaluation excluded) is spent; evaluated greedily on held-out seeds at `curve_points` points

    arm                 after the shared SFT, within the budget
    sft                 more SFT on the demonstrations
    sft_offline         offline RL (AWR + DPO) on demonstrations + the logged fleet
    sft_offline_ppo     offline RL for offline_share of the budget, then online PPO (GRPO groups), no guidance
    sft_offline_refkl   ... then online PPO + beta * KL(pi || pi_SFT)
    sft_offline_databc  ... then online PPO + beta * demo NLL
    sft_ppo             online PPO from SFT, no offline stage, no guidance
    offline_only        offline RL from a fresh model (no SFT), the same data, SFT's steps + the budget
    sft_semi_online     semi-online RL (learner.semi_online) on the demonstrations: no environment steps
    sft_semi_online_views  ... each trajectory's rollouts on one random view of it (SEMI_ONLINE_VIEWS)

Every post-SFT stage uses the same learning rate (rl_lr) and optimizer steps per round. Rollouts run in
a local browser through the fleet's own loop (edge_client.episode) and become the rows the pipeline would
write (processors.rows, processors.scoring): this measures the learning; `flywheel demo --minutes`
measures the pipeline around it. env_steps counts every environment step an arm's data cost: the
demonstrations, the logged fleet when it reads it, its own online rollouts.

Resumes: the shared parts are kept in OUT/shared/, each arm's counters and curve in OUT/<arm>/state.json
(its stages resume from their checkpoints). Writes OUT/curriculum.json and OUT/curriculum.png.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import polars as pl

from core.console import say
from core.settings import SUITE_TASKS, TIER1_TASKS, TIER2_TASKS

ARMS: dict[str, tuple[str, ...]] = {
    "sft": ("sft", "sft"),
    "sft_offline": ("sft", "offline_rl"),
    "sft_offline_ppo": ("sft", "offline_rl", "online_rl:none"),
    "sft_offline_refkl": ("sft", "offline_rl", "online_rl:refkl"),
    "sft_offline_databc": ("sft", "offline_rl", "online_rl:databc"),
    "sft_ppo": ("sft", "online_rl:none"),
    "offline_only": ("offline_rl",),
    "sft_semi_online": ("sft", "semi_online"),
    "sft_semi_online_views": ("sft", "semi_online:views"),
}
# The semi-online views (learner.semi_online): the training views of the vision experiment's augmented arm.
SEMI_ONLINE_VIEWS = {"view_shift_px": 6, "view_scale": 0.05, "view_colour": 0.1}
LOG_SEED, ROUND_SEED = 500_000, 600_000  # training seeds of the logged fleet and online rounds (eval: 1,000,000+)
COLUMNS = ["episode_id", "step", "task", "instruction", "screenshot", "thought", "action_type", "x", "y",
           "text", "key", "tokens", "token_logprobs", "seed", "model_version", "purpose", "weight", "score",
           "success", "target_box"]  # fmt: skip


@dataclass(frozen=True)
class CurriculumConfig:
    out: Path = Path("runs/curriculum")
    """Everything of the run: shared data and SFT, each arm, curriculum.json and .png."""
    budget_minutes: float = 20.0
    """Per arm: wall minutes of its post-SFT training and rollouts (evaluation excluded)."""
    tasks: tuple[str, ...] = SUITE_TASKS
    """Trained on and evaluated; tier means over the Tier 1 / Tier 2 tasks among them."""
    episodes: int = 50
    """Evaluation episodes per task at each curve point (held-out seeds, greedy)."""
    eval_browsers: int = 1
    """Browsers each evaluation runs in parallel (the figures do not depend on it)."""
    curve_points: int = 3
    """Evaluations along each arm's budget (the last at its end); the shared SFT is the curve's start."""
    arms: str = ""
    """Comma-separated arms to run (empty: all)."""
    recipe: str = "demo"
    """VLA recipe of the SFT stage (learner.config.VLARecipe)."""
    demos_per_task: int = 20
    """Expert demonstrations per task (seeds 0..n-1)."""
    sft_steps: int = 800
    """Optimizer steps of the shared SFT."""
    log_seeds: int = 4
    """Seeds per task of the logged fleet (the SFT model, sampled) ..."""
    repeats: int = 4
    """... and rollouts per seed, there and in each online round (a GRPO group)."""
    round_seeds: int = 1
    """Seeds per task in an online round."""
    update_steps: int = 50
    """Optimizer steps per round of an SFT or offline RL stage (each round reloads its data: not too few)."""
    temperature: float = 1.0
    """Sampling temperature of every rollout."""
    top_k: int = 5
    """Rollouts sample among the k likeliest allowed tokens."""
    rl_lr: float = 3e-4
    """Learning rate of every stage after the shared SFT."""
    offline_share: float = 0.3
    """Share of an arm's budget its offline stage gets when an online stage follows."""
    semi_online_trajectories: int = 16
    """Expert trajectories per semi-online round (cycling through the demonstrations), 8 rollouts each."""
    max_steps: int = 10
    """An episode still running after this many steps fails."""
    seed: int = 0
    """Seed of the rollouts' sampling and of the semi-online batches."""


@dataclass
class ArmState:
    """An arm's progress, saved after every round (OUT/<arm>/state.json)."""

    rounds: int = 0
    spent_s: float = 0.0
    cpu_s: float = 0.0
    own_env_steps: int = 0
    checkpoint: str = ""
    stage: str = ""
    curve: list[dict] | None = None

    @classmethod
    def load(cls, path: Path) -> ArmState:
        return cls(**json.loads(path.read_text())) if path.exists() else cls(curve=[])

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=2))


def tier_means(per_task: dict[str, float]) -> tuple[float | None, float | None]:
    """Unweighted means of the evaluated Tier 1 and Tier 2 tasks (None where a tier has none)."""
    short = {t.removeprefix("miniwob/").removesuffix("-v1"): rate for t, rate in per_task.items()}
    means = []
    for tier in (TIER1_TASKS, TIER2_TASKS):
        rates = [short[t] for t in tier if t in short]
        means.append(round(sum(rates) / len(rates), 4) if rates else None)
    return means[0], means[1]


def stage_at(stages: tuple[str, ...], spent: float, budget: float, offline_share: float) -> str:
    """The stage an arm trains in after `spent` of its `budget` seconds (its stages after the shared SFT)."""
    after_sft = stages[1:] if stages[0] == "sft" and len(stages) > 1 else stages
    if len(after_sft) == 1:
        return after_sft[0]
    return after_sft[0] if spent < offline_share * budget else after_sft[1]


def episode_rows(result, episode_id: str, version: str) -> list[dict]:
    """The rows (COLUMNS) of one episode run by edge_client.episode, as the pipeline would write and score them."""
    from edge_client.runner import step_event
    from processors.rows import step_row
    from processors.scoring import EpisodeProgress, score_episode

    events = [step_event(r, "curriculum", episode_id, result.task, result.seed, version) for r in result.records]
    progress = EpisodeProgress()
    for event in events:
        progress.add(event)
    scored = score_episode(events[-1], progress)
    purpose = "demo" if version == "expert" else ("success" if scored.success else "failure")
    extra = {"purpose": purpose, "weight": 1.0, "score": scored.score, "success": scored.success}
    return [{k: v for k, v in step_row(e, 0, 0).items() if k in COLUMNS} | extra for e in events]


def to_frame(rows: list[dict]) -> pl.DataFrame:
    from learner.data import ROLLOUT_TYPES

    types = ROLLOUT_TYPES | {"target_box": pl.List(pl.Float32)}
    return pl.DataFrame(rows, schema_overrides=types, infer_schema_length=None).select(COLUMNS)


def run_episodes(env, policy_for, tasks, seeds, repeats: int, version: str, tag: str, max_steps: int):
    """(rows frame, env steps): every task x seed x repeat through the fleet's loop."""
    from edge_client.episode import run_episode

    rows, env_steps = [], 0
    for task in tasks:
        for seed in seeds:
            for r in range(repeats):
                result = run_episode(env, policy_for(task), task, seed, max_steps)
                env_steps += result.steps
                rows += episode_rows(result, f"{tag}-{task}-{seed}-{r}", version)
    return to_frame(rows), env_steps


class Shared:
    """The demonstrations, the SFT model and the logged fleet every arm starts from (OUT/shared/)."""

    def __init__(self, config: CurriculumConfig, env):
        from edge_client.experts import expert_for
        from learner.config import VLARecipe
        from learner.vla_sft import train_vla

        self.config, self.dir = config, config.out / "shared"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.recipe = VLARecipe.load(config.recipe, progress_bar=False)
        meta_path = self.dir / "meta.json"
        meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
        if not (self.dir / "demos.parquet").exists():
            say(f"demonstrations: {config.demos_per_task} per task on {len(config.tasks)} tasks")
            demos, meta["demo_env_steps"] = run_episodes(env, expert_for, config.tasks, range(config.demos_per_task),
                                                         1, "expert", "demo", config.max_steps)  # fmt: skip
            demos.write_parquet(self.dir / "demos.parquet")
        self.demos = pl.read_parquet(self.dir / "demos.parquet")
        sft_dir = self.dir / "sft"
        started, cpu = time.perf_counter(), time.process_time()
        sft = train_vla(self.demos, replace(self.recipe.train, steps=config.sft_steps), sft_dir,
                        model_config=self.recipe.model, pruning=self.recipe.pruning,
                        vocab_size=self.recipe.vocab_size)  # fmt: skip
        meta.setdefault("sft_wall_s", round(time.perf_counter() - started, 1))
        meta.setdefault("sft_cpu_s", round(time.process_time() - cpu, 1))
        self.sft_checkpoint = sft.checkpoint_path
        self.sft, self.env = sft, env
        meta_path.write_text(json.dumps(meta, indent=2))
        self.meta, self._logged = meta, None

    @property
    def logged(self) -> pl.DataFrame:
        """Demonstrations + the logged fleet (recorded on first use: only the offline stages read it)."""
        if self._logged is None:
            if not (self.dir / "logged.parquet").exists():
                config, sft = self.config, self.sft
                say(f"logged fleet: the SFT model, {config.log_seeds} seeds x {config.repeats} rollouts per task")
                seeds = range(LOG_SEED, LOG_SEED + config.log_seeds)
                logged, self.meta["log_env_steps"] = self.rollouts(self.env, sft.model, sft.tokenizer, sft.pruning,
                                                                   seeds, "sft", self.dir / "log.vla")  # fmt: skip
                logged.write_parquet(self.dir / "logged.parquet")
                (self.dir / "meta.json").write_text(json.dumps(self.meta, indent=2))
            self._logged = pl.concat([self.demos, pl.read_parquet(self.dir / "logged.parquet")])
        return self._logged

    def rollouts(self, env, model, tok, pruning, seeds, version: str, bundle: Path):
        """Sampled rollouts of a model on every task: exported to `bundle`, run by onnxruntime as at the edge."""
        from learner.vla_export import export_bundle
        from policy.runtime import VLAPolicy
        from policy.sampling import Sampling

        export_bundle(model, tok, pruning, bundle)
        policy = VLAPolicy(bundle, version, sampling=Sampling(self.config.temperature, self.config.top_k,
                                                              seed=self.config.seed))  # fmt: skip
        return run_episodes(env, lambda _task: policy, self.config.tasks, seeds, self.config.repeats, version,
                            bundle.stem, self.config.max_steps)  # fmt: skip

    def env_steps(self, stages: tuple[str, ...]) -> int:
        """Environment steps of the shared data an arm reads: the demos, and the logged fleet for offline RL."""
        if "offline_rl" not in stages:
            return self.meta["demo_env_steps"]
        self.logged  # noqa: B018  (recorded on first use, and its env steps with it)
        return self.meta["demo_env_steps"] + self.meta["log_env_steps"]


def train_round(arm: str, stage: str, state: ArmState, shared: Shared, env, out: Path, origin: str):
    """One round of `stage`: update_steps optimizer steps (SFT, offline RL) or a batch of fresh rollouts and
    one PPO update (online RL). `origin`: the arm's model before its budget (the shared SFT, or offline_only's
    fresh model), the offline stage's reference. Returns (VLAResult, env steps it took)."""
    from learner.offline_rl import OfflineRLConfig, train_offline_rl
    from learner.online_rl import OnlineRLConfig, ppo_update
    from learner.semi_online import SemiOnlineConfig, semi_online_update
    from learner.vla_sft import load_vla, train_vla

    config = shared.config
    # A long schedule sliced by stop_at: past its warm-up the learning rate stays ~rl_lr for the whole budget.
    train = replace(shared.recipe.train, lr=config.rl_lr, steps=100_000, warmup_steps=10, checkpoint_every=0)
    stop_at = (state.rounds + 1) * config.update_steps
    start = state.checkpoint or origin
    if stage == "sft":
        return train_vla(shared.demos, train, out / "sft", init_checkpoint=start, stop_at=stop_at), 0
    if stage == "offline_rl":
        return train_offline_rl(shared.logged, train, OfflineRLConfig(), origin, out / "offline", stop_at=stop_at), 0
    if stage.startswith("semi_online"):
        episodes = shared.demos["episode_id"].unique(maintain_order=True).to_list()
        take = [episodes[(state.rounds * config.semi_online_trajectories + i) % len(episodes)]
                for i in range(config.semi_online_trajectories)]  # fmt: skip
        batch = shared.demos.filter(pl.col("episode_id").is_in(take))
        views = SEMI_ONLINE_VIEWS if stage.endswith(":views") else {}
        semi = SemiOnlineConfig(temperature=config.temperature, top_k=config.top_k, **views)
        result, _ = semi_online_update(batch, train, semi, start, shared.sft_checkpoint, out / "semi_online",
                                       seed=config.seed + state.rounds)  # fmt: skip
        return result, 0  # expert trajectories only: no environment step
    # Online: the current model's rollouts on this round's seeds (the same seeds for every online arm).
    first = ROUND_SEED + state.rounds * config.round_seeds
    rollouts, env_steps = shared.rollouts(env, *load_vla(start), range(first, first + config.round_seeds),
                                          f"{arm}-r{state.rounds}", out / "round.vla")  # fmt: skip
    guidance = stage.split(":")[1]
    result = ppo_update(rollouts, train, OnlineRLConfig(guidance=guidance), start, shared.sft_checkpoint,
                        out / "online", shared.demos if guidance == "databc" else None)  # fmt: skip
    return result, env_steps


def run_arm(arm: str, shared: Shared, env) -> dict:
    from flywheel.experiment import evaluate_model
    from learner.vla_sft import load_vla, train_vla

    config, stages, out = shared.config, ARMS[arm], shared.config.out / arm
    state_path = out / "state.json"
    state = ArmState.load(state_path)
    budget = 60 * config.budget_minutes
    origin = str(shared.sft_checkpoint)
    if arm == "offline_only":
        # No SFT: a fresh model (the recipe's, its tokenizer trained on the same demonstrations); the offline
        # stage gets the time SFT took on top of the budget.
        fresh = train_vla(shared.demos, replace(shared.recipe.train, steps=1), out / "init", stop_at=0,
                          model_config=shared.recipe.model, pruning=shared.recipe.pruning,
                          vocab_size=shared.recipe.vocab_size)  # fmt: skip
        origin = str(fresh.checkpoint_path)
        budget += shared.meta["sft_wall_s"]
    points = [budget * (k + 1) / config.curve_points for k in range(config.curve_points)]
    shared_env_steps = shared.env_steps(stages)

    def evaluate(model, tok, pruning, label: int) -> dict:
        # The shared SFT (every SFT arm's start) is evaluated once, in OUT/shared/eval-0.json.
        where = shared.dir if label == 0 and origin == str(shared.sft_checkpoint) else out
        if (where / f"eval-{label}.json").exists() and where == shared.dir:
            entry = json.loads((where / f"eval-{label}.json").read_text())
        else:
            meta = {"arm": arm, "step": label, "fraction": 1.0, "group": arm, "demo_episodes": 0, "demo_steps": 0,
                    "train_wall_s": state.spent_s, "train_cpu_s": state.cpu_s,
                    "parameters": model.num_parameters()}  # fmt: skip
            entry = evaluate_model(
                model, tok, pruning, meta, config.tasks, config.episodes, where, config.eval_browsers
            )
        tier1, tier2 = tier_means(entry["tasks"])
        return {"env_steps": shared_env_steps + state.own_env_steps, "spent_s": round(state.spent_s, 1),
                "stage": state.stage, "tier1_mean": tier1, "tier2_mean": tier2, "per_task": entry["tasks"]}  # fmt: skip

    if not state.curve:
        state.curve = [evaluate(*load_vla(origin), 0)]
        state.save(state_path)
    while len(state.curve) - 1 < config.curve_points:
        stage = stage_at(stages, state.spent_s, budget, config.offline_share)
        t0, c0 = time.perf_counter(), time.process_time()
        result, env_steps = train_round(arm, stage, state, shared, env, out, origin)
        state.spent_s += time.perf_counter() - t0
        state.cpu_s += time.process_time() - c0
        state.rounds, state.own_env_steps, state.stage = state.rounds + 1, state.own_env_steps + env_steps, stage
        state.checkpoint = str(result.checkpoint_path)
        if state.spent_s >= points[len(state.curve) - 1]:
            state.curve.append(evaluate(result.model, result.tokenizer, result.pruning, len(state.curve)))
            say(f"arm {arm}: {state.spent_s:.0f} s ({state.stage}), env steps {state.curve[-1]['env_steps']}, "
                f"tier1 {state.curve[-1]['tier1_mean']}, tier2 {state.curve[-1]['tier2_mean']}")  # fmt: skip
        state.save(state_path)
    last = state.curve[-1]
    return {"stages": list(stages), "env_steps": last["env_steps"], "cpu_s": round(state.cpu_s, 1),
            "wall_s": round(state.spent_s, 1), "rounds": state.rounds, "tier1_mean": last["tier1_mean"],
            "tier2_mean": last["tier2_mean"], "per_task": last["per_task"],
            "curve": [{k: p[k] for k in ("env_steps", "spent_s", "stage", "tier1_mean", "tier2_mean")}
                      for p in state.curve]}  # fmt: skip


def run_curriculum(config: CurriculumConfig) -> dict:
    from edge_client.env import GuiEnv

    names = [a for a in config.arms.split(",") if a] or list(ARMS)
    unknown = set(names) - set(ARMS)
    if unknown:
        raise ValueError(f"unknown arms {sorted(unknown)}; the arms are {', '.join(ARMS)}")
    config.out.mkdir(parents=True, exist_ok=True)
    path = config.out / "curriculum.json"
    report = json.loads(path.read_text()) if path.exists() else {"arms": {}}
    env = GuiEnv(config.tasks[0])
    try:
        shared = Shared(config, env)
        report["config"] = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(config).items()}
        report["shared"] = shared.meta
        for arm in names:
            say(f"arm {arm}: stages {' -> '.join(ARMS[arm])}, budget {config.budget_minutes} min")
            report["arms"][arm] = run_arm(arm, shared, env)
            path.write_text(json.dumps(report, indent=2))
    finally:
        env.close()
    plot_curriculum(config.out / "curriculum.png", report)
    say(f"wrote {path} and {config.out / 'curriculum.png'}")
    for arm, entry in report["arms"].items():
        say(f"  {arm:20s} tier1 {entry['tier1_mean']}  tier2 {entry['tier2_mean']}  env steps {entry['env_steps']}  "
            f"cpu {entry['cpu_s']} s")  # fmt: skip
    return report


def plot_curriculum(path: Path, report: dict) -> None:
    """Tier 1 and Tier 2 mean success vs environment steps, one line per arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), dpi=110)
    for ax, key in zip(axes, ("tier1_mean", "tier2_mean"), strict=True):
        for arm, entry in report["arms"].items():
            points = [(p["env_steps"], p[key]) for p in entry["curve"] if p[key] is not None]
            if points:
                ax.plot(*zip(*points, strict=True), marker="o", label=arm)
        ax.set_xlabel("environment steps (demonstrations + logged fleet + own rollouts)")
        ax.set_ylabel(f"{key.replace('_', ' ')} success (greedy, held-out seeds)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Curriculum arms at {report['config']['budget_minutes']} min each")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
