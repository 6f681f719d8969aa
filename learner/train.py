"""One learner run: read Delta, train by SFT (warm-started from the previous version), publish."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path

from flywheel.canary import latest_by_channel
from flywheel.observe import await_scrape
from flywheel.registry import resolve_model
from flywheel.settings import Settings
from learner import metrics
from learner.data import load_samples, table_versions
from learner.model import load_model
from learner.publish import publish_artifact, publish_model
from learner.sft import SFTConfig, SFTProgress, train_sft
from learner.vla_export import export_bundle
from learner.vla_sft import VLATrainConfig, train_vla

log = logging.getLogger(__name__)


@dataclass
class LearnConfig:
    sft: SFTConfig
    """Optimiser settings of the pixel policy; `sft.steps` is the step count of this run."""
    arch: str = "pixel"
    """'pixel' (learner.model, one ONNX graph) or 'vla' (learner.vla, a `.vla` bundle)."""
    vla: VLATrainConfig = field(default_factory=VLATrainConfig)
    """Optimiser settings of the VLA (arch='vla')."""
    vla_model: dict = field(default_factory=dict)
    """VLAConfig overrides for a fresh VLA (arch='vla', no VLA parent)."""
    purposes: tuple[str, ...] = ("demo", "success")
    """training_samples purposes used by SFT: expert demonstrations and the fleet's own successes."""
    warm_start: bool = True
    """Continue from the newest published checkpoint when there is one."""
    min_samples: int = 8
    """Refuse to train on fewer samples (a broken pipeline, not a model to publish)."""


def learn_once(settings: Settings, config: LearnConfig, progress=None) -> dict:
    versions = table_versions(settings.tables_dir)
    frame = load_samples(settings.tables_dir, config.purposes, versions)
    if frame.height < config.min_samples:
        raise RuntimeError(f"only {frame.height} training samples in {settings.tables_dir} (need {config.min_samples})")
    parent, resume, parent_arch = _previous(settings) if config.warm_start else ("", None, "")
    metrics.training_started("sft", settings.tables_dir, versions)
    await_scrape()  # a launcher's Prometheus sees the counters at 0 before training moves them
    work_dir = settings.data_dir / "learner" / "runs" / f"from-{parent or 'scratch'}"
    if config.arch == "vla":
        # train_vla resumes from its directory's checkpoint: only a run on the same parent *and* the same table
        # versions may resume; new data starts a new run.
        work_dir = work_dir.with_name(f"vla-{work_dir.name}-at-" + "-".join(str(v) for v in versions.values()))

    def on_progress(p: SFTProgress) -> None:
        metrics.TRAINING_STEPS.labels("sft").inc(p.step - on_progress.last)
        on_progress.last = p.step
        metrics.LOSS.labels("sft").set(p.loss)
        metrics.SAMPLES_PER_SECOND.labels("sft").set(p.samples_per_s)
        if progress:
            progress(p)

    on_progress.last = 0
    if config.arch == "vla":
        # A VLA warm-starts only from a VLA parent; the first VLA after pixel-policy versions starts fresh.
        init = resume if parent_arch == "vla" else None
        result = train_vla(frame, config.vla, work_dir, model_config=config.vla_model, init_checkpoint=init,
                           progress=on_progress)  # fmt: skip
        bundle = export_bundle(result.model, result.tokenizer, result.pruning, work_dir / "model.vla")
        event = publish_artifact(
            bundle, settings, stage="sft", parent=parent, lineage=versions,
            extra_manifest={"arch": "vla", "checkpoint": str(result.checkpoint_path.resolve()),
                            "samples": frame.height, "vla_config": asdict(config.vla)},
        )  # fmt: skip
    else:
        init_model = load_model(resume) if resume and parent_arch == "pixel" else None
        result = train_sft(frame, config.sft, work_dir, init_model=init_model, progress=on_progress)
        event = publish_model(
            result.model,
            settings,
            stage="sft",
            parent=parent,
            lineage=versions,
            work_dir=work_dir,
            extra_manifest={
                "arch": "pixel",
                "checkpoint": str(result.checkpoint_path.resolve()),
                "samples": frame.height,
                "sft_config": config.sft.__dict__,
            },
        )
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


def _previous(settings: Settings) -> tuple[str, Path | None, str]:
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
        return "", None, ""
    manifest = json.loads((settings.artifacts_dir / "manifests" / f"{version}.json").read_text())
    return version, Path(manifest["checkpoint"]), manifest.get("arch", "pixel")
