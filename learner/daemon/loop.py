"""`flywheel learner`: the continuous learner. It follows the tables, trains the curriculum's current stage,
publishes a signed version every N new episodes or T minutes, and never makes the fleet wait.

    no version yet            -> SFT on the demonstrations (and successes) in training_samples: a fresh model
                                 of the recipe, or `start_from` (e.g. the shipped release) fine-tuned
    curriculum "supervised" (the default): every later version is retrained from the SFT model, at the SFT
    rate, on the demonstrations + every teacher label in the steps table (DAgger's aggregate, stage
    "dagger"), or, while no label was ever given (a teacher budget of 0), + the fleet's verified successes
    drawn greedily or from the top-k (stage "self_imitation"); `rl_updates_per_retrain` anchored PPO
    updates (a fixed-weight BC term on that same data) may refine each retrained model before the next
    retrain starts from SFT again
    curriculum "rl": SFT done, failures logged -> offline RL once (AWR + DPO); afterwards
                                 online RL: one PPO update (learner.algorithms.online_rl) per batch of fresh rollouts,
                                 the episodes the fleet produced since the last publish plus those of the
                                 `replay_versions` - 1 versions before (a replay with a bounded version lag),
                                 guided towards SFT with a beta that anneals over the environment steps taken

Every stage is trained through learner.algorithms.stages.run_stage, the dispatcher the curriculum experiment uses too;
each version's stage diagnostics (KLs, clip fraction, entropy, ...) are in its state entry and the metrics.

The fleet keeps acting with whatever version it has while the learner trains; a new version reaches it
through the model-versions topic (canary first when configured, learner.daemon.publish). The daemon's progress
(the SFT reference, the current checkpoint, every published version, the stage in progress) is in
DATA/learner/daemon/state.json: a restarted daemon continues the curriculum where it stopped, and a stage killed
mid-way resumes from its last checkpoint (every `checkpoint_every` steps) on the table versions it pinned, rather
than starting again on newer ones. Every run reads pinned table versions.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import polars as pl
from deltalake.exceptions import TableNotFoundError

from core.object_store import Location
from core.settings import Settings
from lake.pins import pinned
from lake.tables import EPISODES, STEPS, TRAINING_SAMPLES, open_table, scan, table_uri
from learner.algorithms.stages import StageData, StageRun, repeated, retrain_steps, run_stage, with_extra
from learner.algorithms.training_run import VLAResult
from learner.daemon import metrics
from learner.daemon.daemon_config import DaemonConfig
from learner.daemon.publish import publish_artifact
from learner.daemon.retention import prune_runs, retire_versions
from learner.data.tables import load_rollouts, load_samples, table_versions
from learner.data.teacher_labels import (
    label_count,
    load_filtered_successes,
    load_teacher_labels,
    load_verified_successes,
)
from learner.model.export import export_bundle
from learner.recipe import VLARecipe, VLATrainConfig

log = logging.getLogger(__name__)


@dataclass
class DaemonState:
    sft_checkpoint: str = ""  # the SFT model: the RL stages' reference
    checkpoint: str = ""  # the newest published version's weights
    version: str = ""
    offline_done: bool = False
    last_publish_at: float = 0.0
    online_env_steps: int = 0  # environment steps of the rollouts online updates consumed (beta's clock)
    rl_since_retrain: int = 0  # anchored RL updates published since the last retrain (curriculum "supervised")
    online_dir: str = "online"  # the online run's directory (a new one after each retrain: it starts from it)
    versions: list[dict] = field(default_factory=list)
    in_progress: dict = field(default_factory=dict)  # the stage being trained: stage, table versions, counts, start

    @classmethod
    def load(cls, path: Path) -> DaemonState:
        return cls(**json.loads(path.read_text())) if path.exists() else cls()

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        tmp.replace(path)


def next_stage(state: DaemonState, counts: TableCounts, config: DaemonConfig) -> str:
    """The curriculum stage the next version comes from."""
    if not state.sft_checkpoint:
        return "sft"
    if config.curriculum == "rl":
        return "offline_rl" if not state.offline_done and counts.failures_logged else "online_rl"
    retrained = bool(state.versions) and state.versions[-1]["stage"] in ("dagger", "self_imitation", "online_rl")
    if retrained and state.rl_since_retrain < config.rl_updates_per_retrain:
        return "online_rl"
    return "dagger" if counts.teacher_labels else "self_imitation"


@dataclass(frozen=True)
class TableCounts:
    fresh: int  # model episodes produced after the last publish
    fresh_steps: int  # their environment steps
    failures_logged: bool  # whether any model failure is logged at all
    demos: int  # successful expert episodes
    teacher_labels: int = 0  # steps a teacher labelled, in the steps table


def is_due(state: DaemonState, counts: TableCounts, now: float, config: DaemonConfig) -> bool:
    """Whether to train and publish now: the first version once min_demos demonstrations are in, later ones
    after every_episodes fresh episodes, or every_minutes with at least min_new_episodes."""
    if not state.sft_checkpoint:
        return counts.demos >= config.min_demos
    new_episodes = counts.fresh
    if new_episodes >= config.every_episodes:
        return True
    return new_episodes >= config.min_new_episodes and now - state.last_publish_at >= 60 * config.every_minutes


def table_counts(tables_dir: Location, since: float) -> TableCounts:
    """What the schedule looks at, from the episodes table (and the teacher's labels from the steps table)."""
    model, expert = pl.col("policy") == "model", pl.col("policy") == "expert"
    counts = (
        scan(table_uri(tables_dir, EPISODES))
        .select(
            (model & (pl.col("produced_at") > since)).sum().alias("fresh"),
            pl.col("steps").filter(model & (pl.col("produced_at") > since)).sum().alias("fresh_steps"),
            (model & ~pl.col("success")).sum().alias("failures"),
            (expert & pl.col("success")).sum().alias("demos"),
        )
        .collect()
    )
    steps = scan(table_uri(tables_dir, STEPS))
    labels = 0
    if "teacher_action_type" in steps.collect_schema().names():
        labels = int(steps.select(pl.col("teacher_action_type").is_not_null().sum()).collect().item() or 0)
    return TableCounts(int(counts["fresh"][0] or 0), int(counts["fresh_steps"][0] or 0),
                       int(counts["failures"][0] or 0) > 0, int(counts["demos"][0] or 0), labels)  # fmt: skip


@dataclass(frozen=True)
class StagePlan:
    stage: str
    versions: dict[str, int]  # the table versions it reads (pinned while it trains; its run directory's name)
    counts: TableCounts
    started_at: float


def planned_stage(state: DaemonState, tables_dir: Location, config: DaemonConfig) -> StagePlan | None:
    """The stage to train now: the one a killed daemon left in progress (the same stage on the same table versions,
    so the same run directory, which holds its checkpoint), else the curriculum's next stage when one is due."""
    if state.in_progress:
        plan = StagePlan(**{**state.in_progress, "counts": TableCounts(**state.in_progress["counts"])})
        if readable(tables_dir, plan.versions):
            log.warning("resuming %s on table versions %s", plan.stage, plan.versions)
            return plan
        log.warning("%s was in progress on table versions %s, no longer readable: starting anew", plan.stage,
                    plan.versions)  # fmt: skip
    counts = table_counts(tables_dir, state.last_publish_at)
    if not is_due(state, counts, time.time(), config):
        return None
    return StagePlan(next_stage(state, counts, config), table_versions(tables_dir), counts, time.time())


def readable(tables_dir: Location, versions: dict[str, int]) -> bool:
    """Whether each table still reads at its version (maintenance may vacuum a version no live reader pins)."""
    try:
        for name, version in versions.items():
            scan(table_uri(tables_dir, name), version).select(pl.len()).collect()
    except Exception:  # noqa: BLE001 - whatever the store says of a version it no longer has
        return False
    return True


def train_stage(stage: str, settings: Settings, config: DaemonConfig, state: DaemonState,
                versions: dict[str, int], counts: TableCounts) -> VLAResult:  # fmt: skip
    tables, work = settings.tables_dir, settings.learner_dir / "daemon"
    recipe = VLARecipe.load(config.recipe, progress_bar=False)
    at = "-".join(str(v) for v in versions.values())
    rl_train = rl_train_config(recipe, config)
    if stage == "sft":
        sft_train = rl_train if config.start_from else recipe.train  # a trained start is fine-tuned, like a retrain
        sft_train = replace(sft_train, steps=config.sft_steps) if config.sft_steps else sft_train
        return run_stage(StageRun("sft", sft_train, work / f"sft-at-{at}", start=config.start_from, recipe=recipe),
                         StageData(demos=load_samples(tables, ("demo", "success"), versions)))  # fmt: skip
    if stage in ("dagger", "self_imitation"):
        # From the SFT model, never the last version: retrained on the aggregate, the policy cannot drift.
        extra = gathered_supervision(tables, versions, config, labelled=stage == "dagger")
        new = new_task_supervision(tables, versions, config)
        demos = load_samples(tables, ("demo",), versions)
        rows = demos.height + label_count(extra) + (new.height if new is not None else 0)
        steps = retrain_steps(config.retrain_steps, config.retrain_passes, rows, recipe.train.batch_size)
        run = retrain_run(stage, recipe, config, state.sft_checkpoint, work / f"{stage}-at-{at}", steps)
        state.online_dir = f"online-after-{at}"  # anchored RL after this retrain starts from it
        return run_stage(run, StageData(demos=demos, extra=extra, new_task_rows=new))
    if stage == "offline_rl":
        frame = load_rollouts(tables, ("demo", "success", "failure"), versions)
        offline = StageRun("offline_rl", replace(rl_train, steps=config.offline_steps), work / f"offline-at-{at}",
                           start=state.checkpoint, reference=state.checkpoint)  # fmt: skip
        return run_stage(offline, StageData(logged=frame))
    # The replay: since the publish replay_versions versions ago (the versions' entries are in publish order).
    back = state.versions[-config.replay_versions :] if config.replay_versions > 1 else []
    since = back[0]["published_at"] if len(back) == config.replay_versions else state.last_publish_at
    rollouts = load_rollouts(tables, ("success", "failure"), versions, since=since)
    rollouts = rollouts.filter(pl.col("tokens").list.len() > 0)  # sampled by a model (not an expert's)
    guidance = config.guidance if config.curriculum == "rl" else "anchor"
    demos = load_samples(tables, ("demo",), versions) if guidance in ("databc", "anchor") else None
    if guidance == "anchor":  # the same supervision the retrain had: demonstrations + labels (or successes)
        extra = gathered_supervision(tables, versions, config, labelled=bool(counts.teacher_labels))
        demos = with_extra(with_extra(demos, extra), new_task_supervision(tables, versions, config))
    # One online run across updates (per retrain): its directory keeps the optimizer going.
    online_train = replace(rl_train, lr=config.online_lr)
    result = run_stage(StageRun(f"online_rl:{guidance}", online_train, work / state.online_dir, start=state.checkpoint,
                                reference=state.sft_checkpoint, env_steps=state.online_env_steps),
                       StageData(rollouts=rollouts, demos=demos))  # fmt: skip
    state.online_env_steps += counts.fresh_steps  # beta's clock: each environment step counted once
    return result


def rl_train_config(recipe: VLARecipe, config: DaemonConfig) -> VLATrainConfig:
    """The training of every stage after SFT: the recipe's, at rl_lr, with a short warm-up."""
    return replace(recipe.train, lr=config.rl_lr, warmup_steps=min(10, recipe.train.warmup_steps))


def retrain_run(stage: str, recipe: VLARecipe, config: DaemonConfig, sft_checkpoint: str, out_dir: Path,
                steps: int) -> StageRun:  # fmt: skip
    """A retrain (dagger, self_imitation) from the SFT model: `steps` at rl_lr. One builder, so the no-fleet twin
    (learner.daemon.twin) trains exactly as the version it is the twin of (its steps read from the version's manifest),
    on other data."""
    train = replace(rl_train_config(recipe, config), steps=steps)
    return StageRun(stage, train, out_dir, reference=sft_checkpoint, recipe=recipe)


def gathered_supervision(tables: Path, versions: dict[str, int], config: DaemonConfig, labelled: bool) -> pl.DataFrame:
    """What the fleet's experience bought beyond the demonstrations on the tasks they cover: every teacher label
    (DAgger's aggregate), or, while no label was given, the verified successes."""
    rows = load_teacher_labels(tables, versions) if labelled else load_verified_successes(
        tables, config.self_imitation_top_k, versions)  # fmt: skip
    return rows.filter(~pl.col("task").is_in(list(config.new_tasks)))  # a new task's rows are filtered BC's alone


def new_task_supervision(tables: Path, versions: dict[str, int], config: DaemonConfig) -> pl.DataFrame | None:
    """Filtered BC on the tasks nobody demonstrated: each seed's shortest verified success, `new_task_copies` times
    (None: no new task, or no success on one yet)."""
    rows = load_filtered_successes(tables, config.new_tasks, versions)
    return repeated(rows, config.new_task_copies) if rows.height else None


def run_daemon(settings: Settings, config: DaemonConfig) -> DaemonState:
    """Train and publish until max_versions or stop_after_s (forever when both are 0)."""
    state_path = settings.learner_dir / "daemon" / "state.json"
    state = DaemonState.load(state_path)
    started = time.monotonic()
    published_now = 0
    while not (config.max_versions and published_now >= config.max_versions):
        if config.stop_after_s and time.monotonic() - started > config.stop_after_s:
            break
        if not _has_tables(settings.tables_dir):
            time.sleep(config.poll_s)
            continue
        plan = planned_stage(state, settings.tables_dir, config)
        if plan is None:
            time.sleep(config.poll_s)
            continue
        state.in_progress = asdict(plan)
        state.save(state_path)  # killed from here on, the next daemon resumes this stage
        stage, versions, counts, started_at = plan.stage, plan.versions, plan.counts, plan.started_at
        with pinned(settings.pins_dir, versions):
            metrics.training_started(stage, settings.tables_dir, versions)
            result = train_stage(stage, settings, config, state, versions, counts)
        bundle = export_bundle(
            result.model, result.tokenizer, result.pruning, result.checkpoint_path.parent / "model.vla"
        )
        # The lineage is the table versions read (maintenance keeps them, a check reopens them); the teacher labels
        # the version's data held (each a paid call) are a count beside it in the manifest.
        anchored = stage == "online_rl" and config.curriculum == "supervised"
        labels = result.diagnostics.get("teacher_labels", counts.teacher_labels if anchored else 0)
        event = publish_artifact(bundle, settings, stage=stage, parent=state.version, lineage=versions,
                                 extra_manifest={"checkpoint": str(result.checkpoint_path.resolve()),
                                                 "stage_steps": result.steps - result.start_step,
                                                 "resumed_from_step": result.start_step,
                                                 "teacher_labels": int(labels)})  # fmt: skip
        metrics.published(stage, event.version, event.produced_at, dict(event.eval))
        metrics.stage_diagnostics(stage, result.diagnostics)
        if stage == "sft":
            state.sft_checkpoint = str(result.checkpoint_path)
        state.offline_done = state.offline_done or stage == "offline_rl"
        state.rl_since_retrain = state.rl_since_retrain + 1 if stage == "online_rl" else 0
        # Rollouts produced while this stage trained still count as fresh for the next one.
        state.checkpoint, state.version, state.last_publish_at = str(result.checkpoint_path), event.version, started_at
        state.in_progress = {}
        state.versions.append({"model_version": event.version, "stage": stage, "published_at": event.produced_at,
                               "fresh_episodes": counts.fresh, "train_s": round(event.produced_at - started_at, 1),
                               "resumed_from_step": result.start_step,
                               "bundle": str(bundle.resolve()), "teacher_labels_in_tables": counts.teacher_labels,
                               "diagnostics": result.diagnostics})  # fmt: skip
        state.save(state_path)
        if config.keep_versions:
            keep_tidy(settings, state, config.keep_versions, state_path.parent)
        published_now += 1
        log.warning("published %s (%s) after %.0f s of training", event.version, stage, event.produced_at - started_at)
    return state


def keep_tidy(settings: Settings, state: DaemonState, keep_versions: int, work: Path) -> None:
    """Retention after a publish (learner.daemon.retention): housekeeping, so a failure is logged, never fatal. The
    SFT versions stay live: the RL stages' reference, the twin's start and the run's first evaluation read them."""
    sft = {v["model_version"] for v in state.versions if v["stage"] == "sft"}
    try:
        retire_versions(settings, {state.version} | sft, keep_versions)
        prune_runs(work, {Path(state.sft_checkpoint).parent.name, Path(state.checkpoint).parent.name, state.online_dir})
    except Exception:  # noqa: BLE001 - a broker or store hiccup must not stop the daemon; the next publish retries
        log.exception("retention after %s failed", state.version)


def _has_tables(tables_dir: Location) -> bool:
    """Whether the pipeline has written the tables the curriculum reads (a fresh deployment has none)."""
    for name in (STEPS, EPISODES, TRAINING_SAMPLES):
        try:
            open_table(table_uri(tables_dir, name))
        except TableNotFoundError:
            return False
    return True
