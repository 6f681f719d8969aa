"""Read-side questions about the Delta tables (counts and success rates), via polars."""

from __future__ import annotations

import polars as pl

from core.object_store import Location
from lake.tables import EPISODES, STEPS, TRAINING_SAMPLES, scan, table_exists, table_uri


def scan_table(tables_dir: Location, table: str) -> pl.LazyFrame | None:
    """The table, or None before its first commit."""
    uri = table_uri(tables_dir, table)
    return scan(uri) if table_exists(uri) else None


def step_count(tables_dir: Location, client_prefix: str = "") -> int:
    steps = scan_table(tables_dir, STEPS)
    if steps is None:
        return 0
    return steps.filter(pl.col("client_id").str.starts_with(client_prefix)).select(pl.len()).collect().item()


def episode_stats(tables_dir: Location, client_prefix: str = "", model_version: str | None = None) -> dict:
    """{"episodes", "success_rate", "per_task": {task: {"episodes", "success_rate"}}} of matching episodes
    (of one model version when given)."""
    episodes = scan_table(tables_dir, EPISODES)
    if episodes is None:
        return {"episodes": 0, "success_rate": 0.0, "per_task": {}}
    if model_version is not None:
        episodes = episodes.filter(pl.col("model_version") == model_version)
    frame = (
        episodes.filter(pl.col("client_id").str.starts_with(client_prefix))
        .group_by("task")
        .agg(pl.len().alias("episodes"), pl.col("success").cast(pl.Float64).mean().alias("success_rate"))
        .sort("task")
        .collect()
    )
    total = int(frame["episodes"].sum()) if frame.height else 0
    successes = float((frame["episodes"] * frame["success_rate"]).sum()) if frame.height else 0.0
    return {
        "episodes": total,
        "success_rate": successes / total if total else 0.0,
        "per_task": {
            row["task"]: {"episodes": row["episodes"], "success_rate": row["success_rate"]}
            for row in frame.iter_rows(named=True)
        },
    }


def success_by_task_and_version(tables_dir: Location) -> list[dict]:
    """[{"task", "model_version", "episodes", "success_rate"}] over every episode in the table."""
    episodes = scan_table(tables_dir, EPISODES)
    if episodes is None:
        return []
    return (
        episodes.group_by("task", "model_version")
        .agg(pl.len().alias("episodes"), pl.col("success").cast(pl.Float64).mean().alias("success_rate"))
        .sort("task", "model_version")
        .collect()
        .to_dicts()
    )


def episodes_by_version(tables_dir: Location) -> list[dict]:
    """[{"model_version", "episodes", "successes"}] over every episode in the table."""
    episodes = scan_table(tables_dir, EPISODES)
    if episodes is None:
        return []
    return (
        episodes.group_by("model_version")
        .agg(pl.len().alias("episodes"), pl.col("success").sum().alias("successes"))
        .collect()
        .to_dicts()
    )


def supervision_on(tables_dir: Location, tasks: tuple[str, ...]) -> dict[str, dict[str, int]]:
    """Per task, what the tables hold on it that a person or a DOM could have supplied, beside the fleet's own
    steps: {"steps", "episodes", "successes", "expert_steps", "teacher_labels", "target_boxes", "demo_rows"}. On
    a task nobody demonstrated every count after the third must be 0: the proof, read from the tables themselves,
    that the fleet learned it from its verified endings alone."""
    out = {task: dict.fromkeys(("steps", "episodes", "successes", "expert_steps", "teacher_labels", "target_boxes",
                                "demo_rows"), 0) for task in tasks}  # fmt: skip
    on = pl.col("task").is_in(list(tasks))
    steps = scan_table(tables_dir, STEPS)
    if steps is not None:
        counts = (
            steps.filter(on)
            .group_by("task")
            .agg(
                pl.len().alias("steps"),
                (pl.col("model_version") == "expert").sum().alias("expert_steps"),
                pl.col("teacher_action_type").is_not_null().sum().alias("teacher_labels"),
                (pl.col("target_box").list.len().fill_null(0) > 0).sum().alias("target_boxes"),
            )
        )
        for row in counts.collect().iter_rows(named=True):
            out[row.pop("task")].update(row)
    episodes = scan_table(tables_dir, EPISODES)
    if episodes is not None:
        counts = episodes.filter(on).group_by("task").agg(pl.len().alias("episodes"),
                                                          pl.col("success").sum().alias("successes"))  # fmt: skip
        for row in counts.collect().iter_rows(named=True):
            out[row.pop("task")].update(row)
    samples = scan_table(tables_dir, TRAINING_SAMPLES)
    if samples is not None:
        counts = samples.filter(on & (pl.col("purpose") == "demo")).group_by("task").agg(pl.len().alias("demo_rows"))
        for row in counts.collect().iter_rows(named=True):
            out[row.pop("task")].update(row)
    return out
