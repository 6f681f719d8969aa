"""One learner run: read Delta, train the VLA by SFT (warm-started from the previous version), publish.

Under `torchrun --nproc_per_node P -m flywheel.cli sft ...` the SFT is data-parallel (learner.algorithms.distributed)
and rank 0 alone exports and publishes."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from pathlib import Path

from core.metrics import await_scrape
from core.settings import Settings
from lake.pins import pinned
from learner.algorithms import distributed
from learner.algorithms.sft import train_vla
from learner.algorithms.training_run import VLAProgress
from learner.daemon import metrics
from learner.daemon.publish import publish_artifact
from learner.data.tables import load_samples, table_versions
from learner.model.export import export_bundle
from learner.recipe import LearnConfig
from registry.store import read_manifest, resolve_model
from streams.model_versions import latest_by_channel

log = logging.getLogger(__name__)


def learn_once(settings: Settings, config: LearnConfig, progress=None) -> dict:
    versions = table_versions(settings.tables_dir)
    # Delta maintenance keeps these versions' files while the run reads them; the manifest's lineage then does.
    with pinned(settings.pins_dir, versions):
        return _learn_at(settings, config, versions, progress)


def _learn_at(settings: Settings, config: LearnConfig, versions: dict[str, int], progress=None) -> dict:
    frame = load_samples(settings.tables_dir, config.purposes, versions)
    if frame.height < config.min_samples:
        raise RuntimeError(f"only {frame.height} training samples in {settings.tables_dir} (need {config.min_samples})")
    parent, resume = _previous(settings) if config.warm_start else ("", None)
    metrics.training_started("sft", settings.tables_dir, versions)
    await_scrape()  # a launcher's Prometheus sees the counters at 0 before training moves them
    # train_vla resumes from its directory's checkpoint: only a run on the same parent *and* the same table
    # versions may resume; new data starts a new run.
    at = "-".join(str(v) for v in versions.values())
    work_dir = settings.learner_dir / "runs" / f"vla-from-{parent or 'scratch'}-at-{at}"

    def on_progress(p: VLAProgress) -> None:
        metrics.TRAINING_STEPS.labels("sft").inc(p.step - on_progress.last)
        on_progress.last = p.step
        metrics.LOSS.labels("sft").set(p.loss)
        metrics.SAMPLES_PER_SECOND.labels("sft").set(p.samples_per_s)
        if progress:
            progress(p)

    on_progress.last = 0
    recipe = config.recipe
    result = train_vla(frame, recipe, work_dir, init_checkpoint=resume, progress=on_progress)
    if not distributed.is_main():  # under torchrun: one process exports and publishes
        return {"rank": distributed.world()[0], "steps": result.steps}
    bundle = export_bundle(result.model, result.tokenizer, result.pruning, work_dir / "model.vla")
    event = publish_artifact(
        bundle, settings, stage="sft", parent=parent, lineage=versions,
        extra_manifest={"checkpoint": str(result.checkpoint_path.resolve()), "samples": frame.height,
                        "vla_config": asdict(recipe.train)},
    )  # fmt: skip
    metrics.published("sft", event.version, event.produced_at, dict(event.eval))
    summary = {
        "version": event.version,
        "parent": parent,
        "samples": frame.height,
        "steps": result.steps,
        "first_loss": result.losses[0] if result.losses else None,
        "final_loss": result.losses[-1] if result.losses else None,
        "samples_per_s": result.samples_per_s,
        "wall_s": result.wall_s,
        "lineage": versions,
        "sha256": event.sha256,
    }
    log.warning("published %s", json.dumps(summary))
    return summary


def _previous(settings: Settings) -> tuple[str, Path | None]:
    """The version to warm-start from: the newest one, or with a canary stage the stable one (a canary
    that was rolled back must not become the parent)."""
    if settings.canary_fraction > 0:
        stable = latest_by_channel(settings).get("stable")
        version = stable.version if stable is not None else None
    else:
        try:
            _, version = resolve_model("latest", settings.artifacts_dir)
        except FileNotFoundError:
            version = None
    if version is None:
        return "", None
    manifest = read_manifest(settings.artifacts_dir, version) or {}
    return version, Path(manifest["checkpoint"]) if manifest.get("checkpoint") else None
