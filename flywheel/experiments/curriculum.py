"""`flywheel experiment curriculum`: the curriculum's arms at the same budget, seeded, paired, side by side.

    shared:  expert demonstrations on every task -> one SFT (the demo recipe) -> the RL set, chosen by a rule
             (the tasks whose SFT greedy success on selection seeds lies in [rl_set_low, rl_set_high], at most
             rl_set_size, the nearest to 0.5) -> a logged fleet: the SFT model's sampled rollouts on the RL
             set, `repeats` per seed (recorded when an arm with an offline stage first runs)
    per arm: its stages after SFT (learner.algorithms.stages, the dispatcher the learner daemon uses too), in rounds,
             until its budget (wall minutes of training and rollouts, evaluation excluded) is spent;
             evaluated greedily at `curve_points` points, every arm on the same held-out seeds

    arm                 after the shared SFT, within the budget
    sft                 more SFT on the demonstrations (every task's)
    sft_offline         offline RL (AWR + DPO) on demonstrations + the logged fleet
    sft_offline_ppo     offline RL for offline_share of the budget, then online PPO, no guidance
    sft_offline_refkl   ... then online PPO + beta * KL(pi || pi_SFT), beta annealed over environment steps
    sft_offline_databc  ... then online PPO + beta * demo NLL
    sft_ppo             online PPO from SFT, no offline stage, no guidance
    sft_semi_online     semi-online RL on the RL set's demonstrations (learner's semi_online): no environment step
    sft_more_demos      each round: more expert demonstrations on the RL set (every expert step a teacher call),
                        then SFT from the shared SFT on all demonstrations: what a teacher's label must beat
    dagger              each round: the policy's greedy episodes on the RL set, the teacher (edge_client.teacher)
                        labelling the screens its rule picks; from a failure's first step where the label differs
                        from the policy's action, the teacher's own continuation (edge_client.search
                        .continue_by_teacher), kept when it succeeds: labels whose history is the teacher's
                        then SFT from the shared SFT on the demonstrations + every label so far
    dagger_edge         dagger as the edge gathers it: every label on the policy's own history, kept whatever
                        followed (the latching the history fix removes)
    dart                each round: new expert episodes on the RL set, each click displaced with probability near
                        the start's per-step error rate, every state labelled with the clean action
                        (edge_client.dart), then SFT from the shared SFT on the demonstrations + those rows
    search_bc           each round: the policy's greedy episodes on the RL set; its failures searched
                        (edge_client.search: the same seed, the prefix replayed, the policy's other likely
                        actions at the failing steps, the policy finishing), the successes found kept, then SFT
                        from the shared SFT on the demonstrations + every success so far (no teacher)
    search_bc_teacher   search_bc, the teacher finishing a branch within search_teacher_calls a failure; the
                        teacher's steps of a success are its targets, the policy's prefix and candidate context
    search_bc_rl        search_bc for offline_share of the budget, then online PPO anchored on the demonstrations
                        + the successes found
    self_imitation      each round: the policy's top-k sampled episodes on the RL set, the successes kept, then
                        SFT from the shared SFT on the demonstrations + every success so far (no teacher)
    dagger_rl           dagger for offline_share of the budget, then online PPO anchored (a fixed-weight BC term on
                        the demonstrations + labels; the teacher still labels, its agreement a step reward)
    self_imitation_rl   self_imitation, then online PPO anchored on the demonstrations + successes
    offline_only, sft_semi_online_views and the earlier arms: optional (not in the default set)

A retrain round trains max(retrain_steps, retrain_passes x rows / batch) steps (a fixed count spreads
over more rows each round), and each retrain arm's last model has a no-fleet twin: the same steps, rate and start
on the demonstrations alone (OUT/twins/, shared by arms of the same steps), reported as vs_twin.
With `start_from` (e.g. the release) the arms start from that trained model instead of a shared SFT; with
`replay`, the sft arm, the retrains and the twins also imitate a release's demonstrations (the start's own mix).

An online round (the signal per environment step): groups of `repeats` rollouts of one (task, seed) on the
RL set, the task drawn with a weight that falls when its recent groups were all-success or all-failure
(learner.algorithms.online_rl.task_weights), until `groups_per_round` informative groups are in (or
`max_groups_per_round` were tried); then one PPO update over the informative groups of the last
`replay_rounds` rounds (a replay whose version lag is bounded by it), per-step credit within each group.

Evaluation: every RL-set task on the same `eval_episodes` held-out seeds (1,000,000+) for every arm and
point, the Tier 1 tasks on their first `tier1_episodes`; the RL-set mean with a 95 % bootstrap CI, and each
arm's paired difference to `sft` (core.stats). Rollouts run in one local browser through the fleet's own
loop (edge_client.episode) and become the rows the pipeline would write (processors.table_rows, processors.scoring).
env_steps counts every environment step an arm's data cost: the demonstrations, the logged fleet when it
reads it, its own online rollouts.

Resumes: the shared parts are kept in OUT/shared/, each arm's counters, curve and replay in OUT/<arm>/
(its stages resume from their checkpoints). Writes OUT/curriculum.json, OUT/curriculum.png and, per arm,
OUT/<arm>/final.vla (the last checkpoint's bundle, to evaluate later on other tasks).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, replace
from functools import cached_property
from pathlib import Path

import numpy as np
import polars as pl

from core.console import say
from core.machine import machine
from core.settings import SUITE_TASKS, TIER1_TASKS, TIER2_TASKS
from core.stats import mean_ci, paired_diff_ci
from flywheel.gathering.episodes import run_episodes, sampling_policy
from flywheel.gathering.evaluation import EVAL_SEED, evaluate_model
from registry.store import sha256_of

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
    "sft_more_demos": ("sft", "dagger:demos"),
    "dagger": ("sft", "dagger"),
    "dagger_edge": ("sft", "dagger:edge"),
    "dart": ("sft", "dagger:dart"),
    "search_bc": ("sft", "self_imitation:search"),
    "search_bc_teacher": ("sft", "self_imitation:search_teacher"),
    "search_bc_rl": ("sft", "self_imitation:search", "online_rl:anchor"),
    "self_imitation": ("sft", "self_imitation"),
    "dagger_rl": ("sft", "dagger", "online_rl:anchor"),
    "self_imitation_rl": ("sft", "self_imitation", "online_rl:anchor"),
}
# The arms whose rounds retrain from the shared SFT on the demonstrations + what their rounds gathered.
RETRAIN_STAGES = ("dagger", "self_imitation")
# The default arms: what the fleet's experience adds over demonstrations, at equal expert calls and optimizer steps;
# the earlier arms stay runnable by name.
DEFAULT_ARMS = ("sft", "sft_more_demos", "dart", "dagger", "search_bc", "search_bc_teacher", "search_bc_rl")
# Seed ranges: demonstrations 0.., the logged fleet, online rounds, RL-set selection; evaluation 1,000,000+.
LOG_SEED, ROUND_SEED, SELECTION_SEED = 500_000, 600_000, 900_000


@dataclass(frozen=True)
class CurriculumConfig:
    out: Path = Path("runs/curriculum")
    """Everything of the run: shared data and SFT, each arm, curriculum.json and .png."""
    budget_minutes: float = 30.0
    """Per arm: wall minutes of its post-SFT training and rollouts (evaluation excluded)."""
    tasks: tuple[str, ...] = SUITE_TASKS
    """Demonstrated and SFT-trained; the RL set is chosen among them."""
    rl_tasks: str = ""
    """Comma-separated RL set instead of the rule (recorded as given); empty: chosen by the rule."""
    rl_set_size: int = 8
    """The rule: at most this many tasks, the nearest to 0.5 ..."""
    rl_set_low: float = 0.1
    """... of those whose shared-SFT greedy success on the selection seeds is at least this ..."""
    rl_set_high: float = 0.9
    """... and at most this."""
    selection_episodes: int = 50
    """Selection seeds per task (900,000..; never evaluation seeds)."""
    eval_episodes: int = 100
    """Evaluation episodes per RL-set task at each curve point (held-out seeds 1,000,000.., greedy, every arm)."""
    tier1_episodes: int = 50
    """Evaluation episodes per Tier 1 task (forgetting; the first of the same seeds)."""
    eval_browsers: int = 1
    """Browsers each evaluation runs in parallel (the figures do not depend on it)."""
    curve_points: int = 4
    """Evaluations along each arm's budget (the last at its end); the shared SFT is the curve's start."""
    arms: str = ",".join(DEFAULT_ARMS)
    """Comma-separated arms to run, in order ('all': every arm, optional ones included)."""
    shared_only: bool = False
    """Prepare the shared part (demonstrations, SFT, RL set, its start evaluation) and stop."""
    recipe: str = "demo"
    """VLA recipe of the SFT stage (learner.recipe.VLARecipe); with start_from, the start's own recipe."""
    start_from: str = ""
    """A trained model's checkpoint (e.g. release/model.pt) every arm starts from instead of a shared SFT on the
    demonstrations ("": the shared SFT)."""
    demos_per_task: int = 20
    """Expert demonstrations per task (seeds 0..n-1)."""
    sft_steps: int = 1200
    """Optimizer steps of the shared SFT."""
    log_seeds: int = 8
    """Seeds per RL-set task of the logged fleet (the SFT model, sampled; `repeats` rollouts each)."""
    repeats: int = 8
    """Rollouts per (task, seed): a group, there and in each online round."""
    groups_per_round: int = 4
    """An online round collects until this many informative groups (rollouts that did not all end alike) ..."""
    max_groups_per_round: int = 12
    """... or this many groups were tried."""
    replay_rounds: int = 2
    """An update trains on the informative groups of the last this many rounds (bounded version lag)."""
    update_steps: int = 50
    """Optimizer steps per round of an SFT or offline RL stage (each round reloads its data: not too few)."""
    temperature: float = 1.0
    """Sampling temperature of every rollout."""
    top_k: int = 5
    """Rollouts sample among the k likeliest allowed tokens."""
    rl_lr: float = 3e-4
    """Learning rate of the SFT and offline RL stages after the shared SFT."""
    online_lr: float = 3e-5
    """Learning rate of the online and semi-online RL stages: their updates are a few noisy steps each, and Adam
    moves every weight by about the learning rate a step whatever the gradient's size: at 3e-4 one step moved the
    action tokens by a KL of 0.12 (PPO's early stop then ended each update after that step) and the pointer
    collapsed within 30 rounds; at 3e-5 a step moves them ~0.005 and an update takes 6-18 steps."""
    online_epochs: int = 2
    """Passes of each online update over its rollouts (the fresh round's and the replay's) ..."""
    online_minibatch_rows: int = 0
    """... in minibatches of about this many steps (0: the recipe's batch size; online_rl.OnlineRLConfig)."""
    online_negative_weight: float = 1.0
    """Share of a failure's negative advantage an online update applies (1: PPO as written, 0: the successes
    only; learner.algorithms.rl_losses.weigh_failures)."""
    online_target_kl: float = 0.02
    """An online update stops at a minibatch this far (approximate KL on the action tokens, x1.5) from pi_old
    (0: never; learner.algorithms.online_rl.OnlineRLConfig.target_kl)."""
    offline_share: float = 0.3
    """Share of an arm's budget its first stage (offline RL, dagger, self-imitation) gets when an online stage
    follows."""
    retrain_steps: int = 300
    """Retrain arms (dagger, dart, search_bc, self_imitation, sft_more_demos): optimizer steps at least of each
    round's SFT from the shared SFT (at rl_lr, the rate the sft arm continues at) ..."""
    retrain_passes: float = 4.0
    """... or this many passes over the demonstrations + the round's trainable rows, if more."""
    replay: str = ""
    """A `flywheel release` build directory (e.g. runs/release) whose demonstrations (--recipe's, collected there
    when missing, as the release does) the sft arm, the retrains and the twins train on too: with --start-from,
    the start's own training mix, so a retrain can take the steps new rows need without forgetting what the start
    learned ("": the shared demonstrations alone)."""
    gathered_repeats: int = 1
    """Retrain arms: copies of each gathered row in a retrain (each its own episode): weighs the fleet's rows
    against a large replay mix."""
    twins: bool = True
    """Train and evaluate each retrain arm's no-fleet twin at its last round's steps (vs_twin)."""
    round_episodes: int = 16
    """dagger, sft_more_demos: episodes per round on the RL set (greedy policy, or the experts on new seeds);
    self_imitation: groups of `repeats` top-k rollouts per round."""
    teacher_budget: int = 10
    """dagger arms: teacher labels per episode at most (edge_client.teacher.TeacherConfig.teacher_budget)."""
    search_candidates: int = 3
    """search arms: the policy's other likely actions tried at a failing step (edge_client.search.SearchBudget) ..."""
    search_branch_steps: int = 2
    """... at this many failing steps, the latest first ..."""
    search_simulations: int = 6
    """... in at most this many branches a failure ..."""
    search_env_steps: int = 60
    """... and this many environment steps a failure, replays included."""
    search_teacher_calls: int = 10
    """search_bc_teacher: teacher actions a failure's branches may take (the policy finishes after them)."""
    dart_sigma_px: float = 15.0
    """dart: the standard deviation, in px, of a noised click's displacement in x and in y."""
    self_imitation_top_k: int = 3
    """self_imitation arms: rollouts sample among the policy's k likeliest tokens (never every token)."""
    semi_online_trajectories: int = 16
    """Informative expert trajectories per semi-online round (refilled from the next ones while groups are flat)."""
    max_steps: int = 10
    """An episode still running after this many steps fails."""
    seed: int = 0
    """Seed of the rollouts' sampling, the task draws and the semi-online batches, and added to the recipe's seed
    for the arms' and twins' training batches (a second run with another seed: the run-to-run spread)."""
    tune: bool = False
    """A tuning run: every curve point is evaluated on the selection seeds (selection_episodes per RL-set task,
    Tier 1 on the first tier1_episodes of them), its start is the RL-set selection's evaluation, and no figure
    touches an evaluation seed: what a setting is piloted on before the reported run uses it."""


@dataclass
class ArmState:
    """An arm's progress, saved after every round (OUT/<arm>/state.json)."""

    rounds: int = 0
    spent_s: float = 0.0
    cpu_s: float = 0.0
    own_env_steps: int = 0
    rollout_s: float = 0.0
    learner_samples: int = 0
    learner_s: float = 0.0
    checkpoint: str = ""
    stage: str = ""
    curve: list[dict] = field(default_factory=list)
    groups: dict[str, list[bool]] = field(default_factory=dict)  # per RL-set task: was each group informative
    next_seed: dict[str, int] = field(default_factory=dict)  # per task: the next online seed's offset
    replay: list[str] = field(default_factory=list)  # the last rounds' informative groups (parquet files)
    semi_cursor: int = 0  # the next expert trajectory a semi-online round starts from
    teacher_labels: int = 0  # teacher calls answered: labels on own states, or expert steps of new demonstrations
    gathered: list[str] = field(default_factory=list)  # each round's teacher rows / successes / demos (parquet)
    gathering: dict = field(default_factory=dict)  # the last round's gathering: rows, calls, env steps, search figures
    diagnostics: list[dict] = field(default_factory=list)  # one per round
    # Where its rounds ran (core.machine): the budget is wall-clock, so the CPU says what it bought.
    machines: list[dict] = field(default_factory=list)

    @classmethod
    def load(cls, path: Path) -> ArmState:
        return cls(**json.loads(path.read_text())) if path.exists() else cls()

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        tmp.replace(path)


def tier_means(per_task: dict[str, float]) -> tuple[float | None, float | None]:
    """Unweighted means of the evaluated Tier 1 and Tier 2 tasks (None where a tier has none)."""
    short = {t.removeprefix("miniwob/").removesuffix("-v1"): rate for t, rate in per_task.items()}
    means = []
    for tier in (TIER1_TASKS, TIER2_TASKS):
        rates = [short[t] for t in tier if t in short]
        means.append(round(sum(rates) / len(rates), 4) if rates else None)
    return means[0], means[1]


def choose_rl_set(rates: dict[str, float], low: float, high: float, size: int) -> list[str]:
    """The RL set's rule: the tasks whose rate lies in [low, high], at most `size`, the nearest to 0.5 (ties by
    name), in the order given."""
    inside = [t for t, r in rates.items() if low <= r <= high]
    chosen = set(sorted(inside, key=lambda t: (abs(rates[t] - 0.5), t))[:size])
    return [t for t in rates if t in chosen]


def stage_at(stages: tuple[str, ...], spent: float, budget: float, offline_share: float) -> str:
    """The stage an arm trains in after `spent` of its `budget` seconds (its stages after the shared SFT)."""
    after_sft = stages[1:] if stages[0] == "sft" and len(stages) > 1 else stages
    if len(after_sft) == 1:
        return after_sft[0]
    return after_sft[0] if spent < offline_share * budget else after_sft[1]


class Shared:
    """The demonstrations, the SFT model, the RL set and the logged fleet every arm starts from (OUT/shared/)."""

    def __init__(self, config: CurriculumConfig, env, replay_demos=None):
        from edge_client.experts import expert_for
        from learner.algorithms.sft import train_vla
        from learner.recipe import VLARecipe

        self.config, self.dir, self.env, self.replay_demos = config, config.out / "shared", env, replay_demos
        self.dir.mkdir(parents=True, exist_ok=True)
        self.recipe = VLARecipe.load(config.recipe, progress_bar=False)
        meta_path = self.dir / "meta.json"
        meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
        if not (self.dir / "demos.parquet").exists():
            say(f"demonstrations: {config.demos_per_task} per task on {len(config.tasks)} tasks")
            demos, meta["demo_env_steps"] = run_episodes(env, expert_for, config.tasks, range(config.demos_per_task),
                                                         1, "expert", "demo", config.max_steps)  # fmt: skip
            demos.write_parquet(self.dir / "demos.parquet")
            meta["demo_episodes"] = demos["episode_id"].n_unique()
            meta["demo_successes"] = demos.filter(pl.col("success"))["episode_id"].n_unique()
            meta_path.write_text(json.dumps(meta, indent=2))
        # Every arm imitates the successful demonstrations only (a failed one is no demonstration).
        self.demos = pl.read_parquet(self.dir / "demos.parquet").filter(pl.col("success"))
        if config.start_from:  # a trained model (the release): every arm starts from it, nothing trained here
            self.sft = trained_start(Path(config.start_from))
            digest = sha256_of(Path(config.start_from))
            meta.setdefault("start_from", {"checkpoint": config.start_from, "sha256": digest})
            meta.setdefault("sft_wall_s", 0.0)
            meta.setdefault("sft_cpu_s", 0.0)
            meta.setdefault("sft_steps", 0)
        else:
            started, cpu = time.perf_counter(), time.process_time()
            sft_recipe = replace(self.recipe, train=replace(self.recipe.train, steps=config.sft_steps))
            self.sft = train_vla(self.demos, sft_recipe, self.dir / "sft")
            meta.setdefault("sft_wall_s", round(time.perf_counter() - started, 1))
            meta.setdefault("sft_cpu_s", round(time.process_time() - cpu, 1))
            meta.setdefault("sft_steps", config.sft_steps)
        self.sft_checkpoint = str(self.sft.checkpoint_path)
        if "rl_set" not in meta:
            meta["rl_set"] = self._choose_rl_set()
        self.rl_set: list[str] = meta["rl_set"]["tasks"]
        self.meta, self._logged = meta, None
        self.base  # noqa: B018  (the replay read now: its size goes into meta)
        meta_path.write_text(json.dumps(meta, indent=2))

    def _choose_rl_set(self) -> dict:
        config = self.config
        seeds = [SELECTION_SEED, SELECTION_SEED + config.selection_episodes - 1]
        if config.rl_tasks:
            tasks, rule, rates = [t for t in config.rl_tasks.split(",") if t], "given (--rl-tasks)", {}
        else:
            meta = {"arm": "shared-sft", "step": "selection", "parameters": self.sft.model.num_parameters()}
            say(f"RL set: the shared SFT on {config.selection_episodes} selection seeds per task")
            sft = self.sft
            entry = evaluate_model(sft.model, sft.tokenizer, sft.pruning, meta, config.tasks, config.selection_episodes,
                                   self.dir, config.eval_browsers, seed=SELECTION_SEED)  # fmt: skip
            rates = entry["tasks"]
            tasks = choose_rl_set(rates, config.rl_set_low, config.rl_set_high, config.rl_set_size)
            rule = (f"the tasks whose shared-SFT greedy success on {config.selection_episodes} selection seeds lies "
                    f"in [{config.rl_set_low}, {config.rl_set_high}]; at most {config.rl_set_size}, the nearest "
                    "to 0.5")  # fmt: skip
        if not tasks:
            raise ValueError(f"no task qualifies for the RL set ({rule}): {rates}")
        say(f"RL set: {', '.join(tasks)}")
        return {"tasks": tasks, "rule": rule, "selection_success": rates, "selection_seeds": seeds,
                "eval_seeds": [EVAL_SEED, EVAL_SEED + config.eval_episodes - 1]}  # fmt: skip

    @cached_property
    def train(self):
        """The recipe's training settings for the arms' updates and twins, its batch seed offset by the run's `seed`
        (a second run with another seed draws other batches: the run-to-run spread of an arm)."""
        return replace(self.recipe.train, seed=self.recipe.train.seed + self.config.seed)

    @cached_property
    def base(self) -> pl.DataFrame:
        """What the sft arm, the retrains and the twins imitate: the demonstrations, and the replay's too."""
        from learner.algorithms.stages import with_replay

        if not self.config.replay:
            return self.demos
        if self.replay_demos is None:
            raise ValueError("replay: no way to read a release's demonstrations was given (run_curriculum's)")
        base = with_replay(self.demos, self.replay_demos(self.recipe.raw, Path(self.config.replay)))
        self.meta["replay_rows"] = base.height - self.demos.height
        say(f"replay: {self.meta['replay_rows']} demonstration steps of {self.config.replay}")
        return base

    @cached_property
    def steps_per_demonstration(self) -> dict[str, float]:
        """Each task's mean expert steps an episode in the demonstrations."""
        counts = self.demos.group_by("task").agg(pl.len().alias("steps"), pl.col("episode_id").n_unique().alias("n"))
        return {row["task"]: row["steps"] / row["n"] for row in counts.iter_rows(named=True)}

    @property
    def trajectories(self) -> pl.DataFrame:
        """The RL set's demonstrations: semi-online RL's expert trajectories."""
        return self.demos.filter(pl.col("task").is_in(self.rl_set))

    @property
    def logged(self) -> pl.DataFrame:
        """Demonstrations + the logged fleet on the RL set (recorded on first use: only offline stages read it)."""
        if self._logged is None:
            if not (self.dir / "logged.parquet").exists():
                config, sft = self.config, self.sft
                say(f"logged fleet: the SFT model, {config.log_seeds} seeds x {config.repeats} rollouts per task")
                policy = sampling_policy(sft.model, sft.tokenizer, sft.pruning, "sft", self.dir / "log.vla",
                                         config.temperature, config.top_k, config.seed)  # fmt: skip
                logged, self.meta["log_env_steps"] = run_episodes(
                    self.env, lambda _task: policy, self.rl_set, range(LOG_SEED, LOG_SEED + config.log_seeds),
                    config.repeats, "sft", "log", config.max_steps)  # fmt: skip
                logged.write_parquet(self.dir / "logged.parquet")
                (self.dir / "meta.json").write_text(json.dumps(self.meta, indent=2))
            self._logged = pl.concat([self.demos, pl.read_parquet(self.dir / "logged.parquet")], how="vertical_relaxed")
        return self._logged

    def env_steps(self, stages: tuple[str, ...]) -> int:
        """Environment steps of the shared data an arm reads: the demos, and the logged fleet for offline RL."""
        if "offline_rl" not in stages:
            return self.meta["demo_env_steps"]
        self.logged  # noqa: B018  (recorded on first use, and its env steps with it)
        return self.meta["demo_env_steps"] + self.meta["log_env_steps"]

    def start_point(self) -> dict:
        """The shared SFT's evaluation (start_entry) as a curve point: every SFT arm's curve starts there."""
        entry = self.start_entry()
        return {"env_steps": self.meta["demo_env_steps"], "spent_s": 0.0, "stage": "sft",
                **point_summary(entry, self.rl_set, self.config.tier1_episodes)}  # fmt: skip

    def start_entry(self) -> dict:
        """The shared SFT's evaluation every arm is paired with: on the evaluation seeds (OUT/shared/eval-0.json,
        evaluated on first use), or in a tuning run on the selection seeds (OUT/shared/eval-selection.json, the
        RL-set selection's evaluation, or evaluated here when the RL set was given)."""
        step = "selection" if self.config.tune else 0
        path = self.dir / f"eval-{step}.json"
        if path.exists():
            return json.loads(path.read_text())
        meta = {"arm": "shared-sft", "step": step, "parameters": self.sft.model.num_parameters()}
        sft, episodes = self.sft, self.eval_episodes()
        return evaluate_model(sft.model, sft.tokenizer, sft.pruning, meta, tuple(episodes), episodes, self.dir,
                              self.config.eval_browsers, seed=self.eval_seed)  # fmt: skip

    def eval_episodes(self) -> dict[str, int]:
        """Per evaluated task: the RL set at eval_episodes (selection_episodes in a tuning run), the other Tier 1
        tasks at tier1_episodes."""
        config = self.config
        tier1 = [t for t in TIER1_TASKS if t in config.tasks and t not in self.rl_set]
        rl_episodes = config.selection_episodes if config.tune else config.eval_episodes
        tier1_episodes = min(config.tier1_episodes, rl_episodes)
        return {t: rl_episodes for t in self.rl_set} | {t: tier1_episodes for t in tier1}

    @property
    def eval_seed(self) -> int:
        """The first seed every curve point is evaluated on."""
        return SELECTION_SEED if self.config.tune else EVAL_SEED


@dataclass(frozen=True)
class TrainedStart:
    """A trained model the arms start from (CurriculumConfig.start_from), shaped as the shared SFT's result."""

    checkpoint_path: Path
    model: object
    tokenizer: object
    pruning: object


def trained_start(checkpoint: Path) -> TrainedStart:
    from learner.model.checkpoints import load_vla

    if not checkpoint.exists():
        raise FileNotFoundError(f"start_from: no checkpoint at {checkpoint}")
    return TrainedStart(checkpoint, *load_vla(checkpoint))


def point_summary(entry: dict, rl_set: list[str], tier1_episodes: int) -> dict:
    """An evaluation's figures: the RL-set mean and its 95 % CI, the Tier 1 mean (first tier1_episodes seeds)."""
    by_seed = entry["success_by_seed"]
    mean, lo, hi = mean_ci({t: by_seed[t] for t in rl_set})
    tier1 = [float(np.mean(by_seed[t][:tier1_episodes])) for t in TIER1_TASKS if t in by_seed]
    return {"rl_set_mean": round(mean, 4), "rl_set_ci": [round(lo, 4), round(hi, 4)],
            "tier1_mean": round(float(np.mean(tier1)), 4) if tier1 else None,
            "per_task": {t: round(float(np.mean(v)), 4) for t, v in by_seed.items()}}  # fmt: skip


def train_round(arm: str, stage: str, state: ArmState, shared: Shared, env, out: Path, origin: str):
    """One round of `stage` through the learner's stage dispatcher: update_steps optimizer steps (SFT, offline
    RL), one semi-online update, or an online round (its rollouts collected here, then one PPO update).
    `origin`: the arm's model before its budget (the shared SFT, or offline_only's fresh model). Returns
    (VLAResult, env steps it took, rollout seconds)."""
    from learner.algorithms.online_rl import OnlineRLConfig
    from learner.algorithms.stages import StageData, StageRun, repeated, retrain_steps, run_stage, with_extra
    from learner.data.teacher_labels import label_count
    from learner.model.checkpoints import load_vla

    config = shared.config
    kind = stage.split(":")[0]
    # A long schedule sliced by stop_at: past its warm-up the learning rate stays ~lr for the whole budget.
    lr = config.online_lr if kind in ("online_rl", "semi_online") else config.rl_lr
    train = replace(shared.train, lr=lr, steps=100_000, warmup_steps=10, checkpoint_every=0)
    start = state.checkpoint or origin
    run = StageRun(stage, train, out / {"sft": "sft", "offline_rl": "offline", "online_rl": "online",
                                        "semi_online": "semi_online"}.get(kind, kind), start=start,
                   reference=origin if kind == "offline_rl" else shared.sft_checkpoint,
                   stop_at=(state.rounds + 1) * config.update_steps, env_steps=state.own_env_steps,
                   seed=config.seed + state.rounds)  # fmt: skip
    if kind == "sft":
        return run_stage(run, StageData(demos=shared.base)), 0, 0.0
    if kind == "offline_rl":
        return run_stage(run, StageData(logged=shared.logged)), 0, 0.0
    if kind in RETRAIN_STAGES:
        t0 = time.perf_counter()
        env_steps = gather_round(arm, stage, state, shared, env, out, *load_vla(start))
        rollout_s = time.perf_counter() - t0
        # Every round from the shared SFT, on the demonstrations + all that the rounds gathered (the aggregate),
        # for steps that grow with those rows.
        extra = repeated(gathered(state), config.gathered_repeats)
        # label_count: the rows a retrain trains on (every one but the context before a label)
        rows = shared.base.height + label_count(extra)
        steps = retrain_steps(config.retrain_steps, config.retrain_passes, rows, shared.recipe.train.batch_size)
        run = replace(run, train=retrain_config(train, steps), out_dir=out / kind / f"round-{state.rounds}", start="",
                      reference=shared.sft_checkpoint, stop_at=None, recipe=shared.recipe)  # fmt: skip
        result = run_stage(run, StageData(demos=shared.base, extra=extra))
        return replace(result, diagnostics=result.diagnostics | {"retrain_steps": steps}), env_steps, rollout_s
    if kind == "semi_online":
        data = StageData(trajectories=shared.trajectories, cursor=state.semi_cursor)
        result = run_stage(run, data, semi=semi_online_config(config, stage))
        state.semi_cursor = int(result.diagnostics["cursor"])
        return result, 0, 0.0  # expert trajectories only: no environment step
    t0 = time.perf_counter()
    teacher = arm_teacher(config) if "dagger" in ARMS[arm] else None
    rollouts, env_steps = collect_online_round(arm, state, shared, env, out, *load_vla(start), teacher=teacher)
    rollout_s = time.perf_counter() - t0
    state.teacher_labels += sum(teacher.labels.values()) if teacher is not None else 0
    guidance = stage.split(":")[1]
    # The anchor: the demonstrations + what the arm's first stage gathered (teacher labels or verified successes).
    demos = {"databc": shared.demos, "anchor": with_extra(shared.demos, gathered(state))}.get(guidance)
    data = StageData(rollouts=rollouts, demos=demos)
    online = OnlineRLConfig(epochs=config.online_epochs, minibatch_rows=config.online_minibatch_rows,
                            negative_weight=config.online_negative_weight,
                            target_kl=config.online_target_kl)  # fmt: skip
    return run_stage(run, data, online=online), env_steps, rollout_s


def retrain_config(train, steps: int):
    """A retrain's schedule: `steps` at the arm's rate after a short warm-up, checkpointed at its end."""
    return replace(train, steps=steps, warmup_steps=10, checkpoint_every=steps)


def semi_online_config(config: CurriculumConfig, stage: str):
    from learner.algorithms.semi_online import SemiOnlineConfig

    views = SEMI_ONLINE_VIEWS if stage.endswith(":views") else {}
    return SemiOnlineConfig(temperature=config.temperature, top_k=config.top_k,
                            trajectories=config.semi_online_trajectories, **views)  # fmt: skip


def arm_teacher(config: CurriculumConfig):
    """The teacher of a dagger arm's episodes: the DOM expert, every reason, teacher_budget labels an episode."""
    from edge_client.experts import expert_for
    from edge_client.teacher import Teacher, TeacherConfig

    return Teacher(TeacherConfig(teacher_budget=config.teacher_budget), expert_for)


def gather_round(arm: str, stage: str, state: ArmState, shared: Shared, env, out: Path, model, tok, pruning) -> int:
    """A retrain round's new supervision, kept in OUT/<arm>/gathered/, round_episodes episodes or groups on the RL
    set, tasks in turn, new seeds each round:

        dagger:demos          new expert demonstrations (every expert step a teacher call)
        dagger                the teacher's continuations from the policy's greedy failures (continued_labels)
        dagger:edge           the teacher's labels of the policy's greedy episodes, on the policy's history
        dagger:dart           the noisy expert's episodes, each state labelled with its clean action
        self_imitation        the successes of the policy's top-k rollouts
        self_imitation:search[_teacher]   the successes the search finds from its greedy failures

    Counts the teacher's calls in state.teacher_labels and the round's figures in state.diagnostics' next entry
    (`gathered`); returns the environment steps taken."""
    from edge_client.dart import per_step_noise
    from edge_client.experts import expert_for
    from edge_client.search import SearchBudget
    from flywheel.gathering.episodes import continued_labels, dart_episode, search_episode
    from learner.data.teacher_labels import teacher_rows, verified_successes

    config = shared.config
    version = f"{arm}-r{state.rounds}"
    search = SearchBudget(candidates=config.search_candidates, branch_steps=config.search_branch_steps,
                          simulations=config.search_simulations, env_steps=config.search_env_steps)  # fmt: skip
    tasks = [shared.rl_set[(state.rounds * config.round_episodes + i) % len(shared.rl_set)]
             for i in range(config.round_episodes)]  # fmt: skip
    if stage == "self_imitation":
        policy = sampling_policy(model, tok, pruning, version, out / "round.vla", config.temperature,
                                 config.self_imitation_top_k, config.seed + state.rounds)  # fmt: skip
    else:
        policy = sampling_policy(model, tok, pruning, version, out / "round.vla", 0.0, 0, 0)  # greedy
    teacher = arm_teacher(config) if stage in ("dagger", "dagger:edge") else None
    rng = np.random.default_rng([config.seed, state.rounds])
    frames, env_steps, calls, figures = [], 0, 0, {}
    for task in tasks:
        offset = state.next_seed.get(task, 0)
        state.next_seed[task] = offset + 1
        seed = ROUND_SEED + offset
        if stage == "dagger:demos":
            rows, steps = run_episodes(env, expert_for, [task], [seed], 1, "expert", version, config.max_steps)
            rows = rows.filter(pl.col("success"))
            calls += rows.height  # every expert step is a teacher call
        elif stage == "dagger:edge":
            rows, steps = run_episodes(env, lambda _t: policy, [task], [seed], 1, version, version, config.max_steps,
                                       teacher)  # fmt: skip
            rows = teacher_rows(rows)
        elif stage == "dagger":
            rows, steps, continued = continued_labels(env, policy, teacher, task, seed, version, config.max_steps)
            calls += continued
        elif stage == "dagger:dart":
            # DART's noise: the start's episode failure rate on the task spread over the expert's steps an episode.
            success = shared.meta["rl_set"]["selection_success"].get(task, 0.5)
            noise = per_step_noise(success, shared.steps_per_demonstration[task])
            rows, steps = dart_episode(env, task, seed, version, noise, config.dart_sigma_px, rng, config.max_steps)
            calls += steps  # the expert acted at every step, and its clean action is the label
        elif stage.startswith("self_imitation:search"):
            budget = replace(search, teacher_calls=config.search_teacher_calls if stage.endswith("_teacher") else 0)
            rows, steps, found = search_episode(env, policy, task, seed, version, budget, config.seed + state.rounds,
                                                config.max_steps)  # fmt: skip
            calls += found.pop("teacher_calls")
            for key, value in found.items():
                figures[key] = figures.get(key, 0) + value
        else:
            rows, steps = run_episodes(env, lambda _t: policy, [task], [seed], config.repeats, version, version,
                                       config.max_steps)  # fmt: skip
            rows = verified_successes(rows, config.self_imitation_top_k)
        env_steps += steps
        frames.append(rows)
    if teacher is not None:
        calls += sum(teacher.labels.values())
    state.teacher_labels += calls
    new = [f for f in frames if not f.is_empty()]
    rows = pl.concat(new, how="diagonal_relaxed") if new else pl.DataFrame()
    keep_gathered(state, out, rows, f"round-{state.rounds}")
    state.gathering = {"rows": sum(f.height for f in frames), "teacher_calls": calls, "env_steps": env_steps,
                       **figures}  # fmt: skip
    say(f"arm {arm} round {state.rounds}: {stage} gathered {state.gathering}, "
        f"{state.teacher_labels} teacher calls so far")  # fmt: skip
    return env_steps


def keep_gathered(state: ArmState, out: Path, rows: pl.DataFrame, name: str) -> None:
    """Adds a round's rows to the arm's aggregate (a parquet file each; nothing when there are none)."""
    if rows.is_empty():
        return
    path = out / "gathered" / f"{name}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    rows.write_parquet(path)
    state.gathered.append(str(path))


def gathered(state: ArmState) -> pl.DataFrame | None:
    """Everything the arm's rounds gathered so far (DAgger's aggregate), None before any."""
    frames = [pl.read_parquet(p) for p in state.gathered]
    return pl.concat(frames, how="diagonal_relaxed") if frames else None


# The semi-online views (learner.algorithms.semi_online): the training views of the vision experiment's augmented arm.
SEMI_ONLINE_VIEWS = {"view_shift_px": 6, "view_scale": 0.05, "view_colour": 0.1}


def collect_online_round(arm: str, state: ArmState, shared: Shared, env, out: Path, model, tok, pruning, teacher=None):
    """An online round's data: groups of `repeats` rollouts of one (task, seed) on the RL set, each task drawn
    by its weight (fewer for tasks whose recent groups all ended alike), until groups_per_round informative
    groups or max_groups_per_round tried. The informative ones are kept for replay_rounds rounds; returns
    (the replay's rows, env steps taken)."""
    from learner.algorithms.online_rl import task_weights
    from learner.data.teacher_labels import teacher_rows

    config = shared.config
    version = f"{arm}-r{state.rounds}"
    policy = sampling_policy(model, tok, pruning, version, out / "round.vla", config.temperature, config.top_k,
                             config.seed + state.rounds)  # fmt: skip
    rng = np.random.default_rng([config.seed, state.rounds])
    kept, tried, env_steps = [], 0, 0
    while len(kept) < config.groups_per_round and tried < config.max_groups_per_round:
        weights = task_weights({t: state.groups.get(t, []) for t in shared.rl_set})
        task = shared.rl_set[int(rng.choice(len(weights), p=weights / weights.sum()))]
        offset = state.next_seed.get(task, 0)
        state.next_seed[task] = offset + 1
        rows, steps = run_episodes(env, lambda _task: policy, [task], [ROUND_SEED + offset], config.repeats, version,
                                   version, config.max_steps, teacher)  # fmt: skip
        env_steps, tried = env_steps + steps, tried + 1
        if teacher is not None:  # the labels of every group, informative or not, join the anchor's aggregate
            keep_gathered(state, out, teacher_rows(rows), f"online-{state.rounds}-{tried}")
        informative = rows["success"].n_unique() > 1
        state.groups.setdefault(task, []).append(informative)
        if informative:
            kept.append(rows)
    replay = state.replay[-(config.replay_rounds - 1) :] if config.replay_rounds > 1 else []
    if kept:
        path = out / "rounds" / f"round-{state.rounds}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pl.concat(kept).write_parquet(path)
        replay.append(str(path))
    # The replay holds the informative groups of the last replay_rounds rounds that had any.
    state.replay = replay
    say(f"arm {arm} round {state.rounds}: {len(kept)} informative of {tried} groups, {env_steps} env steps")
    frames = [pl.read_parquet(p) for p in state.replay]
    return (pl.concat(frames) if frames else None), env_steps


def run_arm(arm: str, shared: Shared, env) -> dict:
    from learner.algorithms.sft import train_vla
    from learner.model.checkpoints import load_vla
    from learner.model.export import export_bundle

    config, stages, out = shared.config, ARMS[arm], shared.config.out / arm
    state_path = out / "state.json"
    state = ArmState.load(state_path)
    budget = 60 * config.budget_minutes
    origin = shared.sft_checkpoint
    if arm == "offline_only":
        # No SFT: a fresh model (the recipe's, its tokenizer trained on the same demonstrations); the offline
        # stage gets the time SFT took on top of the budget.
        init_recipe = replace(shared.recipe, train=replace(shared.recipe.train, steps=1))
        fresh = train_vla(shared.demos, init_recipe, out / "init", stop_at=0)
        origin = str(fresh.checkpoint_path)
        budget += shared.meta["sft_wall_s"]
    points = [budget * (k + 1) / config.curve_points for k in range(config.curve_points)]
    shared_env_steps = shared.env_steps(stages)

    def evaluate(model, tok, pruning, label: int) -> dict:
        meta, episodes = {"arm": arm, "step": label, "parameters": model.num_parameters()}, shared.eval_episodes()
        entry = evaluate_model(model, tok, pruning, meta, tuple(episodes), episodes, out, config.eval_browsers,
                               seed=shared.eval_seed)  # fmt: skip
        return {"env_steps": shared_env_steps + state.own_env_steps, "spent_s": round(state.spent_s, 1),
                "stage": state.stage, "teacher_labels": state.teacher_labels,
                **point_summary(entry, shared.rl_set, config.tier1_episodes)}  # fmt: skip

    if not state.curve:
        state.curve = [shared.start_point() if origin == shared.sft_checkpoint else evaluate(*load_vla(origin), 0)]
        state.curve[0] = state.curve[0] | {"env_steps": shared_env_steps}
        state.save(state_path)
    here = machine()
    while len(state.curve) - 1 < config.curve_points:
        if here not in state.machines:
            state.machines.append(here)
        stage = stage_at(stages, state.spent_s, budget, config.offline_share)
        t0, c0 = time.perf_counter(), time.process_time()
        result, env_steps, rollout_s = train_round(arm, stage, state, shared, env, out, origin)
        state.spent_s += time.perf_counter() - t0
        state.cpu_s += time.process_time() - c0
        state.rounds, state.own_env_steps, state.stage = state.rounds + 1, state.own_env_steps + env_steps, stage
        state.rollout_s += rollout_s
        state.learner_samples += len(result.losses) * shared.recipe.train.batch_size
        state.learner_s += result.wall_s
        gathering = {"gathered": state.gathering} if state.gathering else {}
        state.diagnostics.append({"round": state.rounds, "stage": stage, "env_steps": state.own_env_steps,
                                  **result.diagnostics, **gathering})  # fmt: skip
        state.gathering = {}
        state.checkpoint = str(result.checkpoint_path)
        if state.spent_s >= points[len(state.curve) - 1]:
            state.curve.append(evaluate(result.model, result.tokenizer, result.pruning, len(state.curve)))
            say(f"arm {arm}: {state.spent_s:.0f} s ({state.stage}), env steps {state.curve[-1]['env_steps']}, "
                f"RL set {state.curve[-1]['rl_set_mean']} {state.curve[-1]['rl_set_ci']}, "
                f"tier1 {state.curve[-1]['tier1_mean']}")  # fmt: skip
            if len(state.curve) - 1 == config.curve_points:
                export_bundle(result.model, result.tokenizer, result.pruning, out / "final.vla")
        state.save(state_path)
    summary = arm_summary(arm, stages, state)
    steps = state.diagnostics[-1].get("retrain_steps") if state.diagnostics else None
    if config.twins and steps and state.stage.split(":")[0] in RETRAIN_STAGES:
        summary["twin"] = {"retrain_steps": steps, "eval": str(twin_eval(shared, steps))}
    return summary


def twin_eval(shared: Shared, steps: int) -> Path:
    """The no-fleet twin of a retrain of `steps` steps: that retrain from the shared SFT (the same rate, warm-up
    and start) on the demonstrations (+ the replay) alone, evaluated on the arms' seeds; trained once for every arm
    whose last retrain took those steps (OUT/twins/steps-N/). Returns its eval json."""
    from learner.algorithms.stages import StageData, StageRun, run_stage

    config, out = shared.config, shared.config.out / "twins" / f"steps-{steps}"
    path = out / "eval-twin.json"
    if path.exists():
        return path
    say(f"twin: {steps} steps from the start on the demonstrations alone{' + the replay' * bool(config.replay)}")
    train = retrain_config(replace(shared.train, lr=config.rl_lr), steps)
    run = StageRun("self_imitation", train, out / "train", reference=shared.sft_checkpoint, recipe=shared.recipe)
    result = run_stage(run, StageData(demos=shared.base))
    meta = {"arm": f"twin-{steps}", "step": "twin", "retrain_steps": steps,
            "parameters": result.model.num_parameters()}  # fmt: skip
    episodes = shared.eval_episodes()
    evaluate_model(result.model, result.tokenizer, result.pruning, meta, tuple(episodes), episodes, out,
                   config.eval_browsers, seed=shared.eval_seed)  # fmt: skip
    return path


def arm_summary(arm: str, stages: tuple[str, ...], state: ArmState) -> dict:
    last = state.curve[-1]
    own_env_steps_per_s = state.own_env_steps / state.rollout_s if state.rollout_s else None
    return {"stages": list(stages), "env_steps": last["env_steps"], "own_env_steps": state.own_env_steps,
            "teacher_labels": state.teacher_labels,
            "cpu_s": round(state.cpu_s, 1), "wall_s": round(state.spent_s, 1), "rounds": state.rounds,
            "rl_set_mean": last["rl_set_mean"], "rl_set_ci": last["rl_set_ci"], "tier1_mean": last["tier1_mean"],
            "per_task": last["per_task"],
            "learner_samples_per_s": round(state.learner_samples / state.learner_s, 2) if state.learner_s else None,
            "env_steps_per_s": round(own_env_steps_per_s, 2) if own_env_steps_per_s else None,
            "curve": [{k: p.get(k, 0) for k in ("env_steps", "teacher_labels", "spent_s", "stage", "rl_set_mean",
                                                 "rl_set_ci", "tier1_mean")} for p in state.curve],
            "machines": state.machines, "diagnostics": state.diagnostics}  # fmt: skip


def final_success_by_seed(report: dict, arm: str, out: Path) -> dict | None:
    """An arm's last evaluation, each task's success by seed (None: not evaluated yet)."""
    entry = report["arms"].get(arm)
    path = out / arm / f"eval-{len(entry['curve']) - 1}.json" if entry else None
    return json.loads(path.read_text())["success_by_seed"] if path and path.exists() else None


def paired_to_sft(report: dict, shared: Shared) -> None:
    """Each arm's final RL-set success minus `sft`'s (vs_sft), the shared SFT's (vs_start) and its no-fleet twin's
    (vs_twin, retrain arms), paired on the evaluation seeds, with 95 % bootstrap CIs; and what each point of
    vs_start cost in teacher calls and in the arm's own environment steps."""
    rl_set, out = report["rl_set"]["tasks"], shared.config.out
    on_rl_set = lambda by_seed: {t: by_seed[t][: shared.eval_episodes()[t]] for t in rl_set}  # noqa: E731
    start = on_rl_set(shared.start_entry()["success_by_seed"])
    baseline = final_success_by_seed(report, "sft", out)
    for arm, entry in report["arms"].items():
        mine = final_success_by_seed(report, arm, out)
        if mine is None:
            continue
        twin_path = Path(entry["twin"]["eval"]) if "twin" in entry else None
        twin = on_rl_set(json.loads(twin_path.read_text())["success_by_seed"]) if twin_path else None
        for key, other in (("vs_start", start), ("vs_sft", baseline and on_rl_set(baseline)), ("vs_twin", twin)):
            if other is not None:
                diff, lo, hi = paired_diff_ci(on_rl_set(mine), other)
                entry[key] = {"diff": round(diff, 4), "ci": [round(lo, 4), round(hi, 4)]}
        # What a point of RL-set success over the shared SFT cost (None: nothing spent, or no gain).
        gain = 100 * entry.get("vs_start", {}).get("diff", 0.0)
        for key, spent in (("teacher_labels_per_point", entry.get("teacher_labels", 0)),
                           ("env_steps_per_point", entry.get("own_env_steps", 0))):  # fmt: skip
            entry[key] = round(spent / gain, 1) if spent and gain > 0 else None


def run_curriculum(config: CurriculumConfig, replay_demos=None) -> dict:
    """`replay_demos(recipe, work)`: a recipe's demonstrations collected in (or reused from) work, for `replay`."""
    from edge_client.env import GuiEnv

    names = list(ARMS) if config.arms == "all" else [a for a in config.arms.split(",") if a]
    unknown = set(names) - set(ARMS)
    if unknown:
        raise ValueError(f"unknown arms {sorted(unknown)}; the arms are {', '.join(ARMS)}")
    config.out.mkdir(parents=True, exist_ok=True)
    path = config.out / "curriculum.json"
    report = json.loads(path.read_text()) if path.exists() else {"arms": {}}
    env = GuiEnv(config.tasks[0])
    try:
        shared = Shared(config, env, replay_demos)
        report["config"] = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(config).items()}
        report["shared"] = {k: v for k, v in shared.meta.items() if k != "rl_set"}
        report["rl_set"] = {k: shared.meta["rl_set"][k] for k in ("tasks", "rule", "selection_seeds", "eval_seeds")}
        report["rl_set"]["selection_success"] = shared.meta["rl_set"]["selection_success"]
        if config.tune:  # a pilot: its figures are on the selection seeds, never comparable to a reported run's
            report["rl_set"]["eval_seeds"] = report["rl_set"]["selection_seeds"]
            report["tuning"] = "every point evaluated on the selection seeds (--tune)"
        report["start"] = shared.start_point()
        path.write_text(json.dumps(report, indent=2))
        for arm in [] if config.shared_only else names:
            say(f"arm {arm}: stages {' -> '.join(ARMS[arm])}, budget {config.budget_minutes} min")
            report["arms"][arm] = run_arm(arm, shared, env)
            paired_to_sft(report, shared)
            path.write_text(json.dumps(report, indent=2))
    finally:
        env.close()
    plot_curriculum(config.out / "curriculum.png", report)
    say(f"wrote {path} and {config.out / 'curriculum.png'}")
    for arm, entry in report["arms"].items():
        vs, twin = entry.get("vs_sft", {}), entry.get("vs_twin", {})
        say(f"  {arm:20s} RL set {entry['rl_set_mean']} {entry['rl_set_ci']}  vs sft {vs.get('diff')} {vs.get('ci')}  "
            f"vs twin {twin.get('diff')} {twin.get('ci')}  tier1 {entry['tier1_mean']}  "
            f"teacher calls {entry['teacher_labels']}  env steps {entry['env_steps']}")  # fmt: skip
    return report


def plot_curriculum(path: Path, report: dict) -> None:
    """RL-set mean success (95 % CI band) and Tier 1 mean vs environment steps, one line per arm; RL-set success vs
    the teacher labels spent, for the arms that spent any."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(19, 4.8), dpi=110)
    for arm, entry in report["arms"].items():
        curve = entry["curve"]
        x = [p["env_steps"] for p in curve]
        (line,) = axes[0].plot(x, [p["rl_set_mean"] for p in curve], marker="o", label=arm)
        axes[0].fill_between(x, [p["rl_set_ci"][0] for p in curve], [p["rl_set_ci"][1] for p in curve],
                             color=line.get_color(), alpha=0.12)  # fmt: skip
        axes[1].plot(x, [p["tier1_mean"] for p in curve], marker="o", color=line.get_color(), label=arm)
        if entry.get("teacher_labels"):
            axes[2].plot([p.get("teacher_labels", 0) for p in curve], [p["rl_set_mean"] for p in curve], marker="o",
                         color=line.get_color(), label=arm)  # fmt: skip
    tasks = ", ".join(report.get("rl_set", {}).get("tasks", []))
    axes[0].set_ylabel("RL-set mean success (greedy, 95 % CI)")
    axes[0].set_title(f"RL set: {tasks}", fontsize=8)
    axes[1].set_ylabel("Tier 1 mean success (greedy)")
    axes[2].set_ylabel("RL-set mean success (greedy)")
    axes[2].set_xlabel("teacher labels spent (sft_more_demos: expert steps of its new demonstrations)")
    axes[2].grid(alpha=0.3)
    for ax in axes[:2]:
        ax.set_xlabel("environment steps (demonstrations + logged fleet + own rollouts)")
        ax.set_xscale("symlog", linthresh=1000)
        ax.grid(alpha=0.3)
    if report["arms"]:
        axes[0].legend(fontsize=8)
    fig.suptitle(f"Curriculum arms at {report['config']['budget_minutes']} min each")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
