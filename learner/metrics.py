"""Prometheus metrics of the learner (DESIGN §7 naming)."""

from prometheus_client import Counter, Gauge

TRAINING_STEPS = Counter("flywheel_learner_training_steps_total", "Optimiser steps taken", ["stage"])
LOSS = Gauge("flywheel_learner_loss", "Latest training loss", ["stage"])
SAMPLES_PER_SECOND = Gauge("flywheel_learner_samples_per_second", "Training throughput", ["stage"])
VERSIONS_PUBLISHED = Counter("flywheel_learner_versions_published_total", "Model versions published", ["stage"])
CURRENT_VERSION = Gauge("flywheel_learner_model_version_info", "Newest published version (value 1)", ["version"])
