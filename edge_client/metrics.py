"""Prometheus metrics of an edge client (docs/runbook.md naming: base units, `_total` counters, histograms)."""

from prometheus_client import Counter, Gauge, Histogram

STEPS_PUBLISHED = Counter("flywheel_edge_steps_published_total", "Step events acknowledged by Kafka", ["task"])
EPISODES = Counter(
    "flywheel_edge_episodes_total", "Episodes finished", ["task", "outcome", "model_version"]
)  # outcome: success | failure
STEP_SECONDS = Histogram(
    "flywheel_edge_step_phase_seconds",
    "Time per step phase",
    ["phase"],  # think | act | verify; MiniWoB++ acts in 20-90 ms here, experts think in < 1 ms
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
INFERENCE_SECONDS = Histogram(
    "flywheel_edge_inference_seconds",
    "Model forward pass per step (onnxruntime)",
    ["model_version"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
VISUAL_TOKENS_KEPT = Histogram(
    "flywheel_edge_visual_tokens_kept_ratio",
    "Fraction of visual tokens kept after pruning, per model step (1: no pruning)",
    buckets=(0.1, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.75, 0.9, 1.0),
)
SPOOL_DEPTH = Gauge("flywheel_edge_spool_depth", "Step events in the local spool, not yet acknowledged by Kafka")
MODEL_VERSION = Gauge("flywheel_edge_model_version_info", "Model version in use (value 1)", ["version"])
MODEL_SWAPS = Counter("flywheel_edge_model_swaps_total", "Model versions received, by outcome", ["outcome"])
TASK_KIND = Gauge(
    "flywheel_edge_task_kind_info", "The kind of each task the client runs (value 1)", ["task", "kind"]
)  # kind: demonstrated | new (nobody demonstrated it); dashboards join episodes on it to split the two


def declare_tasks(tasks: tuple[str, ...], new_tasks: tuple[str, ...]) -> None:
    """One info series per task the client runs, naming its kind."""
    for task in tasks:
        TASK_KIND.labels(task, "demonstrated").set(1)
    for task in new_tasks:
        TASK_KIND.labels(task, "new").set(1)


def use_model_version(version: str, tasks: tuple[str, ...]) -> None:
    """Mark `version` as the one in use and create its episode series at 0, so Prometheus sees every
    increment of them (a counter's first sample is not counted as an increase)."""
    MODEL_VERSION.clear()
    MODEL_VERSION.labels(version).set(1)
    for task in tasks:
        STEPS_PUBLISHED.labels(task)
        for outcome in ("success", "failure"):
            EPISODES.labels(task, outcome, version)


def observe_decision(version: str, extras: dict[str, float], think_s: float) -> None:
    """Inference latency and visual-token keep ratio of a model's step (scripted experts have neither)."""
    if version == "expert":
        return
    INFERENCE_SECONDS.labels(version).observe(extras.get("inference_ms", think_s * 1e3) / 1e3)
    total = extras.get("visual_tokens_total", 0)
    VISUAL_TOKENS_KEPT.observe(extras.get("visual_tokens_kept", total) / total if total else 1.0)


TEACHER_LABELS = Counter(
    "flywheel_edge_teacher_labels_total", "Teacher labels received (each a budgeted call), by why asked", ["reason"]
)  # reason: edge_client.teacher.REASONS
TEACHER_SKIPPED = Counter(
    "flywheel_edge_teacher_skipped_total", "States worth a label that got none, by why", ["why"]
)  # why: budget_episode | budget_hour | no_label (the teacher could not answer; the call still counts)
TEACHER_REUSED = Counter(
    "flywheel_edge_teacher_reused_total", "Labels given again to a screen the teacher had labelled (no call)"
)
TEACHER_SECONDS = Histogram(
    "flywheel_edge_teacher_seconds",
    "Time of one teacher call (here the DOM expert on a fresh DOM read excluded)",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
