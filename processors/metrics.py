"""Prometheus metrics of the stream processors (DESIGN §7 naming)."""

from prometheus_client import Counter, Histogram

EVENTS = Counter("flywheel_processor_events_total", "Events handled by the processors", ["topic", "outcome"])
DEAD_LETTERS = Counter("flywheel_dead_letters_total", "Events sent to the dead-letter topic", ["reason"])
DELTA_COMMITS = Counter("flywheel_delta_commits_total", "Delta commits made by the sinks", ["table"])
DELTA_ROWS = Counter("flywheel_delta_rows_total", "Rows appended to Delta tables", ["table"])
DELTA_COMMIT_SECONDS = Histogram(
    "flywheel_delta_commit_seconds",
    "Time to append one batch to Delta",
    ["table"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
EPISODES_SCORED = Counter("flywheel_episodes_scored_total", "Episodes assembled and scored", ["task", "success"])
