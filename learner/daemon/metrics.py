"""Prometheus metrics of the learner (naming: docs/runbook.md, Metric names)."""

from __future__ import annotations

import time

from prometheus_client import Counter, Gauge

from core.object_store import Location

TRAINING_STEPS = Counter("flywheel_learner_training_steps_total", "Optimiser steps taken", ["stage"])
LOSS = Gauge("flywheel_learner_loss", "Latest training loss", ["stage"])
SAMPLES_PER_SECOND = Gauge("flywheel_learner_samples_per_second", "Training throughput", ["stage"])
VERSIONS_PUBLISHED = Counter("flywheel_learner_versions_published_total", "Model versions published", ["stage"])
CURRENT_VERSION = Gauge("flywheel_learner_model_version_info", "Newest published version (value 1)", ["version"])
STAGE = Gauge("flywheel_learner_stage_info", "Curriculum stage being trained (value 1)", ["stage"])
DATA_AGE_SECONDS = Gauge(
    "flywheel_learner_data_age_seconds", "Age of the newest training row read, when training started"
)
LAST_PUBLISH_TIMESTAMP = Gauge(
    "flywheel_learner_last_publish_timestamp_seconds", "Unix time of the last model version published"
)
EVAL_SUCCESS = Gauge(
    "flywheel_learner_eval_success_ratio",
    "Success rate the published version's eval reported (ModelVersionEvent.eval), by task",
    ["task", "model_version"],
)

UPDATE_DIAGNOSTIC = Gauge(
    "flywheel_learner_update_diagnostic",
    "The last update's diagnostics by name: kl_old, kl_sft, clip_fraction, entropy, ratio quantiles, informative_share",
    ["stage", "name"],
)

LIVE_SUCCESS = Gauge(
    "flywheel_learner_live_success_ratio",
    "Fleet success per task of each model version, from the episodes table the learner trains on",
    ["task", "model_version"],
)


def training_started(stage: str, tables_dir: Location, versions: dict[str, int]) -> None:
    """Stage in progress, and how old the newest training_samples row at the version read is."""
    import polars as pl

    from lake.queries import success_by_task_and_version
    from lake.tables import TRAINING_SAMPLES, scan, table_uri

    STAGE.clear()
    STAGE.labels(stage).set(1)
    TRAINING_STEPS.labels(stage)  # at 0 before the first step, so no step goes uncounted
    VERSIONS_PUBLISHED.labels(stage)
    newest = (
        scan(table_uri(tables_dir, TRAINING_SAMPLES), version=versions[TRAINING_SAMPLES])
        .select(pl.col("ingested_at").max())
        .collect()
        .item()
    )
    if newest is not None:
        DATA_AGE_SECONDS.set(max(0.0, time.time() - newest))
    for row in success_by_task_and_version(tables_dir):
        LIVE_SUCCESS.labels(row["task"], row["model_version"]).set(row["success_rate"])


def published(stage: str, version: str, at: float, evals: dict[str, float]) -> None:
    VERSIONS_PUBLISHED.labels(stage).inc()
    CURRENT_VERSION.clear()
    CURRENT_VERSION.labels(version).set(1)
    LAST_PUBLISH_TIMESTAMP.set(at)
    for task, rate in evals.items():
        EVAL_SUCCESS.labels(task, version).set(rate)


def stage_diagnostics(stage: str, diagnostics: dict) -> None:
    """The numeric diagnostics of the update a version came from (learner.algorithms.stages)."""
    for name, value in diagnostics.items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            UPDATE_DIAGNOSTIC.labels(stage, name).set(value)
