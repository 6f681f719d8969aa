"""Training data from the Delta tables: gold `training_samples` joined to bronze `steps`."""

from __future__ import annotations

import polars as pl

from core.object_store import Location
from lake.tables import EPISODES, STEPS, TRAINING_SAMPLES, open_table, scan, table_uri

SFT_COLUMNS = [
    "episode_id", "step", "task", "instruction", "screenshot", "thought", "action_type", "x", "y", "text", "key"
]  # fmt: skip


ROLLOUT_COLUMNS = ["tokens", "token_logprobs", "seed", "model_version"]  # beyond SFT_COLUMNS, for the RL stages
ROLLOUT_TYPES = {"tokens": pl.List(pl.Int32), "token_logprobs": pl.List(pl.Float32), "seed": pl.Int64,
                 "model_version": pl.String}  # fmt: skip


def table_versions(tables_dir: Location) -> dict[str, int]:
    """Current version of each table the learner reads: the lineage a model version records."""
    return {name: open_table(table_uri(tables_dir, name)).version() for name in (STEPS, TRAINING_SAMPLES)}


def load_samples(
    tables_dir: Location, purposes: tuple[str, ...], versions: dict[str, int] | None = None
) -> pl.DataFrame:
    """Rows of `training_samples` with the given purposes, joined to their step payloads (SFT_COLUMNS + target_box).

    `versions` pins the table versions read (time travel), so a training run is reproducible.
    """
    versions = versions or table_versions(tables_dir)
    samples = scan(
        table_uri(tables_dir, TRAINING_SAMPLES), versions[TRAINING_SAMPLES], ["episode_id", "step", "purpose", "weight"]
    ).filter(pl.col("purpose").is_in(list(purposes)))
    steps = steps_with_target_box(table_uri(tables_dir, STEPS), versions[STEPS])
    return samples.join(steps, on=["episode_id", "step"], how="inner").collect()


def steps_with_target_box(uri: str, version: int) -> pl.LazyFrame:
    """SFT_COLUMNS + `target_box` (each expert click's element box) of the steps table, the box empty in tables
    written before the experts recorded it."""
    if "target_box" in scan(uri, version).collect_schema().names():
        return scan(uri, version, [*SFT_COLUMNS, "target_box"])
    return scan(uri, version, SFT_COLUMNS).with_columns(pl.lit([], dtype=pl.List(pl.Float32)).alias("target_box"))


def load_rollouts(
    tables_dir: Location, purposes: tuple[str, ...], versions: dict[str, int] | None = None, since: float = 0.0
) -> pl.DataFrame:
    """Curated steps of logged episodes for the RL stages: SFT_COLUMNS + ROLLOUT_COLUMNS + purpose, weight,
    score and success (joined from `episodes`). `since`: only episodes produced after this unix time (the
    fleet's fresh rollouts for online RL). `versions` pins steps and training_samples as in load_samples;
    `episodes` is read at its newest version, which holds every episode those samples name."""
    versions = versions or table_versions(tables_dir)
    columns = ["episode_id", "step", "purpose", "weight", "score", "produced_at"]
    samples = (
        scan(table_uri(tables_dir, TRAINING_SAMPLES), versions[TRAINING_SAMPLES], columns)
        .filter(pl.col("purpose").is_in(list(purposes)) & (pl.col("produced_at") > since))
        .drop("produced_at")
    )
    steps_uri = table_uri(tables_dir, STEPS)
    have = scan(steps_uri, versions[STEPS]).collect_schema().names()
    # Tables written before the edge recorded its tokens have no such columns: their steps have none.
    missing = [pl.lit(None, dtype=ROLLOUT_TYPES[c]).alias(c) for c in ROLLOUT_COLUMNS if c not in have]
    present = SFT_COLUMNS + [c for c in ROLLOUT_COLUMNS if c in have]
    steps = scan(steps_uri, versions[STEPS], present).with_columns(missing)
    episodes = scan(table_uri(tables_dir, EPISODES), columns=["episode_id", "success"])
    return (
        samples.join(steps, on=["episode_id", "step"], how="inner")
        .join(episodes, on="episode_id", how="inner")
        .with_columns(pl.col(c).fill_null(pl.lit([], dtype=ROLLOUT_TYPES[c])) for c in ("tokens", "token_logprobs"))
        .collect()
    )


def load_trajectories(tables_dir: Location, versions: dict[str, int] | None = None) -> pl.DataFrame:
    """The demonstrations as expert trajectories for semi-online RL and SOP (learner.algorithms.semi_online):
    SFT_COLUMNS
    + target_box, in episode and step order. Curation keeps only successful demonstrations, so every trajectory
    reaches its goal."""
    return load_samples(tables_dir, ("demo",), versions).select(*SFT_COLUMNS, "target_box").sort("episode_id", "step")
