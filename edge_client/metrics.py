"""Prometheus metrics of an edge client (DESIGN §7 naming)."""

from prometheus_client import Counter, Gauge, Histogram

STEPS_PUBLISHED = Counter("flywheel_edge_steps_published_total", "Step events published to Kafka", ["task"])
EPISODES = Counter("flywheel_edge_episodes_total", "Episodes finished", ["task", "outcome"])
STEP_SECONDS = Histogram(
    "flywheel_edge_step_phase_seconds",
    "Time per step phase",
    ["phase"],  # think | act | verify
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
MODEL_VERSION = Gauge("flywheel_edge_model_version_info", "Model version in use (value 1)", ["version"])
MODEL_SWAPS = Counter("flywheel_edge_model_swaps_total", "Model versions received, by outcome", ["outcome"])
