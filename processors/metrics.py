"""Prometheus metrics of the stream processors (naming: docs/runbook.md, Metric names).

Consumer lag (`kafka_consumergroup_lag`, kafka_exporter's names) is exported by processors.lag.LagExporter,
which runs as a thread of the worker."""

from prometheus_client import Counter, Histogram

from schemas import EpisodeEvent

EVENTS = Counter(
    "flywheel_processor_events_total", "Events consumed by the sinks", ["topic", "outcome"]
)  # outcome: ok | dead_letter | duplicate (already in Delta: a redelivery, or a copy of a step by event_id)
DEAD_LETTERS = Counter("flywheel_dead_letters_total", "Events sent to the dead-letter topic", ["reason"])
DELTA_COMMITS = Counter("flywheel_delta_commits_total", "Delta commits made by the sinks", ["table"])
DELTA_ROWS = Counter("flywheel_delta_rows_total", "Rows appended to Delta tables", ["table"])
DELTA_COMMIT_SECONDS = Histogram(
    "flywheel_delta_commit_seconds",
    "Time to append one batch to Delta",
    ["table"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
BATCH_EVENTS = Histogram(
    "flywheel_processor_batch_events",
    "Events per sink batch (size/age rule of processors.batching, at most 500)",
    ["sink"],
    buckets=(1, 2, 5, 10, 25, 50, 100, 250, 500),
)
END_TO_END_SECONDS = Histogram(
    "flywheel_pipeline_end_to_end_seconds",
    "Step produced at the edge (StepEvent.produced_at) -> its row committed to Delta",
    buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800),
)
EPISODES_SCORED = Counter(
    "flywheel_episodes_scored_total", "Episodes assembled and scored", ["task", "outcome", "model_version"]
)  # outcome: success | failure | abandoned (closed without a final step: processors.assembly); each a row in Delta
OUTCOMES = ("success", "failure", "abandoned")
LATE_STEPS = Counter(
    "flywheel_processor_late_steps_total",
    "Steps of an episode already closed as abandoned: written to Delta `steps`, not assembled again",
)

# Created at 0 so that dashboards and rates show "none" rather than "no data".
for _reason in (
    "invalid_header", "undecodable", "unknown_kind", "wrong_kind", "unknown_schema_version", "invalid_field",
    "oversize_screenshot",
):  # fmt: skip
    DEAD_LETTERS.labels(_reason)


def count_episode(episode: EpisodeEvent) -> None:
    """Count a scored episode; every outcome of a (task, version) exists from its first episode on."""
    for outcome in OUTCOMES:
        EPISODES_SCORED.labels(episode.task, outcome, episode.model_version)
    EPISODES_SCORED.labels(episode.task, episode_outcome(episode), episode.model_version).inc()


def episode_outcome(episode: EpisodeEvent) -> str:
    if episode.termination == "abandoned":
        return "abandoned"
    return "success" if episode.success else "failure"
