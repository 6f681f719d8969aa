"""`flywheel learner`: the continuous learner. It follows the tables, trains the curriculum's current stage,
publishes a signed version every N new episodes or T minutes, and never makes the fleet wait.

    no version yet            -> SFT on the demonstrations (and successes) in training_samples
    SFT done, failures logged -> offline RL once (AWR + DPO on every logged episode, learner.offline_rl)
    afterwards                -> online RL: one PPO update (learner.online_rl) per batch of fresh rollouts,
                                 the episodes the fleet produced since the last publish, guided towards SFT

The fleet keeps acting with whatever version it has while the learner trains; a new version reaches it
through the model-versions topic (canary first when configured, learner.publish). The daemon's progress
(the SFT reference, the current checkpoint, every published version) is in DATA/learner/daemon/state.json:
a restarted daemon continues the curriculum where it stopped. Every run reads pinned table versions.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import polars as pl
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from core.settings import Settings
from lake.pins import pinned
from lake.tables import EPISODES, STEPS, TRAINING_SAMPLES, table_uri
from learner import metrics
from learner.config import VLARecipe
from learner.data import load_rollouts, load_samples, table_versions
from learner.offline_rl import OfflineRLConfig, train_offline_rl
from learner.online_rl import Guidance, OnlineRLConfig, ppo_update
from learner.publish import publish_artifact
from learner.vla_export import export_bundle
from learner.vla_sft import VLAResult, train_vla

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DaemonConfig:
    recipe: str = "demo"
    """VLA recipe of the SFT stage: 'demo', 'release' (configs/vla_<name>.json) or a path."""
    sft_steps: int = 0
    """Optimizer steps of the SFT stage (0: the recipe's)."""
    min_demos: int = 20
    """Successful demonstration episodes in the tables before the first (SFT) version is trained."""
    every_episodes: int = 64
    """Publish after this many new model episodes in the tables ..."""
    every_minutes: float = 5.0
    """... or after this long, once at least min_new_episodes arrived."""
    min_new_episodes: int = 16
    """Fewer fresh episodes than this: no RL update (too few groups to rank)."""
    poll_s: float = 5.0
    """How often the tables are looked at."""
    offline_steps: int = 100
    """Optimizer steps of the offline RL stage."""
    rl_lr: float = 3e-4
    """Learning rate of the RL stages."""
    guidance: Guidance = "refkl"
    """Online RL's offline guidance: 'none', 'refkl' or 'databc'."""
    max_versions: int = 0
    """Stop after publishing this many versions (0: run until stopped)."""
    stop_after_s: float = 0.0
    """Stop after this many seconds (0: run until stopped)."""


@dataclass
class DaemonState:
    sft_checkpoint: str = ""  # the SFT model: the RL stages' reference
    checkpoint: str = ""  # the newest published version's weights
    version: str = ""
    offline_done: bool = False
    last_publish_at: float = 0.0
    versions: list[dict] = field(default_factory=list)

    @classmethod
    def load(cls, path: Path) -> DaemonState:
        return cls(**json.loads(path.read_text())) if path.exists() else cls()

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        tmp.replace(path)


def next_stage(state: DaemonState, failures_logged: bool) -> str:
    """The curriculum stage the next version comes from."""
    if not state.sft_checkpoint:
        return "sft"
    if not state.offline_done and failures_logged:
        return "offline_rl"
    return "online_rl"


@dataclass(frozen=True)
class TableCounts:
    fresh: int  # model episodes produced after the last publish
    failures_logged: bool  # whether any model failure is logged at all
    demos: int  # successful expert episodes


def is_due(state: DaemonState, counts: TableCounts, now: float, config: DaemonConfig) -> bool:
    """Whether to train and publish now: the first version once min_demos demonstrations are in, later ones
    after every_episodes fresh episodes, or every_minutes with at least min_new_episodes."""
    if not state.sft_checkpoint:
        return counts.demos >= config.min_demos
    new_episodes = counts.fresh
    if new_episodes >= config.every_episodes:
        return True
    return new_episodes >= config.min_new_episodes and now - state.last_publish_at >= 60 * config.every_minutes


def table_counts(tables_dir: Path, since: float) -> TableCounts:
    """What the schedule looks at, from the episodes table."""
    model, expert = pl.col("policy") == "model", pl.col("policy") == "expert"
    counts = (
        pl.scan_delta(table_uri(tables_dir, EPISODES))
        .select(
            (model & (pl.col("produced_at") > since)).sum().alias("fresh"),
            (model & ~pl.col("success")).sum().alias("failures"),
            (expert & pl.col("success")).sum().alias("demos"),
        )
        .collect()
    )
    return TableCounts(int(counts["fresh"][0] or 0), int(counts["failures"][0] or 0) > 0, int(counts["demos"][0] or 0))


def train_stage(stage: str, settings: Settings, config: DaemonConfig, state: DaemonState,
                versions: dict[str, int]) -> VLAResult:  # fmt: skip
    tables, work = settings.tables_dir, settings.data_dir / "learner" / "daemon"
    recipe = VLARecipe.load(config.recipe, progress_bar=False)
    at = "-".join(str(v) for v in versions.values())
    rl_train = replace(recipe.train, lr=config.rl_lr, warmup_steps=min(10, recipe.train.warmup_steps))
    if stage == "sft":
        frame = load_samples(tables, ("demo", "success"), versions)
        sft_train = replace(recipe.train, steps=config.sft_steps) if config.sft_steps else recipe.train
        return train_vla(frame, sft_train, work / f"sft-at-{at}", model_config=recipe.model,
                         pruning=recipe.pruning, vocab_size=recipe.vocab_size)  # fmt: skip
    if stage == "offline_rl":
        frame = load_rollouts(tables, ("demo", "success", "failure"), versions)
        return train_offline_rl(frame, replace(rl_train, steps=config.offline_steps), OfflineRLConfig(),
                                state.checkpoint, work / f"offline-at-{at}")  # fmt: skip
    rollouts = load_rollouts(tables, ("success", "failure"), versions, since=state.last_publish_at)
    rollouts = rollouts.filter(pl.col("tokens").list.len() > 0)  # sampled by a model (not an expert's)
    demos = load_samples(tables, ("demo",), versions) if config.guidance == "databc" else None
    rl = OnlineRLConfig(guidance=config.guidance)
    # One online run across updates: its directory keeps the optimizer and beta's schedule going.
    return ppo_update(rollouts, rl_train, rl, state.checkpoint, state.sft_checkpoint, work / "online", demos)


def run_daemon(settings: Settings, config: DaemonConfig) -> DaemonState:
    """Train and publish until max_versions or stop_after_s (forever when both are 0)."""
    state_path = settings.data_dir / "learner" / "daemon" / "state.json"
    state = DaemonState.load(state_path)
    started = time.monotonic()
    published_now = 0
    while not (config.max_versions and published_now >= config.max_versions):
        if config.stop_after_s and time.monotonic() - started > config.stop_after_s:
            break
        if not _has_tables(settings.tables_dir):
            time.sleep(config.poll_s)
            continue
        counts = table_counts(settings.tables_dir, state.last_publish_at)
        if not is_due(state, counts, time.time(), config):
            time.sleep(config.poll_s)
            continue
        stage = next_stage(state, counts.failures_logged)
        versions = table_versions(settings.tables_dir)
        with pinned(settings.pins_dir, versions):
            metrics.training_started(stage, settings.tables_dir, versions)
            started_at = time.time()
            result = train_stage(stage, settings, config, state, versions)
        bundle = export_bundle(
            result.model, result.tokenizer, result.pruning, result.checkpoint_path.parent / "model.vla"
        )
        event = publish_artifact(bundle, settings, stage=stage, parent=state.version, lineage=versions,
                                 extra_manifest={"checkpoint": str(result.checkpoint_path.resolve()),
                                                 "stage_steps": result.steps - result.start_step})  # fmt: skip
        metrics.published(stage, event.version, event.produced_at, dict(event.eval))
        if stage == "sft":
            state.sft_checkpoint = str(result.checkpoint_path)
        state.offline_done = state.offline_done or stage == "offline_rl"
        # Rollouts produced while this stage trained still count as fresh for the next one.
        state.checkpoint, state.version, state.last_publish_at = str(result.checkpoint_path), event.version, started_at
        state.versions.append({"model_version": event.version, "stage": stage, "published_at": event.produced_at,
                               "fresh_episodes": counts.fresh,
                               "train_s": round(event.produced_at - started_at, 1)})  # fmt: skip
        state.save(state_path)
        published_now += 1
        log.warning("published %s (%s) after %.0f s of training", event.version, stage, event.produced_at - started_at)
    return state


def _has_tables(tables_dir: Path) -> bool:
    """Whether the pipeline has written the tables the curriculum reads (a fresh deployment has none)."""
    for name in (STEPS, EPISODES, TRAINING_SAMPLES):
        try:
            DeltaTable(table_uri(tables_dir, name))
        except TableNotFoundError:
            return False
    return True
